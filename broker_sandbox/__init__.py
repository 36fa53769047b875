"""The mocked clouds: AWS EC2 (moto behind a front that adds what moto lacks), GCP Compute and
Cloud Billing, Azure Resource Manager and Retail Prices, each an HTTP server on 127.0.0.1 that
speaks the real API's paths, shapes and error codes, so the real SDKs talk to them unchanged.

The test suite runs the broker against them (``tests/clouds`` imports these modules), and
``broker sandbox`` starts them with a broker configured against them, so a laptop with no cloud
account can quote, launch, hand off, watch and release. Install with the ``sandbox`` extra
(``pip install -e '.[sandbox]'``): moto and flask serve the fake EC2.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class SandboxCloud:
    """One cloud's fakes, started on loopback, as its registration's ``sandbox`` function returns
    them (``sandbox_cloud(market=False)``; ``market=True`` also starts the fakes of market APIs
    that only ``broker sandbox`` calls). :class:`broker_sandbox.clouds.Clouds` holds one per
    registered cloud.

    ``fakes``: attribute name on ``Clouds`` -> a started fake (each has ``stop()`` and ``reset()``).
    ``table``: the ``[providers.NAME]`` table that points a broker at the fakes.
    ``alive``: what exists server-side and is not terminated.
    ``env``: the environment a broker process needs to talk to them (fake credentials only)."""

    fakes: dict[str, Any]
    table: Callable[[], dict[str, Any]]
    alive: Callable[[], list[Any]]
    env: dict[str, str] = field(default_factory=dict)
