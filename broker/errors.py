"""One family of errors for the whole service, and ONE table from each to its gRPC status and CLI
exit code.

Product code raises these (or a subclass); the gRPC layer and the CLI translate them through
:data:`OUTCOMES` and nothing else. A message is one sentence a person can act on; ``field`` names
the request field or config key that was wrong, where there is one; ``attempts`` carries the
launch attempts of a failed lease (provider, scope, the provider's own code).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import grpc


class BrokerError(Exception):
    """Base of every error the service means to show its caller."""

    def __init__(self, message: str, *, field: str = "", attempts: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.field = field
        self.attempts = list(attempts)


class InvalidArgument(BrokerError, ValueError):
    """The request (or a CLI flag) is malformed or out of range; retrying it unchanged fails again."""


class ConfigError(InvalidArgument):
    """The configuration (file, environment, flags) is wrong: a start-up error, exit 2."""


class NotFound(BrokerError):
    """The named object (lease, quote, token) does not exist, or the caller may not see it."""


class Unauthenticated(BrokerError):
    """No valid credential was presented."""


class PermissionDenied(BrokerError):
    """The caller is known but may not do this."""


class OverBudget(BrokerError):
    """The tenant's spending cap would be exceeded."""


class Conflict(BrokerError):
    """The object changed under the request (a concurrent writer, an idempotency key reused)."""


class FailedPrecondition(BrokerError):
    """The system is not in a state where this can succeed (a lease not running, a launch that
    failed for good); a retry as-is will not help."""


class Unavailable(BrokerError):
    """A dependency (cloud, database, leader) is briefly unavailable; the same request may succeed later."""


@dataclass(frozen=True)
class Outcome:
    status: grpc.StatusCode
    exit_code: int


#: The one mapping from error to gRPC status and CLI exit code. Most specific class first.
OUTCOMES: dict[type[BrokerError], Outcome] = {
    ConfigError: Outcome(grpc.StatusCode.INVALID_ARGUMENT, 2),
    InvalidArgument: Outcome(grpc.StatusCode.INVALID_ARGUMENT, 2),
    NotFound: Outcome(grpc.StatusCode.NOT_FOUND, 4),
    Unauthenticated: Outcome(grpc.StatusCode.UNAUTHENTICATED, 5),
    PermissionDenied: Outcome(grpc.StatusCode.PERMISSION_DENIED, 5),
    OverBudget: Outcome(grpc.StatusCode.RESOURCE_EXHAUSTED, 3),
    Conflict: Outcome(grpc.StatusCode.ABORTED, 6),
    FailedPrecondition: Outcome(grpc.StatusCode.FAILED_PRECONDITION, 6),
    Unavailable: Outcome(grpc.StatusCode.UNAVAILABLE, 7),
}

#: gRPC status → the error class a client raises for it (the inverse of OUTCOMES).
FROM_STATUS: dict[grpc.StatusCode, type[BrokerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: OverBudget,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
}


def outcome(err: BaseException) -> Outcome:
    """The status and exit code for ``err``; anything not a BrokerError is an internal error (1)."""
    for cls in type(err).__mro__:
        if cls in OUTCOMES:
            return OUTCOMES[cls]  # type: ignore[index]
    return Outcome(grpc.StatusCode.INTERNAL, 1)
