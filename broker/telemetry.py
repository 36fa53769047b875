"""structlog set-up: one JSON event per line on stderr, with timestamps and levels.

Everything a process writes to its log goes through one handler and one renderer: the broker's
structlog events, and every stdlib ``logging`` record of the libraries underneath (grpcio's
"Exception calling application", the Azure SDK's retries, ``warnings``), tracebacks included, as
are exceptions that escape a thread. So a traceback is a field (``exception``) of one JSON line,
never raw lines in the stream. Third-party loggers speak from ``warning`` up; the broker's own
loggers at the configured level. What native code writes to the process's standard error (gRPC's
C core: a TLS handshake a plaintext client or a port scanner failed, transport errors) is read
back line by line and logged too (:func:`bridge_native_stderr`, logger ``grpc.core``).
"""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import TextIO

import structlog

OWN_LOGGERS = ("broker", "providers", "policies")


def configure(level: str = "info", json_logs: bool = True, stream: TextIO | None = None) -> None:
    lvl = getattr(logging, level.upper(), logging.INFO)
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    renderer = structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, timestamper,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                           structlog.stdlib.ExtraAdder(), timestamper],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(lvl, logging.WARNING))
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(lvl)
    logging.captureWarnings(True)
    threading.excepthook = _thread_exception
    sys.excepthook = _uncaught


# gRPC's C core logs through absl: "E1203 07:47:09.038604    3081 ssl_transport_security.cc:2563] text"
_NATIVE = re.compile(r"([IWEF])\d{4} [\d:.]+\s+\d+\s+([^\]\s]+)\] ?(.*)")
_NATIVE_LEVEL = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
_bridged = False


def bridge_native_stderr() -> None:
    """Make every line native code writes to file descriptor 2 a log record of ``grpc.core`` (at
    its own level; a line in no known format at ``warning``), so the log stays one JSON object per
    line. Python's ``sys.stderr`` keeps the original stream (the log handler, a command's one
    sentence). Call once, before :func:`configure`; a process that cannot spare the descriptors
    keeps its plain stderr."""
    global _bridged
    if _bridged:
        return
    try:
        sys.stderr.flush()
        original = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
    except (OSError, ValueError):
        return
    _bridged = True
    sys.stderr = os.fdopen(original, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    threading.Thread(target=_relay_native, args=(read_fd,), name="native-stderr", daemon=True).start()


def _relay_native(fd: int) -> None:
    log = logging.getLogger("grpc.core")
    with os.fdopen(fd, "rb") as lines:
        for raw in lines:
            line = raw.decode("utf-8", "backslashreplace").rstrip()
            if not line:
                continue
            m = _NATIVE.match(line)
            if m:
                log.log(_NATIVE_LEVEL[m.group(1)], m.group(3), extra={"source": m.group(2)})
            else:
                log.warning(line)


def _thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("broker.thread").error("thread_died", extra={"thread_name": name},
                                             exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def _uncaught(exc_type, exc, tb) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    logging.getLogger("broker").critical("uncaught_exception", exc_info=(exc_type, exc, tb))


# ---------------------------------------------------------------------------------------------
# Prometheus metrics: RPC latency (interceptor), background-loop durations, and the store's view
# of leases, spend, events and decisions, read at scrape time so every replica reports the truth.

class Metrics:
    def __init__(self, store, catalog) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.rpc = Histogram("broker_rpc_duration_seconds", "gRPC handling time", ["method", "code"],
                             registry=self.registry,
                             buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30, 120))
        self.loop = Histogram("broker_loop_duration_seconds", "Reconciler / autoscaler pass time", ["loop"],
                              registry=self.registry, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
        # Several serving processes (broker serve --processes N) write their samples to files that
        # the one process serving /metrics adds up (prometheus_client's multiprocess mode); a
        # gauge says how: the host leads if any process does, a loop is alive if alive in all.
        self.leader = Gauge("broker_leader", "1 while this replica leads (runs the reconciler and the "
                            "autoscaler), else 0", registry=self.registry, multiprocess_mode="max")
        self.reconcile_errors = Counter(
            "broker_reconcile_errors", "Leases, tenants or providers a reconciler pass could not handle "
            "(each is logged; the pass goes on without it)", ["phase", "provider"], registry=self.registry)
        self.notices = Counter(
            "broker_interruption_notices", "Interruption notices read, by provider, kind (preemption, "
            "maintenance, stopping, rebalance) and outcome (acted, recorded, repeated, no_lease, malformed, "
            "error)", ["provider", "kind", "outcome"], registry=self.registry)
        self.loop_alive = Gauge("broker_loop_alive", "1 while a background loop runs, 0 once it has died "
                                "(health turns NOT_SERVING)", ["loop"], registry=self.registry,
                                multiprocess_mode="min")
        self.budget_used = Gauge("broker_budget_used_ratio", "Fraction of a tenant's budget cap in use "
                                 "(usd_per_hour: the live rate; usd_per_month: this month's spend); events "
                                 "warn at 0.8 and 1.0", ["tenant", "cap"], registry=self.registry,
                                 multiprocess_mode="max")
        self.store_collector = StoreCollector(store, catalog)
        self.registry.register(self.store_collector)
        self._server = None

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def serve(self, listen: str) -> int:
        """Expose /metrics on ``listen`` (host:port); returns the bound port. Under
        ``PROMETHEUS_MULTIPROC_DIR`` (set by ``broker serve --processes N``) it serves the sum of
        every serving process's samples, and the store's figures once."""
        import os

        from prometheus_client import CollectorRegistry, start_http_server

        registry = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client.multiprocess import MultiProcessCollector

            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            registry.register(self.store_collector)
        host, _, port = listen.rpartition(":")
        self._server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
        return self._server.server_port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None

    def interceptor(self):
        import grpc

        metrics = self

        class _Timing(grpc.ServerInterceptor):
            def intercept_service(self, continuation, details):
                handler = continuation(details)
                if handler is None or not handler.unary_unary:
                    return handler
                method = details.method.rsplit("/", 1)[-1]
                inner = handler.unary_unary

                def timed(request, context):
                    import time

                    t = time.perf_counter()
                    code = "OK"
                    try:
                        return inner(request, context)
                    except Exception:
                        code = (context.code() or grpc.StatusCode.UNKNOWN).name
                        raise
                    finally:
                        metrics.rpc.labels(method, code).observe(time.perf_counter() - t)

                return grpc.unary_unary_rpc_method_handler(timed, handler.request_deserializer,
                                                           handler.response_serializer)

        return _Timing()


class StoreCollector:
    """Leases by state, running $/h and nodes by provider and market, events and decisions."""

    def __init__(self, store, catalog) -> None:
        self.store = store
        self.catalog = catalog

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from sqlalchemy import func
        from sqlmodel import Session, select

        from broker.lease import LIVE, LeaseState
        from broker.store import DecisionRecord, LeaseEventRecord, LeaseRecord

        by_state = GaugeMetricFamily("broker_leases", "Leases by state", labels=["state", "provider", "market"])
        rate = GaugeMetricFamily("broker_spend_rate_usd_per_hour", "Running leases' price", labels=["provider", "market"])
        gpus = GaugeMetricFamily("broker_cloud_gpus", "GPUs of live leases", labels=["provider", "market"])
        spend = CounterMetricFamily("broker_spend_usd", "Spend accrued by leases", labels=["provider"])
        events = CounterMetricFamily("broker_lease_events", "Lease events by kind", labels=["kind"])
        decisions = CounterMetricFamily("broker_decisions", "Autoscaler decisions by action", labels=["action"])
        with Session(self.store.engine) as s:
            rows = s.exec(select(LeaseRecord.state, LeaseRecord.provider, LeaseRecord.market, LeaseRecord.instance_type,
                                 func.count(), func.sum(LeaseRecord.nodes),
                                 func.sum(LeaseRecord.hourly_micros * LeaseRecord.nodes),
                                 func.sum(LeaseRecord.accrued_micros))
                          .group_by(LeaseRecord.state, LeaseRecord.provider, LeaseRecord.market,
                                    LeaseRecord.instance_type)).all()
            ev = s.exec(select(LeaseEventRecord.kind, func.count()).group_by(LeaseEventRecord.kind)).all()
            dec = s.exec(select(DecisionRecord.action, func.count()).group_by(DecisionRecord.action)).all()
        agg: dict = {}
        for state, provider, market, itype, n, nodes, hourly, accrued in rows:
            k = (state, provider, market)
            agg[k] = agg.get(k, 0) + n
            spend_key = provider
            spend.add_metric([spend_key], (accrued or 0) / 1e6)
            if state in LIVE:
                it = self.catalog.instance(provider, itype)
                gpus.add_metric([provider, market], (nodes or 0) * (it.gpus if it else 0))
            if state == LeaseState.RUNNING:
                rate.add_metric([provider, market], (hourly or 0) / 1e6)
        for (state, provider, market), n in agg.items():
            by_state.add_metric([state, provider, market], n)
        for kind, n in ev:
            events.add_metric([kind], n)
        for action, n in dec:
            decisions.add_metric([action], n)
        yield from (by_state, rate, gpus, spend, events, decisions)
