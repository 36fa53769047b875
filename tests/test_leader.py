"""Leader election on PostgreSQL: one leader among replicas, a lease with a renewal deadline, a
fencing term checked before every step, and takeover within ttl_s + renew_s (12 s by default, 15 s
required) of a leader frozen or killed."""
from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest
import tomli_w

from broker.errors import Unavailable
from broker.leader import Leadership, NotLeader
from broker.store import Store
from tests.clouds.three import ServeProcess, _free_port
from tests.lease_kit import wait_until
from tests.stores import pg_url_or_skip


@pytest.fixture
def pg():
    gen = pg_url_or_skip()
    yield next(gen)
    next(gen, None)


def test_one_leader_and_failover(pg):
    a, b = Store(pg), Store(pg)  # two replicas; the second also races schema creation safely
    try:
        la, lb = Leadership(a), Leadership(b)
        assert la.beat() is True and la.is_leader()
        assert lb.beat() is False and not lb.is_leader()
        assert la.beat() is True and la.fence() == la.term  # renewing keeps the term
        la.release()  # a graceful stop hands over at once
        assert lb.beat() is True and lb.term == la.term + 1
        assert la.beat() is False
        with pytest.raises(NotLeader):
            la.fence()
    finally:
        a.close()
        b.close()


def test_a_leader_that_stops_renewing_loses_leadership_and_its_term(pg):
    """What a SIGSTOP does to a leader: it stops renewing. Its lease runs out on the database's
    clock, another replica takes over with a new term, and the old leader — when it runs again —
    is fenced off before its next step, on its own deadline and on the row."""
    a, b = Store(pg), Store(pg)
    try:
        changes: list[bool] = []
        la = Leadership(a, ttl_s=1.0, renew_s=0.2, on_change=changes.append)
        lb = Leadership(b, ttl_s=1.0, renew_s=0.2)
        assert la.beat() and not lb.beat()
        first = la.fence()
        wait_until(lb.beat, timeout=5, interval=0.1, what="the other replica to take over")
        assert lb.term == first + 1
        assert not la.is_leader()  # its own deadline passed while it did nothing
        with pytest.raises(NotLeader) as e:
            la.fence()
        assert isinstance(e.value, Unavailable)
        la._valid_until = time.monotonic() + 60  # even a replica whose clock lies is fenced by the row
        with pytest.raises(NotLeader, match="term"):
            la.fence()
        assert changes == [False, True, False]
        assert la.beat() is False and lb.fence() == lb.term
    finally:
        a.close()
        b.close()


def test_sqlite_owner_always_leads(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'b.db'}")
    le = Leadership(s)
    assert le.is_leader() and le.fence() == 1
    s.close()


@pytest.mark.parametrize("section, field", [
    ({"ttl_s": 0}, "leader.ttl_s"), ({"renew_s": "soon"}, "leader.renew_s"),
    ({"ttl_s": 4, "renew_s": 3}, "leader.renew_s"), ({"lease_s": 3}, "leader.lease_s"),
])
def test_leader_settings_are_checked(section, field):
    from broker.config import ConfigError, load

    with pytest.raises(ConfigError) as e:
        load(None, environ={}, overrides={"leader": section})
    assert field in str(e.value)


# -- real replicas -------------------------------------------------------------------------------
def _gauge(port: int) -> float | None:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    for line in body.splitlines():
        if line.startswith("broker_leader "):
            return float(line.split()[1])
    return None


def _replica(tmp_path, pg: str, name: str) -> tuple[ServeProcess, int]:
    work = tmp_path / name
    work.mkdir()
    metrics = _free_port()
    cfg = work / "broker.toml"
    cfg.write_bytes(tomli_w.dumps({
        "owner": "broker-test", "store": {"url": pg}, "reconciler": {"interval_s": 1},
        "telemetry": {"metrics_listen": f"127.0.0.1:{metrics}"}}).encode())
    return ServeProcess(cfg, work), metrics


def _acquired_at(serve: ServeProcess, since: float) -> float | None:
    """Wall time of the replica's first ``leadership_acquired`` record at or after ``since``."""
    import datetime as dt
    import json

    for line in serve.log.read_text().splitlines():
        if '"leadership_acquired"' in line:
            at = dt.datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00")).timestamp()
            if at >= since:
                return at
    return None


def _lease_ends(pg: str) -> float:
    """Wall time at which the leader's lease in the store runs out (PostgreSQL is on this host,
    so its clock is ours)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(pg)
    try:
        with engine.connect() as conn:
            asked = time.time()  # before the database reads its clock: the answer errs early, never late
            left = conn.execute(text("SELECT expires_at - extract(epoch from clock_timestamp()) "
                                     "FROM broker_leader")).scalar()
        return asked + float(left)
    finally:
        engine.dispose()


@pytest.mark.timeout(300)
def test_takeover_within_15_s_of_a_freeze_and_of_a_kill(tmp_path, pg):
    """Two `broker serve` replicas on one PostgreSQL. SIGSTOP the leader: the other leads; SIGCONT
    it: it reports it no longer leads. SIGKILL the new leader: the first leads again.

    Each takeover is timed from the signal to the new leader's ``leadership_acquired`` record and
    printed (the README's HA section quotes the figures). What the test asserts does not depend
    on how loaded the machine is: no replica leads before the old lease has run out (a slow
    machine only makes that later), and the defaults bound a takeover by ttl_s + renew_s, within
    the 15 s required. The wall-clock figure itself is a measurement, not an assertion: a heartbeat
    thread a loaded machine does not run for seconds delays it by as much."""
    from broker.config import LeaderSettings

    default = LeaderSettings()
    assert default.ttl_s + default.renew_s <= 15
    (a, am), (b, bm) = _replica(tmp_path, pg, "a"), _replica(tmp_path, pg, "b")
    a.start(timeout=60)
    try:
        wait_until(lambda: _gauge(am) == 1.0, timeout=60, interval=0.1, what="replica a to lead")
        b.start(timeout=60)
        wait_until(lambda: _gauge(bm) == 0.0, timeout=60, interval=0.1, what="replica b to serve metrics")

        os.kill(a.proc.pid, signal.SIGSTOP)
        frozen = time.time()
        try:
            a_ends = _lease_ends(pg)
            wait_until(lambda: _acquired_at(b, frozen), timeout=120, interval=0.1,
                       what="b to take over from a frozen a")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        freeze_takeover = _acquired_at(b, frozen) - frozen
        assert _acquired_at(b, frozen) >= a_ends - 0.05, "b led while a's lease still ran"
        wait_until(lambda: _gauge(am) == 0.0, timeout=60, interval=0.1, what="a to notice it lost leadership")
        assert _gauge(bm) == 1.0

        b_ends = _lease_ends(pg)
        b.kill()
        killed = time.time()
        wait_until(lambda: _acquired_at(a, killed), timeout=120, interval=0.1, what="a to take over from a killed b")
        kill_takeover = _acquired_at(a, killed) - killed
        assert _acquired_at(a, killed) >= b_ends - 0.05, "a led while b's lease still ran"
        wait_until(lambda: _gauge(am) == 1.0, timeout=60, interval=0.1, what="a's /metrics to show it leads")
        print(f"\ntakeover after SIGSTOP: {freeze_takeover:.1f} s; after SIGKILL: {kill_takeover:.1f} s "
              f"(ttl_s {default.ttl_s:g} + renew_s {default.renew_s:g} = {default.ttl_s + default.renew_s:g} s)")
    finally:
        for p in (a, b):
            if p.proc is not None and p.proc.poll() is None:
                os.kill(p.proc.pid, signal.SIGCONT)
            p.stop()


def test_the_reconciler_checks_the_fence_before_every_step(tmp_path, mini_catalog):
    """Fencing is per step: a reconciler whose replica stops leading in the middle of a pass
    releases the lease it was at and touches no other."""
    from broker.lease import LeaseState
    from broker.lifecycle import Lifecycle, Settings
    from broker.quote import QuoteEngine
    from broker.reconciler import Reconciler
    from tests.fake_provider import FakeProvider
    from tests.lease_kit import Clock

    clock = Clock(1_800_000_000.0)
    clouds = {"aws": FakeProvider("aws", clock=clock)}
    store = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    try:
        lc = Lifecycle(store, clouds, QuoteEngine(mini_catalog), owner="test", clock=clock,
                       settings=Settings(backoff_s=0.0), sleep=lambda s: None)
        rec = Reconciler(lc, orphan_grace_s=120.0, clock=clock)
        target = lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "on_demand", 1)
        leases = [lc.launch(idempotency_key=f"k{i}", target=target, max_lifetime_s=60) for i in range(3)]
        clock.advance(61)  # every lease is past its lifetime: three releases are due

        def fence():  # leadership is lost as soon as one release has been carried out
            if any(lc.get(l.lease_id).state is LeaseState.RELEASED for l in leases):
                raise NotLeader("another replica leads now")

        rec.fence = fence
        with pytest.raises(NotLeader):
            rec.run_pass()
        after = [lc.get(l.lease_id).state for l in leases]
        assert sorted(after) == sorted([LeaseState.RELEASED, LeaseState.RUNNING, LeaseState.RUNNING]), after
        assert len(clouds["aws"].alive()) == 2
    finally:
        store.close()
