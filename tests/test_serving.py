"""`broker serve` listens before the service is built: health NOT_SERVING and Broker RPCs
UNAVAILABLE ("starting") until the store and providers are ready, then SERVING."""
from __future__ import annotations

import gc
import socket
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker import config as cfgmod
from broker.errors import ConfigError
from broker.serving import serve
from broker.service import Service
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc


def health(addr: str) -> int:
    with grpc.insecure_channel(addr) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="broker.v1.Broker"), timeout=5).status


def wait_for(pred, what: str, deadline_s: float = 30.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def cfg(tmp_path, mini_catalog_dir):
    return cfgmod.load(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path / 'b.db'}",
                                                    "catalog.path": str(mini_catalog_dir)})


def test_listens_not_serving_until_the_service_is_built(cfg):
    release, stop, ready = threading.Event(), threading.Event(), threading.Event()
    ports: list[int] = []

    def make():
        assert release.wait(60)
        return Service(cfg, providers={})

    t = threading.Thread(target=serve, args=(cfg, "127.0.0.1:0", make),
                         kwargs={"on_port": ports.append, "stop": stop, "ready": ready}, daemon=True)
    t.start()
    try:
        addr = f"127.0.0.1:{wait_for(lambda: ports and ports[0], 'the port')}"
        assert health(addr) == health_pb2.HealthCheckResponse.NOT_SERVING
        with grpc.insecure_channel(addr) as ch:
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.BrokerStub(ch).ListLeases(pb.ListLeasesRequest(), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "starting" in e.value.details()
        release.set()
        assert ready.wait(60)
        assert health(addr) == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(addr) as ch:
            assert list(pb_grpc.BrokerStub(ch).ListLeases(pb.ListLeasesRequest(), timeout=5).leases) == []
        # Served inside a process that goes on (this one): its heap is not frozen (only `broker
        # serve` asks for that, for a process that only serves).
        assert gc.get_freeze_count() == 0
    finally:
        release.set()
        stop.set()
        t.join(60)
    assert not t.is_alive()


def test_a_service_that_cannot_be_built_stops_the_server_and_propagates(cfg):
    ports: list[int] = []

    def make():
        raise ConfigError("config: store.url is not usable")

    with pytest.raises(ConfigError):
        serve(cfg, "127.0.0.1:0", make, on_port=ports.append, stop=threading.Event())
    with socket.socket() as s:  # the port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", ports[0]))
