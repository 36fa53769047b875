"""Lambda Cloud as the other clouds are used: quote, launch and release through the real gRPC
server and the real provider against the fake Lambda Cloud API; an instance terminated outside
the broker, an orphan, failover on insufficient capacity and the hourly budget."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest

from broker.convert import demand_to_pb
from broker.v1 import broker_pb2 as pb
from policies.demand import Demand
from providers.base import LABEL_LEASE, LABEL_OWNER
from tests.clouds.lambda_cloud import API_KEY, FakeLambdaCloud
from tests.conftest import ROOT
from tests.lease_kit import Clock, events, offering, service, serving

pytestmark = pytest.mark.timeout(120)

H100X8 = "gpu_8x_h100_sxm5"
REGIONS = ["us-east-1", "us-west-1", "us-south-1"]


class LambdaOnly:
    """The ``clouds`` lease_kit's service() takes: only Lambda, on its fake."""

    def __init__(self, fake: FakeLambdaCloud) -> None:
        self.fake = fake

    def provider_tables(self) -> dict:
        return {"lambda": self.fake.provider_settings(REGIONS)}


@pytest.fixture
def lam(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAMBDA_API_KEY", API_KEY)
    monkeypatch.delenv("LAMBDA_API_ENDPOINT", raising=False)
    with FakeLambdaCloud() as fake:
        yield fake


def tags(inst: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in inst["tags"]}


def quote(stub, **demand):
    return stub.Quote(pb.QuoteRequest(demand=demand_to_pb(Demand(**demand))), timeout=30).quote


def test_quote_launch_and_release_on_lambda(lam: FakeLambdaCloud, tmp_path) -> None:
    boot = {"container": {"image": "busybox:1.36", "command": ["sh", "-c", "exit 0"]}}
    with service(tmp_path, LambdaOnly(lam), bootstrap=boot) as svc, serving(svc) as stub:
        q = quote(stub, gpus=16, hours=4, gpu_model="H100", providers=("lambda",))
        assert q.offers and {o.provider for o in q.offers} == {"lambda"}
        best = next(o for o in q.offers if o.instance_type == H100X8)  # 16 x 1-GPU nodes may rank first
        assert best.nodes == 2 and best.region in REGIONS and float(best.hourly_usd) == pytest.approx(31.92)
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="k1", bootstrap="container", job=pb.Job(job_id="t-1"),
                                             quote_offer=pb.QuoteOffer(quote_id=q.quote_id, rank=best.rank)),
                            timeout=60).lease
        assert lease.state == pb.LEASE_STATE_RUNNING and lease.provider == "lambda"
        alive = lam.instances()
        assert len(alive) == 2 and {tags(i)[LABEL_LEASE] for i in alive} == {lease.lease_id}
        assert {i["region"]["name"] for i in alive} == {best.region}
        # the boot script rides as cloud-init user data; each node reads its name from its hostname
        assert all("BROKER_NODE_NAME=$(hostname)" in lam.user_data[i["id"]] for i in alive)
        assert sorted(i["hostname"] for i in alive) == sorted(n.node_name for n in lease.instances)
        done = stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id), timeout=60).lease
        assert done.state == pb.LEASE_STATE_RELEASED
        assert lam.instances() == []


def test_insufficient_capacity_fails_over_to_the_next_offer(lam: FakeLambdaCloud, tmp_path) -> None:
    with service(tmp_path, LambdaOnly(lam)) as svc, serving(svc) as stub:
        q = quote(stub, gpus=8, hours=4, gpu_model="H100", providers=("lambda",))
        first = q.offers[0]
        lam.set_capacity(first.instance_type, first.region, 0)
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="k2", quote_offer=pb.QuoteOffer(
            quote_id=q.quote_id, rank=1)), timeout=60).lease
        assert lease.state == pb.LEASE_STATE_RUNNING
        assert lease.region != first.region and lease.provider == "lambda"
        refused = [c for c in lam.launch_calls() if c.status == 400]
        assert [c.body["region_name"] for c in refused] == [first.region]
        blocks = svc.store.active_blocks(svc.clock())
        assert f"lambda/{first.region}/{first.instance_type}/on_demand" in blocks
        assert "insufficient-capacity" in blocks[f"lambda/{first.region}/{first.instance_type}/on_demand"]


def test_an_instance_terminated_outside_the_broker_drains_the_lease(lam: FakeLambdaCloud, tmp_path) -> None:
    with service(tmp_path, LambdaOnly(lam)) as svc, serving(svc) as stub:
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="k3", offering=offering(
            "lambda", "us-east-1", H100X8, count=2)), timeout=60).lease
        lam.kill(lease.instances[0].instance_id)
        svc.reconciler.run_pass()
        svc.reconciler.run_pass()
        rec = svc.store.get_lease(lease.lease_id)
        assert rec.state in ("draining", "released")
        assert rec.state_reason.startswith("instances lost")
        assert any(e[2] == "draining" for e in events(svc.store, lease.lease_id))
        assert lam.instances() == []  # the surviving node is terminated too


def test_an_orphan_is_terminated_and_a_stranger_kept(lam: FakeLambdaCloud, tmp_path) -> None:
    clock = Clock()
    with service(tmp_path, LambdaOnly(lam), clock=clock, reconciler={"orphan_grace_s": 60}) as svc:
        ghost = lam.seed_instance("us-east-1", H100X8, tags={LABEL_LEASE: "l-ghost", LABEL_OWNER: "broker-test"})
        stranger = lam.seed_instance("us-east-1", H100X8, tags={LABEL_OWNER: "someone-else"})
        svc.reconciler.run_pass()
        assert {i["id"] for i in lam.instances()} == {ghost, stranger}  # within the grace period
        clock.advance(61)
        report = svc.reconciler.run_pass()
        assert report.orphans_terminated == 1
        assert [i["id"] for i in lam.instances()] == [stranger]


def test_a_launch_over_the_hourly_budget_never_reaches_lambda(lam: FakeLambdaCloud, tmp_path) -> None:
    with service(tmp_path, LambdaOnly(lam), budgets={"default": {"usd_per_hour": 40}}) as svc, \
            serving(svc) as stub:
        stub.Launch(pb.LaunchRequest(idempotency_key="b1", offering=offering("lambda", "us-east-1", H100X8)),
                    timeout=60)
        calls = len(lam.launch_calls())
        with pytest.raises(grpc.RpcError) as e:
            stub.Launch(pb.LaunchRequest(idempotency_key="b2", offering=offering("lambda", "us-west-1", H100X8)),
                        timeout=60)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert e.value.details() == ("budget default.usd_per_hour = 40 would be exceeded: 31.92 $/h already running "
                                     "+ 31.92 $/h requested.")
        assert len(lam.launch_calls()) == calls and len(lam.instances()) == 1


def test_cli_quote_lists_lambda_offers(tmp_path) -> None:
    """``broker quote --gpu H100:8 --providers lambda -o json`` from the bundled catalog."""
    env = {**os.environ, "BROKER_HOME": str(tmp_path)}
    env.pop("BROKER_CONFIG", None)
    r = subprocess.run([sys.executable, "-m", "broker", "quote", "--gpu", "H100:8", "--hours", "10", "--providers",
                        "lambda", "-o", "json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    offers = json.loads(r.stdout)["offers"]
    assert offers and {o["provider"] for o in offers} == {"lambda"}
    assert offers[0]["instance_type"] == H100X8 and offers[0]["hourly_usd"] == 31.92
    assert offers[0]["market"] == "on_demand" and offers[0]["price_source"].startswith("bundled:")
