"""Budgets that hold under concurrency (issue 11, item 5): the cap check and the lease insert are
one atomic step, so many launches at once, through two replicas of the store, never put a
tenant over its cap — on SQLite and on PostgreSQL."""
from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from broker.budget import Budgets
from broker.config import Budget
from broker.lease import LIVE
from broker.errors import OverBudget
from broker.lifecycle import Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.store import Store
from providers.base import MICROS
from tests.fake_provider import FakeProvider
from tests.stores import db_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(120)

LAUNCHES = 16
CAP_NODES = 4


def test_concurrent_launches_never_exceed_the_hourly_cap(db_url, mini_catalog):  # noqa: F811
    cloud = FakeProvider("aws")
    stores = [Store(db_url), Store(db_url)]  # two replicas of one store
    try:
        probe = Lifecycle(stores[0], {"aws": cloud}, QuoteEngine(mini_catalog), owner="test")
        target = probe.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "on_demand", 1)
        cap_usd = Decimal(target.hourly_micros * CAP_NODES + target.hourly_micros // 2) / MICROS
        budgets = {"default": Budget("default", usd_per_hour=cap_usd)}
        replicas = [Lifecycle(s, {"aws": cloud}, QuoteEngine(mini_catalog), owner="test",
                              budgets=Budgets(s, budgets), settings=Settings(backoff_s=0.0), sleep=lambda _: None)
                    for s in stores]
        start = threading.Barrier(LAUNCHES)
        outcomes: list[str] = []
        lock = threading.Lock()

        def launch(i: int) -> None:
            lc = replicas[i % len(replicas)]
            start.wait()
            try:
                lease = lc.launch(idempotency_key=f"k{i}", target=target)
                out = lease.state.value
            except OverBudget:
                out = "budget"
            with lock:
                outcomes.append(out)

        threads = [threading.Thread(target=launch, args=(i,)) for i in range(LAUNCHES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(outcomes) == LAUNCHES
        assert outcomes.count("running") == CAP_NODES, outcomes
        assert outcomes.count("budget") == LAUNCHES - CAP_NODES, outcomes
        assert len(cloud.alive()) == CAP_NODES, "launched and billed over the cap"
        live = [l for l in stores[0].list_leases() if l.state in LIVE]
        assert sum(l.hourly_micros * l.nodes for l in live) <= cap_usd * MICROS
    finally:
        for s in stores:
            s.close()
