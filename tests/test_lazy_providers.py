"""The enabled clouds' providers are built lazily: the service can answer before their SDKs are
imported and builds them behind it, and a call that needs one first waits for it. `broker serve`
waits for the builds before SERVING (``[server] warm_up_s``), up to that bound."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from broker.config import load
from broker.service import Service
from providers import registry
from providers.base import AuthError
from providers.registry import LazyProvider, build_enabled

ROOT = Path(__file__).resolve().parents[1]
AWS = {"enabled": True, "regions": ["us-east-1"], "image_id": "ami-0abc12345def67890",
       "endpoint_url": "http://127.0.0.1:9", "credentials": "anonymous"}


def wait_for(cond, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_lazy_providers_import_no_sdk_until_used():
    snippet = ("import json, sys\n"
               "from providers.registry import build_enabled\n"
               f"ps = build_enabled({{'aws': {AWS!r}}}, 'o', lazy=True)\n"
               "before = 'boto3' in sys.modules\n"
               "regions = ps['aws'].settings.regions\n"
               "print(json.dumps([before, 'boto3' in sys.modules, type(ps['aws'].build()).__name__, regions]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", snippet], check=False, capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [False, True, "AwsProvider", ["us-east-1"]]


def test_a_provider_that_cannot_be_built_says_why_on_every_use_and_is_tried_once(monkeypatch):
    calls = []

    def refuse(name, settings, owner):
        calls.append(name)
        raise ValueError("credentials file /nowhere/key.json does not exist")

    monkeypatch.setattr(registry, "build", refuse)
    p = build_enabled({"aws": AWS}, "o", lazy=True)["aws"]
    for _ in range(2):
        with pytest.raises(AuthError) as e:
            p.describe("l-1", "us-east-1")
        assert "providers.aws cannot be used: credentials file /nowhere/key.json does not exist" in str(e.value)
        assert e.value.provider == "aws"
    assert calls == ["aws"] and not p.built


def test_an_unknown_cloud_is_refused_at_once_even_lazily():
    with pytest.raises(ValueError, match="not a known cloud"):
        build_enabled({"zed": {"enabled": True}}, "o", lazy=True)


def test_callers_that_need_the_provider_meanwhile_wait_for_the_one_build(monkeypatch):
    gate, calls = threading.Event(), []

    def slow(name, settings, owner):
        calls.append(name)
        gate.wait(10)
        return object()

    monkeypatch.setattr(registry, "build", slow)
    p = LazyProvider("aws", AWS, "o")
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(p.build())) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: calls)
    gate.set()
    for t in threads:
        t.join(10)
    assert calls == ["aws"] and len(got) == 4 and all(g is got[0] for g in got) and p.built


def test_the_service_answers_before_the_clouds_are_built_and_builds_them_behind(tmp_path):
    config = load(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path / 's.db'}",
                                               "providers.aws": AWS, "catalog.refresh_interval_s": 0})
    svc = Service(config)
    try:
        assert isinstance(svc.providers["aws"], LazyProvider) and not svc.providers["aws"].built
        assert svc.quote(svc.engine.validate(_demand())).offers  # the bundled prices serve
        svc.start_background()
        wait_for(lambda: svc.providers["aws"].built)
    finally:
        svc.stop()


def _demand():
    from policies.demand import Demand

    return Demand(gpus=8, hours=1, gpu_model="H100")


class _Built:
    """What a slow build returns: a provider with no instances (the reconciler lists it)."""

    def list_managed(self, *args, **kwargs) -> list:
        return []


def _serve_in_thread(config, stop: threading.Event, ready: threading.Event, ports: list):
    from broker.serving import serve

    t = threading.Thread(target=serve, args=(config, "127.0.0.1:0", lambda: Service(config)),
                         kwargs={"on_port": ports.append, "stop": stop, "ready": ready}, daemon=True)
    t.start()
    return t


def _health(addr: str) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(addr) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="broker.v1.Broker"), timeout=5).status


def test_serve_says_serving_once_the_clouds_are_built(tmp_path, monkeypatch):
    """`broker serve` builds the providers before SERVING (their SDK imports would stall every
    call made meanwhile); the port answers NOT_SERVING until then."""
    from grpc_health.v1 import health_pb2

    gate, calls = threading.Event(), []

    def slow(name, settings, owner):
        calls.append(name)
        assert gate.wait(60)
        return _Built()

    monkeypatch.setattr(registry, "build", slow)
    config = load(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path / 's.db'}",
                                               "providers.aws": AWS, "catalog.refresh_interval_s": 0})
    stop, ready, ports = threading.Event(), threading.Event(), []
    t = _serve_in_thread(config, stop, ready, ports)
    try:
        wait_for(lambda: calls)
        addr = f"127.0.0.1:{ports[0]}"
        assert not ready.is_set()
        assert _health(addr) == health_pb2.HealthCheckResponse.NOT_SERVING
        gate.set()
        assert ready.wait(60)
        assert _health(addr) == health_pb2.HealthCheckResponse.SERVING
        assert calls == ["aws"]
    finally:
        gate.set()
        stop.set()
        t.join(60)
    assert not t.is_alive()


def _slow_aws(tmp_path, monkeypatch, warm_up_s: float):
    """AWS enabled, its build held until the returned gate is set (its name is in calls once it
    began), and the configuration with that warm-up bound."""
    gate, calls = threading.Event(), []

    def slow(name, settings, owner):
        calls.append(name)
        assert gate.wait(60)
        return _Built()

    monkeypatch.setattr(registry, "build", slow)
    config = load(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path / 's.db'}",
                                               "providers.aws": AWS, "catalog.refresh_interval_s": 0,
                                               "server.warm_up_s": warm_up_s})
    return gate, calls, config


def test_serve_does_not_wait_past_its_bound_for_a_cloud_that_builds_slowly(tmp_path, monkeypatch):
    """A build that outlasts the warm-up's bound (``[server] warm_up_s``) goes on behind
    SERVING, as without the warm-up."""
    gate, calls, config = _slow_aws(tmp_path, monkeypatch, warm_up_s=0.1)
    stop, ready, ports = threading.Event(), threading.Event(), []
    t = _serve_in_thread(config, stop, ready, ports)
    try:
        assert ready.wait(60)  # SERVING while the build still waits on the gate
        assert calls == ["aws"] and not gate.is_set()
        gate.set()
    finally:
        gate.set()
        stop.set()
        t.join(60)
    assert not t.is_alive()


def test_a_stop_during_the_warm_up_stops_at_once_and_never_serves(tmp_path, monkeypatch):
    """SIGTERM (the stop event) while a cloud's build holds the warm-up: the server stops within
    a second, never saying SERVING, rather than when the warm-up's bound runs out."""
    gate, calls, config = _slow_aws(tmp_path, monkeypatch, warm_up_s=600)
    stop, ready, ports = threading.Event(), threading.Event(), []
    t = _serve_in_thread(config, stop, ready, ports)
    try:
        deadline = time.monotonic() + 60
        while calls != ["aws"]:  # the build has begun: the warm-up now waits on it
            assert time.monotonic() < deadline, "the build never began"
            time.sleep(0.01)
        stop.set()
        t.join(10)
        assert not t.is_alive(), "a stop during the warm-up waited for the warm-up"
        assert not ready.is_set()
    finally:
        gate.set()
        stop.set()
        t.join(60)
