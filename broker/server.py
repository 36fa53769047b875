"""The gRPC layer: protobuf in, :class:`broker.service.Service` (the façade) called, protobuf out.

Nothing else lives here: who may call what (broker.auth), protobuf ⇄ domain (broker.convert),
and the calls. Every error the service raises is one of :mod:`broker.errors`; its gRPC status
comes from that module's one table (the interceptor below): a bad request is INVALID_ARGUMENT
with a sentence naming the field; an unknown lease or quote NOT_FOUND; a launch over budget
RESOURCE_EXHAUSTED naming the cap; a launch whose every offer failed FAILED_PRECONDITION listing
each attempt (a retry with the same key gets the same answer).
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Iterator

import grpc
import structlog

from broker import convert
from broker.errors import ANSWERED, BrokerError, InvalidArgument, PermissionDenied, Unavailable, outcome
from broker.lease import EventKind
from broker.lifecycle import lease_view
from broker.quote import DerivedCache
from broker.service import Service, WatchedEvent
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from providers.base import ProviderError

log = structlog.get_logger("broker.server")


class BrokerServicer(pb_grpc.BrokerServicer):
    def __init__(self, service: Service) -> None:
        self.svc = service
        self.auth = service.auth
        # Encoded quote bodies by result (bytes, weighed by their length against the byte budget).
        limits = service.config.limits
        self._encoded = DerivedCache(limits.quote_cache_entries, limits.derived_cache_bytes)

    # -- helpers ---------------------------------------------------------------------------------
    def _lease_pb(self, lease) -> pb.Lease:
        return convert.lease_to_pb(lease_view(lease, self.svc.clock()))

    def _own_lease(self, context, lease_id: str):
        """The lease, if the (already authenticated) caller may see it; NOT_FOUND otherwise,
        the same for a missing lease and another tenant's."""
        lease = self.svc.lease(lease_id)
        self.auth.principal(context).own(lease.tenant, "lease", lease_id)
        return lease

    # -- RPCs ------------------------------------------------------------------------------------
    def Quote(self, request: pb.QuoteRequest, context) -> bytes:
        """The QuoteResponse, already encoded (the server sends bytes as they are; see
        :func:`preencoded`)."""
        if not request.HasField("demand"):
            raise InvalidArgument("demand is required.", field="demand")
        if request.top < 0:
            raise InvalidArgument(f"top must be zero or more, got {request.top}.", field="top")
        tenant = self.auth.principal(context).acting_for(request.demand.tenant, "demand.tenant")
        demand = convert.demand_from_pb(request.demand)
        q = self.svc.quote(replace(demand, tenant=tenant), top=request.top)
        return self._quote_bytes(q)

    def _quote_bytes(self, q) -> bytes:
        """Repeated demands share their priced offers (the engine caches them): encode each such
        result once, and encode only the id and validity per response."""
        body = self._encoded.get((q.offers, q.excluded),
                                 lambda: convert.quote_body_pb(q).SerializeToString())
        return convert.quote_response_bytes(q, body)

    def Launch(self, request: pb.LaunchRequest, context) -> pb.LaunchResponse:
        caller = self.auth.principal(context)
        tenant = caller.acting_for(request.tenant)
        if request.WhichOneof("target") == "quote_offer":
            quote_id = request.quote_offer.quote_id
            quoted_for = self.svc.quote_tenant(quote_id)
            caller.own(quoted_for, "quote", quote_id)
            if caller.operator and not request.tenant:
                tenant = quoted_for
            elif quoted_for != tenant:
                raise PermissionDenied(f"quote {quote_id} was made for tenant {quoted_for}, not {tenant}.",
                                       field="tenant")
        lease = self.svc.launch(convert.launch_from_pb(request, tenant))
        return pb.LaunchResponse(lease=self._lease_pb(lease))

    def GetLease(self, request: pb.GetLeaseRequest, context) -> pb.GetLeaseResponse:
        lease = self._own_lease(context, request.lease_id)
        return pb.GetLeaseResponse(lease=self._lease_pb(lease))

    def ListLeases(self, request: pb.ListLeasesRequest, context) -> pb.ListLeasesResponse:
        states = [convert.STATE_FROM_PB[s] for s in request.states if s in convert.STATE_FROM_PB]
        caller = self.auth.principal(context)
        tenant = request.tenant if caller.operator else caller.acting_for(request.tenant)
        leases, next_token = self.svc.leases(states=states, tenant=tenant, limit=request.limit,
                                             page_token=request.page_token)
        return pb.ListLeasesResponse(leases=[self._lease_pb(l) for l in leases], next_page_token=next_token)

    def WatchLeases(self, request: pb.WatchLeasesRequest, context) -> Iterator[pb.WatchLeasesResponse]:
        caller = self.auth.principal(context)
        if request.lease_id and not caller.operator:
            self._own_lease(context, request.lease_id)
        after = request.after_event_id if request.HasField("after_event_id") else None
        for watched in self.svc.watch(request.lease_id, after, context.is_active):
            # A non-operator sees only events about its tenants' leases (a decision that names
            # no lease is the operator's).
            if caller.operator or (watched.lease is not None and caller.sees(watched.lease.tenant)):
                yield self._event_pb(watched)

    def _event_pb(self, watched: WatchedEvent) -> pb.WatchLeasesResponse:
        ev, lease = watched
        out = pb.WatchLeasesResponse(kind=convert.EVENT_TO_PB.get(ev.kind, pb.LEASE_EVENT_KIND_UNSPECIFIED),
                                     message=ev.message, event_id=ev.id)
        out.at.CopyFrom(convert.ts(ev.at))
        data = json.loads(ev.data or "{}")
        if lease is not None:
            out.lease.CopyFrom(self._lease_pb(lease))
            if ev.to_state in convert.STATE_TO_PB:  # the lease as this event left it
                out.lease.state = convert.STATE_TO_PB[ev.to_state]
        if ev.kind == EventKind.REQUEUE and data.get("job"):
            out.job.CopyFrom(convert.job_to_pb(data["job"]))
        if ev.kind == EventKind.DECISION:
            d = out.decision
            d.decision_id, d.action, d.reason = data.get("decision_id", ""), data.get("action", ""), ev.message
            d.job_ids.extend(data.get("job_ids", []))
            d.lease_id = ev.lease_id
            d.at.CopyFrom(convert.ts(ev.at))
        return out

    def Release(self, request: pb.ReleaseRequest, context) -> pb.ReleaseResponse:
        self._own_lease(context, request.lease_id)
        lease = self.svc.release(request.lease_id, request.reason)
        return pb.ReleaseResponse(lease=self._lease_pb(lease))

    def Handoff(self, request: pb.HandoffRequest, context) -> pb.HandoffResponse:
        self._own_lease(context, request.lease_id)
        lease = self.svc.handoff(request.lease_id, convert.job_record_from_pb(request.job))
        return pb.HandoffResponse(lease=self._lease_pb(lease))

    def ReportJob(self, request: pb.ReportJobRequest, context) -> pb.ReportJobResponse:
        from broker.auth import Role

        caller = self.auth.principal(context)
        report = convert.report_from_pb(request).checked()
        if caller.role is Role.LEASE:  # a node: its own lease only, and that lease is not looked up to say so
            if caller.lease != report.lease_id:
                raise PermissionDenied("lease_id: this credential reports for its own lease only.", field="lease_id")
        else:
            self._own_lease(context, report.lease_id)
        lease, action = self.svc.report_job(report)
        return pb.ReportJobResponse(lease=self._lease_pb(lease), action=convert.ACTION_TO_PB[action.value])

    def ReportQueue(self, request: pb.ReportQueueRequest, context) -> pb.ReportQueueResponse:
        from broker.queue_api import report_queue

        return report_queue(self.svc, self._reported(context, request))

    def _reported(self, context, request):
        """``request`` as the caller may send it: a scheduler reports only jobs of its own queues
        (PERMISSION_DENIED naming the first other), under its own scope of sources."""
        caller = self.auth.principal(context)
        if caller.operator or not request.HasField("snapshot"):
            return request
        snapshot = request.snapshot
        for i, job in enumerate(snapshot.pending):
            caller.reports_for(job.queue, f"snapshot.pending[{i}].queue")
        for i, job in enumerate(snapshot.running):
            caller.reports_for(job.queue, f"snapshot.running[{i}].queue")
        scoped = type(request)()
        scoped.CopyFrom(request)
        scoped.snapshot.source = caller.source(snapshot.source)
        return scoped

    def ListDecisions(self, request: pb.ListDecisionsRequest, context) -> pb.ListDecisionsResponse:
        since = convert.from_ts(request.since) if request.HasField("since") else 0.0
        out = pb.ListDecisionsResponse()
        for r in self.svc.decisions(limit=request.limit, since=since or 0.0):
            d = out.decisions.add(decision_id=r.decision_id, action=r.action, reason=r.reason,
                                  job_ids=json.loads(r.job_ids), lease_id=r.lease_id)
            d.at.CopyFrom(convert.ts(r.at))
        return out

    def Diagnose(self, request: pb.DiagnoseRequest, context) -> pb.DiagnoseResponse:
        from broker.queue_api import diagnose

        if not request.HasField("snapshot") and not self.auth.principal(context).operator:
            raise PermissionDenied("snapshot: a scheduler diagnoses the snapshot it sends; the latest "
                                   "reported one is the operator's.", field="snapshot")
        return diagnose(self.svc, self._reported(context, request))


class _ErrorStatus(grpc.ServerInterceptor):
    """Every error a handler lets out becomes a status a client can act on: the service's typed
    errors through errors.OUTCOMES; a lost or busy database UNAVAILABLE (retry); anything else
    INTERNAL with a reference to the log line, never the exception's own text."""

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or not details.method.startswith("/broker.v1.Broker/"):
            return handler
        method = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary:
            inner = handler.unary_unary

            def unary(request, context):
                try:
                    return inner(request, context)
                except Exception as e:
                    _fail(context, method, e)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            def stream(request, context):
                try:
                    yield from inner_stream(request, context)
                except Exception as e:
                    _fail(context, method, e)

            return grpc.unary_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                        handler.response_serializer)
        return handler


def _fail(context, method: str, e: Exception):
    if context.code() is not None:  # the handler aborted with a status of its own
        raise e
    context.set_trailing_metadata(((ANSWERED, "1"),))
    if isinstance(e, BrokerError):
        context.abort(outcome(e).status, str(e))
    if isinstance(e, ProviderError):  # a cloud's answer a handler let through: say whose and what
        log.warning("rpc_provider_error", method=method, provider=e.provider, code=e.code)
        context.abort(outcome(e).status, str(e)[:500])
    from sqlalchemy import exc as db

    if isinstance(e, (db.OperationalError, db.InterfaceError, db.TimeoutError)) or (
            isinstance(e, db.DBAPIError) and e.connection_invalidated):
        log.warning("rpc_database_unavailable", method=method, error=type(e.orig or e).__name__)
        lost = Unavailable("the database is unavailable; retry shortly.")
        context.abort(outcome(lost).status, str(lost))
    import uuid

    ref = uuid.uuid4().hex[:12]
    log.error("rpc_internal_error", method=method, ref=ref, exc_info=e)
    context.abort(outcome(e).status, f"internal error (the server logged it as ref {ref}).")  # INTERNAL


def preencoded(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with a response serializer that sends ``bytes`` as they are (a handler that
    encoded its response itself, as Quote does) and serializes a message as before."""
    if not handler.unary_unary or handler.response_serializer is None:
        return handler
    serialize = handler.response_serializer

    def send(response):
        return response if type(response) is bytes else serialize(response)

    return grpc.unary_unary_rpc_method_handler(handler.unary_unary, handler.request_deserializer, send)

