"""Issue #17: managed jobs on the mocked clouds. A job's end, reported with `broker report-job`,
releases its lease within one reconciler pass; a lease lost in any way with a job running is
requeued onto a replacement quoted for the work left (or the job failed past max_restarts); the
lease's lifetime and its tenant's budget never end a running job without a requeue."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest

from broker.convert import demand_to_pb
from broker.v1 import broker_pb2 as pb
from broker.records import Job
from policies.demand import Demand
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.conftest import ROOT
from tests.lease_kit import Clock, events, existing_by_lease, instances_of, live_by_lease, offering, service, serving

pytestmark = pytest.mark.timeout(180)

REGIONS = ("us-east-1", "us-west-2", "us-central1", "europe-west4", "eastus", "westeurope")


def _quoted(stub, hours: float = 10.0, provider: str = "aws", market=pb.MARKET_ON_DEMAND):
    demand = Demand(gpus=1, hours=hours, gpu_model="A10G" if provider == "aws" else "A100", regions=REGIONS,
                    interruptible=market == pb.MARKET_SPOT, checkpoint_minutes=20)
    quote = stub.Quote(pb.QuoteRequest(demand=demand_to_pb(demand)), timeout=30).quote
    return quote, next(o.rank for o in quote.offers if o.provider == provider and o.market == market)


def _launch(stub, key: str, job_id: str = "train-1", **kw) -> pb.Lease:
    quote, rank = _quoted(stub, **{k: kw.pop(k) for k in ("hours", "provider", "market") if k in kw})
    req = pb.LaunchRequest(idempotency_key=key, quote_offer=pb.QuoteOffer(quote_id=quote.quote_id, rank=rank),
                           job=pb.Job(job_id=job_id, checkpoint_uri="s3://ckpt/start") if job_id else None, **kw)
    lease = stub.Launch(req, timeout=60).lease
    assert lease.state == pb.LEASE_STATE_RUNNING, lease.state_reason
    return lease


def _terminate_from_outside(clouds, lease) -> None:  # noqa: F811
    """An operator (or a script) terminates the instance in the EC2 console: Client.UserInitiatedShutdown."""
    inst = instances_of(lease)[0]
    iid = inst.instance_id
    clouds.aws.client(lease.region).terminate_instances(InstanceIds=[iid])


def _replacement_of(svc, lease_id: str):
    found = [l for l in svc.store.list_leases() if l.replaces == lease_id]
    assert len(found) <= 1
    return found[0] if found else None


def _kinds(svc, lease_id: str) -> list[str]:
    return [k for k, *_ in events(svc.store, lease_id)]


def test_report_job_succeeded_releases_the_lease_within_one_pass(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="a", offering=offering("aws", "us-west-2", "g5.xlarge"),
                                             job=pb.Job(job_id="train-1")), timeout=60).lease
        other = stub.Launch(pb.LaunchRequest(idempotency_key="b", offering=offering("aws", "us-west-2", "g5.xlarge"),
                                             job=pb.Job(job_id="train-2")), timeout=60).lease
        env = {**os.environ, "BROKER_SERVER": stub.address}
        r = subprocess.run([sys.executable, "-m", "broker.cli", "report-job", lease.lease_id, "--job-id", "train-1",
                            "--state", "succeeded", "--exit-code", "0", "-o", "json"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["action"] == "stop" and out["lease"]["job"]["state"] == "succeeded"

        report = svc.reconciler.run_pass()
        assert report.expired == 1, report
        rec = svc.store.get_lease(lease.lease_id)
        assert rec.state == "released" and rec.state_reason == "job train-1 succeeded (exit code 0)"
        assert "job" in _kinds(svc, lease.lease_id)
        assert svc.store.get_lease(other.lease_id).state == "running"  # its job runs on
        assert lease.lease_id not in existing_by_lease(clouds)

        # A report on the ended lease, a job it never ran, a state that is not one: refused, nothing lost.
        for args, code in ((["--job-id", "train-1", "--state", "failed"], 6),
                           (["--job-id", "x", "--state", "done"], 2),
                           (["--job-id", "train-1", "--state", "running", "--progress", "nan"], 2)):
            r = subprocess.run([sys.executable, "-m", "broker.cli", "report-job", lease.lease_id, *args],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
            assert r.returncode == code, (args, r.stdout, r.stderr)
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        with pytest.raises(grpc.RpcError) as e:
            stub.ReportJob(pb.ReportJobRequest(lease_id=other.lease_id, job_id="train-9",
                                               state=pb.JOB_STATE_RUNNING), timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "runs job train-2" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.ReportJob(pb.ReportJobRequest(lease_id=other.lease_id, job_id="train-2",
                                               state=pb.JOB_STATE_RUNNING, progress=1.5), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "progress" in e.value.details()
        stub.Release(pb.ReleaseRequest(lease_id=other.lease_id), timeout=60)


def test_an_instance_terminated_from_outside_is_requeued_for_the_work_left(clouds, tmp_path):  # noqa: F811
    clock = Clock()
    with service(tmp_path, clouds, clock=clock) as svc, serving(svc) as stub:
        lease = _launch(stub, "outside", hours=10.0)
        clock.advance(2 * 3600)  # two hours of work, then a checkpoint
        r = stub.ReportJob(pb.ReportJobRequest(lease_id=lease.lease_id, job_id="train-1", state=pb.JOB_STATE_RUNNING,
                                               checkpoint_uri="s3://ckpt/train-1/step-2000"), timeout=10)
        assert r.action == pb.JOB_ACTION_CONTINUE
        clock.advance(3600)  # an hour more that no checkpoint saved
        _terminate_from_outside(clouds, lease)

        report = svc.reconciler.run_pass()
        assert (report.lost, report.replaced, report.interrupted) == (1, 1, 0), report
        old = svc.store.get_lease(lease.lease_id)
        assert old.state == "released" and old.state_reason.startswith("outside termination: ")
        assert "Client.UserInitiatedShutdown" in old.state_reason
        (rq,) = [e for e in svc.store.events_of(lease.lease_id) if e.kind == "requeue"]
        assert "from checkpoint s3://ckpt/train-1/step-2000 after outside termination; work left 8.00 h" in rq.message
        new = _replacement_of(svc, lease.lease_id)
        assert new is not None and new.lease_id in rq.message
        assert new.state == "running", new.state_reason
        assert new.demand.hours == pytest.approx(8.0)  # 10 h asked, 2 h saved by the checkpoint
        assert new.job.checkpoint_uri == "s3://ckpt/train-1/step-2000"
        assert (new.job.restarts, new.job_state) == (1, "running")
        assert list(live_by_lease(clouds)) == [new.lease_id]

        # On the replacement the work goes on from there: a checkpoint at 50 % of the job...
        clock.advance(600)
        stub.ReportJob(pb.ReportJobRequest(lease_id=new.lease_id, job_id="train-1", state=pb.JOB_STATE_RUNNING,
                                           checkpoint_uri="s3://ckpt/train-1/step-5000", progress=0.5), timeout=10)
        _terminate_from_outside(clouds, svc.store.get_lease(new.lease_id))
        svc.reconciler.run_pass()
        third = _replacement_of(svc, new.lease_id)
        assert third is not None, events(svc.store, new.lease_id)
        assert third.demand.hours == pytest.approx(5.0) and third.job.restarts == 2
        stub.Release(pb.ReleaseRequest(lease_id=third.lease_id), timeout=60)
        assert existing_by_lease(clouds) == {}


def test_past_max_restarts_the_job_is_failed_not_dropped(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        lease = _launch(stub, "once", max_restarts=0)
        _terminate_from_outside(clouds, lease)
        report = svc.reconciler.run_pass()
        assert (report.lost, report.replaced) == (1, 0), report
        old = svc.store.get_lease(lease.lease_id)
        assert old.state == "released" and old.job_state == "failed" and old.job.state == "failed"
        (ev,) = [e for e in svc.store.events_of(lease.lease_id) if e.kind == "job"]
        assert ev.message == "job train-1 failed: outside termination after 0 restart(s), max_restarts 0"
        assert "no replacement: job train-1 failed" in old.state_reason
        assert _replacement_of(svc, lease.lease_id) is None
        assert existing_by_lease(clouds) == {}


def test_a_lost_lease_without_a_job_is_released_as_before(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        lease = _launch(stub, "idle", job_id="")
        _terminate_from_outside(clouds, lease)
        report = svc.reconciler.run_pass()
        assert (report.failed, report.lost, report.replaced) == (1, 0, 0), report
        assert svc.store.get_lease(lease.lease_id).state_reason.startswith("instances lost: ")
        assert "requeue" not in _kinds(svc, lease.lease_id)


@pytest.mark.parametrize("with_job", ["requeue", "extend"])
def test_a_lease_with_a_job_at_max_lifetime_is_warned_then_requeued_or_extended(clouds, tmp_path, with_job):  # noqa: F811
    clock = Clock()
    with service(tmp_path, clouds, clock=clock,
                 lifecycle={"lifetime_warning_s": 600, "lifetime_with_job": with_job}) as svc, serving(svc) as stub:
        lease = _launch(stub, "life", hours=3.0, max_lifetime_s=3600)
        idle = stub.Launch(pb.LaunchRequest(idempotency_key="idle", max_lifetime_s=3600,
                                            offering=offering("aws", "us-west-2", "g5.xlarge")), timeout=60).lease
        clock.advance(3000)
        svc.reconciler.run_pass()
        (warn,) = [e for e in svc.store.events_of(lease.lease_id) if e.kind == "lifetime_warning"]
        assert "job train-1" in warn.message and "checkpoint now" in warn.message
        r = stub.ReportJob(pb.ReportJobRequest(lease_id=lease.lease_id, job_id="train-1", state=pb.JOB_STATE_RUNNING,
                                               checkpoint_uri="s3://ckpt/train-1/at-50min"), timeout=10)
        assert r.action == pb.JOB_ACTION_CHECKPOINT
        svc.reconciler.run_pass()  # warned once
        assert _kinds(svc, lease.lease_id).count("lifetime_warning") == 1

        clock.advance(700)  # past the limit
        svc.reconciler.run_pass()
        assert svc.store.get_lease(idle.lease_id).state == "released"  # idle capacity simply ends
        rec = svc.store.get_lease(lease.lease_id)
        if with_job == "extend":
            assert rec.state == "running" and rec.max_lifetime_s == 3600 + 7 * 86400
            assert "lifetime_extended" in _kinds(svc, lease.lease_id)
            stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id), timeout=60)
            return
        assert rec.state == "released" and rec.state_reason.startswith("maximum lifetime: ")
        (rq,) = [e for e in svc.store.events_of(lease.lease_id) if e.kind == "requeue"]
        assert "from checkpoint s3://ckpt/train-1/at-50min after maximum lifetime" in rq.message
        new = _replacement_of(svc, lease.lease_id)
        assert new.job.restarts == 1 and new.demand.hours == pytest.approx(3.0 - 3000 / 3600)
        svc.reconciler.run_pass()  # the replacement launches
        new = svc.store.get_lease(new.lease_id)
        assert new.state == "running", new.state_reason
        stub.Release(pb.ReleaseRequest(lease_id=new.lease_id), timeout=60)
        assert existing_by_lease(clouds) == {}


@pytest.mark.parametrize("on_exhausted", ["finish_running", "checkpoint_and_stop"])
def test_a_spent_budget_warns_refuses_new_spend_and_never_kills_a_job_silently(clouds, tmp_path, on_exhausted):  # noqa: F811
    clock = Clock()
    budgets = {"default": {"usd_per_month": 10.0}, "on_exhausted": on_exhausted}
    with service(tmp_path, clouds, clock=clock, budgets=budgets, lifecycle={"idle_timeout_s": 0}) as svc, \
            serving(svc) as stub:
        job = stub.Launch(pb.LaunchRequest(idempotency_key="job", offering=offering("aws", "us-west-2", "g5.xlarge"),
                                           job=pb.Job(job_id="train-1")), timeout=60).lease
        idle = stub.Launch(pb.LaunchRequest(idempotency_key="idle", offering=offering("aws", "us-west-2", "g5.xlarge")),
                           timeout=60).lease
        rate = float(job.hourly_usd) * 2  # both leases
        clock.advance(0.85 * 10.0 / rate * 3600)
        svc.reconciler.run_pass()
        warnings = [e for e in svc.store.events_of("") if e.kind == "budget_warning"]
        assert [json.loads(e.data)["level"] for e in warnings] == [0.8]
        used = svc.metrics.registry.get_sample_value("broker_budget_used_ratio", {"tenant": "default", "cap": "usd_per_month"})
        assert used == pytest.approx(0.85, abs=0.01)

        clock.advance(0.2 * 10.0 / rate * 3600)
        report = svc.reconciler.run_pass()
        assert [json.loads(e.data)["level"] for e in svc.store.events_of("") if e.kind == "budget_warning"] == [0.8, 1.0]
        assert svc.store.get_lease(idle.lease_id).state == "released"
        with pytest.raises(grpc.RpcError) as e:  # new spend is refused
            stub.Launch(pb.LaunchRequest(idempotency_key="more", offering=offering("aws", "us-west-2", "g5.xlarge")),
                        timeout=60)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        rec = svc.store.get_lease(job.lease_id)
        if on_exhausted == "finish_running":
            assert rec.state == "running" and report.expired == 1
            stub.ReportJob(pb.ReportJobRequest(lease_id=job.lease_id, job_id="train-1",
                                               state=pb.JOB_STATE_SUCCEEDED, exit_code=0), timeout=10)
            svc.reconciler.run_pass()
            assert svc.store.get_lease(job.lease_id).state == "released"
        else:
            assert rec.state == "released" and rec.state_reason.startswith("budget exhausted: ")
            (rq,) = [e for e in svc.store.events_of(job.lease_id) if e.kind == "requeue"]
            assert "requeued from checkpoint (none) after budget exhausted" in rq.message
            assert "no replacement: budget exhausted: no new spend" in rq.message
        assert existing_by_lease(clouds) == {}


def test_a_spot_lease_whose_job_ended_is_not_replaced_when_interrupted(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        lease = _launch(stub, "done", market=pb.MARKET_SPOT)
        stub.ReportJob(pb.ReportJobRequest(lease_id=lease.lease_id, job_id="train-1", state=pb.JOB_STATE_FAILED,
                                           exit_code=3), timeout=10)
        clouds.aws.interrupt(instances_of(lease)[0].instance_id)  # before the pass that would release it
        report = svc.reconciler.run_pass()
        assert (report.interrupted, report.replaced) == (1, 0), report
        rec = svc.store.get_lease(lease.lease_id)
        assert rec.state == "released" and "no replacement: its job train-1 had failed" in rec.state_reason
        assert "requeue" not in _kinds(svc, lease.lease_id)


def test_hostile_reports_get_a_clear_answer_and_lose_nothing(clouds, tmp_path):  # noqa: F811
    """Whatever a node sends with a valid credential: 200, 400 naming the field, 409 or 413; never a
    500, and the lease stays readable and live until a report that ends its job."""
    import http.client

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from broker.serving import start_callback

    with service(tmp_path, clouds) as svc:
        lease = svc.lifecycle.launch(idempotency_key="h", target=svc.lifecycle.target_explicit(
            "aws", "us-west-2", "", "g5.xlarge", "on_demand", 1), job=Job(job_id="train-h"))
        token = svc.credentials.mint(lease.lease_id)
        callback = start_callback(svc.config, svc)
        texts = st.one_of(st.text(max_size=40), st.just("\x00" * 3), st.just("x" * 5000), st.just("train-h"))
        values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                           texts, st.lists(st.integers(), max_size=3))
        states = st.one_of(st.sampled_from(["running", "RUNNING", "succeeded ", "", "done"]), values)
        bodies = st.fixed_dictionaries({"job_id": st.one_of(st.just("train-h"), values), "state": states},
                                       optional={"exit_code": values, "progress": values,
                                                 "checkpoint_uri": values, "extra": values})

        @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
        @given(bodies)
        def post(body):
            conn = http.client.HTTPConnection("127.0.0.1", callback.port, timeout=10)
            try:
                conn.request("POST", f"/v1/leases/{lease.lease_id}/job", body=json.dumps(body),
                             headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
                r = conn.getresponse()
                answer = json.loads(r.read())
            finally:
                conn.close()
            assert r.status in (200, 400, 409, 413), (str(body)[:300], r.status, answer)
            if r.status == 400:
                assert answer["error"].split(" ")[0] in ("job_id", "state", "exit_code", "progress",
                                                         "checkpoint_uri", "the"), answer
            rec = svc.store.get_lease(lease.lease_id)
            assert rec is not None and rec.job.job_id == "train-h"

        try:
            post()
        finally:
            callback.stop()
        svc.lifecycle.release(lease.lease_id)


def test_the_cause_of_a_loss_is_named_from_the_clouds_stop_reason():
    from broker.reconciler import loss_cause
    from providers.base import Instance, InstanceState, Market, StopReason

    def stopped(reason):
        return Instance("aws", "i-1", "r", "z", "t", Market.ON_DEMAND, InstanceState.TERMINATED, "l",
                        stop_reason=reason)

    assert loss_cause([stopped(StopReason.USER)]) == "outside termination"
    assert loss_cause([stopped(StopReason.ERROR)]) == "host failure"
    assert loss_cause([stopped(StopReason.CAPACITY)]) == "host failure"
    assert loss_cause([]) == "lost instance"


@pytest.mark.parametrize("job, demand_hours, left", [
    ({"job_id": "j"}, 10.0, 10.0),  # no checkpoint: all of it again
    ({"job_id": "j", "work_done_s": 7200.0}, 10.0, 8.0),
    ({"job_id": "j", "work_done_s": 36000.0 * 2}, 10.0, 0.05),  # saved more than asked: the least quoted
    ({"job_id": "j", "total_hours": 10.0, "work_done_s": 5 * 3600.0}, 8.0, 5.0),  # a replacement's lease
])
def test_the_work_left_is_the_jobs_hours_minus_what_its_checkpoint_saved(job, demand_hours, left):
    from broker.jobs import hours_left, plan_requeue
    from broker.lease import Lease

    lease = Lease(lease_id="l", idempotency_key="k", state="running", provider="aws", region="r",
                  instance_type="t", market="on_demand", nodes=1, hourly_micros=1, client_token="c",
                  created_at=0, updated_at=0, state_since=0, job=job, demand={"gpus": 1, "hours": demand_hours},
                  job_state="running")
    assert hours_left(lease) == pytest.approx(left)
    plan = plan_requeue(lease, "lost instance", default_max_restarts=3)
    assert plan.hours == pytest.approx(left) and plan.job.restarts == 1 and plan.job.total_hours == 10.0
    assert plan_requeue(_with_job(lease, {**job, "restarts": 3}), "lost instance", 3).failed


def _with_job(lease, job):
    import dataclasses

    return dataclasses.replace(lease, job=job)
