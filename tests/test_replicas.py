"""Several replicas on one PostgreSQL store: every replica accepts a pushed queue, and only the
leader decides and launches (issue 11, item 2)."""
from __future__ import annotations

import contextlib

import pytest

from broker.v1 import broker_pb2 as pb
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.lease_kit import Clock, Watched, service, serving, wait_until
from tests.stores import pg_url_or_skip

pytestmark = pytest.mark.timeout(180)

AUTOSCALER = {"enabled": True, "default_gpu_model": "L4", "interval_s": 0.5,
              "trigger": {"stabilization_s": 0, "cooldown_s": 0, "pending_gpus_threshold": 4}}


@pytest.fixture
def pg():
    gen = pg_url_or_skip()
    yield next(gen)
    next(gen, None)


@pytest.fixture
def clock():
    """One clock for every replica, standing still: the leader decides on a pushed snapshot only
    while it is fresh (taken within three autoscaler intervals, 1.5 s here), and a loaded machine
    can take longer than that to tick; on this clock the snapshot stays fresh however long."""
    return Clock()


@contextlib.contextmanager
def replica(tmp_path, clouds, pg, name, clock, before=None):  # noqa: F811
    watched = {}

    def wrap(provider_name, p):
        watched[provider_name] = Watched(p, before)
        return watched[provider_name]

    work = tmp_path / name
    work.mkdir()
    # Leadership moves here only when a test moves it: a lease long enough that no stall of a
    # loaded machine lets it lapse (then the other replica would lead and launch, legitimately).
    # Expiry itself is tests/test_leader.py's subject.
    with service(work, clouds, clock=clock, wrap=wrap, store={"url": pg}, autoscaler=AUTOSCALER,
                 leader={"ttl_s": 60, "renew_s": 0.5}) as svc:
        assert svc.autoscaler is not None  # built by the service from [autoscaler]
        svc.start_background()
        with serving(svc) as stub:
            yield svc, stub, watched


def launches(watched) -> int:
    return sum(len(w.ops("launch")) for w in watched.values())


def queue(clock, source="kueue:prod"):
    nodes = [pb.ClusterNode(name=f"gpu-{i}", state="alloc", gpus_total=8, gpus_allocated=8, gpu_model="A100")
             for i in range(4)]
    pending = [pb.PendingJob(job_id=str(i), gpus=1, gpu_model="L4", est_runtime_s=7200, waited_s=60,
                             pending_reason="Resources", queue="gpu", user="ana") for i in range(6)]
    s = pb.QueueSnapshot(source=source, pending=pending, nodes=nodes)
    s.taken_at.FromNanoseconds(int(clock() * 1e9))
    return s


def test_a_queue_pushed_to_a_follower_is_decided_and_launched_by_the_leader(tmp_path, clouds, pg, clock):  # noqa: F811
    with replica(tmp_path, clouds, pg, "a", clock) as (a, stub_a, launched_a), \
            replica(tmp_path, clouds, pg, "b", clock) as (b, stub_b, launched_b):
        assert a.leadership.is_leader() and not b.leadership.is_leader()
        r = stub_b.ReportQueue(pb.ReportQueueRequest(snapshot=queue(clock)))
        assert r.diagnosis.verdict == pb.VERDICT_RESOURCE_BOUND
        assert [d.action for d in r.decisions] == ["deferred"], r.decisions
        assert launches(launched_b) == 0, "a replica that does not lead launched"

        def burst():
            leases = [l for l in stub_a.ListLeases(pb.ListLeasesRequest()).leases
                      if l.state == pb.LEASE_STATE_RUNNING]
            return leases if leases and all(l.job.job_id for l in leases) else None

        leases = wait_until(burst, timeout=60, what="the leader to burst the reported jobs")
        assert {l.job.job_id for l in leases} <= {str(i) for i in range(6)}
        assert launches(launched_a) >= len(leases) and launches(launched_b) == 0
        decisions = stub_b.ListDecisions(pb.ListDecisionsRequest()).decisions
        assert any(d.action == "burst" and d.lease_id for d in decisions)
        # the leader decided once: no job was burst twice, whatever replica reads the store
        jobs = [l.job.job_id for l in stub_b.ListLeases(pb.ListLeasesRequest()).leases]
        assert len(jobs) == len(set(jobs))
        assert launches(launched_b) == 0


def test_a_leader_replaced_mid_burst_stops_before_its_next_launch(tmp_path, clouds, pg, clock):  # noqa: F811
    """Fencing is per step, not per pass: the leader loses its lease while it launches the first
    of six bursts (another replica takes over); it launches nothing more, and the new leader
    carries the decision on from the store without launching any job twice."""
    from sqlalchemy import text

    box = {}

    def take_over(op, _arg):
        if op == "launch" and not box.get("done"):
            box["done"] = True
            # b takes the lease over in one statement, as its heartbeat does once a's has run out
            # (expiring the row and then beating would race a's own heartbeat, which renews it)
            b = box["b"].leadership
            with box["b"].store.engine.begin() as conn:
                conn.execute(text("UPDATE broker_leader SET holder = :b, term = term + 1, "
                                  "expires_at = extract(epoch from clock_timestamp()) + :ttl"),
                             {"b": b.replica, "ttl": b.ttl_s})
            assert b.beat()

    with replica(tmp_path, clouds, pg, "a", clock, before=take_over) as (a, stub_a, launched_a), \
            replica(tmp_path, clouds, pg, "b", clock) as (b, stub_b, launched_b):
        box["b"] = b
        assert a.leadership.is_leader()
        r = stub_a.ReportQueue(pb.ReportQueueRequest(snapshot=queue(clock)))
        assert [d.action for d in r.decisions] == ["deferred"], r.decisions
        assert launches(launched_a) == 1, "the replaced leader went on launching"
        assert b.is_leader() and not a.is_leader()

        def carried_on():
            leases = stub_b.ListLeases(pb.ListLeasesRequest()).leases
            return leases if launches(launched_b) and all(l.state == pb.LEASE_STATE_RUNNING for l in leases) else None

        leases = wait_until(carried_on, timeout=60, what="the new leader to carry the burst on")
        jobs = [l.job.job_id for l in leases]
        assert len(jobs) == len(set(jobs)) and len(jobs) > 1
        assert launches(launched_a) == 1
