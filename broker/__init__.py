"""broker: a multi-cloud GPU burst broker (distribution ``gpu-burst-broker``, command ``broker``)."""

__version__ = "0.1.0"
