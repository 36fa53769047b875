"""A slow cloud slows only the calls that wait on it (``limits.max_cloud_calls``).

Launch and Release wait on a cloud's API; Quote, lease reads and health do not. Before the bound,
launches waiting on a cloud that answered slowly took every worker thread of the server and a
Quote waited behind them until its deadline (the soak's throughput fell from 54 calls/s to 0).
These tests hang the mocked EC2's RunInstances and check that the other calls are still answered,
that a launch past the bound is refused at once as "busy" (retryable, marked as such), and that
the client asks again until its launch gets a turn.
"""
from __future__ import annotations

import contextlib
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.client import BrokerClient, ClientError
from broker.config import LimitsSettings
from broker.errors import ANSWERED
from broker.errors import ConfigError
from broker.limits import BUSY, Limits, cloud_rpcs
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from providers.registry import build_enabled
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.grpc_server import running_server

pytestmark = pytest.mark.timeout(300)

WORKERS = 4


@contextlib.contextmanager
def serving(clouds, tmp_path, slow_s: float, **limits):  # noqa: F811
    """A server of WORKERS threads on the mocked clouds whose EC2 answers every RunInstances
    only after ``slow_s`` (an answer, not a timeout: the SDK's read timeout is longer)."""
    tables = clouds.provider_tables(read_timeout_s=int(slow_s) + 60)
    cfg = {"providers": tables, "server.workers": WORKERS, **{f"limits.{k}": v for k, v in limits.items()}}
    clouds.aws.slow_s = slow_s
    clouds.aws.inject("slow", times=0, match="RunInstances")
    with running_server(tmp_path, providers=build_enabled(tables, "broker-test"), config=cfg) as (addr, svc):
        yield addr, svc


def quote(stub, timeout: float):
    demand = pb.Demand(gpu_model="A100", gpus=8, hours=2.0)
    return stub.Quote(pb.QuoteRequest(demand=demand, top=3), timeout=timeout)


def launch_request(key: str) -> pb.LaunchRequest:
    return pb.LaunchRequest(idempotency_key=key, offering=pb.Offering(
        provider="aws", region="us-east-1", instance_type="g5.xlarge", market=pb.MARKET_ON_DEMAND, count=1))


def wait_for(what, within_s: float, every_s: float = 0.05) -> None:
    deadline = time.monotonic() + within_s
    while not what():
        assert time.monotonic() < deadline, f"not within {within_s} s"
        time.sleep(every_s)


def test_quote_lease_reads_and_health_are_answered_while_launches_hang_on_a_slow_cloud(clouds, tmp_path):  # noqa: F811
    slow_s = 20.0
    with serving(clouds, tmp_path, slow_s) as (addr, svc):
        assert svc.limits.max_cloud_calls == 1  # a quarter of 4 workers
        with grpc.insecure_channel(addr) as ch:
            stub = pb_grpc.BrokerStub(ch)
            quote(stub, timeout=120)  # warm: the engine has priced this demand once
            answers: list = []

            def launch(i: int) -> None:
                try:
                    answers.append(stub.Launch(launch_request(f"hang-{i}"), timeout=slow_s + 100))
                except grpc.RpcError as e:
                    answers.append(e)

            launches = [threading.Thread(target=launch, args=(i,)) for i in range(WORKERS + 2)]
            for t in launches:
                t.start()
            # Every launch is either at the cloud or answered: more than the server has workers.
            refused = lambda: [a for a in answers if isinstance(a, grpc.RpcError)]  # noqa: E731
            at_cloud = lambda: clouds.aws.count("RunInstances")  # noqa: E731
            wait_for(lambda: at_cloud() >= 1 and at_cloud() + len(refused()) >= WORKERS, within_s=60)
            started = time.monotonic()
            q = quote(stub, timeout=slow_s / 2)
            assert q.quote.offers and time.monotonic() - started < slow_s / 2
            stub.ListLeases(pb.ListLeasesRequest(limit=10), timeout=slow_s / 2)
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=slow_s / 2)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            assert clouds.aws.count("RunInstances") == 1  # the one launch the bound lets through
            for t in launches:
                t.join(slow_s + 120)
        busy = refused()
        assert len(busy) == WORKERS + 1, [a.details() if isinstance(a, grpc.RpcError) else a for a in answers]
        for e in busy:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "limits.max_cloud_calls" in e.details()
            trailers = dict(e.trailing_metadata() or ())
            assert trailers.get(BUSY) == "1" and trailers.get(ANSWERED) == "1"
        (done,) = [a for a in answers if not isinstance(a, grpc.RpcError)]
        assert done.lease.state == pb.LEASE_STATE_RUNNING
        # a refused launch made no lease: its key is free for the retry
        assert [l.idempotency_key for l in svc.store.list_leases()] == [done.lease.idempotency_key]


def test_the_client_asks_a_busy_server_again_until_its_launch_gets_a_turn(clouds, tmp_path):  # noqa: F811
    with serving(clouds, tmp_path, slow_s=2.0, max_cloud_calls=1) as (addr, svc):
        leases: list = []

        def launch(i: int) -> None:
            with BrokerClient(addr, timeout=180) as c:
                try:
                    leases.append(c.launch(launch_request(f"turn-{i}")))
                except ClientError as e:
                    leases.append(e)

        threads = [threading.Thread(target=launch, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(200)
        assert [x["state"] if isinstance(x, dict) else repr(x) for x in leases] == ["running"] * 3
        assert clouds.aws.count("RunInstances") == 3  # one each: a refusal launched nothing
        refused = svc.metrics.registry.get_sample_value("broker_rpc_duration_seconds_count",
                                                        {"method": "Launch", "code": "UNAVAILABLE"})
        assert refused and refused >= 1  # they did meet a busy server, and asked again


def test_a_busy_answer_past_the_clients_time_is_the_servers_refusal(clouds, tmp_path):  # noqa: F811
    with serving(clouds, tmp_path, slow_s=30.0, max_cloud_calls=1) as (addr, _):
        with grpc.insecure_channel(addr) as ch:
            hang = pb_grpc.BrokerStub(ch).Launch.future(launch_request("first"), timeout=120)
            wait_for(lambda: clouds.aws.count("RunInstances") == 1, within_s=60)
            with BrokerClient(addr, timeout=3) as c, pytest.raises(ClientError) as err:
                c.launch(launch_request("second"))
            assert err.value.code == grpc.StatusCode.UNAVAILABLE and err.value.answered
            assert "max_cloud_calls" in str(err.value) and err.value.exit_code == 7
            assert hang.result().lease.state == pb.LEASE_STATE_RUNNING


def test_the_bound_defaults_to_a_quarter_of_the_workers_and_never_takes_them_all():
    assert Limits.from_settings(LimitsSettings(), 32).max_cloud_calls == 8
    assert Limits.from_settings(LimitsSettings(), 3).max_cloud_calls == 1
    assert Limits.from_settings(LimitsSettings(max_cloud_calls=5), 32).max_cloud_calls == 5
    with pytest.raises(ConfigError) as err:
        Limits.from_settings(LimitsSettings(max_cloud_calls=32), 32)
    assert err.value.field == "limits.max_cloud_calls" and "server.workers (32)" in str(err.value)
    with pytest.raises(ConfigError, match=r"together must be below server.workers \(32\)"):  # 31 + 31 of 32
        Limits.from_settings(LimitsSettings(max_streams=31, max_cloud_calls=31), 32)
    with pytest.raises(ConfigError, match=r"together must be below server.workers \(8\)"):  # 4 (half) + 4
        Limits.from_settings(LimitsSettings(max_cloud_calls=4), 8)
    assert cloud_rpcs(autoscaling=False) == {"Launch", "Release"}
    assert cloud_rpcs(autoscaling=True) == {"Launch", "Release", "ReportQueue"}  # it launches before it answers
