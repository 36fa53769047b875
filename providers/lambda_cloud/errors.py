"""Lambda Cloud's error answers as the providers' typed errors, with the scope failover acts on.

Every failed call answers ``{"error": {"code", "message", "suggestion"}}`` (Lambda Cloud API
1.8.3, "Error responses"; the spec says to branch on ``code`` only, never on the message). The
codes handled here are the spec's ``errorCode`` values and the ``ApiError*`` schemas of
``POST /instance-operations/launch``: capacity and quota come back as HTTP 400 with their own
codes, so the code decides, not the status. A 429 (rate limit: one request per second, one
launch per 12 seconds) may arrive as Cloudflare's page rather than JSON (Lambda's "Are API
requests rate-limited?" page: "error code: 1015"); it is a throttle either way.
"""
from __future__ import annotations

import http.client
from typing import Any

from providers.base import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaError,
    Scope,
    ThrottledError,
    TransientError,
)

NAME = "lambda"

CAPACITY = "instance-operations/launch/insufficient-capacity"
QUOTA = "global/quota-exceeded"
INVALID_KEY = "global/invalid-api-key"
ACCOUNT_INACTIVE = "global/account-inactive"
INVALID_ADDRESS = "global/invalid-address"
INVALID_PARAMETERS = "global/invalid-parameters"
NOT_FOUND = "global/object-does-not-exist"
UNKNOWN = "global/unknown"
AUTH_CODES = {INVALID_KEY, ACCOUNT_INACTIVE, INVALID_ADDRESS}
INVALID_CODES = {INVALID_PARAMETERS, NOT_FOUND, "instance-operations/launch/file-system-in-wrong-region",
                 "instance-operations/launch/file-systems-not-supported", "ssh-keys/key-in-use"}


def classify(status: int, code: str, message: str, *, region: str = "") -> ProviderError:
    """One error answer (its HTTP status and Lambda's ``error.code``) as a typed error."""
    kw: dict[str, Any] = {"provider": NAME, "code": code or f"HTTP{status}", "region": region}
    if code == CAPACITY:
        # Capacity is per instance type and region (Lambda has no zones): rule out this offer only.
        return CapacityError(message, scope=Scope.OFFER, **kw)
    if code == QUOTA:  # the account's limit, not a region's
        return QuotaError(message, scope=Scope.CLOUD, **kw)
    if status == 429:
        return ThrottledError(message, scope=Scope.CLOUD, **kw)
    if code in AUTH_CODES or status in (401, 403):
        return AuthError(message, scope=Scope.CLOUD, **kw)
    if code.startswith("provider/") or code == UNKNOWN or status >= 500:
        return TransientError(message, scope=Scope.REGION, **kw)
    if code in INVALID_CODES or 400 <= status < 500:
        return InvalidRequestError(message, scope=Scope.OFFER, **kw)
    return TransientError(message, scope=Scope.REGION, **kw)


def unreadable(status: int, *, region: str = "") -> ProviderError:
    """An answer that is not the API's JSON (a proxy's HTML page, garbage): retry later."""
    if status == 429:
        return ThrottledError(f"Lambda Cloud answered HTTP 429 {http.client.responses[429]} (rate limited)",
                              provider=NAME, code="HTTP429", region=region)
    reason = http.client.responses.get(status, "")
    said = f"HTTP {status}{' ' + reason if reason else ''}" if status else "an answer"
    return TransientError(f"Lambda Cloud answered {said}, not a Cloud API answer (a proxy's or load "
                          "balancer's page, or garbage)", provider=NAME,
                          code=f"HTTP{status}" if status else "UnreadableAnswer", region=region)


def from_body(status: int, body: Any, *, region: str = "") -> ProviderError:
    """The typed error of a non-2xx answer whose body is ``body`` (decoded JSON, or None)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        return unreadable(status, region=region)
    message = str(err.get("message") or err["code"])
    if err.get("suggestion"):
        message = f"{message} ({err['suggestion']})"
    return classify(status, err["code"], message, region=region)
