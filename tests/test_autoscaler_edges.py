"""The autoscaler's diagnosis as the service asks for it (the source's allocation history within
``history_s``, at the clock's time), a snapshot that names no source, a hand-off that fails with
an error naming no job, and what counts as a source's capacity in flight; on the in-process service
with clouds in memory (tests/test_autoscaler_fake.py's kit)."""
from __future__ import annotations

import json

import pytest

from broker.records import Job
from policies.queue import ClusterNode
from tests import fake_scheduler as fake
from tests.test_autoscaler_fake import T0, Kit, four, job, snap

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
