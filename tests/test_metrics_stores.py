"""/metrics on both stores with leases of several types and markets running: a real exposition
parser (and promtool where installed) reads it, no label set repeats, sums are the store's sums
(PostgreSQL's SUM(bigint) is a Decimal), and the operators' gauges are there."""
from __future__ import annotations

import logging
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker import market_store
from broker.lease import Lease
from providers.market import LivePrice, Snapshot, SourceState
from tests.grpc_server import running_server
from tests.stores import db_url  # noqa: F401 - the fixture

NOW = time.time()


def _lease(i: int, state: str, provider: str, itype: str, market: str, nodes: int, hourly: int,
           accrued: int, tenant: str) -> Lease:
    return Lease(lease_id=f"l-{i}", idempotency_key=f"k-{i}", state=state, provider=provider, region="us-east-1",
                 instance_type=itype, market=market, nodes=nodes, hourly_micros=hourly, client_token=f"t-{i}",
                 created_at=NOW - 60, updated_at=NOW - 60, state_since=NOW - 60, accrued_micros=accrued,
                 accrued_at=NOW - 60, started_at=NOW - 60 if state in ("running", "draining", "released") else 0.0,
                 ended_at=NOW - 10 if state == "released" else 0.0, tenant=tenant)


# Several instance types per (provider, market): the store's groups are finer than the labels.
LEASES = [
    ("running", "aws", "p5.48xlarge", "spot", 2, 40_000_000, 5_000_000, "team-a"),
    ("running", "aws", "p4d.24xlarge", "spot", 1, 10_000_000, 1_000_000, "team-a"),
    ("running", "aws", "p5.48xlarge", "on_demand", 3, 98_320_000, 7_000_000, "team-b"),
    ("running", "aws", "g5.xlarge", "on_demand", 1, 1_006_000, 500_000, "team-b"),
    ("provisioning", "aws", "p4d.24xlarge", "on_demand", 2, 32_770_000, 0, "team-a"),
    ("released", "aws", "g5.xlarge", "spot", 1, 400_000, 250_000, "team-b"),
    ("running", "gcp", "a3-highgpu-8g", "on_demand", 1, 88_000_000, 3_000_000, "team-a"),
]


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()


def _samples(body: str) -> dict[tuple[str, tuple], float]:
    out: dict[tuple[str, tuple], float] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"label set repeated: {key}"
            out[key] = s.value
    return out


def _value(samples, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.mark.timeout(180)
def test_metrics_parse_and_repeat_no_label_set_on_both_stores(tmp_path, db_url):  # noqa: F811
    config = {"store.url": db_url, "budgets": {"team-a": {"usd_per_hour": 200, "usd_per_month": 1000},
                                               "default": {"usd_per_hour": 1000}}}
    with running_server(tmp_path, config=config) as (_addr, svc):
        for i, row in enumerate(LEASES):
            svc.store.create_lease(_lease(i, *row))
        snap = Snapshot("aws", NOW - 120, prices=[LivePrice("us-east-1", "p5.48xlarge", "on_demand", 98_320_000,
                                                            "aws:pricing", "2026-11-01T00:00:00Z")],
                        sources={"price_list": SourceState(NOW - 120), "spot_history": SourceState(NOW - 120),
                                 "placement_scores": SourceState(NOW - 7200, "placement_scores: HTTP 502")})
        market_store.save(svc.store.engine, snap, NOW - 120, "placement_scores: HTTP 502")
        port = svc.metrics.serve("127.0.0.1:0")
        body = _scrape(port)
    (tmp_path / "metrics.txt").write_text(body)
    samples = _samples(body)

    assert _value(samples, "broker_store_read_ok") == 1
    # Every group of the store's SQL adds into its one label set.
    assert _value(samples, "broker_spend_rate_usd_per_hour", provider="aws", market="spot") == pytest.approx(90.0)
    assert _value(samples, "broker_spend_rate_usd_per_hour", provider="aws", market="on_demand") == \
        pytest.approx(3 * 98.32 + 1.006)
    assert _value(samples, "broker_cloud_gpus", provider="aws", market="spot") == 2 * 8 + 8
    assert _value(samples, "broker_cloud_gpus", provider="aws", market="on_demand") == 3 * 8 + 1 + 2 * 8
    assert _value(samples, "broker_spend_usd_total", provider="aws") == pytest.approx(13.75)
    assert _value(samples, "broker_spend_usd_total", provider="gcp") == pytest.approx(3.0)
    assert _value(samples, "broker_leases", state="running", provider="aws", market="on_demand") == 2
    # Budget use per tenant: live rate against the caps.
    assert _value(samples, "broker_budget_spend_rate_usd_per_hour", tenant="team-a") == pytest.approx(90 + 65.54 + 88)
    assert _value(samples, "broker_budget_used_ratio", tenant="team-a", cap="usd_per_hour") == \
        pytest.approx((90 + 65.54 + 88) / 200)
    assert ("broker_budget_used_ratio", (("cap", "usd_per_hour"), ("tenant", "team-b"))) in samples
    # The market's age per provider and source, and which source is failing.
    assert _value(samples, "broker_market_age_seconds", provider="aws", source="price_list") >= 120
    assert _value(samples, "broker_market_age_seconds", provider="aws", source="placement_scores") >= 7200
    assert _value(samples, "broker_market_source_failing", provider="aws", source="placement_scores") == 1
    assert _value(samples, "broker_market_source_failing", provider="aws", source="price_list") == 0
    assert any(k[0] == "broker_leader" for k in samples)
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_store_that_cannot_be_read_still_serves_the_rest_and_logs_why(tmp_path, caplog, capfd, monkeypatch):
    from broker.telemetry import StoreCollector

    def broken(self):
        raise RuntimeError("the database went away")
        yield  # pragma: no cover

    with running_server(tmp_path) as (_addr, svc):
        port = svc.metrics.serve("127.0.0.1:0")
        monkeypatch.setattr(StoreCollector, "_families", broken)
        with caplog.at_level(logging.ERROR, logger="broker.metrics"):
            samples = _samples(_scrape(port))
    assert _value(samples, "broker_store_read_ok") == 0
    assert any(k[0] == "broker_leader" for k in samples)
    assert any(r.name == "broker.metrics" and r.exc_info for r in caplog.records)
    assert "Traceback" not in capfd.readouterr().err


def test_a_scrape_that_fails_is_a_log_record_not_a_raw_traceback(tmp_path, caplog, capfd):
    class Broken:
        def collect(self):
            raise TypeError("unsupported operand type(s) for /: 'decimal.Decimal' and 'float'")

    with running_server(tmp_path) as (_addr, svc):
        port = svc.metrics.serve("127.0.0.1:0")
        svc.metrics.registry.register(Broken())
        with caplog.at_level(logging.ERROR, logger="broker.metrics"):
            with pytest.raises(urllib.error.HTTPError) as e:
                _scrape(port)
    assert e.value.code == 500
    assert any(r.name == "broker.metrics" and r.exc_info for r in caplog.records)
    assert "Traceback" not in capfd.readouterr().err


def test_provider_errors_and_interruption_notices_are_counted(tmp_path):
    from providers.base import QuotaError, TransientError

    with running_server(tmp_path) as (_addr, svc):
        QuotaError("vCPU limit", provider="aws", code="VcpuLimitExceeded", region="us-east-1")
        TransientError("bad gateway", provider="aws", code="HTTP502")
        TransientError("bad gateway", provider="aws", code="HTTP502")
        svc.metrics.notices.labels("aws", "preemption", "acted").inc()
        port = svc.metrics.serve("127.0.0.1:0")
        samples = _samples(_scrape(port))
    assert _value(samples, "broker_provider_errors_total", provider="aws", code="HTTP502") == 2
    assert _value(samples, "broker_provider_errors_total", provider="aws", code="VcpuLimitExceeded") == 1
    assert _value(samples, "broker_interruption_notices_total", provider="aws", kind="preemption",
                  outcome="acted") == 1


def test_the_leader_gauge_drops_when_the_local_deadline_passes():
    """A leader frozen past its lease deadline reports 0 the moment it runs again, before any
    heartbeat tells it so (it showed 1 for ~1.4 s: two leaders on the dashboard)."""
    from broker.leader import Leadership
    from broker.store import Store
    from broker.telemetry import Metrics
    from tests.stores import pg_url_or_skip

    gen = pg_url_or_skip()
    url = next(gen)
    store = Store(url)
    try:
        metrics = Metrics(store, None)
        lead = Leadership(store, ttl_s=1.0, renew_s=0.2, on_change=metrics.set_leader)
        metrics.leader.leading = lead.is_leader
        assert lead.beat()
        assert metrics.registry.get_sample_value("broker_leader") == 1
        # No heartbeat runs (the process is "frozen"); nothing tells on_change.
        deadline = time.monotonic() + 5
        while lead.is_leader() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not lead.is_leader()
        assert metrics.registry.get_sample_value("broker_leader") == 0
        metrics.stop()
    finally:
        store.close()
        next(gen, None)
