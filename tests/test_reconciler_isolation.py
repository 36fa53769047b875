"""No one lease, tenant or provider stops a reconciler pass for the others; no lease is stuck in a
launch forever; a background loop that dies turns health NOT_SERVING."""
from __future__ import annotations

import contextlib

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.lease import LeaseState
from broker.lifecycle import LeaseError, Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.reconciler import Reconciler
from broker.store import Store
from providers.base import Market
from providers.bootstrap import BootContext, render, resolve
from tests.fake_provider import FakeProvider
from tests.grpc_server import running_server
from tests.lease_kit import Clock, wait_until

S = LeaseState


@pytest.fixture
def kit(tmp_path, mini_catalog):
    clock = Clock(1_800_000_000.0)
    clouds = {name: FakeProvider(name, clock=clock) for name in ("aws", "gcp", "azure")}
    store = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    errors: list[tuple[str, str]] = []

    def boot(lease, names):  # the service's renderer: operator templates only (none configured here)
        ctx = BootContext(lease_id=lease.lease_id, node_name=names[0], node_names=tuple(names),
                          provider=lease.provider, region=lease.region)
        return render(resolve(lease.bootstrap, {}), ctx)

    lc = Lifecycle(store, clouds, QuoteEngine(mini_catalog), owner="test", clock=clock, boot=boot,
                   settings=Settings(backoff_s=0.0, provision_timeout_s=900, resume_after_s=60),
                   sleep=lambda s: None)
    rec = Reconciler(lc, orphan_grace_s=60.0, clock=clock, on_error=lambda *a: errors.append(a))
    yield lc, rec, clouds, clock, errors
    store.close()


def target(lc, provider="aws"):
    where = {"aws": ("us-east-1", "p5.48xlarge"), "gcp": ("us-central1", "a3-highgpu-8g"),
             "azure": ("eastus", "Standard_ND96isr_H100_v5")}[provider]
    return lc.target_explicit(provider, where[0], "", where[1], "on_demand", 1)


def test_a_poisoned_lease_and_a_broken_cloud_do_not_stop_an_orphan_being_reaped_in_another(kit):
    lc, rec, clouds, clock, errors = kit
    poisoned = lc.launch(idempotency_key="p", target=target(lc, "aws"))
    healthy = lc.launch(idempotency_key="h", target=target(lc, "aws"))
    orphan = clouds["gcp"].plant("l-long-gone", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    rec.run_pass()  # the orphan is seen for the first time
    clock.advance(61)
    # The poisoned lease's node drops out of the listing, and asking about it raises what no
    # provider error covers (an SDK bug); the Azure client itself is broken this pass.
    clouds["aws"].vanish(next(iter(poisoned.instance_ids)))
    clouds["aws"].fail("describe", RuntimeError("SDK bug: 'NoneType' object is not subscriptable"))
    clouds["azure"].fail("list_managed", TypeError("unexpected keyword argument 'filter'"))
    report = rec.run_pass()
    assert report.orphans_terminated == 1 and orphan.instance_id not in clouds["gcp"].instances
    assert report.errors == 2 and sorted(errors) == [("list", "azure"), ("sync", "aws")]
    assert report.skipped_providers == ["azure"]
    assert lc.get(healthy.lease_id).state is S.RUNNING
    assert lc.get(poisoned.lease_id).state is S.RUNNING  # nothing concluded from the failure...
    report = rec.run_pass()  # ...and the next pass handles it
    assert report.errors == 0 and lc.get(poisoned.lease_id).state is S.RELEASED


def test_an_instance_name_a_cloud_refuses_fails_only_its_own_terminate(kit):
    lc, rec, clouds, clock, errors = kit
    bad = clouds["aws"].plant("l-gone-1", "us-east-1", "p5.48xlarge", Market.ON_DEMAND, node_name="node\x00-1")
    good = clouds["gcp"].plant("l-gone-2", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    rec.run_pass()
    clock.advance(61)
    clouds["aws"].fail("terminate", ValueError("embedded null byte"))
    report = rec.run_pass()
    assert report.orphans_terminated == 1 and good.instance_id not in clouds["gcp"].instances
    assert errors == [("orphans", "aws")] and bad.instance_id in clouds["aws"].instances
    assert rec.run_pass().orphans_terminated == 1  # tried again on the next pass
    assert clouds["aws"].instances == {}


def test_an_unknown_boot_template_fails_the_lease_without_a_cloud_call(kit):
    lc, rec, clouds, clock, errors = kit
    with pytest.raises(LeaseError) as e:
        lc.launch(idempotency_key="k", target=target(lc), bootstrap="removed-from-config")
    lease = lc.store.lease_by_key("default", "k")
    assert lease.state is S.FAILED and "boot template 'removed-from-config'" in lease.state_reason
    assert [a.code for a in e.value.attempts] == ["BootScript"]
    assert [m for m, _ in clouds["aws"].calls] == []


class ProcessDied(BaseException):
    """The launching process dies in the middle of the cloud call (nothing of it runs on)."""


def test_a_launch_resumed_again_and_again_still_times_out_from_its_creation(kit):
    lc, rec, clouds, clock, errors = kit
    created = clock()
    # Every launch call dies with its process: the lease is left provisioning, and every pass
    # resumes it (provisioning → requested → provisioning restarts state_since).
    clouds["aws"].fail("launch", ProcessDied(), times=100)
    with pytest.raises(ProcessDied):
        lc.launch(idempotency_key="k", target=target(lc))
    lease_id = lc.store.lease_by_key("default", "k").lease_id
    while clock() - created < 900:
        clock.advance(250)
        with contextlib.suppress(ProcessDied):  # the broker dies in the pass's launch, and restarts
            rec.run_pass()
        if lc.get(lease_id).state not in (S.REQUESTED, S.PROVISIONING):
            break
    lease = lc.get(lease_id)
    assert lease.state is S.RELEASED and lease.state_reason == "launch did not finish within 900 s"
    assert created + 900 <= lease.ended_at <= created + 900 + 250
    launches = [m for m, _ in clouds["aws"].calls if m == "launch"]
    assert len(launches) == 4  # resumed at each pass


def test_a_provider_bug_in_a_launch_fails_over_at_once_naming_the_provider_and_the_class(kit):
    lc, rec, clouds, clock, errors = kit
    clouds["aws"].fail("launch", KeyError("Reservations"))
    from policies.demand import Demand

    lease = lc.launch(idempotency_key="k", target=target(lc, "aws"), alternatives=[target(lc, "gcp")],
                      demand=Demand(gpus=8, hours=1, gpu_model="H100"))
    assert lease.state is S.RUNNING and lease.provider == "gcp"  # failed over, not left provisioning
    (bug,) = [a for a in lease.attempts if a.provider == "aws" and a.kind != "blocked"]
    assert bug.code == "KeyError" and bug.message == "aws raised KeyError: 'Reservations'"
    assert [m for m, _ in clouds["aws"].calls].count("launch") == 1  # a bug is not retried


def test_a_provider_bug_after_the_launch_fails_the_lease_and_its_nodes_are_reaped_as_orphans(kit):
    lc, rec, clouds, clock, errors = kit
    aws = clouds["aws"]
    real_launch = aws.launch

    def launched_then_crashed(spec):  # the nodes exist; the answer is never recorded
        real_launch(spec)
        raise AttributeError("'NoneType' object has no attribute 'get'\n  (and a second line)")

    aws.launch = launched_then_crashed
    aws.fail("describe", RuntimeError("the rollback's listing is broken too"))
    with pytest.raises(LeaseError) as e:
        lc.launch(idempotency_key="k", target=target(lc, "aws"))
    lease = lc.store.lease_by_key("default", "k")
    assert lease.state is S.FAILED and lease.ended_at == clock()  # at once, not after provision_timeout_s
    assert "aws raised AttributeError: 'NoneType' object has no attribute 'get'" in str(e.value)
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value)
    (left,) = aws.alive()
    assert left.lease_id == lease.lease_id
    rec.run_pass()  # seen for the first time: the orphan grace starts
    clock.advance(61)
    assert rec.run_pass().orphans_terminated == 1 and aws.alive() == []


def test_a_provider_bug_is_failed_precondition_to_a_grpc_caller_never_internal(tmp_path, mini_catalog_dir):
    from broker.v1 import broker_pb2 as pb
    from broker.v1 import broker_pb2_grpc as pb_grpc

    aws = FakeProvider("aws")
    aws.fail("launch", TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'"), times=100)
    with running_server(tmp_path, providers={"aws": aws}, config={"catalog.path": str(mini_catalog_dir)}) as (addr, svc):
        with grpc.insecure_channel(addr) as ch:
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.BrokerStub(ch).Launch(pb.LaunchRequest(
                    idempotency_key="k", offering=pb.Offering(provider="aws", region="us-east-1",
                                                             instance_type="p5.48xlarge",
                                                             market=pb.MARKET_ON_DEMAND, count=1)), timeout=60)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
        assert "aws raised TypeError" in e.value.details() and "Traceback" not in e.value.details()
        (lease,) = svc.store.list_leases()
        assert lease.state is LeaseState.FAILED


def test_a_background_loop_that_dies_turns_health_not_serving(tmp_path, mini_catalog_dir):
    with running_server(tmp_path, config={"catalog.path": str(mini_catalog_dir)}) as (addr, svc):
        with grpc.insecure_channel(addr) as ch:
            health = health_pb2_grpc.HealthStub(ch)

            def status():
                return health.Check(health_pb2.HealthCheckRequest(service="broker.v1.Broker"), timeout=5).status

            assert status() == health_pb2.HealthCheckResponse.SERVING
            # ``interval_s = inf``: waiting inf seconds between passes raises in the loop's thread
            svc._threads.append(svc._loop("reconciler", float("inf"), lambda: None))
            wait_until(lambda: status() == health_pb2.HealthCheckResponse.NOT_SERVING, timeout=20,
                       what="health NOT_SERVING")
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
        assert svc.dead_loops == ["reconciler"]
        assert svc.metrics.registry.get_sample_value("broker_loop_alive", {"loop": "reconciler"}) == 0


def test_reconcile_errors_are_counted_in_the_metric(tmp_path, mini_catalog_dir):
    aws = FakeProvider("aws")
    with running_server(tmp_path, providers={"aws": aws}, config={"catalog.path": str(mini_catalog_dir)}) as (_, svc):
        aws.fail("list_managed", KeyError("Reservations"))
        assert svc.reconciler.run_pass().skipped_providers == ["aws"]
        assert svc.metrics.registry.get_sample_value(
            "broker_reconcile_errors_total", {"phase": "list", "provider": "aws"}) == 1
