"""Compute's errors as the providers' typed errors: HTTP ``error.errors[].reason`` and Operation
``error.errors[].code`` alike, with the scope failover acts on."""
from __future__ import annotations

import json
import re
import threading
from typing import Any, Sequence

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from providers.gcp.sdk import compute_v1
from google.protobuf import json_format

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

NAME = "gcp"

CAPACITY_CODES = {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                  "resourcePoolExhausted", "insufficientCapacity", "STOCKOUT"}
QUOTA_CODES = {"QUOTA_EXCEEDED", "quotaExceeded", "RESOURCE_QUOTA_EXCEEDED"}
THROTTLE_CODES = {"rateLimitExceeded", "userRateLimitExceeded", "RESOURCE_OPERATION_RATE_EXCEEDED",
                  "RATE_LIMIT_EXCEEDED"}
GONE_CODES = {"RESOURCE_NOT_FOUND", "notFound"}
# 4xx answers that only mean "not now": the resource is busy with another operation.
TRANSIENT_CODES = {"resourceNotReady", "RESOURCE_NOT_READY", "RESOURCE_OPERATION_IN_PROGRESS", "backendError",
                   "internalError"}


def classify(codes: Sequence[str], status: int | None, message: str, *, region: str = "",
             zone: str = "") -> ProviderError:
    """One GCP error (HTTP ``error.errors[].reason`` or Operation ``error.errors[].code``)."""
    codes = [c for c in codes if c]
    code = codes[0] if codes else (str(status) if status else "")
    text = message.lower()
    kw: dict[str, Any] = {"provider": NAME, "code": code, "region": region, "zone": zone}
    hit = set(codes)
    if hit & CAPACITY_CODES or "resource pool exhausted" in text or "does not have enough resources" in text:
        return CapacityError(message, scope=Scope.ZONE, **{**kw, "code": next(iter(hit & CAPACITY_CODES), code)})
    if hit & THROTTLE_CODES or status == 429:
        return ThrottledError(message, scope=Scope.REGION, **kw)
    if hit & QUOTA_CODES:
        return QuotaError(message, scope=Scope.REGION, **{**kw, "code": next(iter(hit & QUOTA_CODES))})
    if hit & TRANSIENT_CODES:
        return TransientError(message, scope=Scope.REGION, **kw)
    if status in (401, 403):
        return AuthError(message, scope=Scope.CLOUD, **kw)
    if status in (400, 404, 409, 412, 413, 422):
        return InvalidRequestError(message, scope=Scope.OFFER, **kw)
    return TransientError(message, scope=Scope.REGION, **kw)


def _looks_like_a_page(text: str) -> bool:
    """An error whose body is an HTML page (a proxy's, a load balancer's), not Google's JSON."""
    low = text.lower()
    return "<html" in low or "<!doctype" in low or "<body" in low


def _not_an_answer(status: int) -> str:
    import http.client

    reason = http.client.responses.get(status, "")
    said = f"HTTP {status}{' ' + reason if reason else ''}" if status else "an answer"
    return f"GCP answered {said}, not a Compute API answer (a proxy's or load balancer's page, or garbage)"


_answer = threading.local()  # the HTTP status of this thread's last Compute answer (see note_status)

#: What the REST transport raises for a 2xx whose body it cannot read: not JSON, cut short, or
#: JSON of another shape than the method's (its own errors are GoogleAPICallError).
UNREADABLE = (json_format.ParseError, json.JSONDecodeError, UnicodeDecodeError)


# A JSON escape of a lone UTF-16 surrogate (a high one not followed by a low one, or a low one
# alone), not itself an escaped backslash's "u": no text, and protobuf refuses the whole answer.
_LONE_SURROGATE = re.compile(rb"(?<!\\)\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                             rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})(?<!\\)\\u[dD][c-fC-F][0-9a-fA-F]{2}")
UNREADABLE_TEXT = "\ufffd"  # what a value that JSON cannot carry as text reads as


def note_status(response: requests.Response, *_args: Any, **_kwargs: Any) -> requests.Response:
    """A ``requests`` response hook on every Compute client's session: remember the answer's HTTP
    status, for the sentence of an answer that cannot be read, and make a lone surrogate in a 2xx
    answer (one metadata value written outside the broker) U+FFFD, so that value is reported by
    the inventory instead of failing every instance of the listing with it."""
    _answer.status = response.status_code
    if 200 <= response.status_code < 300:
        body = response.content
        if body and (b"\\ud" in body or b"\\uD" in body):
            response._content = _LONE_SURROGATE.sub(rb"\\ufffd", body)
    return response


def map_error(exc: BaseException, *, region: str = "", zone: str = "") -> ProviderError:
    """Any error a Compute call raised, as the provider error that decides failover."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, UNREADABLE):  # a 2xx whose body is garbage: retryable, named by its status
        status = int(getattr(_answer, "status", 0) or 0)
        return TransientError(_not_an_answer(status), provider=NAME, code=f"HTTP{status}" if status else
                              "UnreadableAnswer", region=region, zone=zone)
    if isinstance(exc, gexc.GoogleAPICallError):
        status = exc.code if isinstance(exc.code, int) else 0
        if not exc.errors and not exc.reason and _looks_like_a_page(exc.message or str(exc)):
            return TransientError(_not_an_answer(status), provider=NAME, code=f"HTTP{status}" if status else
                                  "UnreadableAnswer", region=region, zone=zone)
        reasons = [e.get("reason", "") for e in exc.errors if isinstance(e, dict)]
        if exc.reason:
            reasons.append(exc.reason)
        return classify(reasons, exc.code if isinstance(exc.code, int) else None, exc.message or str(exc),
                        region=region, zone=zone)
    if isinstance(exc, (requests.exceptions.Timeout, TimeoutError)):
        return TransientError(f"Compute call timed out: {exc}", provider=NAME, code="TIMEOUT",
                              region=region, zone=zone)
    if isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError)):
        return TransientError(f"cannot reach Compute: {exc}", provider=NAME, code="CONNECTION_ERROR",
                              region=region, zone=zone)
    if isinstance(exc, auth_exc.TransportError):
        return TransientError(f"cannot reach the token endpoint: {exc}", provider=NAME, code="AUTH_TRANSPORT",
                              region=region, zone=zone)
    if isinstance(exc, auth_exc.GoogleAuthError):  # refresh refused, anonymous asked to refresh, ...
        return AuthError(f"credentials refused: {exc}", provider=NAME, code=type(exc).__name__,
                         region=region, zone=zone)
    raise exc


def operation_error(op: compute_v1.Operation, *, region: str, zone: str) -> ProviderError | None:
    """The error a DONE operation ended with, if any."""
    errors = list(op.error.errors)
    if not errors and not op.http_error_status_code:
        return None
    message = "; ".join(e.message for e in errors if e.message) or op.http_error_message or "operation failed"
    return classify([e.code for e in errors], op.http_error_status_code or None, message,
                    region=region, zone=zone)
