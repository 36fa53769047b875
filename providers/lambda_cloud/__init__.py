"""Lambda Cloud: on-demand GPU instances for a lease through Lambda's public REST API, with ``httpx``.

How the pieces of the protocol map onto the Lambda Cloud API (spec 1.8.3,
``https://cloud.lambda.ai/api/v1/openapi.json``):

* **offerings**: ``GET /api/v1/instance-types`` gives every type's price
  (``price_cents_per_hour``, per instance) and the regions that have capacity for it now
  (``regions_with_capacity_available``); the market refresh reads it
  (:mod:`providers.market.lambda_cloud`). The bundled catalog holds Lambda's public on-demand
  prices (``providers/data``). Lambda sells no spot capacity.
* **launch** is all or nothing in one region: ``POST /api/v1/instance-operations/launch`` launches
  one instance per call, so a lease of N nodes is N calls, each with tags ``broker-lease``,
  ``broker-owner`` and ``broker-node``, the node name as ``name`` and ``hostname`` (the node reads
  its name from its hostname at boot) and the boot script as cloud-init ``user_data``. The API
  has no idempotency token: before launching, the lease's instances are looked up by tag and a
  retry adopts what a crashed call made. If a node fails, every instance of the lease is
  terminated and the mapped error raised.
* **list**: ``GET /api/v1/instances``, filtered by the ``broker-owner`` tag.
* **terminate**: ``POST /api/v1/instance-operations/terminate``; an instance already gone is fine.
* **errors**: the ``{"error": {"code", "message", "suggestion"}}`` envelope mapped by ``code``
  (:mod:`providers.lambda_cloud.errors`): insufficient capacity rules out the offer, quota the
  account, 429 is retried with back-off, a page that is not the API's JSON is retryable.
* **credentials**: the API key from ``api_key_file`` or ``$LAMBDA_API_KEY``, sent as a Bearer
  header and never logged, printed or put in an error (:class:`ApiKey`). ``endpoint`` (or
  ``$LAMBDA_API_ENDPOINT``) points the client elsewhere, plain http on loopback only.
"""
from __future__ import annotations

import importlib
from typing import Any

from providers.lambda_cloud.boot import BOOT
from providers.lambda_cloud.names import node_name_problem
from providers.lambda_cloud.settings import LambdaSettings
from providers.registration import CloudRegistration

REGISTRATION = CloudRegistration(
    name="lambda", title="Lambda Cloud", provider="providers.lambda_cloud.provider:LambdaProvider",
    settings=LambdaSettings, market="providers.market.lambda_cloud:MARKET", node_name_problem=node_name_problem,
    sdk_modules=("httpx",), sandbox="broker_sandbox.lambda_cloud:sandbox_cloud", boot=BOOT)

# The httpx-bound names, imported on first use so that reading the registration loads no httpx.
_LAZY = {"ApiKey": "client", "LambdaClient": "client", "NAME": "errors", "classify": "errors",
         "from_body": "errors", "LambdaProvider": "provider"}

__all__ = ["REGISTRATION", "LambdaSettings", "node_name_problem", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
