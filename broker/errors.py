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
    """A gRPC status (by its ``grpc.StatusCode`` name) and a CLI exit code.

    The name, not the enum, so that importing this module (every command does) does not import
    gRPC: ``status`` resolves it when a server or client needs it."""

    status_name: str
    exit_code: int

    @property
    def status(self):
        import grpc

        return grpc.StatusCode[self.status_name]


#: The one mapping from error to gRPC status and CLI exit code. Most specific class first.
OUTCOMES: dict[type[BrokerError], Outcome] = {
    ConfigError: Outcome("INVALID_ARGUMENT", 2),
    InvalidArgument: Outcome("INVALID_ARGUMENT", 2),
    NotFound: Outcome("NOT_FOUND", 4),
    Unauthenticated: Outcome("UNAUTHENTICATED", 5),
    PermissionDenied: Outcome("PERMISSION_DENIED", 5),
    OverBudget: Outcome("RESOURCE_EXHAUSTED", 3),
    Conflict: Outcome("ABORTED", 6),
    FailedPrecondition: Outcome("FAILED_PRECONDITION", 6),
    Unavailable: Outcome("UNAVAILABLE", 7),
}

#: gRPC status name (``code.name``) → the error class a client raises for it (the inverse of OUTCOMES).
FROM_STATUS: dict[str, type[BrokerError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "NOT_FOUND": NotFound,
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
    "RESOURCE_EXHAUSTED": OverBudget,
    "ABORTED": Conflict,
    "FAILED_PRECONDITION": FailedPrecondition,
    "UNAVAILABLE": Unavailable,
}


def outcome(err: BaseException) -> Outcome:
    """The status and exit code for ``err``; a cloud's error that reaches a caller is UNAVAILABLE
    (exit 7) when retrying may help (throttling, a 5xx, an unreadable answer), else
    FAILED_PRECONDITION; anything else not a BrokerError is an internal error (1)."""
    for cls in type(err).__mro__:
        if cls in OUTCOMES:
            return OUTCOMES[cls]  # type: ignore[index]
    from providers.base import ProviderError

    if isinstance(err, ProviderError):
        return OUTCOMES[Unavailable] if err.retryable else OUTCOMES[FailedPrecondition]
    return Outcome("INTERNAL", 1)


#: Trailing metadata the server puts on every status it sends: a client tells the broker's own
#: UNAVAILABLE (a cloud down, a database lost) from no broker answering at all.
ANSWERED = "broker-answered"
