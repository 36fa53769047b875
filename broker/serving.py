"""Listening before the service is built: `broker serve` answers on its port (gRPC health
NOT_SERVING, Broker RPCs UNAVAILABLE "starting") while the store opens and the enabled clouds'
SDKs load, then opens the gate. This module imports only gRPC and the generated descriptors, so
the port is bound a fraction of a second after the process starts (``benchmarks/startup.py``).
"""
from __future__ import annotations

import gc
import signal
import threading
import time
from concurrent import futures
from typing import TYPE_CHECKING

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from broker.errors import ANSWERED, ConfigError
from broker.v1 import broker_pb2 as pb

if TYPE_CHECKING:
    from broker.service import Service

log = structlog.get_logger("broker.server")


class Gate(grpc.GenericRpcHandler):
    """The Broker service behind a gate, so the port answers (health NOT_SERVING) while the
    service is still being built: before :meth:`open`, every Broker RPC is UNAVAILABLE ("the
    broker is starting", retryable); after it, the servicer's handlers run behind the service's
    interceptors (metrics, authorization, error statuses)."""

    def __init__(self) -> None:
        self._handlers: list = []
        self._interceptors: list = []
        self.health = health.HealthServicer()
        for name in ("", "broker.v1.Broker"):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    # grpc.Server's registration calls, as add_BrokerServicer_to_server makes them
    def add_generic_rpc_handlers(self, handlers) -> None:
        self._handlers.extend(handlers)

    def add_registered_method_handlers(self, service_name: str, handlers) -> None:
        from broker.server import preencoded

        handlers = {name: preencoded(h) for name, h in handlers.items()}
        # ahead of the generic handler the generated code also adds for the same methods
        self._handlers.insert(0, grpc.method_handlers_generic_handler(service_name, handlers))

    def open(self, service) -> None:
        from broker.server import BrokerServicer, _ErrorStatus
        from broker.v1 import broker_pb2_grpc as pb_grpc

        from broker.limits import EdgeInterceptor, cloud_rpcs

        self._interceptors = [service.metrics.interceptor(), _ReplicaName(), service.auth.interceptor(),
                              EdgeInterceptor(service.limits, cloud_rpcs(service.autoscaler is not None)),
                              _ErrorStatus()]
        pb_grpc.add_BrokerServicer_to_server(BrokerServicer(service), self)
        for name in ("", "broker.v1.Broker"):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        service.on_loop_death(self._not_serving)  # a replica that no longer reconciles is not well

    def _not_serving(self, _loop: str) -> None:
        for name in ("", "broker.v1.Broker"):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    def service(self, details):
        if not details.method.startswith("/broker.v1.Broker/"):
            return None
        if not self._handlers:
            return grpc.unary_unary_rpc_method_handler(_starting)

        def lookup(d):
            for h in self._handlers:
                found = h.service(d)
                if found is not None:
                    return found
            return None

        chain = lookup
        for i in reversed(self._interceptors):
            chain = (lambda inner, icpt: lambda d: icpt.intercept_service(inner, d))(chain, i)
        return chain(details)


REPLICA_KEY = "broker-replica"


class _ReplicaName(grpc.ServerInterceptor):
    """A call that sends ``broker-replica`` metadata is told which process answered it
    (``host:pid`` in the response's initial metadata): several processes share one port, and an
    operator tracing a call to a log needs to know whose log."""

    def __init__(self) -> None:
        import os
        import socket

        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or not handler.unary_unary or not any(
                k == REPLICA_KEY for k, _ in details.invocation_metadata or ()):
            return handler
        inner, name = handler.unary_unary, self.name

        def named(request, context):
            context.send_initial_metadata(((REPLICA_KEY, name),))
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(named, handler.request_deserializer, handler.response_serializer)


def _starting(request, context):
    context.set_trailing_metadata(((ANSWERED, "1"),))  # a broker answered: not "no broker answering"
    context.abort(grpc.StatusCode.UNAVAILABLE, "the broker is starting; retry in a moment.")


def open_server(config, listen: str, reuse_port: bool = False) -> tuple[grpc.Server, int, Gate]:
    """A server bound to ``listen`` (not yet started) with health, reflection and the gated
    Broker service; returns it, its port and the gate to open once the service is built.
    ``reuse_port``: share the port with the other serving processes of this host (SO_REUSEPORT;
    the kernel spreads new connections over them). Otherwise a second server on the port fails."""
    from broker.auth import server_credentials

    from broker.limits import Limits, server_options

    gate = Gate()
    limits = Limits.from_settings(config.limits, config.workers)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="rpc"),
                         handlers=[gate], options=[("grpc.so_reuseport", int(reuse_port)), *server_options(limits)])
    health_pb2_grpc.add_HealthServicer_to_server(gate.health, server)
    names = (pb.DESCRIPTOR.services_by_name["Broker"].full_name, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    creds = server_credentials(config.server)
    port = server.add_secure_port(listen, creds) if creds else server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    server._broker_health = gate.health  # type: ignore[attr-defined]
    return server, port, gate


def serve(config, listen: str, make_service, *, ready: threading.Event | None = None, on_port=None,
          stop: threading.Event | None = None, process: int = 0, ready_fd: int | None = None,
          settle_heap: bool = False) -> None:
    """Listen first (health NOT_SERVING), then build the service with ``make_service()`` (the
    store, the clouds' SDKs, the providers) and serve it; run until SIGTERM/SIGINT, then stop
    taking RPCs, finish in-flight ones and stop the background loops.

    A failure before the service is built propagates (the caller exits 2: a start-up error).
    ``stop`` (default: set by SIGTERM/SIGINT) ends it; ``ready`` is set once it is SERVING.

    ``process``: this process's index among ``config.server.processes`` serving processes
    sharing the port (:mod:`broker.processes` starts them). Process 0 runs the leader's work and
    /metrics; the others serve RPCs and re-price, and build the service before they listen (the
    port already answers), so a connection the kernel hands them is never told "starting". ``ready_fd``: a pipe to write one line to once
    SERVING (how the parent process learns it). ``settle_heap``: this process only serves (`broker
    serve`), so what start-up built is moved out of the garbage collector's view once warmed up
    (:func:`_warm_up`); never in a process that goes on to do other work (tests, in-process use)."""
    stop = stop or threading.Event()

    def _term(signum, _frame) -> None:
        log.info("shutting_down", signal=signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _term)
        signal.signal(signal.SIGINT, _term)
    several = config.server.processes > 1
    service = None
    if process > 0:  # the port already answers (process 0): join it only once able to serve
        service = make_service()
        _warm_up(service, process, settle_heap, stop)
        if stop.is_set():
            service.stop()
            return
    server, port, gate = open_server(config, listen, reuse_port=several)
    server.start()
    log.info("listening", listen=listen, port=port, process=process)
    if on_port:
        on_port(port)
    try:
        if service is None:  # a process > 0 made and warmed its own before it joined the port
            service = make_service()
            _warm_up(service, process, settle_heap, stop)
    except BaseException:
        server.stop(grace=None)
        raise
    if stop.is_set():  # SIGTERM while warming up: stop now, never SERVING
        return _stop_unserved(server, service, process)
    gate.open(service)
    service.start_background(lead=process == 0,
                             after_first_market_poll=(lambda: _freeze(process, "market")) if settle_heap else None)
    callback = _start_callback(config, service, server) if process == 0 else None
    metrics_listen = config.telemetry.metrics_listen
    if metrics_listen and process == 0:
        try:
            log.info("metrics", listen=metrics_listen, port=service.metrics.serve(metrics_listen))
        except OSError as e:
            server.stop(grace=None)
            service.stop()
            raise ConfigError(f"config: telemetry.metrics_listen {metrics_listen} cannot be served: "
                              f"{e.strerror or e}", field="telemetry.metrics_listen") from None
    log.info("serving", listen=listen, port=port, db=config.db_url.split("@")[-1],
             providers=sorted(service.providers), process=process)
    if ready:
        ready.set()
    if ready_fd is not None:
        import os

        try:
            os.write(ready_fd, b"serving\n")
            os.close(ready_fd)
        except OSError:  # the parent is gone; SIGTERM (or its death signal) follows
            pass
    stop.wait()
    server._broker_health.enter_graceful_shutdown()  # type: ignore[attr-defined]
    server.stop(grace=10).wait()
    if callback is not None:
        callback.stop()
    service.stop()
    log.info("stopped", process=process)


def _stop_unserved(server, service, process: int) -> None:
    server.stop(grace=None)
    service.stop()
    log.info("stopped", process=process)


def _warm_up(service, process: int, settle_heap: bool = False, stop: threading.Event | None = None) -> None:
    """Build the providers, open the store's connections and price a quote before SERVING
    (``[server] warm_up_s``; 0: none): under load from the first second, what the first calls
    would otherwise wait for (a quote's p99 of seconds in the first 15 s of a soak, then a few
    hundred ms).

    ``settle_heap``: then collect once and freeze what is left (:func:`gc.freeze`). The ~380,000
    objects start-up leaves (the clouds' SDKs, the catalog, the quote engine) live as long as the
    process; while the collector tracks them, each full collection scans them all with every
    thread stopped, 150–300 ms about once a minute under load (``benchmarks/load.py``); frozen,
    a full collection scans what calls made since, 20–30 ms. The market loop freezes once more
    after its first poll. What is frozen and later dropped (the start-up quote engine, once the
    first market refresh replaces it) is freed by its reference counts; a part of it held in
    reference cycles stays for the process's life (once: nothing is frozen after that)."""
    within = service.config.server.warm_up_s
    t = time.monotonic()
    left = service.warm_up(within, stop) if within else []
    frozen = {"frozen_objects": _freeze()} if settle_heap else {}
    if within or settle_heap:
        log.info("warmed_up", seconds=round(time.monotonic() - t, 3), process=process,
                 **({"providers_still_building": left} if left else {}), **frozen)


def _freeze(process: int | None = None, after: str = "") -> int:
    """Collect once, then freeze what is left (:func:`gc.freeze`); returns how many objects are
    frozen. Called twice in `broker serve`: after the warm-up, and after the first market poll
    (the engine of the live market, ~100,000 objects, built a second after SERVING)."""
    t = time.monotonic()
    gc.collect()
    gc.freeze()
    if after:
        log.info("heap_frozen", after=after, objects=gc.get_freeze_count(), process=process,
                 seconds=round(time.monotonic() - t, 3))
    return gc.get_freeze_count()


def start_callback(config, service):
    """The nodes' HTTP endpoint on ``[server] callback_listen`` (None when it is ""), started;
    the service learns the address it is bound to (boot scripts point at it)."""
    listen = config.server.callback_listen
    if not listen:
        return None
    from broker.callback import CallbackServer

    callback = CallbackServer(service, listen).start()
    host = listen.rsplit(":", 1)[0]
    service.callback_address = f"{host}:{callback.port}"
    log.info("callback", listen=listen, port=callback.port)
    return callback


def _start_callback(config, service, server):
    try:
        return start_callback(config, service)
    except OSError as e:
        server.stop(grace=None)
        service.stop()
        raise ConfigError(f"config: server.callback_listen {config.server.callback_listen} cannot be served: "
                          f"{e.strerror or e}", field="server.callback_listen") from None


def build_server(service: "Service", listen: str) -> tuple[grpc.Server, int]:
    """A server for a built ``service`` bound to ``listen`` (not yet started), SERVING once started."""
    server, port, gate = open_server(service.config, listen)
    gate.open(service)
    return server, port
