"""A /metrics scrape reads what its gauges need, not the store's history (SQLite and PostgreSQL):
after the first scrape of a process, every statement on the leases, lease events and decisions
searches an index range (the live leases, the rows of the last hour, the rows that passed the
hour since the last scrape), and the figures are those a new process counts over everything."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

from sqlalchemy import insert

from broker.lease import EventKind, Lease, LeaseState
from broker.store import LeaseEventRecord, LeaseRecord, Store
from broker.telemetry import StoreCollector
from tests.stores import db_url  # noqa: F401  (fixture)
from tests.test_store_listing import plan, statements

NOW = time.time()
HISTORY = ("leases", "lease_events", "decisions")


class _Catalog:
    def instance(self, provider: str, instance_type: str):
        return SimpleNamespace(gpus=8)


def _lease(lid: str, state: str, at: float, provider: str = "aws", market: str = "on_demand", **kw) -> Lease:
    return Lease(lease_id=lid, idempotency_key=lid, state=state, provider=provider, region="us-east-1",
                 instance_type="g5.xlarge", market=market, nodes=2, hourly_micros=1_006_000, client_token=lid,
                 created_at=at, updated_at=at, state_since=at, **kw)


def _seed_history(store: Store, n: int) -> None:
    """``n`` leases ended two to three hours ago, with their events, written in bulk."""
    leases, events = [], []
    for i in range(n):
        at = NOW - 3 * 3600 + i * (3600 / n)
        state = LeaseState.RELEASED if i % 5 else LeaseState.FAILED
        leases.append(_lease(f"old-{i:05d}", state, at, provider=("aws", "gcp")[i % 2],
                             market=("spot", "on_demand")[i % 3 == 0], started_at=at + 1, ended_at=at + 5,
                             accrued_at=at + 5, accrued_micros=1_000 + i).to_row())
        events += [{"lease_id": f"old-{i:05d}", "at": at + k, "kind": EventKind.STATE_CHANGED.value,
                    "from_state": "", "to_state": state.value, "message": "", "data": "{}"} for k in range(3)]
    with store.engine.begin() as conn:
        conn.execute(insert(LeaseRecord.__table__), leases)
        conn.execute(insert(LeaseEventRecord.__table__), events)
    for i in range(12):
        store.record_decision(f"d-old-{i}", NOW - 2.5 * 3600, ("burst", "no_burst")[i % 2], "seeded")


def _scrape(collector: StoreCollector) -> dict:
    out = {}
    for fam in collector.collect():
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, key
            out[key] = s.value
    return out


def _unbounded(how: str, postgres: bool) -> list[str]:
    """The scans of a history table in a plan that read it whole (no index condition)."""
    if not postgres:
        return [step for step in how.split(" | ") if any(step.startswith(f"SCAN {t}") for t in HISTORY)]
    found = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("Relation Name") in HISTORY and not {"Index Cond", "Recheck Cond"} & node.keys():
                found.append(f'{node.get("Node Type")} on {node["Relation Name"]}')
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(json.loads(how))
    return found


def test_a_scrape_after_the_first_reads_only_recent_rows_and_counts_what_a_new_process_counts(db_url):  # noqa: F811
    store = Store(db_url)
    try:
        _seed_history(store, 400)
        running = [store.create_lease(_lease(f"live-{i}", LeaseState.RUNNING, NOW, started_at=NOW,
                                             accrued_at=NOW, accrued_micros=10 * i))[0] for i in range(4)]
        first = _scrape(collector := StoreCollector(store, _Catalog(), clock=lambda: NOW))
        assert first == _scrape(StoreCollector(store, _Catalog(), clock=lambda: NOW))
        # An hour and more later: two leases end, events and decisions are written, and rows that
        # were recent at the first scrape have passed the hour.
        for i, lease in enumerate(running[:2]):
            lease = store.update_lease(lease, now=NOW + 60, state=LeaseState.DRAINING, message="done")
            store.update_lease(lease, now=NOW + 120, state=LeaseState.RELEASED, message="done", ended_at=NOW + 120,
                               accrued_micros=5_000_000 + i)
        store.record_decision("d-new", NOW + 1_800, "burst", "queue grew")
        store.add_event("", EventKind.BUDGET_WARNING, "80 %", NOW + 2 * 3600)
        seen: list[dict] = []
        sqls = statements(store, lambda: seen.append(_scrape(collector)))
        (second,) = seen
        assert second == _scrape(StoreCollector(store, _Catalog(), clock=lambda: NOW))
        assert second != first
        assert second[("broker_leases", (("market", "on_demand"), ("provider", "aws"), ("state", "released")))] == 2 + \
            first[("broker_leases", (("market", "on_demand"), ("provider", "aws"), ("state", "released")))]
        assert second[("broker_decisions_total", (("action", "burst"),))] == 7
        for sql, params in sqls:
            assert not _unbounded(plan(store, sql, params), store.is_postgres), (sql, plan(store, sql, params))
    finally:
        store.close()


def test_a_scrape_reads_one_snapshot_so_a_lease_that_ends_meanwhile_counts_once(db_url):  # noqa: F811
    """A lease that ends between the scrape's read of the live leases and its read of the ended
    ones is either live or ended in that scrape, never both (on SQLite, too)."""
    from sqlalchemy import create_engine, event, text

    from broker.store_metrics import StoreReader

    store = Store(db_url)
    other = create_engine(db_url)
    try:
        store.create_lease(_lease("moving", LeaseState.RUNNING, NOW, started_at=NOW, accrued_at=NOW))
        store.add_event("moving", EventKind.BUDGET_WARNING, "x", NOW)
        reader = StoreReader(store.engine)
        ended_meanwhile: list[str] = []

        def after(conn, cursor, statement, *args):
            if not ended_meanwhile and "GROUP BY" in statement.upper():  # the live leases were read
                with other.begin() as c:
                    c.execute(text("UPDATE leases SET state = 'released', ended_at = :t WHERE lease_id = 'moving'"),
                              {"t": NOW + 1})
                ended_meanwhile.append(statement)

        event.listen(store.engine, "after_cursor_execute", after)
        try:
            totals = reader.read()
        finally:
            event.remove(store.engine, "after_cursor_execute", after)
        assert ended_meanwhile
        live = sum(r[4] for r in totals.live)
        ended = sum(v[0] for v in totals.ended.values())
        assert (live, ended) == (1, 0), totals
        after_it = StoreReader(store.engine).read()  # a later scrape sees it ended
        assert (sum(r[4] for r in after_it.live), sum(v[0] for v in after_it.ended.values())) == (0, 1)
    finally:
        other.dispose()
        store.close()
