"""The autoscaler's own rules on the in-process service with clouds in memory
(tests/fake_provider.py) and a clock the test moves: which pushed snapshots are decided on, what
a job asks of the clouds, what counts as this source's capacity in flight and idle, what is
recorded once, and how a burst that cannot launch is said. ``tests/test_autoscaler.py`` walks the
same code through gRPC on the mocked clouds."""
from __future__ import annotations

import json
import re

import pytest
from structlog.testing import capture_logs

from broker import config as cfgmod
from broker.autoscaler import Autoscaler, autoscaler_for
from broker.lease import LeaseState
from broker.records import Job
from broker.service import Service
from broker.watchers.base import HandoffError
from broker.watchers.snapshot_json import encode
from policies.demand import Demand
from policies.queue import ClusterNode, PendingJob, QueueSnapshot, RunningJob
from providers.base import CapacityError
from tests import fake_scheduler as fake
from tests.fake_provider import FakeProvider
from tests.lease_kit import Clock
from tests.test_failover import REGIONS, SETTINGS

pytestmark = pytest.mark.timeout(120)

T0 = 1_800_000_000.0
TRIGGER = {"stabilization_s": 0, "cooldown_s": 0, "pending_gpus_threshold": 1}


def settings(**autoscaler):
    trigger = {**TRIGGER, **autoscaler.pop("trigger", {})}
    return {"enabled": True, "default_gpu_model": "L4", "interval_s": 10.0, "trigger": trigger, **autoscaler}


class Kit:
    def __init__(self, tmp_path, **autoscaler):
        self.clock = Clock(T0)
        self.clouds = {name: FakeProvider(name, clock=self.clock) for name in REGIONS}
        cfg = cfgmod.load(None, environ={}, overrides={
            "store.url": f"sqlite:///{tmp_path / 'broker.db'}", "owner": "broker-test",
            "providers": {name: {"enabled": True, "regions": regions, **SETTINGS[name]}
                          for name, regions in REGIONS.items()},
            "lifecycle": {"backoff_s": 0, "retries": 1},
            "autoscaler": settings(**autoscaler)})
        self.svc = Service(cfg, providers=self.clouds, clock=self.clock)
        self.store = self.svc.store
        self.auto = self.svc.autoscaler

    def scaler(self, *watchers) -> Autoscaler:
        s = self.svc.config.autoscaler
        return Autoscaler(self.svc, s, s.trigger_config(), s.diagnose_config(),
                          watchers={w.source: w for w in watchers}, clock=self.clock)

    def decisions(self, action: str | None = None) -> list:
        every = self.store.list_decisions(limit=1000)
        # a decision's id says what it is, as a quote's and a lease's do
        assert all(re.fullmatch(r"d-[0-9a-z]+-[0-9a-f]{8}", d.decision_id) for d in every), every
        return [d for d in every if action is None or d.action == action]

    def alive(self) -> int:
        return sum(len(c.alive()) for c in self.clouds.values())


@pytest.fixture
def kit(tmp_path):
    k = Kit(tmp_path)
    try:
        yield k
    finally:
        k.svc.stop()


FULL = tuple(ClusterNode(f"gpu-{i}", "alloc", 8, 8, "A100") for i in range(4))


def job(i, gpus=1, **kw) -> PendingJob:
    kw.setdefault("gpu_model", "L4")
    kw.setdefault("est_runtime_s", 7200)
    kw.setdefault("waited_s", 600)
    kw.setdefault("pending_reason", "Resources")
    return PendingJob(str(i), gpus, user="ana", queue="gpu", **kw)


def four(*ids) -> list[PendingJob]:
    """Four one-GPU training jobs waiting on a full cluster: a resource-bound queue that bursts."""
    return [job(i) for i in (ids or range(4))]


def snap(source, taken_at, *pending, nodes=FULL, running=()) -> QueueSnapshot:
    return QueueSnapshot(source, taken_at, tuple(pending), nodes, running=tuple(running))


# -- what a job asks of the clouds -----------------------------------------------------------------
def test_a_jobs_demand_takes_its_runtime_model_and_memory_else_the_defaults(kit):
    a = kit.auto
    d = a.demand_for(job(1, gpus=4, gpu_model="h100", est_runtime_s=3600, nodes=2, data_gb=5.0,
                         interruptible=True, checkpoint_minutes=15))
    assert d == Demand(gpus=4, hours=1.2, gpu_model="H100", min_gpu_memory_gb=0, nodes=2, data_in_gb=5.0,
                       data_location="onprem", interruptible=True, checkpoint_minutes=15, tenant="default",
                       job_id="1")
    # no estimate: the time limit; neither: default_runtime_s (3600 s), both times runtime_margin
    assert a.demand_for(job(2, est_runtime_s=0, time_limit_s=7200)).hours == pytest.approx(2.4)
    assert a.demand_for(job(3, est_runtime_s=0)).hours == pytest.approx(1.2)
    # a very short job is quoted for at least three minutes
    assert a.demand_for(job(4, est_runtime_s=60)).hours == pytest.approx(0.05)
    assert a.demand_for(job(5, est_runtime_s=300)).hours == pytest.approx(0.1)
    # memory instead of a model: no default model; neither: the default model, no memory floor
    mem = a.demand_for(job(6, gpu_model="", min_gpu_memory_gb=40))
    assert (mem.gpu_model, mem.min_gpu_memory_gb) == ("", 40)
    dflt = a.demand_for(job(7, gpu_model=""))
    assert (dflt.gpu_model, dflt.min_gpu_memory_gb) == ("L4", 0)
    # nodes only when they split the GPUs evenly
    assert a.demand_for(job(8, gpus=4, nodes=3)).nodes == 0
    assert a.demand_for(job(9, gpus=4, nodes=4)).nodes == 4


def test_without_a_default_model_a_job_naming_nothing_asks_for_the_default_memory(tmp_path):
    k = Kit(tmp_path, default_gpu_model="", default_min_gpu_memory_gb=24)
    try:
        d = k.auto.demand_for(job(1, gpu_model=""))
        assert (d.gpu_model, d.min_gpu_memory_gb) == ("", 24)
    finally:
        k.svc.stop()


def test_a_jobs_demand_says_where_its_data_lives_as_configured(tmp_path):
    k = Kit(tmp_path, data_location="aws:us-east-1")
    try:
        assert k.auto.demand_for(job(1, data_gb=50.0)).data_location == "aws:us-east-1"
    finally:
        k.svc.stop()


def test_a_lease_left_requested_under_a_jobs_key_is_launched_by_the_next_burst(kit):
    # a burst recorded its lease and stopped before the launch (a restart): the next one launches it
    t = kit.svc.lifecycle.target_explicit("aws", "us-east-1", "", "g6.xlarge", "on_demand", 1)
    left, _ = kit.svc.lifecycle.create(idempotency_key="auto-q-0", target=t, job=Job(job_id="0", source="q"))
    assert left.state is LeaseState.REQUESTED
    _, d = kit.auto.on_snapshot(snap("q", T0, job(0, gpus=4)))
    assert d.action == "burst" and [c.job.job_id for c in d.jobs] == ["0"], d.reason
    assert [l.lease_id for l in kit.store.list_leases()] == [left.lease_id]
    assert kit.store.get_lease(left.lease_id).state is LeaseState.RUNNING


def test_a_burst_is_charged_to_the_jobs_queue_when_asked(tmp_path):
    k = Kit(tmp_path, tenant_from_queue=True)
    try:
        assert k.auto.demand_for(job(1)).tenant == "gpu"
        assert k.auto.demand_for(PendingJob("2", 1, gpu_model="L4")).tenant == "default"
        k.auto.on_snapshot(snap("q", T0, *four()))
        leases = k.store.list_leases()
        assert leases and {l.tenant for l in leases} == {"gpu"}
    finally:
        k.svc.stop()


# -- a burst launches leases, once per job ------------------------------------------------------------
def test_a_burst_launches_one_lease_per_job_with_its_quote_and_alternatives(kit):
    diag, d = kit.auto.on_snapshot(snap("q", T0, *[job(i) for i in range(4)]))
    assert diag.verdict == "resource-bound" and d.action == "burst", d.reason
    leases = kit.store.list_leases()
    assert sorted(l.job.job_id for l in leases) == sorted(c.job.job_id for c in d.jobs)
    burst = kit.decisions("burst")
    assert len(burst) == len(leases)
    for l in leases:
        assert l.state is LeaseState.RUNNING and l.idempotency_key == f"auto-q-{l.job.job_id}"
        assert (l.job.source, l.job.owner, l.job.queue, l.tenant) == ("q", "ana", "gpu", "default")
        # max_failover (4) offers of the five the quote has: the first and three alternatives
        assert l.quote_id and l.offer_rank == 1 and len(l.alternatives) == kit.svc.lifecycle.settings.max_failover - 1
        assert l.demand.job_id == l.job.job_id and l.demand.gpus == 1
        assert l.bootstrap == ""  # a pushed source's node joins no cluster
        (rec,) = [r for r in burst if r.lease_id == l.lease_id]
        assert json.loads(rec.job_ids) == [l.job.job_id]
        assert json.loads(rec.data) == {"source": "q", "trigger": d.trigger}
        assert rec.reason.startswith(f"{d.reason}; job {l.job.job_id} → {l.provider}/{l.region} {l.instance_type} "
                                     f"({l.market.value}), quote {l.quote_id}")
    assert kit.alive() == len(leases)
    # the same jobs again: none is burst twice (they are in flight)
    kit.clock.advance(10)
    kit.auto.on_snapshot(snap("q", T0 + 10, *[job(i) for i in range(4)]))
    assert len(kit.store.list_leases()) == len(leases) and len(kit.decisions("burst")) == len(leases)


def test_a_job_gone_from_the_queue_is_forgotten_and_may_burst_again(kit):
    kit.auto.on_snapshot(snap("q", T0, *four()))
    st = kit.auto.sources["q"]
    first = set(st.burst_jobs)
    assert len(first) >= 2 and first <= {"0", "1", "2", "3"}
    # a burst job still reported running stays known; one neither pending nor running is dropped
    (kept, *gone) = sorted(first)
    kit.clock.advance(10)
    kit.auto.on_snapshot(snap("q", T0 + 10, running=[RunningJob(kept, 1)]))
    assert st.burst_jobs == {kept}
    kit.clock.advance(10)
    kit.auto.on_snapshot(snap("q", T0 + 20))
    assert st.burst_jobs == set()


def test_a_launch_that_fails_everywhere_is_a_burst_failed_naming_the_job(kit):
    for c in kit.clouds.values():
        c.fail("launch", CapacityError("none left", provider=c.name, code="InsufficientCapacity"), times=100)
    _, d = kit.auto.on_snapshot(snap("q", T0, *four()))
    assert d.action == "burst", d.reason
    failed = kit.decisions("burst_failed")
    assert {tuple(json.loads(f.job_ids)) for f in failed} == {(c.job.job_id,) for c in d.jobs}
    for f in failed:
        (jid,) = json.loads(f.job_ids)
        assert f.reason.startswith(f"job {jid}: lease ") and "could not be launched" in f.reason
        assert json.loads(f.data) == {"source": "q"}
    assert all(l.state is LeaseState.FAILED for l in kit.store.list_leases())


def test_a_job_no_offer_fits_is_a_burst_failed_with_the_quotes_reasons(kit):
    # three nodes of one H100 each: every H100 machine has 8
    _, d = kit.auto.on_snapshot(snap("q", T0, *[job(i, gpus=3, nodes=3, gpu_model="H100") for i in range(4)]))
    assert d.action == "burst", d.reason
    failed = kit.decisions("burst_failed")
    assert len(failed) == len(d.jobs) > 0 and not kit.store.list_leases()
    for f in failed:
        (jid,) = json.loads(f.job_ids)
        assert f.reason == f"job {jid}: every offer excluded (8 GPUs per node cannot make 3 nodes of 1 GPUs)"
        data = json.loads(f.data)
        assert data["source"] == "q" and data["quote_id"]


def test_a_burst_failed_names_the_two_commonest_reasons_offers_were_excluded_for(kit):
    # two L4 GPUs on each of three nodes: machines of 1 GPU (the commonest), 4 and 8 GPUs are refused
    _, d = kit.auto.on_snapshot(snap("q", T0, *[job(i, gpus=6, nodes=3) for i in range(4)]))
    assert d.action == "burst", d.reason
    failed = kit.decisions("burst_failed")
    assert len(failed) == len(d.jobs) > 0
    for f in failed:
        (jid,) = json.loads(f.job_ids)
        assert f.reason == (f"job {jid}: every offer excluded (1 GPUs per node cannot make 3 nodes of 2 GPUs; "
                            "4 GPUs per node cannot make 3 nodes of 2 GPUs)")


def test_a_job_that_is_no_demand_is_a_burst_failed(kit):
    _, d = kit.auto.on_snapshot(snap("q", T0, *[job(i, gpu_model="NOPE") for i in range(4)]))
    assert d.action == "burst", d.reason
    failed = kit.decisions("burst_failed")
    assert len(failed) == len(d.jobs) > 0 and not kit.store.list_leases()
    for f in failed:
        (jid,) = json.loads(f.job_ids)
        assert f.reason.startswith(f"job {jid}: no demand: demand.gpu_model: unknown GPU model 'NOPE'")
        assert json.loads(f.data) == {"source": "q"}


def test_a_jobs_class_sets_its_wait_target(kit):
    """A production job waiting past its class's 30 minutes goes, although its runtime is a week."""
    prod = job("t1", est_runtime_s=168 * 3600, waited_s=2400, job_class="prod", priority=100, qos="high")
    _, d = kit.auto.on_snapshot(snap("q", T0, prod))
    assert d.action == "burst" and [c.job.job_id for c in d.jobs] == ["t1"], d.reason
    assert "class production 30 min" in d.reason


# -- what counts as this source's capacity ------------------------------------------------------------
def test_only_this_sources_leases_count_as_gpus_in_flight(tmp_path):
    k = Kit(tmp_path, trigger={"max_gpus_in_flight": 2})
    try:
        k.auto.on_snapshot(snap("a", T0, *four()))
        assert len(k.store.list_leases()) == 2  # the limit
        gpus, idle = k.auto._cloud_state("a")
        assert (gpus, idle) == (2, {})
        assert k.auto._cloud_state("b") == (0, {})
        k.clock.advance(10)
        _, held = k.auto.on_snapshot(snap("a", T0 + 10, *four(4, 5, 6, 7)))
        assert held.action == "hold" and "2 cloud GPUs are already in flight (limit 2)" in held.reason
        # another source is not held back by a's capacity
        _, other = k.auto.on_snapshot(snap("b", T0 + 10, *four(8, 9, 10, 11)))
        assert other.action == "burst", other.reason
    finally:
        k.svc.stop()


def _idle_lease(k, source: str, key: str = "idle"):
    t = k.svc.lifecycle.target_explicit("aws", "us-east-1", "", "g6.xlarge", "on_demand", 1)
    return k.svc.lifecycle.launch(idempotency_key=key, target=t, job=Job(source=source))


def test_an_idle_lease_of_the_source_is_scaled_in_after_the_idle_window(kit):
    lease = _idle_lease(kit, "q")
    assert lease.state is LeaseState.RUNNING and lease.idle_since == T0
    assert kit.auto._cloud_state("q") == (1, {lease.lease_id: T0})
    assert kit.auto._cloud_state("other") == (0, {})
    idle_s = kit.auto.trigger_cfg.scale_in_idle_s
    kit.clock.advance(idle_s - 1)
    _, d = kit.auto.on_snapshot(snap("q", T0 + idle_s - 1))
    assert d.action == "hold" and kit.svc.lifecycle.get(lease.lease_id).state is LeaseState.RUNNING
    kit.clock.advance(1)
    _, d = kit.auto.on_snapshot(snap("q", T0 + idle_s))
    assert d.action == "scale_in" and d.scale_in == (lease.lease_id,)
    after = kit.svc.lifecycle.get(lease.lease_id)
    assert after.state is LeaseState.RELEASED and after.state_reason == "scale-in: idle cloud capacity"
    (rec,) = kit.decisions("scale_in")
    assert json.loads(rec.data) == {"leases": [lease.lease_id]} and rec.reason == d.reason
    assert kit.alive() == 0


def test_a_lease_with_a_job_or_scheduler_nodes_is_not_idle(kit):
    lc = kit.svc.lifecycle
    t = lc.target_explicit("aws", "us-east-1", "", "g6.xlarge", "on_demand", 1)
    lc.launch(idempotency_key="busy", target=t, job=Job(job_id="j", source="q"))
    lc.launch(idempotency_key="nodes", target=t, job=Job(node_names=("n1",), source="q"))
    assert kit.auto._cloud_state("q") == (2, {})


def test_a_watched_source_that_hands_bursts_over_counts_its_schedulers_own_nodes_in_flight(kit):
    lc = kit.svc.lifecycle
    t = lc.target_explicit("aws", "us-east-1", "", "g6.xlarge", "on_demand", 1)
    lc.launch(idempotency_key="resumed", target=t, job=Job(node_names=("cloud-1",)))  # no source
    lc.launch(idempotency_key="plain", target=t, job=Job())  # no source, no nodes: nobody's
    handing = kit.scaler(fake.Capable(source="w"))
    assert handing._cloud_state("w") == (1, {})
    plain = kit.scaler(fake.Plain(source="w"))
    assert plain._cloud_state("w") == (0, {})


def test_a_released_lease_is_no_longer_in_flight(kit):
    lease = _idle_lease(kit, "q")
    kit.svc.lifecycle.release(lease.lease_id)
    assert kit.auto._cloud_state("q") == (0, {})


# -- what is decided on -------------------------------------------------------------------------------
def _push(k, source, taken_at, *pending):
    k.store.save_snapshot(source, taken_at, encode(snap(source, taken_at, *pending)))


def test_only_pushed_snapshots_fresher_than_three_intervals_and_not_yet_decided_count(kit):
    a = kit.auto
    interval = a.interval_s
    _push(kit, "old", T0 - 3 * interval, *four())  # exactly three intervals old: stale
    _push(kit, "new", T0 - 3 * interval + 1, *four())
    out = a.on_pushed(T0)
    assert [d.action for d in out] == ["burst"] and set(a.sources) == {"new"}
    assert a.sources["new"].last_taken_at == T0 - 3 * interval + 1
    assert a.on_pushed(T0) == []  # decided on already
    _push(kit, "new", T0 - 1, *four(4, 5, 6, 7))  # a newer one from the same source
    assert len(a.on_pushed(T0)) == 1 and a.sources["new"].last_taken_at == T0 - 1


def test_a_watched_sources_pushed_snapshot_is_left_to_its_watcher(kit):
    w = fake.Plain(source="w", snap=snap("w", T0, *four()))
    a = kit.scaler(w)
    _push(kit, "w", T0 - 1, job(1), job(2))
    assert a.on_pushed(T0) == []
    out = a.tick()  # the watcher's own snapshot, read once
    assert len(out) == 1 and set(a.sources) == {"w"}


def test_a_watcher_that_cannot_be_read_is_skipped_and_logged_by_name_with_the_error(kit):
    broken = fake.Plain(source="broken", fail="connection refused")
    good = fake.Plain(source="good", snap=snap("good", T0, *four()))
    with capture_logs() as logs:
        out = kit.scaler(broken, good).tick()
    assert [d.action for d in out] == ["burst"]
    assert [e for e in logs if e["event"] == "snapshot_failed"] == [
        {"event": "snapshot_failed", "source": "broken", "error": "connection refused", "log_level": "warning"}]


def test_a_pushed_snapshot_left_out_does_not_stop_the_later_ones(kit):
    w = fake.Plain(source="w", snap=snap("w", T0, *four()))
    a = kit.scaler(w)
    _push(kit, "w", T0 - 3, *four())  # the watcher's own: left to it
    _push(kit, "a", T0 - 2, *four())
    assert [kit.store.snapshots_since(0)[i][0] for i in (0, 1)] == ["w", "a"]
    assert len(a.on_pushed(T0)) == 1 and set(a.sources) == {"a"}
    _push(kit, "b", T0 - 1, *four(4, 5, 6, 7))  # after "a", decided on already
    assert len(a.on_pushed(T0)) == 1 and set(a.sources) == {"a", "b"}


def test_an_older_snapshot_does_not_move_the_last_decided_time_back(kit):
    a = kit.auto
    a.on_snapshot(snap("q", T0))
    a.on_snapshot(snap("q", T0 - 100))
    assert a.sources["q"].last_taken_at == T0


def test_the_allocation_history_keeps_the_window_and_only_clusters_with_gpus(kit):
    a = kit.auto
    half = tuple(ClusterNode(f"n{i}", "mix", 8, 4, "A100") for i in range(2))
    a.on_snapshot(snap("q", T0, nodes=half))
    a.on_snapshot(snap("q", T0, nodes=()))  # no GPUs: no sample
    assert list(a.sources["q"].history) == [(T0, 0.5)]


def test_a_hold_is_recorded_once_until_its_reason_changes(kit):
    a = kit.auto
    a.on_snapshot(snap("q", T0))
    a.on_snapshot(snap("q", T0 + 1))
    holds = kit.decisions("hold")
    assert len(holds) == 1 and json.loads(holds[0].data) == {"source": "q"}
    a.on_snapshot(snap("q", T0 + 2, job(1)))  # another reason: 1 GPU pending
    assert len(kit.decisions("hold")) == 2
    _, d = a.on_snapshot(snap("q", T0 + 3, *four()))  # a burst forgets the last hold
    assert d.action == "burst"
    a.on_snapshot(snap("q", T0 + 4))
    assert len(kit.decisions("hold")) == 3


# -- offloading light jobs --------------------------------------------------------------------------------
EVALS = [job(f"e{i}", kind="eval") for i in range(2)]


def test_a_pushed_source_gets_an_offload_decision_and_the_moved_jobs_do_not_burst(kit):
    a = kit.auto
    a.on_snapshot(snap("q", T0, *EVALS, *[job(i) for i in range(4)]))
    (off,) = kit.decisions("offload")
    assert sorted(json.loads(off.job_ids)) == ["e0", "e1"]
    assert json.loads(off.data) == {"source": "q", "partition": ""}
    assert off.reason.startswith("offload 2 tuning/eval/inference jobs")
    assert not {"e0", "e1"} & {l.job.job_id for l in kit.store.list_leases()}
    assert a.sources["q"].offloaded == {"e0", "e1"}
    # reported again: not offloaded twice; once gone from the queue, forgotten
    a.on_snapshot(snap("q", T0 + 1, *EVALS))
    assert len(kit.decisions("offload")) == 1
    a.on_snapshot(snap("q", T0 + 2, EVALS[0]))
    assert a.sources["q"].offloaded == {"e0"}


def test_a_watcher_moves_light_jobs_and_a_failed_move_is_recorded_once(kit):
    w = fake.Capable(source="w", snap=snap("w", T0, *EVALS, *[job(i) for i in range(4)]))
    a = kit.scaler(w)
    a.tick()
    assert w.calls[0] == ("offload", ("e0", "e1"))
    (off,) = kit.decisions("offload")
    assert off.reason.startswith("moved 2 tuning/eval/inference jobs")
    assert json.loads(off.data) == {"source": "w", "partition": "light"}
    stuck = MoveFails(source="r", snap=snap("r", T0, *EVALS, *four()))
    b = kit.scaler(stuck)
    b.tick()
    b.tick()
    (failed,) = kit.decisions("offload_failed")
    assert failed.reason.endswith("; the move failed: partition light is down")
    assert failed.reason.startswith("offload 2 tuning/eval/inference jobs")
    assert sorted(json.loads(failed.job_ids)) == ["e0", "e1"]
    assert json.loads(failed.data) == {"source": "r"} and b.sources["r"].offloaded == set()


class MoveFails(fake.Capable):
    def offload(self, job_ids: list[str]) -> list[str]:
        self.calls.append(("offload", tuple(job_ids)))
        raise RuntimeError("partition light is down")


class SomeMovesFail(fake.Capable):
    """Moves every job but e1 (the others are moved, as a HandoffError says)."""

    def offload(self, job_ids: list[str]) -> list[str]:
        self.calls.append(("offload", tuple(job_ids)))
        if "e1" in job_ids:
            raise HandoffError.of([("e1", "partition light is full")])
        return list(job_ids)


def test_the_jobs_a_partly_failed_move_moved_do_not_burst_and_the_others_burst_as_usual(kit):
    """A move that fails for some jobs moved the others: those are offloaded (recorded, not
    counted by the trigger, not handed over to burst). A job left in the training queue is an
    ordinary pending job: it bursts if and only if the trigger picks it, as on a queue with no
    offload queue."""
    w = SomeMovesFail(source="w", snap=snap("w", T0, *EVALS, *four()))
    a = kit.scaler(w)
    (d,) = a.tick()
    assert a.sources["w"].offloaded == {"e0"}
    (off,) = kit.decisions("offload")
    assert json.loads(off.job_ids) == ["e0"] and off.reason.startswith("moved 1 tuning/eval/inference job ")
    (failed,) = kit.decisions("offload_failed")
    assert json.loads(failed.job_ids) == ["e1"]
    assert failed.reason.startswith("offload 1 tuning/eval/inference job ")
    assert failed.reason.endswith("; the move failed: job e1: partition light is full")
    (handed,) = [c[1] for c in w.calls if c[0] == "allow_burst"]
    assert "e0" not in handed and "e1" in handed
    # the same queue without e0 and with nowhere to move e1 hands over the same jobs
    ref = fake.Capable(source="n", snap=snap("n", T0, EVALS[1], *four()), offload_queue="")
    _, d_ref = kit.scaler(ref).on_snapshot(ref.snapshot(T0))
    assert [c[1] for c in ref.calls if c[0] == "allow_burst"] == [handed]
    assert [c.job.job_id for c in d.jobs] == [c.job.job_id for c in d_ref.jobs]


def test_a_watcher_with_no_offload_queue_moves_nothing(kit):
    w = fake.Capable(source="w", snap=snap("w", T0, *EVALS), offload_queue="")
    kit.scaler(w).tick()
    assert not [c for c in w.calls if c[0] == "offload"] and not kit.decisions("offload")
    plain = fake.Plain(source="p", snap=snap("p", T0, *EVALS))
    kit.scaler(plain).tick()
    assert not kit.decisions("offload")


# -- hand-off to the scheduler ----------------------------------------------------------------------------
def test_a_watcher_that_hands_bursts_over_gets_the_job_ids_and_no_lease(kit):
    w = fake.Capable(source="w", snap=snap("w", T0, *[job(i) for i in range(4)]))
    (d,) = kit.scaler(w).tick()
    (call,) = [c for c in w.calls if c[0] == "allow_burst"]
    assert list(call[1]) == [c.job.job_id for c in d.jobs] and call[1]
    assert kit.store.list_leases() == []
    (rec,) = kit.decisions("burst")
    assert json.loads(rec.data) == {"source": "w", "trigger": d.trigger, "handoff": "scheduler"}
    assert json.loads(rec.job_ids) == list(call[1]) and rec.reason == d.reason


def test_a_refused_hand_off_is_recorded_once_and_the_jobs_may_burst_again(kit):
    w = fake.Capable(source="w", snap=snap("w", T0, *[job(i) for i in range(4)]),
                     refuse=frozenset({"0", "1", "2", "3"}))
    a = kit.scaler(w)
    a.tick()
    (failed,) = kit.decisions("burst_failed")
    assert "; hand-off failed: job " in failed.reason and json.loads(failed.data) == {"source": "w"}
    assert a.sources["w"].burst_jobs == set()
    a.tick()
    assert len(kit.decisions("burst_failed")) == 1
    assert len([c for c in w.calls if c[0] == "allow_burst"]) == 2


def test_a_hand_off_refused_for_some_jobs_keeps_the_others_sent_out(kit):
    """A HandoffError names the jobs it could not hand over; the others were handed over: they
    are recorded as a burst and not handed over again, while the refused one may go next time."""
    w = fake.Capable(source="w", snap=snap("w", T0, *four()), refuse=frozenset({"1"}))
    a = kit.scaler(w)
    (d,) = a.tick()
    chosen = [c.job.job_id for c in d.jobs]
    assert "1" in chosen and len(chosen) > 1
    others = [i for i in chosen if i != "1"]
    assert a.sources["w"].burst_jobs == set(others)
    (failed,) = kit.decisions("burst_failed")
    assert json.loads(failed.job_ids) == ["1"] and failed.reason.endswith("hand-off failed: job 1: refused by the fake")
    (burst,) = kit.decisions("burst")
    assert json.loads(burst.job_ids) == others and json.loads(burst.data)["handoff"] == "scheduler"
    w.refuse = frozenset()
    a.tick()
    assert [c[1] for c in w.calls if c[0] == "allow_burst"][1] == ("1",)
    assert a.sources["w"].burst_jobs == set(chosen) and len(kit.decisions("burst")) == 2


def test_a_failing_move_and_a_failing_hand_off_are_each_recorded_once(kit):
    """Both fail on every tick: each failure is recorded once, not again because the other one
    was recorded in between."""
    ids = frozenset({"e0", "e1", "0", "1", "2", "3"})
    w = MoveFails(source="w", snap=snap("w", T0, *EVALS, *four()), refuse=ids)
    a = kit.scaler(w)
    for _ in range(3):
        a.tick()
    assert len([c for c in w.calls if c[0] == "offload"]) == 3
    assert len([c for c in w.calls if c[0] == "allow_burst"]) == 3
    assert len(kit.decisions("offload_failed")) == 1
    assert len(kit.decisions("burst_failed")) == 1
    w.refuse = frozenset()  # the hand-off works once: the same failure after it is recorded again
    a.tick()
    w.refuse, full = ids, w.snap
    w.snap = snap("w", T0)  # the jobs leave the queue and come back (requeued)
    a.tick()
    w.snap = full
    a.tick()
    assert len(kit.decisions("burst_failed")) == 2 and len(kit.decisions("offload_failed")) == 1


def test_a_joining_watcher_gets_leases_that_boot_into_its_cluster(kit):
    w = fake.Joining(source="w", snap=snap("w", T0, *four()))
    kit.scaler(w).tick()
    leases = kit.store.list_leases()
    assert leases
    for l in leases:
        assert l.bootstrap == "container"
        assert l.job.env == {"FAKE_CLUSTER": "w", "FAKE_JOB": l.job.job_id}


def test_the_service_builds_an_autoscaler_only_when_enabled(tmp_path):
    k = Kit(tmp_path, enabled=False)
    try:
        assert k.svc.autoscaler is None and autoscaler_for(k.svc) is None
    finally:
        k.svc.stop()
