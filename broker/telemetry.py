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
import time
import weakref
from typing import Any, TextIO

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
# Prometheus metrics: RPC latency (interceptor), background-loop durations, cloud API errors and
# interruption notices counted as they happen, and the store's view of leases, spend, budgets,
# events, decisions and the market's age, read at scrape time so every replica reports the truth.

class Metrics:
    def __init__(self, store, catalog, budgets=None, clock=time.time) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.rpc = Histogram("broker_rpc_duration_seconds", "gRPC handling time", ["method", "code"],
                             registry=self.registry,
                             buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 120))
        self.loop = Histogram("broker_loop_duration_seconds", "Reconciler / autoscaler pass time", ["loop"],
                              registry=self.registry, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
        self.reconcile_errors = Counter(
            "broker_reconcile_errors", "Leases, tenants or providers a reconciler pass could not handle "
            "(each is logged; the pass goes on without it)", ["phase", "provider"], registry=self.registry)
        self.notices = Counter(
            "broker_interruption_notices", "Interruption notices read, by provider, kind (preemption, "
            "maintenance, stopping, rebalance) and outcome (acted, recorded, repeated, no_lease, malformed, "
            "error)", ["provider", "kind", "outcome"], registry=self.registry)
        self.provider_errors = Counter(
            "broker_provider_errors", "Errors the clouds' APIs answered, by the cloud's own code "
            "(capacity, quota, throttling, auth, 5xx, unreadable answers)", ["provider", "code"],
            registry=self.registry)
        self.market_source_errors = Counter(
            "broker_market_source_errors", "Market refreshes of one source (price list, spot history, "
            "placement scores, quotas, reservations, zones) that failed; the others stay fresh",
            ["provider", "source"], registry=self.registry)
        from prometheus_client import Gauge

        # Several serving processes (broker serve --processes N) write their samples to files that
        # the one process serving /metrics adds up (prometheus_client's multiprocess mode); a
        # loop is alive if alive in all. Leadership and the store's figures are read at scrape
        # time by that process (the one that contends for leadership).
        self.loop_alive = Gauge("broker_loop_alive", "1 while a background loop runs, 0 once it has died "
                                "(health turns NOT_SERVING)", ["loop"], registry=self.registry,
                                multiprocess_mode="min")
        self.leader = LeaderCollector()
        self.store_collector = StoreCollector(store, catalog, budgets, clock)
        self.registry.register(self.leader)
        self.registry.register(self.store_collector)
        self._server = None
        from providers.base import ON_ERROR

        if _on_provider_error not in ON_ERROR:
            ON_ERROR.append(_on_provider_error)
        _ERROR_SINKS.add(self)

    def _count_error(self, provider: str, code: str) -> None:
        self.provider_errors.labels(provider or "?", (code or "unknown")[:64]).inc()

    def set_leader(self, leading: bool) -> None:
        self.leader.value = bool(leading)

    def serve(self, listen: str) -> int:
        """Expose /metrics on ``listen`` (host:port); returns the bound port. Under
        ``PROMETHEUS_MULTIPROC_DIR`` (set by ``broker serve --processes N``) it serves the sum of
        every serving process's samples, and leadership and the store's figures once. The
        server's own errors (a scrape that fails, a client that hangs up) are JSON log records."""
        import os

        from prometheus_client import CollectorRegistry

        registry = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client.multiprocess import MultiProcessCollector

            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            registry.register(self.leader)
            registry.register(self.store_collector)
        from broker.config import split_host_port

        host, port = split_host_port(listen)  # "[::1]:9464" binds ::1, not "[::1]"
        self._server = _metrics_server(host, port, registry)
        return self._server.server_port

    def stop(self) -> None:
        _ERROR_SINKS.discard(self)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
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


#: Where cloud API errors are counted: every live :class:`Metrics` (see :func:`count_provider_error`).
#: Held weakly, so a Metrics that is dropped without :meth:`Metrics.stop` is not kept counting.
_ERROR_SINKS: "weakref.WeakSet[Metrics]" = weakref.WeakSet()


def count_provider_error(provider: str, code: str) -> None:
    """Count one error a cloud's API answered (called as each provider error is made)."""
    for metrics in list(_ERROR_SINKS):
        metrics._count_error(provider, code)


def _on_provider_error(err) -> None:
    count_provider_error(err.provider, err.code or type(err).__name__)


class _LogStream:
    """A text stream whose lines become ``error`` records of a logger (what wsgiref writes)."""

    def __init__(self, name: str) -> None:
        self.log = logging.getLogger(name)
        self._buf = ""

    def write(self, text: str) -> int:
        self._buf += text
        return len(text)

    def flush(self) -> None:
        if self._buf.strip():
            self.log.error("metrics_server_error", extra={"detail": self._buf.strip()[-4000:]})
        self._buf = ""


def _metrics_server(host: str, port: int, registry):
    """prometheus_client's WSGI server for ``registry`` on a daemon thread, with every error it
    meets logged through the process's JSON log instead of printed to stderr."""
    from wsgiref.simple_server import make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family, _SilentHandler

    log = logging.getLogger("broker.metrics")
    inner = make_wsgi_app(registry)

    def app(environ, start_response):
        try:
            return inner(environ, start_response)
        except Exception:
            log.exception("metrics_scrape_failed")
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info())
            return [b"the metrics could not be collected; the broker's log says why\n"]

    class Handler(_SilentHandler):
        def get_stderr(self):
            return _LogStream("broker.metrics")

    class Server(ThreadingWSGIServer):
        def handle_error(self, request, client_address):
            log.warning("metrics_request_failed", exc_info=True, extra={"client": str(client_address[0])})

    Server.address_family, addr = _get_best_family(host, port)
    httpd = make_server(addr, port, app, Server, handler_class=Handler)
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return httpd


class LeaderCollector:
    """``broker_leader``: 1 while this replica leads, read at scrape time from ``leading()`` (the
    leadership's own deadline, so a replica that was frozen past it reports 0 the moment it runs
    again, before any heartbeat); without it, the last value it was told."""

    def __init__(self) -> None:
        self.value = False
        self.leading = None  # a callable, set once the replica contends (Service.start_background)

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        leading = self.leading() if self.leading is not None else self.value
        g = GaugeMetricFamily("broker_leader", "1 while this replica leads (runs the reconciler and the "
                              "autoscaler), else 0")
        g.add_metric([], 1.0 if leading else 0.0)
        yield g


def _num(value) -> float:
    """A database aggregate as a float: SUM of integers is an int on SQLite and a Decimal on
    PostgreSQL (NULL when nothing was summed)."""
    return float(value or 0)


class StoreCollector:
    """Leases by state, running $/h and GPUs by provider and market, spend by provider, budget use
    per tenant, the market's age per provider and source, events and decisions: one sample per
    label set, whatever the store's SQL groups by."""

    def __init__(self, store, catalog, budgets=None, clock=time.time) -> None:
        self.store = store
        self.catalog = catalog
        self.budgets = budgets
        self.clock = clock  # the service's clock: budget use as the budgets themselves count it
        self._reader: Any = None  # broker.store_metrics.StoreReader, made at the first scrape

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        ok = GaugeMetricFamily("broker_store_read_ok", "1 when this scrape could read the store, else 0 "
                               "(the log says why)")
        families = []
        try:
            families = list(self._families())
        except Exception:  # the leader gauge and the process's own series are still served
            logging.getLogger("broker.metrics").exception("metrics_store_read_failed")
        ok.add_metric([], 1.0 if families else 0.0)
        yield ok
        yield from families

    def _families(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from broker.lease import LIVE, LeaseState
        from broker.store_metrics import StoreReader

        if self._reader is None:
            self._reader = StoreReader(self.store.engine)
        got = self._reader.read()  # the live leases, and the history's totals kept between scrapes
        counts: dict = {}
        rate: dict = {}
        gpus: dict = {}
        spend: dict = {}  # micro-dollars
        for state, provider, market, itype, n, nodes, hourly, accrued in got.live:
            add(counts, (state, provider, market), _num(n))
            spend[(provider,)] = spend.get((provider,), 0) + int(accrued or 0)
            if state in LIVE:
                it = self.catalog.instance(provider, itype)
                add(gpus, (provider, market), _num(nodes) * (it.gpus if it else 0))
            if state == LeaseState.RUNNING:
                add(rate, (provider, market), _num(hourly) / 1e6)
        for (state, provider, market), (n, accrued) in got.ended.items():
            add(counts, (state, provider, market), float(n))
            spend[(provider,)] = spend.get((provider,), 0) + accrued
        yield family(GaugeMetricFamily, "broker_leases", "Leases by state", ["state", "provider", "market"], counts)
        yield family(GaugeMetricFamily, "broker_spend_rate_usd_per_hour", "Running leases' price",
                     ["provider", "market"], rate)
        yield family(GaugeMetricFamily, "broker_cloud_gpus", "GPUs of live leases", ["provider", "market"], gpus)
        yield family(CounterMetricFamily, "broker_spend_usd", "Spend accrued by leases", ["provider"],
                     {k: v / 1e6 for k, v in spend.items()})
        yield family(CounterMetricFamily, "broker_lease_events", "Lease events by kind", ["kind"],
                     {k: float(n) for k, (n,) in got.events.items()})
        yield family(CounterMetricFamily, "broker_decisions", "Autoscaler decisions by action", ["action"],
                     {k: float(n) for k, (n,) in got.decisions.items()})
        now = self.clock()
        yield from self._budgets(now)
        yield from self._market(now)

    def _budgets(self, now: float):
        from prometheus_client.core import GaugeMetricFamily

        if self.budgets is None or not self.budgets.budgets:
            return
        rate, month, used = {}, {}, {}
        for tenant in self._budget_tenants(now):
            caps = self.budgets.caps(tenant)
            if caps is None:
                continue
            r, m = self.budgets.usage(tenant, now)
            rate[(tenant,)], month[(tenant,)] = r / 1e6, m / 1e6
            for cap, have, limit in (("usd_per_hour", r, caps.usd_per_hour_micros),
                                      ("usd_per_month", m, caps.usd_per_month_micros)):
                if limit:
                    used[(tenant, cap)] = have / limit
        yield family(GaugeMetricFamily, "broker_budget_spend_rate_usd_per_hour", "A tenant's live leases' price "
                     "(counts against its usd_per_hour cap)", ["tenant"], rate)
        yield family(GaugeMetricFamily, "broker_budget_month_spend_usd", "A tenant's spend this calendar month "
                     "(UTC; counts against its usd_per_month cap)", ["tenant"], month)
        yield family(GaugeMetricFamily, "broker_budget_used_ratio", "A tenant's use of each of its caps "
                     "(1 = the cap is reached)", ["tenant", "cap"], used)

    def _budget_tenants(self, now: float) -> list[str]:
        """Tenants with a budget of their own, and (with a default budget) every tenant with
        leases that count this month."""
        from sqlalchemy import or_, select

        from broker.budget import month_start
        from broker.lease import ENDED, LIVE
        from broker.store import LeaseRecord

        named = {t for t in self.budgets.budgets if t != "default"}
        if "default" in self.budgets.budgets:
            t = LeaseRecord.__table__.c
            with self.store.engine.connect() as conn:  # both by ix_leases_state_ended_at
                named |= {r[0] for r in conn.execute(select(t.tenant).distinct().where(or_(
                    t.state.in_([s.value for s in LIVE]),
                    t.state.in_([s.value for s in ENDED]) & (t.ended_at >= month_start(now)))))}
        return sorted(named)

    def _market(self, now: float):
        from prometheus_client.core import GaugeMetricFamily

        from broker import market_store

        age, failing = {}, {}
        for provider, row in sorted(market_store.load(self.store.engine).items()):
            for source, state in row.sources().items():
                if state.ok_at:
                    age[(provider, source)] = max(0.0, now - state.ok_at)
                failing[(provider, source)] = 1.0 if state.error else 0.0
        yield family(GaugeMetricFamily, "broker_market_age_seconds", "Age of the last good answer of each "
                     "market source (price list, spot history, placement scores, quotas, reservations, "
                     "zones) of each provider", ["provider", "source"], age)
        yield family(GaugeMetricFamily, "broker_market_source_failing", "1 when the last refresh of the "
                     "source failed (its last good data stays in use)", ["provider", "source"], failing)


def add(acc: dict, key: tuple, value: float) -> None:
    acc[key] = acc.get(key, 0.0) + value


def family(kind, name: str, doc: str, labels: list[str], values: dict):
    """A metric family with one sample per label set (``values`` is already aggregated)."""
    f = kind(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        f.add_metric([str(k) for k in key], value)
    return f
