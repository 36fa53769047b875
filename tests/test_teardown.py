"""Teardown that matches the job (issue 11, item 6): a lease is idle only when no job is attached
and none runs on it; with the default settings an idle lease is released after the idle timeout,
every lease at its maximum lifetime, and an operator can turn either off."""
from __future__ import annotations

import pytest

from broker.lease import LeaseState
from broker.lifecycle import Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.reconciler import Reconciler
from broker.store import Store
from broker.records import Job
from tests.fake_provider import FakeProvider
from tests.lease_kit import Clock

S = LeaseState
DAY = 86400.0


@pytest.fixture
def make(tmp_path, mini_catalog):
    stores = []

    def _make(**settings):
        clock = Clock(1_800_000_000.0)
        cloud = FakeProvider("aws", clock=clock)
        store = Store(f"sqlite:///{tmp_path / f'b{len(stores)}.db'}")
        stores.append(store)
        lc = Lifecycle(store, {"aws": cloud}, QuoteEngine(mini_catalog), owner="test", clock=clock,
                       settings=Settings(**settings), sleep=lambda _: None)
        return lc, Reconciler(lc, orphan_grace_s=120.0, clock=clock), cloud, clock

    yield _make
    for s in stores:
        s.close()


def launch(lc, key, job=None, **kw):
    target = lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "on_demand", 1)
    return lc.launch(idempotency_key=key, target=target, job=job or {}, **kw)


def test_defaults_release_an_idle_lease_and_spare_one_whose_job_runs(make):
    lc, rec, cloud, clock = make()
    s = lc.settings
    assert s.idle_timeout_s > 0 and s.max_lifetime_s > s.idle_timeout_s, "no default teardown"
    with_job = launch(lc, "with-job", job=Job(job_id="4211", owner="ana"))
    idle = launch(lc, "idle")
    slurm_node = launch(lc, "slurm-node", job=Job(node_names=("burst-1",)))  # Slurm runs jobs on it
    clock.advance(s.idle_timeout_s + 1)
    rec.run_pass()
    assert lc.get(with_job.lease_id).state is S.RUNNING, "a lease whose job runs was torn down as idle"
    assert lc.get(slurm_node.lease_id).state is S.RUNNING
    gone = lc.get(idle.lease_id)
    assert gone.state is S.RELEASED and "idle" in gone.state_reason and "no job" in gone.state_reason
    # a job handed off later makes a lease busy; its maximum lifetime still ends it
    later = launch(lc, "later")
    lc.handoff(later.lease_id, Job(job_id="7"))
    clock.advance(s.max_lifetime_s)
    rec.run_pass()
    for lease in (with_job, slurm_node, later):
        after = lc.get(lease.lease_id)
        assert after.state is S.RELEASED and "maximum lifetime" in after.state_reason, after.state_reason
    assert cloud.alive() == []


def test_a_lease_without_a_job_is_gone_within_30_days_by_default(make):
    lc, rec, cloud, clock = make()
    lease = launch(lc, "forgotten")
    for _ in range(30):
        clock.advance(DAY)
        rec.run_pass()
    assert lc.get(lease.lease_id).state is S.RELEASED and cloud.alive() == []


def test_the_operator_can_turn_both_off(make):
    lc, rec, cloud, clock = make(idle_timeout_s=0, max_lifetime_s=0)
    idle, busy = launch(lc, "idle"), launch(lc, "busy", job=Job(job_id="1"))
    clock.advance(30 * DAY)
    rec.run_pass()
    assert [lc.get(l.lease_id).state for l in (idle, busy)] == [S.RUNNING, S.RUNNING]
    assert len(cloud.alive()) == 2
    # a lifetime asked for by the launch still holds
    short = launch(lc, "short", max_lifetime_s=3600)
    clock.advance(3601)
    rec.run_pass()
    assert lc.get(short.lease_id).state is S.RELEASED
