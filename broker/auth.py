"""Who may call what: bearer tokens, roles, and the one authorization table of the API.

Without ``[auth]`` the API is open (bind it to loopback, the default): every caller is an
operator acting for the tenant it names (``default`` when it names none). With tokens::

    [auth.tokens]                         # token = who it is
    "9f2c…" = "team-a"                    # a tenant: its own quotes, leases, budget and events
    "5be1…" = "scheduler:team-a,team-c"   # a scheduler: reports and diagnoses the queues of these
                                          # tenants, and watches their leases and decisions
    "77ab…" = "*"                         # an operator: everything, for any tenant
    "sha256:3a7b…" = "team-b"             # any token may be given as the hex SHA-256 of itself

every Broker RPC needs ``authorization: Bearer <token>`` metadata. The caller is authenticated
before anything is looked up (UNAUTHENTICATED, the same for every request), then :data:`TABLE`
says whether its role may call the RPC at all (PERMISSION_DENIED), and each object it touches is
checked against its tenant: another tenant's lease or quote is NOT_FOUND, exactly like a missing
one, so ids leak nothing. Health and reflection stay open for probes.

A token's role comes from its spec string in the config file, or from wherever issued tokens are
kept (``Auth(issued=...)``, answering with :func:`principal_for` from a stored role and tenants):
the same roles, the same table.
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import grpc

from broker.errors import BrokerError, ConfigError, NotFound, PermissionDenied, Unauthenticated, outcome
from broker.fields import TENANT as _TENANT
from providers.files import SMALL_BYTES, read_bytes

ANY_TENANT = "*"
LEASE_PREFIX = "brl_"  # broker.jobs.CREDENTIAL_PREFIX
SERVICE_PREFIX = "/broker.v1.Broker/"
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})\Z", re.IGNORECASE)


class Role(enum.Enum):
    NONE = "none"            # no valid token
    TENANT = "tenant"
    SCHEDULER = "scheduler"
    OPERATOR = "operator"
    LEASE = "lease"          # a lease's callback credential (broker.jobs): its own job reports only


#: The authorization table: which roles may call each RPC. Object-level walls (whose lease,
#: whose quote, which queues) apply on top, in :class:`Principal`. An RPC missing here is denied.
TABLE: dict[str, frozenset[Role]] = {
    "Quote": frozenset({Role.TENANT, Role.OPERATOR}),
    "Launch": frozenset({Role.TENANT, Role.OPERATOR}),
    "GetLease": frozenset({Role.TENANT, Role.OPERATOR}),
    "ListLeases": frozenset({Role.TENANT, Role.OPERATOR}),
    "Release": frozenset({Role.TENANT, Role.OPERATOR}),
    "Handoff": frozenset({Role.TENANT, Role.OPERATOR}),
    "WatchLeases": frozenset({Role.TENANT, Role.SCHEDULER, Role.OPERATOR}),
    "ReportQueue": frozenset({Role.SCHEDULER, Role.OPERATOR}),
    "Diagnose": frozenset({Role.SCHEDULER, Role.OPERATOR}),
    "ListDecisions": frozenset({Role.OPERATOR}),
    "ReportJob": frozenset({Role.TENANT, Role.OPERATOR, Role.LEASE}),
}


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: its role and the tenants it may act for or see."""

    role: Role
    tenants: frozenset[str] = frozenset()  # tenant: exactly its own; scheduler: its queues
    lease: str = ""  # a lease credential's lease

    @property
    def operator(self) -> bool:
        return self.role is Role.OPERATOR

    @property
    def tenant(self) -> str:
        """A tenant's own tenant ("" for the other roles)."""
        return next(iter(self.tenants)) if self.role is Role.TENANT else ""

    def acting_for(self, requested: str, field: str = "tenant") -> str:
        """The tenant a call is charged to: a tenant's own (naming another is PERMISSION_DENIED),
        or for an operator the one it names (``default`` when none)."""
        if self.operator:
            return requested or "default"
        if self.role is Role.TENANT and requested in ("", self.tenant):
            return self.tenant
        raise PermissionDenied(f"{field}: this token acts for tenant {self.tenant or '(none)'}, "
                               f"not {requested[:64]!r}.", field=field)

    def sees(self, tenant: str) -> bool:
        """Whether objects of ``tenant`` (leases, quotes, their events) are visible to the caller."""
        return self.operator or tenant in self.tenants

    def own(self, tenant: str, what: str, ident: str) -> None:
        """NOT_FOUND, as for a missing one, unless the caller may see this tenant's object."""
        if not self.sees(tenant):
            raise NotFound(f"{what} {ident[:64]} does not exist.")

    def source(self, name: str) -> str:
        """The queue source a snapshot of this caller is kept and decided under. An operator's is
        the name it gives; a scheduler's is scoped to its tenants ("team-a,team-c/kueue:prod"), so
        no scheduler replaces another's queue (its pending jobs, its idle capacity to scale in),
        reads its allocation history, or reports as a source the broker watches itself."""
        if self.operator:
            return name
        return f"{','.join(sorted(self.tenants))}/{name or 'default'}"

    def reports_for(self, queue: str, field: str) -> None:
        """A scheduler reports only jobs of its own queues (a job's queue names its tenant)."""
        if not self.operator and (queue or "default") not in self.tenants:
            raise PermissionDenied(f"{field}: this token reports for {', '.join(sorted(self.tenants))}, "
                                   f"not queue {(queue or 'default')[:64]!r}.", field=field)


OPEN = Principal(Role.OPERATOR)


def principal_for(role: str, tenants: Iterable[str]) -> Principal:
    """A principal from a stored role and tenant list (ValueError when they do not make one)."""
    try:
        r = Role(role)
    except ValueError:
        raise ValueError(f"unknown role {role!r} (tenant, scheduler or operator)") from None
    if r is Role.LEASE:
        raise ValueError("a lease credential is minted for its lease at launch, never issued")
    names = frozenset(t.strip() for t in tenants if t.strip())
    if r is Role.OPERATOR:
        return Principal(r)
    if r is Role.NONE or not names:
        raise ValueError(f"a {r.value} token needs {'one tenant' if r is Role.TENANT else 'tenants'}")
    if r is Role.TENANT and len(names) != 1:
        raise ValueError("a tenant token acts for exactly one tenant")
    bad = sorted(t for t in names if not _TENANT.match(t))
    if bad:
        raise ValueError(f"{bad[0]!r} is not a tenant name (letters, digits, '.', '_', '-'; at most 63)")
    return Principal(r, names)


def parse_spec(spec: str) -> Principal:
    """``"team-a"`` (a tenant), ``"*"`` or ``"operator"``, ``"scheduler:team-a,team-c"``,
    ``"tenant:team-a"``."""
    spec = str(spec).strip()
    if spec in (ANY_TENANT, Role.OPERATOR.value):
        return OPEN
    role, sep, rest = spec.partition(":")
    if not sep:
        return principal_for("tenant", [spec])
    return principal_for(role.strip(), rest.split(","))


def _digest(token: str) -> bytes:
    m = _DIGEST.match(token)
    return bytes.fromhex(m.group(1)) if m else hashlib.sha256(token.encode()).digest()


class Auth:
    """The token table and the checks every RPC goes through."""

    def __init__(self, tokens: Mapping[str, str] | None = None,
                 issued: Callable[[bytes], Principal | None] | None = None) -> None:
        """``tokens``: the config file's table; ``issued``: looks a token up by its SHA-256 digest
        among tokens kept elsewhere (a store of issued tokens, building its answer with
        :func:`principal_for`). Either makes auth required."""
        self._issued = issued
        # A lease callback credential's lease, by the credential (broker.jobs.LeaseCredentials.lease_of).
        self.lease_credential: Callable[[str], str | None] | None = None
        self._entries: list[tuple[bytes, Principal]] = []
        for token, spec in (tokens or {}).items():
            if not str(token).strip():
                raise ConfigError("config: auth.tokens holds an empty token", field="auth.tokens")
            try:
                self._entries.append((_digest(str(token)), parse_spec(spec)))
            except ValueError as e:
                raise ConfigError(f"config: auth.tokens: {e}", field="auth.tokens") from None

    @property
    def enabled(self) -> bool:
        return bool(self._entries) or self._issued is not None

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Principal:
        """The caller behind ``metadata`` (UNAUTHENTICATED without a valid bearer token)."""
        if not self.enabled:
            return OPEN
        header = ""
        for key, value in metadata or ():
            if key == "authorization" and isinstance(value, str):
                header = value
        scheme, _, given = header.partition(" ")
        given = given.strip()
        found = None
        if scheme.lower() == "bearer" and given:
            digest = hashlib.sha256(given.encode("utf-8", "surrogatepass")).digest()
            for stored, principal in self._entries:  # every entry, so timing tells nothing
                if hmac.compare_digest(digest, stored):
                    found = principal
            if found is None and self._issued is not None:
                found = self._issued(digest)
            if found is None and self.lease_credential is not None and given.startswith(LEASE_PREFIX):
                lease = self.lease_credential(given)
                found = Principal(Role.LEASE, lease=lease) if lease else None
        if found is None:
            raise Unauthenticated("a valid bearer token is required (authorization metadata).")
        return found

    def principal(self, context: grpc.ServicerContext) -> Principal:
        return self.authenticate(context.invocation_metadata())

    def authorize(self, method: str, metadata) -> Principal:
        """Authenticate, then check the table for ``method`` (the RPC's short name)."""
        p = self.authenticate(metadata)
        if p.role not in TABLE.get(method, frozenset()):
            raise PermissionDenied(f"a {p.role.value} token may not call {method}.")
        return p

    def interceptor(self) -> grpc.ServerInterceptor:
        return _AuthInterceptor(self)


class _AuthInterceptor(grpc.ServerInterceptor):
    """Enforces :data:`TABLE` before any handler runs (so before any lookup)."""

    def __init__(self, auth: Auth) -> None:
        self.auth = auth

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or not details.method.startswith(SERVICE_PREFIX):
            return handler
        try:
            self.auth.authorize(details.method[len(SERVICE_PREFIX):], details.invocation_metadata)
            return handler
        except BrokerError as e:
            status, message = outcome(e).status, str(e)

        def refuse(request, context):
            context.abort(status, message)

        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(refuse, handler.request_deserializer,
                                                        handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(refuse, handler.request_deserializer,
                                                   handler.response_serializer)


def check_certificate(cert_file: str, key_file: str, cert_pem: bytes, now: float | None = None) -> None:
    """A ConfigError naming the file and the cause when the key does not match the certificate
    (gRPC would only say "Failed to bind"), or the certificate is expired or not valid yet.
    An expired certificate is refused, not warned about: every client's handshake would fail,
    so the broker would run and serve no one."""
    import datetime as dt
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert_file, key_file, password=lambda: b"")
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(f"config: server.tls_key_file {key_file} is not the key of the certificate in "
                              f"server.tls_cert_file {cert_file}", field="server.tls_key_file") from None
        raise ConfigError(f"config: server.tls_cert_file {cert_file} with server.tls_key_file {key_file} cannot "
                          f"be used: {(e.reason or str(e)).lower().replace('_', ' ')}", field="server.tls_key_file") from None
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        raise ConfigError(f"config: server.tls_cert_file {cert_file} is not a certificate: {e}",
                          field="server.tls_cert_file") from None
    at = dt.datetime.now(dt.timezone.utc) if now is None else dt.datetime.fromtimestamp(now, dt.timezone.utc)
    if cert.not_valid_after_utc < at:
        raise ConfigError(f"config: server.tls_cert_file {cert_file} expired on "
                          f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: renew it", field="server.tls_cert_file")
    if cert.not_valid_before_utc > at:
        raise ConfigError(f"config: server.tls_cert_file {cert_file} is not valid before "
                          f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC", field="server.tls_cert_file")


def server_credentials(server) -> grpc.ServerCredentials | None:
    """TLS (and mutual TLS with ``tls_client_ca_file``) from the typed ``[server]`` settings (the
    schema has checked that cert and key go together), or None for plaintext."""
    if not server.tls:
        return None
    files = {}
    for key in ("tls_key_file", "tls_cert_file", "tls_client_ca_file"):
        path = getattr(server, key)
        if not path:
            continue
        try:
            files[key] = read_bytes(path, SMALL_BYTES, regular=True)
        except OSError as e:
            raise ConfigError(f"config: server.{key} {path} cannot be read: {e.strerror}", field=f"server.{key}") from None
        if b"-----BEGIN " not in files[key]:
            raise ConfigError(f"config: server.{key} {path} is not a PEM file", field=f"server.{key}")
        want = b"PRIVATE KEY-----" if key == "tls_key_file" else b"-----BEGIN CERTIFICATE-----"
        if want not in files[key]:
            what = "private key" if key == "tls_key_file" else "certificate"
            raise ConfigError(f"config: server.{key} {path} holds no {what} (a PEM file of another kind: "
                              "the key and a certificate swapped?)", field=f"server.{key}")
    check_certificate(server.tls_cert_file, server.tls_key_file, files["tls_cert_file"])
    roots = files.get("tls_client_ca_file")
    return grpc.ssl_server_credentials([(files["tls_key_file"], files["tls_cert_file"])], root_certificates=roots,
                                       require_client_auth=bool(roots))
