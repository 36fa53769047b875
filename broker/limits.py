"""Bounds at the API's edge: every request is checked against its proto descriptor before any
handler sees it, so no size, count or value can make the server build something unbounded.

One walk over each request (the fields it sets) applies:

- every string: at most ``max_string_chars`` characters (tighter for names and ids, see
  :data:`FIELDS`), and none of the characters no cloud, database or log line takes: C0 and C1
  controls (tab, line feed and carriage return only in free text: a reason, a job's
  environment), Unicode non-characters (U+FDD0..U+FDEF, U+xFFFE/U+xFFFF) and lone surrogates
  (a cloud that is sent one answers with something its SDK cannot parse);
- every list and map: at most ``max_list_items`` entries (tighter for a demand's filters and a
  launch's node names);
- every double: a finite number, inside its field's range where :data:`FIELDS` gives one
  (``hours``, GB, percentages); every count and duration inside its range (``Offering.count`` and
  ``Demand.nodes`` at most ``max_nodes``);
- every enum: one of its declared values; every Timestamp: a real instant (years 1–9999,
  nanos 0–999,999,999).

A violation is INVALID_ARGUMENT naming the field as the request spells it
(``snapshot.pending[3].queue``). The message size itself is capped by gRPC
(``max_message_bytes``, both ways), and long-lived streams hold at most ``max_streams`` worker
threads: one more is RESOURCE_EXHAUSTED at once, so streams never starve unary calls or health.

Calls that wait on a cloud's API (:func:`cloud_rpcs`: Launch and Release, and ReportQueue when the
autoscaler may launch from it) hold at most ``max_cloud_calls`` worker threads: one more is
answered UNAVAILABLE at once, marked :data:`BUSY` (the client backs off and asks again, the same
idempotency key launching nothing twice). A slow or hanging cloud then slows only the calls that
need it; a Quote, a lease listing and health always find a free worker. Without the bound, 32
launches waiting on a cloud that answers in 30 s took every worker, and Quote (which calls no
cloud) waited behind them until its deadline.

All of these are ``[limits]`` keys.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, fields
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor

from broker.errors import ANSWERED, ConfigError, InvalidArgument
from broker.fields import FIELDS, TS_MAX, TS_MIN, Rule, bad_character

SERVICE_PREFIX = "/broker.v1.Broker/"


@dataclass(frozen=True)
class Limits:
    """``[limits]``: the edge's bounds (defaults fit every real cluster we know of)."""

    max_message_bytes: int = 4 * 1024 * 1024   # one request or response, in bytes
    max_string_chars: int = 4096               # any string field (names and ids are tighter)
    max_list_items: int = 100_000              # any list or map (a demand's filters are tighter)
    max_nodes: int = 1024                      # nodes of one lease or demand
    max_streams: int = 0                       # open WatchLeases streams; 0 = half the workers
    max_cloud_calls: int = 0                   # calls waiting on a cloud at once; 0 = a quarter of the workers

    @classmethod
    def from_settings(cls, settings: Any, workers: int = 32) -> "Limits":
        """From the ``[limits]`` table (ranges checked by the config schema); resolves
        ``max_streams = 0`` to half the workers and ``max_cloud_calls = 0`` to a quarter, and
        refuses either when it could take every worker."""
        values = {f.name: getattr(settings, f.name) for f in fields(cls)}
        for key, share, what in (("max_streams", 2, "streams"), ("max_cloud_calls", 4, "calls waiting on a cloud")):
            if not values[key]:
                values[key] = max(1, workers // share)
            elif values[key] >= workers:
                raise ConfigError(f"config: limits.{key} ({values[key]}) must be below server.workers "
                                  f"({workers}), or {what} can take every worker", field=f"limits.{key}")
        if values["max_streams"] + values["max_cloud_calls"] >= workers:
            raise ConfigError(f"config: limits.max_streams ({values['max_streams']}) and limits.max_cloud_calls "
                              f"({values['max_cloud_calls']}) together must be below server.workers ({workers}), "
                              "or streams and cloud calls can take every worker and health goes unanswered",
                              field="limits.max_streams")
        return cls(**values)


#: RPCs that wait on a cloud's API (launch and failover; terminate and its wait).
CLOUD_RPCS = frozenset({"Launch", "Release"})
#: Trailing metadata of a call refused because this server is busy with as many calls of its
#: kind as it takes (its value: seconds after which to ask again); only the refusal carries it.
BUSY = "broker-busy"


def cloud_rpcs(autoscaling: bool) -> frozenset[str]:
    """The RPCs bounded by ``max_cloud_calls``: :data:`CLOUD_RPCS`, and ReportQueue when an
    autoscaler decides on reported snapshots (it launches and releases before it answers)."""
    return CLOUD_RPCS | {"ReportQueue"} if autoscaling else CLOUD_RPCS


class Bounds:
    """Checks requests against :class:`Limits` and :data:`FIELDS`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        nodes, names = Rule(0, limits.max_nodes), Rule(items=limits.max_nodes, chars=128)
        self.rules = {**FIELDS, "Demand.nodes": nodes, "Offering.count": nodes, "PendingJob.nodes": nodes,
                      "LaunchRequest.node_names": names, "RunningJob.nodes": names}

    def check(self, message, path: str = "") -> None:
        """INVALID_ARGUMENT naming the first field out of bounds, if any."""
        name = message.DESCRIPTOR.name
        if message.DESCRIPTOR.full_name == "google.protobuf.Timestamp":
            if not (TS_MIN <= message.seconds <= TS_MAX) or not (0 <= message.nanos < 1_000_000_000):
                raise InvalidArgument(f"{path or 'timestamp'} is not a valid time (seconds {message.seconds}, "
                                      f"nanos {message.nanos}).", field=path)
            return
        for fd, value in message.ListFields():
            where = f"{path}.{fd.name}" if path else fd.name
            rule = self.rules.get(f"{name}.{fd.name}", Rule())
            if fd.is_repeated:
                items = rule.items or self.limits.max_list_items
                if len(value) > items:
                    raise InvalidArgument(f"{where} holds {len(value)} entries; at most {items}.", field=where)
                if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                    for k, v in value.items():
                        self._scalar(fd.message_type.fields_by_name["key"], k, f"{where}[{_short(k)}]", Rule())
                        vfd = fd.message_type.fields_by_name["value"]
                        if vfd.message_type is not None:
                            self.check(v, f"{where}[{_short(k)}]")
                        else:  # a map's values (a job's environment) are free text
                            self._scalar(vfd, v, f"{where}[{_short(k)}]", Rule(text=True))
                    continue
                for i, v in enumerate(value):
                    if fd.message_type is not None:
                        self.check(v, f"{where}[{i}]")
                    else:
                        self._scalar(fd, v, f"{where}[{i}]", rule)
            elif fd.message_type is not None:
                self.check(value, where)
            else:
                self._scalar(fd, value, where, rule)

    def _scalar(self, fd, value, where: str, rule: Rule) -> None:
        t = fd.type
        if t == FieldDescriptor.TYPE_STRING:
            chars = rule.chars or self.limits.max_string_chars
            if len(value) > chars:
                raise InvalidArgument(f"{where} is {len(value)} characters long; at most {chars}.", field=where)
            bad = bad_character(value, rule.text)
            if bad:
                raise InvalidArgument(f"{where} contains {bad.split(', ', 1)[1]} ({bad.split(',', 1)[0]}): "
                                      "no cloud, log or database takes it.", field=where)
        elif t == FieldDescriptor.TYPE_ENUM:
            if fd.enum_type.values_by_number.get(value) is None:
                raise InvalidArgument(f"{where} is {value}, not a {fd.enum_type.name} value.", field=where)
        elif t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            if not math.isfinite(value):
                raise InvalidArgument(f"{where} must be a finite number, got {value}.", field=where)
            self._range(value, where, rule)
        elif t != FieldDescriptor.TYPE_BOOL and isinstance(value, int):
            self._range(value, where, rule)

    @staticmethod
    def _range(value, where: str, rule: Rule) -> None:
        if rule.lo is not None and value < rule.lo:
            raise InvalidArgument(f"{where} must be at least {_num(rule.lo)}, got {value}.", field=where)
        if rule.hi is not None and value > rule.hi:
            raise InvalidArgument(f"{where} must be at most {_num(rule.hi)}, got {value}.", field=where)


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _short(key: str) -> str:
    return repr(key if len(key) <= 32 else key[:29] + "...")


class EdgeInterceptor(grpc.ServerInterceptor):
    """Bounds every Broker request before its handler runs, caps open streams, and caps the
    calls of ``cloud_methods`` (see :func:`cloud_rpcs`) that run at once."""

    def __init__(self, limits: Limits, cloud_methods: frozenset[str] = CLOUD_RPCS) -> None:
        self.bounds = Bounds(limits)
        self.max_streams = limits.max_streams
        self._streams = threading.BoundedSemaphore(limits.max_streams)
        self.max_cloud_calls = limits.max_cloud_calls
        self._cloud = threading.BoundedSemaphore(limits.max_cloud_calls)
        self.cloud_methods = cloud_methods

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or not details.method.startswith(SERVICE_PREFIX):
            return handler
        bounds = self.bounds
        if handler.unary_unary and details.method[len(SERVICE_PREFIX):] in self.cloud_methods:
            inner_cloud, cloud, most = handler.unary_unary, self._cloud, self.max_cloud_calls

            def cloud_bound(request, context):
                _checked(bounds, request, context)
                if not cloud.acquire(blocking=False):
                    context.set_trailing_metadata(((ANSWERED, "1"), (BUSY, "1")))
                    context.abort(grpc.StatusCode.UNAVAILABLE,
                                  f"this server is running {most} calls that wait on a cloud already "
                                  "(limits.max_cloud_calls); retry in a moment.")
                try:
                    return inner_cloud(request, context)
                finally:
                    cloud.release()

            return grpc.unary_unary_rpc_method_handler(cloud_bound, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.unary_unary:
            inner = handler.unary_unary

            def unary(request, context):
                _checked(bounds, request, context)
                return inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.unary_stream:
            inner_stream, slots, most = handler.unary_stream, self._streams, self.max_streams

            def stream(request, context):
                _checked(bounds, request, context)
                if not slots.acquire(blocking=False):
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"this server holds {most} open streams already (limits.max_streams); "
                                  "retry later or close one.")
                try:
                    yield from inner_stream(request, context)
                finally:
                    slots.release()

            return grpc.unary_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                        handler.response_serializer)
        return handler


def _checked(bounds: Bounds, request, context) -> None:
    try:
        bounds.check(request)
    except InvalidArgument as e:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))


def server_options(limits: Limits) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_send_message_length", limits.max_message_bytes)]
