"""The mocked clouds live in the installable package :mod:`broker_sandbox` (``broker sandbox``
runs them too); ``tests.clouds.aws`` and the rest name the same modules, so tests import them
from here as before. ``three`` (all clouds plus a ``broker serve`` subprocess) is the suite's."""
import importlib
import sys

for _name in ("aws", "aws_market", "azure", "azure_market", "gcp", "gcp_billing", "gcp_market", "lambda_cloud"):
    sys.modules[f"{__name__}.{_name}"] = globals()[_name] = importlib.import_module(f"broker_sandbox.{_name}")
