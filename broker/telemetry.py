"""structlog set-up: one JSON event per line on stderr, with timestamps and levels."""
from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info", json_logs: bool = True) -> None:
    lvl = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr, format="%(message)s")
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    renderer = structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


# ---------------------------------------------------------------------------------------------
# Prometheus metrics: RPC latency (interceptor), background-loop durations, and the store's view
# of leases, spend, events and decisions, read at scrape time so every replica reports the truth.

class Metrics:
    def __init__(self, store, catalog) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self.registry = CollectorRegistry()
        self.rpc = Histogram("broker_rpc_duration_seconds", "gRPC handling time", ["method", "code"],
                             registry=self.registry,
                             buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30, 120))
        self.loop = Histogram("broker_loop_duration_seconds", "Reconciler / autoscaler pass time", ["loop"],
                              registry=self.registry, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
        self.registry.register(StoreCollector(store, catalog))
        self._server = None

    def serve(self, listen: str) -> int:
        """Expose /metrics on ``listen`` (host:port); returns the bound port."""
        from prometheus_client import start_http_server

        host, _, port = listen.rpartition(":")
        self._server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
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
            if state in ("requested", "provisioning", "running", "draining"):
                it = self.catalog.instance(provider, itype)
                gpus.add_metric([provider, market], (nodes or 0) * (it.gpus if it else 0))
            if state == "running":
                rate.add_metric([provider, market], (hourly or 0) / 1e6)
        for (state, provider, market), n in agg.items():
            by_state.add_metric([state, provider, market], n)
        for kind, n in ev:
            events.add_metric([kind], n)
        for action, n in dec:
            decisions.add_metric([action], n)
        yield from (by_state, rate, gpus, spend, events, decisions)
