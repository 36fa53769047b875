"""The autoscaler's diagnosis as the service asks for it (the source's allocation history within
``history_s``, at the clock's time), a snapshot that names no source, a hand-off that fails with
an error naming no job, and what counts as a source's capacity in flight; on the in-process service
with clouds in memory (tests/test_autoscaler_fake.py's kit)."""
from __future__ import annotations

import json

import pytest

from broker.autoscaler import autoscaler_for
from broker.errors import Unavailable
from broker.lease import LeaseState
from broker.records import Job
from policies.queue import ClusterNode
from providers.base import ProviderError
from tests import fake_scheduler as fake
from tests.test_autoscaler_fake import T0, Kit, SomeMovesFail, _idle_lease, four, job, snap

pytestmark = pytest.mark.timeout(120)

HALF = tuple(ClusterNode(f"n{i}", "mix", 8, 4, "A100") for i in range(2))  # 50 % allocated: under 70 %
WAITING = [job(i) for i in range(6)]
PERSISTENTLY = "allocation 50% persistently under 70% with 6 GPUs waiting"
NOW_ONLY = "allocation 50% under 70% with 6 GPUs waiting"


@pytest.fixture
def kit(tmp_path):
    k = Kit(tmp_path)
    try:
        yield k
    finally:
        k.svc.stop()


def test_a_diagnosis_reads_the_sources_history_of_the_last_history_s_at_the_clocks_time(kit):
    a = kit.auto
    d, _ = a.on_snapshot(snap("q", T0, *WAITING, nodes=HALF))
    assert d.signals == (NOW_ONLY,)  # no sample before this one
    window = a.settings.history_s
    kit.clock.advance(window)
    assert a.diagnose(snap("q", T0 + window, *WAITING, nodes=HALF)).signals == (PERSISTENTLY,)
    assert a.diagnose(snap("q", T0 + window, *WAITING, nodes=HALF), now=T0 + window + 1).signals == (NOW_ONLY,)
    assert a.diagnose(snap("other", T0 + window, *WAITING, nodes=HALF)).signals == (NOW_ONLY,)
    kit.clock.advance(1)
    assert a.diagnose(snap("q", T0 + window + 1, *WAITING, nodes=HALF)).signals == (NOW_ONLY,)


def test_a_snapshot_naming_no_source_is_the_default_sources(kit):
    a = kit.auto
    a.on_snapshot(snap("", T0, *WAITING, nodes=HALF))
    assert set(a.sources) == {"default"} and list(a.sources["default"].history) == [(T0, 0.5)]
    (hold,) = kit.decisions("hold")
    assert json.loads(hold.data) == {"source": "default"}
    kit.clock.advance(1)
    assert a.diagnose(snap("", T0 + 1, *WAITING, nodes=HALF)).signals == (PERSISTENTLY,)


class Unreachable(fake.Capable):
    def allow_burst(self, job_ids: list[str]) -> None:
        self.calls.append(("allow_burst", tuple(job_ids)))
        raise ConnectionError("slurmctld unreachable")


def test_a_hand_off_that_fails_naming_no_job_leaves_every_job_free_to_burst_again(kit):
    w = Unreachable(source="w", snap=snap("w", T0, *four()))
    a = kit.scaler(w)
    (d,) = a.tick()
    (failed,) = kit.decisions("burst_failed")
    assert sorted(json.loads(failed.job_ids)) == sorted(c.job.job_id for c in d.jobs) and d.jobs
    assert failed.reason == f"{d.reason}; hand-off failed: slurmctld unreachable"
    assert json.loads(failed.data) == {"source": "w"} and kit.decisions("burst") == []
    assert a.sources["w"].burst_jobs == set() and kit.store.list_leases() == []


def test_every_lease_of_the_source_counts_whatever_leases_of_others_come_between(kit):
    lc = kit.svc.lifecycle
    t = lc.target_explicit("aws", "us-east-1", "", "g6.xlarge", "on_demand", 1)
    lc.launch(idempotency_key="mine", target=t, job=Job(job_id="j", source="q"))
    kit.clock.advance(1)
    lc.launch(idempotency_key="theirs", target=t, job=Job(job_id="k", source="other"))  # listed first (newer)
    assert kit.auto._cloud_state("q") == (1, {}) and kit.auto._cloud_state("other") == (1, {})


def test_a_lease_of_an_instance_type_the_catalog_no_longer_has_counts_no_gpus(kit):
    lc = kit.svc.lifecycle
    t = lc.target_explicit("aws", "us-east-1", "", "g6.xlarge", "on_demand", 1)
    gone = lc.launch(idempotency_key="gone", target=t, job=Job(job_id="j", source="q"))
    kit.store.update_lease(gone, now=T0, instance_type="g1.retired")
    lc.launch(idempotency_key="known", target=t, job=Job(job_id="k", source="q"))
    assert kit.auto._cloud_state("q") == (1, {})


# -- what the service's configuration reaches ------------------------------------------------------
def test_the_diagnosis_and_its_hold_use_the_configured_thresholds(tmp_path):
    k = Kit(tmp_path, diagnose={"low_allocation": 0.6})
    try:
        d, decision = k.auto.on_snapshot(snap("q", T0, *WAITING, nodes=HALF))
        assert d.signals == ("allocation 50% under 60% with 6 GPUs waiting",)
        (hold,) = k.decisions("hold")
        assert hold.reason == decision.reason and "under 60%" in hold.reason
    finally:
        k.svc.stop()


def test_a_scheduling_bound_hold_says_the_diagnosis_causes_and_fix(kit):
    d, decision = kit.auto.on_snapshot(snap("q", T0, *WAITING, nodes=HALF))
    assert d.verdict == "scheduling-bound" and decision.action == "hold"
    assert decision.reason == f"did not burst, because scheduling-bound: {NOW_ONLY}"
    (hold,) = kit.decisions("hold")
    assert hold.reason == decision.reason


def test_the_services_autoscaler_reads_and_hands_over_through_the_services_schedulers(kit):
    w = fake.Capable(source="w", snap=snap("w", T0, *four()))
    kit.svc.schedulers = {w.source: w}
    (d,) = autoscaler_for(kit.svc).tick()
    assert d.action == "burst" and d.jobs, d.reason
    assert [c for c in w.calls if c[0] == "allow_burst"] == [("allow_burst", tuple(c.job.job_id for c in d.jobs))]
    (rec,) = kit.decisions("burst")
    assert json.loads(rec.data)["source"] == "w" and kit.store.list_leases() == []


# -- what an offload decision says -------------------------------------------------------------------
EVALS = [job(f"e{i}", kind="eval") for i in range(2)]


def test_a_move_names_the_partition_the_jobs_went_to_even_one_called_offload(kit):
    w = fake.Capable(source="w", snap=snap("w", T0, *EVALS, *four()), offload_queue="offload")
    kit.scaler(w).tick()
    (off,) = kit.decisions("offload")
    assert off.reason == ("moved 2 tuning/eval/inference jobs (2 GPUs) to partition offload before bursting "
                          "training: they wait for capacity in the training queue, where 4 training jobs wait too")
    assert json.loads(off.data) == {"source": "w", "partition": "offload"}


def test_a_partly_failed_move_names_the_partition_in_what_moved_and_what_did_not(kit):
    w = SomeMovesFail(source="w", snap=snap("w", T0, *EVALS, *four()))
    kit.scaler(w).tick()
    tail = ("to partition light before bursting training: it waits for capacity in the training queue, "
            "where 4 training jobs wait too")
    (off,) = kit.decisions("offload")
    assert off.reason == f"moved 1 tuning/eval/inference job (1 GPU) {tail}"
    (failed,) = kit.decisions("offload_failed")
    assert failed.reason == f"offload 1 tuning/eval/inference job (1 GPU) {tail}; the move failed: job e1: " \
                            "partition light is full"


def test_on_a_mixed_queue_only_the_jobs_more_capacity_would_start_burst(kit):
    """Twenty nodes, one free: the two 4-GPU jobs fit on it (the scheduler will start them), the
    8-GPU one does not: only it bursts, and only its GPUs count against the threshold."""
    nodes = (*(ClusterNode(f"g{i}", "alloc", 8, 8, "L4") for i in range(19)), ClusterNode("g19", "idle", 8, 0, "L4"))
    fits = [job("a", gpus=4, waited_s=3000), job("b", gpus=4, waited_s=2900)]
    diag, d = kit.auto.on_snapshot(snap("q", T0, *fits, job("c", gpus=8), nodes=nodes))
    assert diag.verdict == "mixed" and d.action == "burst", d.reason
    assert [c.job.job_id for c in d.jobs] == ["c"]
    assert d.reason == "burst 1 job(s), 8 GPUs, because 8 GPUs pending stayed over the threshold of 1 for 0 s " \
                       "on a mixed queue"
    assert [l.job.job_id for l in kit.store.list_leases()] == ["c"]


def test_under_fifo_order_a_class_kept_off_spot_still_launches_on_demand(tmp_path):
    """``order = "fifo"`` skips the ranking, not the classes: a production job (its class says
    ``spot = false``) goes on demand although it says it can be interrupted; a job of the
    default class that can be goes on spot."""
    k = Kit(tmp_path, trigger={"order": "fifo"}, classes={"production": {"spot": False}})
    try:
        prod = job("p", job_class="prod", interruptible=True, waited_s=2400)  # past 30 min
        other = job("f", interruptible=True, waited_s=4000)  # past half its 2 h runtime
        _, d = k.auto.on_snapshot(snap("q", T0, prod, other))
        assert d.action == "burst" and sorted(c.job.job_id for c in d.jobs) == ["f", "p"], d.reason
        leases = {l.job.job_id: l for l in k.store.list_leases()}
        assert (leases["p"].market.value, leases["p"].demand.interruptible) == ("on_demand", False)
        assert (leases["f"].market.value, leases["f"].demand.interruptible) == ("spot", True)
    finally:
        k.svc.stop()


def test_a_burst_decision_names_the_offer_launched_not_its_alternative(kit):
    """One T4: the quote ranks Azure's NC4as_T4_v3 first and AWS's g4dn.xlarge second. Four
    interruptible L4s: GCP's g2-standard-48 on spot first, the same on demand second."""
    _, d = kit.auto.on_snapshot(snap("q", T0, *[job(i, gpu_model="T4") for i in range(4)]))
    _, spot = kit.auto.on_snapshot(snap("s", T0, *[job(f"s{i}", gpus=4, interruptible=True) for i in range(2)]))
    assert d.action == "burst" and spot.action == "burst", (d.reason, spot.reason)
    said = {"q": (d.reason, "azure/eastus Standard_NC4as_T4_v3 (on_demand)", ("aws", "g4dn.xlarge", "on_demand")),
            "s": (spot.reason, "gcp/us-central1 g2-standard-48 (spot)", ("gcp", "g2-standard-48", "on_demand"))}
    burst = kit.decisions("burst")
    assert {json.loads(r.data)["source"] for r in burst} == {"q", "s"}
    for rec in burst:
        lease = kit.store.get_lease(rec.lease_id)
        (jid,) = json.loads(rec.job_ids)
        reason, offer, second = said[json.loads(rec.data)["source"]]
        assert f"{lease.provider}/{lease.region} {lease.instance_type} ({lease.market.value})" == offer
        alt = lease.alternatives[0]
        assert (alt.provider, alt.instance_type, alt.market.value) == second
        assert rec.reason == f"{reason}; job {jid} → {offer}, quote {lease.quote_id}"


def test_a_lease_being_torn_down_is_in_flight_but_never_idle_capacity(kit):
    """An idle lease whose release could not finish (its cloud refused the terminate) is
    draining: its GPUs still count, but no scale-in names it again (the reconciler finishes it)."""
    lease = _idle_lease(kit, "q")
    kit.clouds["aws"].fail("terminate", ProviderError("api down", provider="aws"), times=5)
    with pytest.raises(Unavailable):
        kit.svc.lifecycle.release(lease.lease_id, "done")
    assert kit.svc.lifecycle.get(lease.lease_id).state is LeaseState.DRAINING
    assert kit.auto._cloud_state("q") == (1, {})
    idle_s = kit.auto.trigger_cfg.scale_in_idle_s
    kit.clock.advance(idle_s)
    _, d = kit.auto.on_snapshot(snap("q", T0 + idle_s))
    assert d.action == "hold" and d.scale_in == () and kit.decisions("scale_in") == []


def test_jobs_moved_already_are_not_moved_or_named_again_while_the_queue_still_shows_them(kit):
    """A scheduler's next report may still show the jobs it was told to move (a pushed source
    moves them itself; a watcher's move takes a moment): they are neither named in a second
    offload decision nor asked to move again."""
    queue = (*EVALS, *four())
    w = fake.Capable(source="w", snap=snap("w", T0, *queue))
    a = kit.scaler(w)
    a.tick()
    a.tick()
    assert [c for c in w.calls if c[0] == "offload"] == [("offload", ("e0", "e1"))]
    kit.auto.on_snapshot(snap("q", T0, *queue))
    kit.auto.on_snapshot(snap("q", T0 + 1, *queue))
    by_source = [(json.loads(d.data)["source"], sorted(json.loads(d.job_ids))) for d in kit.decisions("offload")]
    assert sorted(by_source) == [("q", ["e0", "e1"]), ("w", ["e0", "e1"])]
