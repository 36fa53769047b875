"""The store on SQLite and PostgreSQL: idempotent lease creation, optimistic versioning, events."""
from __future__ import annotations

import threading

import pytest

from broker.lease import Lease
from broker.store import StaleLease, Store
from tests.stores import db_url  # noqa: F401  (fixture)


def lease(key="k1", tenant="default", lid="l-1"):
    return Lease(lease_id=lid, tenant=tenant, idempotency_key=key, state="requested", provider="aws",
                       region="us-east-1", instance_type="p5.48xlarge", market="on_demand", nodes=1,
                       hourly_micros=98_320_000, client_token=f"{lid}-1", created_at=1.0, updated_at=1.0,
                       state_since=1.0)


@pytest.fixture
def store(db_url):  # noqa: F811
    s = Store(db_url)
    yield s
    s.close()


def test_same_idempotency_key_returns_the_first_lease(store):
    a, created_a = store.create_lease(lease("k", lid="l-a"))
    b, created_b = store.create_lease(lease("k", lid="l-b"))
    assert created_a and not created_b
    assert b.lease_id == "l-a"
    assert len(store.list_leases()) == 1
    _, other_tenant = store.create_lease(lease("k", tenant="t2", lid="l-c"))
    assert other_tenant


def test_concurrent_creates_with_one_key_make_one_lease(store):
    results = []

    def go(i):
        results.append(store.create_lease(lease("same", lid=f"l-{i}")))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for _, created in results if created) == 1
    assert len({l.lease_id for l, _ in results}) == 1


def test_optimistic_versioning_refuses_a_stale_writer(store):
    l, _ = store.create_lease(lease())
    first = store.update_lease(l, now=2.0, state="provisioning", message="go")
    assert first.version == l.version + 1 and first.state == "provisioning"
    with pytest.raises(StaleLease):
        store.update_lease(l, now=3.0, state="failed", message="late")
    assert store.get_lease(l.lease_id).state == "provisioning"


def test_every_transition_is_an_event_with_time_and_reason(store):
    l, _ = store.create_lease(lease())
    l = store.update_lease(l, now=2.0, state="provisioning", message="launching")
    l = store.update_lease(l, now=3.0, state="running", message="up")
    evs = store.events_of(l.lease_id)
    assert [(e.from_state, e.to_state, e.at) for e in evs] == [("", "requested", 1.0), ("requested", "provisioning", 2.0),
                                                              ("provisioning", "running", 3.0)]
    assert evs[-1].message == "up"


def test_blocks_expire_and_only_extend(store):
    store.block("gcp/us-central1", 100.0, "capacity")
    store.block("gcp/us-central1", 50.0, "shorter")
    assert store.active_blocks(99.0) == {"gcp/us-central1": "capacity"}
    assert store.active_blocks(100.0) == {}


def test_a_postgresql_store_made_with_32_bit_columns_is_widened_on_open():
    """Deployments created before money was 64-bit keep working: opening the store widens them."""
    from sqlalchemy import text

    from tests.stores import pg_url_or_skip

    gen = pg_url_or_skip()
    url = next(gen)
    try:
        old = Store(url)
        with old.engine.begin() as conn:  # the schema as an earlier release created it:
            from alembic import command

            from broker import migrate

            command.downgrade(migrate.config(conn), migrate.BASELINE)  # the baseline's tables,
            conn.execute(text("DROP TABLE alembic_version"))  # made before migrations
            for col in ("accrued_micros", "hourly_micros", "nodes", "version"):
                conn.execute(text(f"ALTER TABLE leases ALTER COLUMN {col} TYPE INTEGER"))
            conn.execute(text("ALTER TABLE lease_events ALTER COLUMN id TYPE INTEGER"))
            conn.execute(text("ALTER SEQUENCE lease_events_id_seq AS INTEGER"))
        old.close()
        store = Store(url)
        with store.engine.connect() as conn:
            types = dict(conn.execute(text(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'leases' "
                "AND column_name IN ('accrued_micros', 'hourly_micros', 'nodes', 'version')")).all())
        assert types == dict.fromkeys(("accrued_micros", "hourly_micros", "nodes", "version"), "bigint")
        l, _ = store.create_lease(lease())
        l = store.update_lease(l, now=2.0, accrued_micros=3 * 2**31)
        assert store.get_lease(l.lease_id).accrued_micros == 3 * 2**31
        store.close()
    finally:
        next(gen, None)  # drops the database


def test_concurrent_reports_of_one_source_keep_the_newest(store):
    """Schedulers push snapshots of one source concurrently (several replicas, retries): each is
    stored without a constraint error, the newest by taken_at wins, and a late older one does not
    replace it."""
    errors: list[BaseException] = []
    start = threading.Barrier(12)

    def report(i: int) -> None:
        start.wait()
        try:
            for k in range(5):
                store.save_snapshot("slurm-a", 1000.0 + i * 10 + k, {"writer": i, "k": k})
        except BaseException as e:  # noqa: BLE001 - the assertion below names it
            errors.append(e)

    threads = [threading.Thread(target=report, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert store.snapshots_since(0) == [("slurm-a", 1114.0, {"writer": 11, "k": 4})]
    store.save_snapshot("slurm-a", 500.0, {"late": True})
    assert store.snapshots_since(0) == [("slurm-a", 1114.0, {"writer": 11, "k": 4})]
    store.save_snapshot("slurm-b", 2000.0, {"other": True})
    assert [src for src, _, _ in store.snapshots_since(0)] == ["slurm-a", "slurm-b"]


def test_create_returns_the_lease_it_wrote_even_if_another_writer_removes_it_at_once(store):
    """The answer is the row as the creating transaction wrote it: a writer that deletes it the
    moment that transaction commits (an operator's cleanup, a restore) cannot turn it into None."""
    from sqlalchemy import delete

    from broker.store import LeaseEventRecord, LeaseRecord

    notify = store._notify

    def remove_then_notify():
        with store.engine.begin() as conn:
            conn.execute(delete(LeaseEventRecord.__table__))
            conn.execute(delete(LeaseRecord.__table__))
        notify()

    store._notify = remove_then_notify
    created, was_created = store.create_lease(lease("gone", lid="l-gone"))
    assert was_created
    assert isinstance(created, Lease)
    assert (created.lease_id, created.idempotency_key, created.state) == ("l-gone", "gone", "requested")
    assert created.hourly_micros == 98_320_000 and created.version >= 1
    assert store.get_lease("l-gone") is None  # it was removed: the answer is what was written


def test_open_connections_fills_the_pool_before_the_first_call(store):
    """At start-up the store opens its pool's connections, so the first calls do not each open one."""
    pool = store.engine.pool
    opened = store.open_connections()
    assert opened == pool.size() and opened >= 1
    assert pool.checkedin() == opened and pool.checkedout() == 0
