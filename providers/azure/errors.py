"""ARM's errors as the providers' typed errors (``provider="azure"``), with the scope failover acts
on, and what a 404 really says."""
from __future__ import annotations

import http.client
import json
import threading
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    DecodeError,
    DeserializationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

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

# ARM error codes, as the Compute resource provider and ARM itself send them.
CAPACITY_CODES = {"AllocationFailed", "OverconstrainedAllocationRequest", "ZonalAllocationFailed",
                  "SkuNotAvailable", "OverconstrainedZonalAllocationRequest"}
QUOTA_CODES = {"QuotaExceeded", "OperationNotAllowedQuotaExceeded"}
THROTTLE_CODES = {"TooManyRequests", "SubscriptionRequestsThrottled", "RetryableError429"}
AUTH_CODES = {"AuthorizationFailed", "InvalidAuthenticationToken", "AuthenticationFailed",
              "ExpiredAuthenticationToken", "InvalidAuthenticationTokenTenant",
              "LinkedAuthorizationFailed", "InvalidAuthenticationTokenAudience"}
INVALID_CODES = {"InvalidParameter", "BadRequest", "InvalidTemplate", "InvalidRequestContent",
                 "LocationRequired", "InvalidResourceReference", "PropertyChangeNotAllowed",
                 "InvalidTagNameCharacters", "InvalidApiVersionParameter",
                 "MissingApiVersionParameter", "InvalidRequestFormat", "NotFound",
                 "ResourceNotFound", "OperationNotAllowed"}
SETUP_CODES = {"ResourceGroupNotFound", "SubscriptionNotFound", "InvalidSubscriptionId",
               "MissingSubscriptionRegistration", "DisallowedProvider", "SubscriptionNotRegistered"}
REGION_CODES = {"LocationNotAvailableForResourceType", "NoRegisteredProviderFound",
                "SkuNotAvailable"}
TRANSIENT_CODES = {"InternalServerError", "InternalExecutionError", "ServiceUnavailable",
                   "GatewayTimeout", "RetryableError", "Conflict", "OperationPreempted",
                   "InternalOperationError", "NetworkingInternalOperationError"}


def _error_code_message(exc: HttpResponseError) -> tuple[str, str]:
    """The most specific ARM error code (a generic code defers to a known one in its details)."""
    err = getattr(exc, "error", None)
    code = getattr(err, "code", None) or ""
    message = getattr(err, "message", None) or ""
    if not code and exc.response is not None:
        try:
            body = exc.response.json()
        except Exception:  # not JSON
            body = None
        if isinstance(body, dict):
            inner = body.get("error") if isinstance(body.get("error"), dict) else body
            code, message = str(inner.get("code") or ""), str(inner.get("message") or "")
    known = CAPACITY_CODES | QUOTA_CODES | THROTTLE_CODES | AUTH_CODES
    if err is not None and code not in known:
        for d in getattr(err, "details", None) or []:
            if getattr(d, "code", None) in known:
                return d.code, d.message or message
    return code, message or exc.message or str(exc)


def _gone(exc: ResourceNotFoundError, kind: str, name: str) -> bool:
    """Does this 404 say that the resource ``kind/name`` (``virtualMachines/node-1``) does not
    exist? Only ARM's ``ResourceNotFound`` naming it does. The SDK raises ResourceNotFoundError
    for every 404 — a missing resource group, a parent, a regional front end's ``NotFound``, or
    another resource — and none of those says the VM is gone: taking them for "gone" would skip
    the DELETE and leave a VM running."""
    code, message = _error_code_message(exc)
    return code == "ResourceNotFound" and f"/{kind}/{name}'".lower() in message.lower()


def _is_page(response) -> bool:
    """An answer that is an HTML page (a gateway's, a proxy's), not ARM's JSON."""
    try:
        ctype = str(response.headers.get("Content-Type", "")).lower()
        body = response.text()[:256].lstrip().lower()
    except Exception:  # noqa: BLE001 - an unreadable body is no ARM answer either
        return True
    return "html" in ctype or body.startswith(("<!doctype", "<html"))


_answer = threading.local()  # the HTTP status of this thread's last ARM answer (see check_answer)


def check_answer(pipeline_response: Any) -> None:
    """The ARM client's ``raw_response_hook``: remember the answer's HTTP status, and make a 2xx
    whose body is not a JSON object (ARM answers objects: a resource, ``{"value": [...]}``, an
    operation's status) — garbage, a body cut short, an array — a :class:`DecodeError`, which
    :func:`map_error` makes a retryable error naming the status, not a crash deep in the SDK."""
    response = pipeline_response.http_response
    status = int(response.status_code or 0)
    _answer.status = status
    if not 200 <= status < 300:
        return
    try:
        body = response.body()
        parsed = json.loads(body) if body and body.strip() else {}
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if not isinstance(parsed, dict):
        raise DecodeError(message=_not_an_answer(status), response=response)


def _not_an_answer(status: int) -> str:
    said = f"HTTP {status} {http.client.responses.get(status, '')}".strip() if status else "an answer"
    return f"Azure answered {said}, not an ARM answer (a gateway's or proxy's page, or garbage)"


def map_error(exc: BaseException, *, region: str = "", zone: str = "") -> ProviderError:
    """Map an Azure SDK error onto the broker's error types (``provider="azure"``)."""
    if isinstance(exc, ProviderError):
        return exc
    kw = dict(provider="azure", region=region, zone=zone)
    if isinstance(exc, (DecodeError, DeserializationError)):  # a 2xx (or error) body that is no answer
        response = getattr(exc, "response", None)
        status = int(getattr(response, "status_code", 0) or getattr(_answer, "status", 0) or 0)
        return TransientError(_not_an_answer(status), code=f"HTTP{status}" if status else "UnreadableAnswer", **kw)
    if isinstance(exc, HttpResponseError) and exc.response is not None:
        status = exc.status_code or 0
        code, message = _error_code_message(exc)
        if not code and _is_page(exc.response):
            return TransientError(_not_an_answer(status), code=f"HTTP{status}", **kw)
        if code in CAPACITY_CODES:
            scope = Scope.ZONE if code.startswith(("Zonal", "OverconstrainedZonal")) and zone \
                else Scope.REGION
            return CapacityError(message, code=code, scope=scope, **kw)
        if code in QUOTA_CODES or (code == "OperationNotAllowed" and "quota" in message.lower()):
            return QuotaError(message, code=code, scope=Scope.REGION, **kw)
        if status == 429 or code in THROTTLE_CODES:
            return ThrottledError(message, code=code or "TooManyRequests", **kw)
        if status in (401, 403) or code in AUTH_CODES:
            return AuthError(message, code=code or str(status), scope=Scope.CLOUD, **kw)
        if code in SETUP_CODES:
            return InvalidRequestError(message, code=code, scope=Scope.CLOUD, **kw)
        if code in REGION_CODES:
            return InvalidRequestError(message, code=code, scope=Scope.REGION, **kw)
        if status >= 500 or code in TRANSIENT_CODES:
            return TransientError(message, code=code or str(status), **kw)
        if code in INVALID_CODES or 400 <= status < 500:
            return InvalidRequestError(message, code=code or str(status), **kw)
        return TransientError(message, code=code or "OperationFailed", **kw)
    if isinstance(exc, ClientAuthenticationError):  # the credential could not get a token
        return AuthError(str(exc.message or exc), code="CredentialUnavailable", **kw)
    if isinstance(exc, ServiceResponseError):  # read timeout, reset mid-response
        return TransientError(str(exc.message or exc), code="ServiceResponseError", **kw)
    if isinstance(exc, ServiceRequestError):  # connect failure / timeout
        return TransientError(str(exc.message or exc), code="ServiceRequestError", **kw)
    if isinstance(exc, _OperationTimeout):
        return TransientError(str(exc), code="OperationTimeout", **kw)
    if isinstance(exc, AzureError):
        return TransientError(str(exc.message or exc), code=type(exc).__name__, **kw)
    raise exc


class _OperationTimeout(Exception):
    """A long-running operation did not finish within ``operation_timeout_s``."""
