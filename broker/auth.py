"""Bearer-token authentication and tenants.

With no ``[auth.tokens]`` configured, the API is open (bind it to loopback, the default) and every
request acts for the tenant it names, ``default`` when it names none. With tokens configured::

    [auth.tokens]            # token = tenant; "*" is an operator who may act for any tenant
    "9f2c…" = "team-a"
    "77ab…" = "*"

every Broker RPC needs ``authorization: Bearer <token>`` metadata (UNAUTHENTICATED otherwise), and
acts for the token's tenant: naming another tenant, or touching another tenant's lease, is
PERMISSION_DENIED. Put tokens in the environment (``BROKER_AUTH__TOKENS='{"9f2c…" = "team-a"}'``),
not in the file. Health and reflection stay open for probes.
"""
from __future__ import annotations

import hmac
from typing import Mapping

import grpc

ANY_TENANT = "*"


class Auth:
    def __init__(self, tokens: Mapping[str, str] | None = None) -> None:
        self.tokens = {str(k): str(v) for k, v in (tokens or {}).items()}

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def _token_tenant(self, context) -> str | None:
        md = dict(context.invocation_metadata() or ())
        header = md.get("authorization", "")
        if not header.lower().startswith("bearer "):
            return None
        given = header[7:].strip().encode()
        found = None
        for token, tenant in self.tokens.items():  # compare against every token: constant time
            if hmac.compare_digest(given, token.encode()):
                found = tenant
        return found

    def tenant(self, context, requested: str = "") -> str:
        """The tenant this call acts for (aborts the call when it may not)."""
        if not self.enabled:
            return requested or "default"
        tenant = self._token_tenant(context)
        if tenant is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid bearer token is required (authorization metadata).")
        if tenant == ANY_TENANT:
            return requested or "default"
        if requested and requested != tenant:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"this token acts for tenant {tenant}, not {requested}.")
        return tenant

    def is_operator(self, context) -> bool:
        return not self.enabled or self._token_tenant(context) == ANY_TENANT

    def check_lease(self, context, lease_tenant: str) -> None:
        """Abort unless the caller may act on a lease of ``lease_tenant``."""
        if not self.enabled:
            return
        tenant = self.tenant(context)
        if not self.is_operator(context) and tenant != lease_tenant:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "this lease belongs to another tenant.")

    def operator(self, context) -> None:
        """Abort unless the caller is an operator (or auth is off): queue reports, decisions."""
        if self.enabled:
            self.tenant(context)


def server_credentials(server_cfg: Mapping) -> grpc.ServerCredentials | None:
    """TLS (and mutual TLS with ``tls_client_ca_file``) from ``[server]``, or None for plaintext."""
    cert, key = server_cfg.get("tls_cert_file"), server_cfg.get("tls_key_file")
    if not cert and not key:
        return None
    from broker.config import ConfigError

    if not (cert and key):
        raise ConfigError("config: server.tls_cert_file and server.tls_key_file go together")
    try:
        pair = (open(key, "rb").read(), open(cert, "rb").read())
        ca = server_cfg.get("tls_client_ca_file")
        roots = open(ca, "rb").read() if ca else None
    except OSError as e:
        raise ConfigError(f"config: cannot read a server.tls_* file: {e}") from None
    return grpc.ssl_server_credentials([pair], root_certificates=roots, require_client_auth=bool(roots))
