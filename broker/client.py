"""A small client for the Broker gRPC API, used by the CLI's server-side commands."""
from __future__ import annotations

from typing import Any, Iterator

import grpc

from broker import convert
from broker.errors import ANSWERED, FROM_STATUS, BrokerError, outcome
from broker.paging import MAX_PAGE
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from policies.demand import Demand
from providers.files import SMALL_BYTES, read_bytes


class ClientError(Exception):
    """A call the broker refused (``code`` is its gRPC status; ``error`` the same as one of
    broker.errors, whose table gives the CLI's exit code), or no broker answering at all."""

    def __init__(self, code: grpc.StatusCode, message: str, *, answered: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.answered = answered  # False: nothing answered (down, unreachable), not a refusal
        self.error = FROM_STATUS.get(code.name, BrokerError)(message)

    @property
    def exit_code(self) -> int:
        return outcome(self.error).exit_code


def _client_error(e: grpc.RpcError, target: str) -> ClientError:
    """The server's own answer, told apart from a transport failure by the mark the server puts
    on every status it sends (a launch that failed in the cloud with a connection error is an
    answer, not a dead broker)."""
    code = e.code()
    answered = any(k == ANSWERED for k, _ in (e.trailing_metadata() or ()))
    if code == grpc.StatusCode.UNAVAILABLE and not answered:
        return ClientError(code, f"no broker answering at {target} (start one with `broker serve`).",
                           answered=False)
    return ClientError(code, e.details() or code.name)


def check_target(target: str) -> str:
    """``HOST:PORT`` (or a gRPC target with its scheme, ``dns:///…``, ``unix:…``), else a
    ClientError of bad input: a malformed address is the caller's typo, not a broker down."""
    if target.startswith(("dns:", "unix:", "ipv4:", "ipv6:")):
        return target
    from broker.config import split_host_port

    try:
        split_host_port(target)
    except ValueError as e:
        raise ClientError(grpc.StatusCode.INVALID_ARGUMENT, f"the broker address (--server or $BROKER_SERVER) {e}.",
                          answered=False) from None
    return target


def _busy(e: grpc.RpcError) -> bool:
    """Whether ``e`` is a server's "busy, ask again" (see broker.limits.BUSY)."""
    from broker.limits import BUSY

    return e.code() == grpc.StatusCode.UNAVAILABLE and any(k == BUSY for k, _ in (e.trailing_metadata() or ()))


def open_channel(target: str, *, token: str | None = None, tls_ca: str | None = None) -> grpc.Channel:
    """A channel to a broker: TLS when ``tls_ca`` (or $BROKER_TLS_CA) names a CA file, and a bearer
    token from ``token`` (or $BROKER_TOKEN) on every call."""
    import os

    token = token if token is not None else os.environ.get("BROKER_TOKEN", "")
    tls_ca = tls_ca if tls_ca is not None else os.environ.get("BROKER_TLS_CA", "")
    if tls_ca:
        creds = grpc.ssl_channel_credentials(root_certificates=read_bytes(tls_ca, SMALL_BYTES))
        if token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(target, creds)
    channel = grpc.insecure_channel(target)
    if token:
        channel = grpc.intercept_channel(channel, _BearerToken(token))
    return channel


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds ``authorization: Bearer`` to plaintext calls (grpc only attaches call credentials over TLS)."""

    def __init__(self, token: str) -> None:
        self.md = ("authorization", f"Bearer {token}")

    def _details(self, d):
        md = list(d.metadata or []) + [self.md]
        return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d, metadata) -> None:
        self.method, self.timeout, self.credentials = d.method, d.timeout, d.credentials
        self.wait_for_ready, self.compression = getattr(d, "wait_for_ready", None), getattr(d, "compression", None)
        self.metadata = metadata


class BrokerClient:
    def __init__(self, target: str, timeout: float = 600.0, *, token: str | None = None,
                 tls_ca: str | None = None) -> None:
        self.target = check_target(target)
        self.timeout = timeout
        self.channel = open_channel(target, token=token, tls_ca=tls_ca)
        self.stub = pb_grpc.BrokerStub(self.channel)

    def __enter__(self) -> "BrokerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.channel.close()

    def _call(self, method, request, timeout: float | None = None):
        """``method(request)`` within ``timeout`` (default: the client's). A server busy with as
        many calls that wait on a cloud as it takes (limits.max_cloud_calls) is asked again after
        a growing, jittered pause until the time is up: such calls are idempotent (a launch by
        its key, a release by its lease)."""
        import random
        import time

        deadline = time.monotonic() + (timeout or self.timeout)
        pause = 0.25
        while True:
            try:
                return method(request, timeout=max(0.001, deadline - time.monotonic()))
            except grpc.RpcError as e:
                wait = pause * (0.5 + random.random())
                if not _busy(e) or time.monotonic() + wait >= deadline:
                    raise _client_error(e, self.target) from None
            time.sleep(wait)
            pause = min(pause * 2, 5.0)

    def quote(self, demand: Demand, top: int = 0) -> dict[str, Any]:
        r = self._call(self.stub.Quote, pb.QuoteRequest(demand=convert.demand_to_pb(demand), top=top), 30)
        return convert.quote_from_pb(r.quote)

    def launch(self, request: pb.LaunchRequest) -> dict[str, Any]:
        return convert.lease_from_pb(self._call(self.stub.Launch, request).lease)

    def get_lease(self, lease_id: str) -> dict[str, Any]:
        return convert.lease_from_pb(self._call(self.stub.GetLease, pb.GetLeaseRequest(lease_id=lease_id), 30).lease)

    def list_leases(self, states: list[str] = (), tenant: str = "", limit: int = 0) -> list[dict[str, Any]]:
        """Leases newest first: at most ``limit`` (0 = every one that matches), read a page at a time."""
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            want = MAX_PAGE if not limit else min(MAX_PAGE, limit - len(out))
            req = pb.ListLeasesRequest(states=[convert.STATE_TO_PB[s] for s in states], tenant=tenant, limit=want,
                                       page_token=token)
            page = self._call(self.stub.ListLeases, req, 30)
            out += [convert.lease_from_pb(l) for l in page.leases]
            token = page.next_page_token
            if not token or (limit and len(out) >= limit):
                return out

    def release(self, lease_id: str, reason: str = "") -> dict[str, Any]:
        return convert.lease_from_pb(self._call(self.stub.Release, pb.ReleaseRequest(lease_id=lease_id, reason=reason)).lease)

    def handoff(self, lease_id: str, job: dict) -> dict[str, Any]:
        req = pb.HandoffRequest(lease_id=lease_id, job=convert.job_to_pb(job))
        return convert.lease_from_pb(self._call(self.stub.Handoff, req, 30).lease)

    def report_job(self, request: pb.ReportJobRequest) -> tuple[dict[str, Any], str]:
        """(the lease after the report, what the node does next: continue | checkpoint | stop)."""
        r = self._call(self.stub.ReportJob, request, 30)
        return convert.lease_from_pb(r.lease), pb.JobAction.Name(r.action).removeprefix("JOB_ACTION_").lower()

    def decisions(self, limit: int = 0) -> list[dict[str, Any]]:
        r = self._call(self.stub.ListDecisions, pb.ListDecisionsRequest(limit=limit), 30)
        return [convert.decision_from_pb(d) for d in r.decisions]

    def watch(self, lease_id: str = "", after_event_id: int | None = None) -> Iterator[pb.WatchLeasesResponse]:
        """Lease events: after ``after_event_id`` (0 replays from the first), or only new ones."""
        try:
            yield from self.stub.WatchLeases(pb.WatchLeasesRequest(lease_id=lease_id, after_event_id=after_event_id))
        except grpc.RpcError as e:
            raise _client_error(e, self.target) from None
