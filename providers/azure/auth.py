"""Authentication: the one place where a loopback endpoint is treated differently, and the
credential ``[providers.azure] credentials`` names."""
from __future__ import annotations

from typing import Any, Sequence

from azure.core.exceptions import ClientAuthenticationError
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.mgmt.core.policies import ARMChallengeAuthenticationPolicy

from providers.settings import is_loopback_url


class _Anonymous:
    """Marker credential: send no ``Authorization`` header (loopback endpoints only)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:  # never called: see _NoAuthPolicy
        raise ClientAuthenticationError("anonymous credentials have no token")

    def __repr__(self) -> str:
        return "ANONYMOUS"


ANONYMOUS = _Anonymous()


class _NoAuthPolicy(SansIOHTTPPolicy):
    """Authentication policy of ``credentials = "anonymous"``: sends no credentials at all."""


class _LoopbackBearerPolicy(ARMChallengeAuthenticationPolicy):
    """ARM bearer-token policy that also allows plain HTTP, for loopback URLs only.

    Chosen by :func:`_auth_policy` only when ``base_url`` is a loopback ``http://`` URL; any other
    request URL still has TLS enforced by the base policy.
    """

    def on_request(self, request: Any) -> None:
        if is_loopback_url(request.http_request.url):
            request.context["enforce_https"] = False
        super().on_request(request)


def _auth_policy(credential: Any, base_url: str, scopes: Sequence[str]) -> Any:
    """The authentication policy for this credential and endpoint (None = the SDK's default)."""
    if credential is ANONYMOUS:
        return _NoAuthPolicy()
    if base_url.lower().startswith("http://") and is_loopback_url(base_url):
        return _LoopbackBearerPolicy(credential, *scopes)
    return None


def _make_credential(kind: str) -> Any:
    if kind == "anonymous":
        return ANONYMOUS
    import azure.identity as identity  # only when Azure is enabled and really authenticates

    return {
        "default": identity.DefaultAzureCredential,
        "cli": identity.AzureCliCredential,
        "managed_identity": identity.ManagedIdentityCredential,
        "environment": identity.EnvironmentCredential,
    }[kind]()
