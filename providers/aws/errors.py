"""EC2's error codes as the providers' typed errors: every botocore exception becomes exactly one
``providers.base`` error carrying EC2's own code, with the scope failover acts on."""
from __future__ import annotations

import http.client
import re
import threading

import botocore.exceptions as bce
from botocore.parsers import ResponseParserError

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

PROVIDER = "aws"

# EC2 error codes -> error class and scope. Codes not listed fall back on their family below.
_CAPACITY = {
    "InsufficientInstanceCapacity": Scope.ZONE,
    "InsufficientCapacity": Scope.ZONE,
    "InsufficientHostCapacity": Scope.ZONE,
    "InsufficientCapacityOnHost": Scope.ZONE,
    "InsufficientReservedInstanceCapacity": Scope.ZONE,
    "ReservationCapacityExceeded": Scope.OFFER,
    "SpotMaxPriceTooLow": Scope.OFFER,
}
_QUOTA = {
    "InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded",
    "VolumeLimitExceeded", "MaxIOPSLimitExceeded", "ResourceLimitExceeded",
    "InsufficientFreeAddressesInSubnet",
}
_THROTTLE = {
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled",
    "TooManyRequestsException", "SlowDown", "EC2ThrottledException",
}
_AUTH = {
    "UnauthorizedOperation": Scope.CLOUD, "AuthFailure": Scope.CLOUD,
    "InvalidClientTokenId": Scope.CLOUD, "SignatureDoesNotMatch": Scope.CLOUD,
    "ExpiredToken": Scope.CLOUD, "RequestExpired": Scope.CLOUD,
    "MissingAuthenticationToken": Scope.CLOUD, "AccessDenied": Scope.CLOUD,
    "AccessDeniedException": Scope.CLOUD, "UnrecognizedClientException": Scope.CLOUD,
    "Blocked": Scope.CLOUD, "OptInRequired": Scope.REGION, "PendingVerification": Scope.REGION,
}
_TRANSIENT = {
    "InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable",
    "ServiceUnavailableException", "RequestTimeout", "RequestTimeoutException",
}
# Invalid-request codes that are about the region's configuration rather than one offer.
_INVALID_REGION_PREFIXES = (
    "InvalidAMIID", "InvalidSubnetID", "InvalidGroup", "InvalidKeyPair", "InvalidSecurityGroupID",
    "InvalidVpcID",
)


#: What a boto3 call can raise: its own errors, and an answer its parser cannot read (a proxy's
#: HTML page with a 200, garbage), which botocore raises as neither.
AWS_ERRORS = (bce.BotoCoreError, bce.ClientError, ResponseParserError)

_answer = threading.local()  # the HTTP status of this thread's last AWS answer (see note_answer)
_PROTOCOL_START = (b"<?xml", b"<Response", b"<ErrorResponse", b"<Error", b"{")


#: What XML 1.0 cannot carry: C0 controls but tab, LF and CR, U+FFFE and U+FFFF (a surrogate or
#: any other byte that is no UTF-8 is decoded as U+FFFD first), and character references to them.
_XML_UNFIT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_CHAR_REF = re.compile(r"&#(x[0-9a-fA-F]{1,8}|[0-9]{1,10});")
_XML_UNFIT_BYTES = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]|\xef\xbf[\xbe\xbf]|&#|[\x80-\xff]")
UNREADABLE = "\ufffd"  # what an unfit character of an answer becomes (see readable)


def _fit_ref(m: re.Match) -> str:
    ref = m.group(1)
    n = int(ref[1:], 16) if ref[0] == "x" else int(ref)
    fit = n in (0x9, 0xA, 0xD) or 0x20 <= n <= 0xD7FF or 0xE000 <= n <= 0xFFFD or 0x10000 <= n <= 0x10FFFF
    return m.group(0) if fit else UNREADABLE


def readable(body: bytes) -> bytes:
    """``body`` with every character XML 1.0 cannot carry replaced by U+FFFD: one tag value
    written outside the broker with a control character (EC2 echoes it raw) would otherwise make
    the whole answer, every other instance of the listing with it, unparseable."""
    if not _XML_UNFIT_BYTES.search(body):
        return body
    text = body.decode("utf-8", errors="replace")
    fixed = _XML_UNFIT.sub(UNREADABLE, text)
    if "&#" in fixed:
        fixed = _CHAR_REF.sub(_fit_ref, fixed)
    return body if fixed == text and UNREADABLE not in text else fixed.encode("utf-8")


def note_answer(response_dict=None, **_kwargs) -> None:
    """botocore's ``before-parse`` hook (every AWS client of the broker): remember the answer's
    HTTP status, and make a 5xx whose body is not the service's own format (a proxy's or load
    balancer's HTML page: ``<!DOCTYPE html>``...) the generic error botocore already makes of a
    bare ``<html>`` one, so it is retried and then mapped by its status, never misparsed. An XML
    answer's characters XML cannot carry become U+FFFD (:func:`readable`), so the one value that
    holds them is reported by the inventory instead of failing the whole answer."""
    if not response_dict:
        return
    status = int(response_dict.get("status_code") or 0)
    _answer.status = status
    body = response_dict.get("body")
    if not isinstance(body, (bytes, bytearray)):
        return
    if status >= 500 and body.strip() and not body.lstrip().startswith(_PROTOCOL_START):
        response_dict["body"] = b""
    elif body.lstrip().startswith(b"<"):
        response_dict["body"] = readable(bytes(body))


def _unreadable(status: int, **where) -> ProviderError:
    reason = http.client.responses.get(status, "")
    said = f"HTTP {status}{' ' + reason if reason else ''}" if status else "an answer"
    return TransientError(f"AWS answered {said}, not an AWS API answer (a proxy's or load balancer's page, "
                          "or garbage)",
                          code=f"HTTP{status}" if status else "UnreadableAnswer", **where)


def map_error(exc: BaseException, *, region: str = "", zone: str = "") -> ProviderError:
    """The one ``providers.base`` error for a botocore exception (``code`` is EC2's own)."""
    where = {"provider": PROVIDER, "region": region, "zone": zone}
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ResponseParserError):
        return _unreadable(int(getattr(_answer, "status", 0) or 0), **where)
    if isinstance(exc, bce.ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(err.get("Code") or "")
        message = str(err.get("Message") or exc)
        status = int((exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
        if code.isdigit():  # botocore's generic error: a page, not an AWS error document
            return _unreadable(int(code), **where)
        return code_error(code, message, status, region=region, zone=zone)
    return _other_error(exc, where)


def code_error(code: str, message: str, status: int = 0, *, region: str = "", zone: str = "") -> ProviderError:
    """The one ``providers.base`` error for EC2's error ``code`` (also where EC2 reports an error
    inside an answer, as CreateFleet does for each override it could not launch)."""
    where = {"provider": PROVIDER, "region": region, "zone": zone}
    if code in _CAPACITY:
        return CapacityError(message, code=code, scope=_CAPACITY[code], **where)
    if code in _QUOTA:
        return QuotaError(message, code=code, **where)
    if code in _THROTTLE or status == 429:
        return ThrottledError(message, code=code, **where)
    if code in _AUTH or status in (401, 403):
        return AuthError(message, code=code, scope=_AUTH.get(code, Scope.CLOUD), **where)
    if code in _TRANSIENT or status >= 500:
        return TransientError(message, code=code, **where)
    scope = Scope.REGION if code.startswith(_INVALID_REGION_PREFIXES) else Scope.OFFER
    return InvalidRequestError(message, code=code, scope=scope, **where)


def _other_error(exc: BaseException, where: dict) -> ProviderError:
    code = type(exc).__name__
    if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError,
                        bce.CredentialRetrievalError, bce.TokenRetrievalError,
                        bce.UnauthorizedSSOTokenError, bce.NoAuthTokenError)):
        return AuthError(str(exc), code=code, **where)
    if isinstance(exc, bce.ParamValidationError):
        return InvalidRequestError(str(exc), code=code, **where)
    # Connection refused/reset, connect and read timeouts, unparseable answers, waiter failures.
    return TransientError(str(exc), code=code, **where)
