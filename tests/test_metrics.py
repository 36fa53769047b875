"""/metrics exposes RPC latency and the store's leases, spend, events and decisions."""
from __future__ import annotations

import urllib.request

import grpc

from broker.lease import Lease
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.grpc_server import running_server


def test_metrics_endpoint(tmp_path, mini_catalog_dir):
    with running_server(tmp_path, config={"catalog.path": str(mini_catalog_dir)}) as (addr, svc):
        port = svc.metrics.serve("127.0.0.1:0")
        with grpc.insecure_channel(addr) as ch:
            pb_grpc.BrokerStub(ch).Quote(pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=1)))
        svc.store.create_lease(Lease(
            lease_id="l-1", idempotency_key="k", state="running", provider="aws", region="us-east-1",
            instance_type="p5.48xlarge", market="spot", nodes=2, hourly_micros=40_000_000, client_token="t",
            created_at=1, updated_at=1, state_since=1, accrued_micros=5_000_000))
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'broker_rpc_duration_seconds_count{code="OK",method="Quote"} 1.0' in body
    assert 'broker_leases{market="spot",provider="aws",state="running"} 1.0' in body
    assert 'broker_spend_rate_usd_per_hour{market="spot",provider="aws"} 80.0' in body
    assert 'broker_cloud_gpus{market="spot",provider="aws"} 16.0' in body
    assert 'broker_spend_usd_total{provider="aws"} 5.0' in body


def test_metrics_on_an_ipv6_loopback_address(tmp_path, mini_catalog_dir):
    """``metrics_listen = "[::1]:PORT"`` binds ::1 (the brackets went to the resolver, which
    found no such host, after the API already listened)."""
    import socket

    import pytest

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    with running_server(tmp_path, config={"catalog.path": str(mini_catalog_dir)}) as (_, svc):
        port = svc.metrics.serve("[::1]:0")
        body = urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=5).read().decode()
    assert "broker_rpc_duration_seconds" in body


def test_provider_errors_are_counted_by_live_metrics_only(tmp_path):
    """A cloud API error is counted by every live Metrics; one stopped, or dropped without being
    stopped (a test, a restarted service), is no longer counted into, nor kept alive for it."""
    import gc
    import weakref

    from broker.store import Store
    from broker.telemetry import Metrics, count_provider_error

    store = Store(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        kept, stopped, dropped = Metrics(store, None), Metrics(store, None), Metrics(store, None)
        gone = weakref.ref(dropped)
        stopped.stop()
        del dropped
        gc.collect()
        assert gone() is None
        count_provider_error("aws", "RequestLimitExceeded")
        sample = ("broker_provider_errors_total", {"provider": "aws", "code": "RequestLimitExceeded"})
        assert kept.registry.get_sample_value(*sample) == 1
        assert stopped.registry.get_sample_value(*sample) is None
        kept.stop()
        count_provider_error("aws", "RequestLimitExceeded")
        assert kept.registry.get_sample_value(*sample) == 1
    finally:
        store.close()
