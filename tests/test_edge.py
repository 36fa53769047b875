"""Hostile requests at the API's edge: no server files through the API, bounded sizes and ranges,
and no internal error text in any answer."""
from __future__ import annotations

import time

import grpc
import pytest

from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from providers.bootstrap import BUILTINS, BootstrapError, resolve
from providers.registry import build_enabled
from tests.clouds.gcp import FakeGcpCompute
from tests.grpc_server import running_server

pytestmark = pytest.mark.timeout(120)

SECRET = "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
CONTAINER = {"image": "registry.example/train:1", "command": ["python", "train.py"]}


@pytest.fixture(scope="module")
def gcp_cloud():
    with FakeGcpCompute() as fake:
        yield fake


@pytest.fixture
def gcp_broker(gcp_cloud, tmp_path, mini_catalog_dir):
    """A server on the mocked GCP with boot scripts configured, and one operator template."""
    gcp_cloud.reset()
    operator_template = tmp_path / "ops" / "gpu-train.sh"
    operator_template.parent.mkdir()
    operator_template.write_text("#!/bin/sh\necho operator template for $lease_id\n")
    table = {"gcp": {"enabled": True, "project": "test-project", "regions": ["us-central1"],
                     "api_endpoint": gcp_cloud.url, "credentials": "anonymous", "timeout_s": 5}}
    cfg = {"catalog.path": str(mini_catalog_dir), "providers": table,
           "bootstrap": {"container": CONTAINER, "templates": {"gpu-train": str(operator_template)}}}
    with running_server(tmp_path, providers=build_enabled(table, "broker-test"), config=cfg) as (addr, svc):
        with grpc.insecure_channel(addr) as ch:
            yield pb_grpc.BrokerStub(ch), svc, gcp_cloud


def _launch(stub, key: str, bootstrap: str):
    return stub.Launch(pb.LaunchRequest(
        idempotency_key=key, bootstrap=bootstrap,
        offering=pb.Offering(provider="gcp", region="us-central1", instance_type="a2-highgpu-1g",
                             market=pb.MARKET_ON_DEMAND, count=1)))


def _startup_scripts(cloud) -> list[str]:
    return [item["value"] for inst in cloud.instances()
            for item in (inst.get("metadata") or {}).get("items", []) if item["key"] == "startup-script"]


def test_a_client_cannot_name_a_server_file_as_its_boot_template(gcp_broker, tmp_path):
    stub, svc, cloud = gcp_broker
    planted = tmp_path / "planted.sh"
    planted.write_text(f"#!/bin/sh\n{SECRET}\n")
    for name in (str(planted), "../../etc/passwd", "/etc/hostname", "no-such-template"):
        with pytest.raises(grpc.RpcError) as e:
            _launch(stub, f"k-{abs(hash(name))}", name)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert "bootstrap" in e.value.details() and "gpu-train" in e.value.details()
    assert cloud.insert_count == 0 and not svc.store.list_leases()
    assert not any(SECRET in s for s in _startup_scripts(cloud))


def test_configured_and_builtin_templates_still_boot(gcp_broker):
    stub, _, cloud = gcp_broker
    lease = _launch(stub, "k-operator", "gpu-train").lease
    assert lease.state == pb.LEASE_STATE_RUNNING
    assert _launch(stub, "k-builtin", "container").lease.state == pb.LEASE_STATE_RUNNING
    scripts = _startup_scripts(cloud)
    assert any(f"operator template for {lease.lease_id}" in s for s in scripts)
    assert any("registry.example/train:1" in s for s in scripts)


def test_a_launch_naming_unknown_capacity_is_invalid_argument_naming_the_field(gcp_broker):
    stub, svc, cloud = gcp_broker
    good = dict(provider="gcp", region="us-central1", instance_type="a2-highgpu-1g", market=pb.MARKET_ON_DEMAND,
                count=1)
    cases = [({"provider": "mars"}, "offering.provider"), ({"provider": "aws"}, "offering.provider"),
             ({"region": "mars-1"}, "offering.region"), ({"region": "x" * 128}, "offering.region"),
             ({"zone": "mars-1a"}, "offering.zone"), ({"instance_type": "t2.micro"}, "offering.instance_type"),
             ({"count": 0}, "offering.count"), ({"market": pb.MARKET_UNSPECIFIED}, "offering.market"),
             ({"market": pb.MARKET_RESERVED}, "offering.market")]
    for i, (change, field) in enumerate(cases):
        with pytest.raises(grpc.RpcError) as e:
            stub.Launch(pb.LaunchRequest(idempotency_key=f"k-{i}", offering=pb.Offering(**{**good, **change})),
                        timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (change, e.value.details())
        assert e.value.details().startswith(field + ": "), (change, e.value.details())
        assert len(e.value.details()) < 300
    assert cloud.insert_count == 0 and not svc.store.list_leases()


def test_resolve_maps_names_to_configured_sources_only(tmp_path):
    assert [resolve(b) for b in BUILTINS] == list(BUILTINS)
    assert resolve("mine", {"mine": "/etc/broker/mine.sh"}) == "/etc/broker/mine.sh"
    assert resolve("slurm", {"slurm": "/etc/broker/slurm-custom.sh"}) == "/etc/broker/slurm-custom.sh"
    with pytest.raises(BootstrapError, match="not configured"):
        resolve(str(tmp_path / "x.sh"), {"mine": "/etc/broker/mine.sh"})
    with pytest.raises(BootstrapError):
        resolve("/etc/broker/mine.sh", {"mine": "/etc/broker/mine.sh"})  # the path is not a name


# ---------------------------------------------------------------------------------------------
# bounded requests and streams; internal errors never leak

@pytest.fixture(params=["sqlite", "postgresql"])
def broker_on(request, tmp_path, mini_catalog_dir):
    """A server (no clouds) on SQLite or on a fresh PostgreSQL database."""
    from tests.stores import pg_url_or_skip

    urls = pg_url_or_skip() if request.param == "postgresql" else iter([f"sqlite:///{tmp_path / 'b.db'}"])
    url = next(urls)
    cfg = {"catalog.path": str(mini_catalog_dir), "store.url": url}
    with running_server(tmp_path, config=cfg) as (addr, svc):
        with grpc.insecure_channel(addr) as ch:
            yield pb_grpc.BrokerStub(ch), svc, url
    next(urls, None)


def _code(fn, *args, **kw):
    try:
        fn(*args, timeout=10, **kw)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()


def _demand(**kw):
    return pb.Demand(**{"gpu_model": "H100", "gpus": 8, "hours": 1.0, **kw})


def _bad_ts(seconds=2**62, nanos=0):
    from google.protobuf.timestamp_pb2 import Timestamp

    return Timestamp(seconds=seconds, nanos=nanos)


def test_out_of_range_values_are_invalid_argument_naming_the_field(broker_on):
    stub, _, _ = broker_on
    snap = pb.QueueSnapshot(source="s", taken_at=_bad_ts(-2**62))
    cases = [
        (stub.Quote, pb.QuoteRequest(demand=_demand(deadline=_bad_ts())), "demand.deadline"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(deadline=_bad_ts(0, -1))), "demand.deadline"),
        (stub.ListDecisions, pb.ListDecisionsRequest(since=_bad_ts()), "since"),
        (stub.ReportQueue, pb.ReportQueueRequest(snapshot=snap), "snapshot.taken_at"),
        (stub.Diagnose, pb.DiagnoseRequest(snapshot=snap), "snapshot.taken_at"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(hours=1e308)), "demand.hours"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(hours=float("nan"))), "demand.hours"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(data_in_gb=float("inf"))), "demand.data_in_gb"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(residency=["x" * 1_000_000])), "demand.residency[0]"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(residency=["mars"] * 1000)), "demand.residency"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(tenant="a\x00b")), "demand.tenant"),
        # names the catalog does not know: refused, never priced or echoed into every exclusion
        (stub.Quote, pb.QuoteRequest(demand=_demand(residency=["mars"])), "demand.residency"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(residency=["eu", "x" * 64])), "demand.residency"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(regions=["mars-1"])), "demand.regions"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(data_location="aws:nowhere-1")), "demand.data_location"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(data_location="mars")), "demand.data_location"),
        (stub.Quote, pb.QuoteRequest(demand=_demand(providers=["mars"])), "demand.providers"),
        (stub.Launch, pb.LaunchRequest(idempotency_key="k", offering=pb.Offering(
            provider="aws", region="us-east-1", instance_type="p5.48xlarge", market=pb.MARKET_ON_DEMAND,
            count=2**31 - 1)), "offering.count"),
        (stub.Launch, pb.LaunchRequest(idempotency_key="k", offering=pb.Offering(market=7)), "offering.market"),
        (stub.GetLease, pb.GetLeaseRequest(lease_id="l-\x00"), "lease_id"),
        (stub.Release, pb.ReleaseRequest(lease_id="l-" + "9" * 5000), "lease_id"),
        (stub.ListLeases, pb.ListLeasesRequest(states=[99]), "states[0]"),
        (stub.ListLeases, pb.ListLeasesRequest(tenant="t\x00"), "tenant"),
        (stub.WatchLeases, pb.WatchLeasesRequest(after_event_id=-1), "after_event_id"),
    ]
    for fn, request, field in cases:
        if fn is stub.WatchLeases:
            code, details = _code(lambda r, **kw: list(fn(r, **kw)), request)  # noqa: B023 (called at once)
        else:
            code, details = _code(fn, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (field, code, details)
        assert details.startswith(field), (field, details)
        assert len(details) < 300 and "Traceback" not in details and "SELECT" not in details


def test_a_repeated_filter_counts_once_and_exclusions_do_not_echo_long_lists(broker_on):
    stub, _, _ = broker_on
    q = stub.Quote(pb.QuoteRequest(demand=_demand(residency=["us-east-1"] * 64, regions=["us-east-1"] * 200,
                                                  providers=["aws"] * 16)), timeout=10).quote
    assert list(q.demand.residency) == ["us-east-1"] and list(q.demand.regions) == ["us-east-1"]
    assert list(q.demand.providers) == ["aws"]
    wide = _demand(residency=["eu-west-1", "europe-west4", "eastus", "us-central1", "eu"])  # not us-east-1
    reasons = [x.reason for x in stub.Quote(pb.QuoteRequest(demand=wide), timeout=10).quote.excluded]
    assert any(r.endswith("outside data residency eu-west-1,europe-west4,eastus,us-central1 (+1 more)")
               for r in reasons), reasons
    assert all(len(r) < 120 for r in reasons), reasons


def test_a_request_over_the_message_limit_is_refused(broker_on):
    stub, _, _ = broker_on
    code, _ = _code(stub.Quote, pb.QuoteRequest(demand=_demand(regions=["r" * 60] * 80_000)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _code(stub.Quote, pb.QuoteRequest(demand=_demand()))[0] == grpc.StatusCode.OK


def test_a_lost_database_is_unavailable_not_unknown(broker_on):
    stub, svc, url = broker_on
    if not url.startswith("postgresql"):
        pytest.skip("the connection-loss case needs PostgreSQL (SQLite has no server to lose)")
    import psycopg

    from tests.stores import PG_ADMIN

    db = url.rsplit("/", 1)[1]
    admin = PG_ADMIN.replace("postgresql+psycopg://", "postgresql://")
    assert _code(stub.ListLeases, pb.ListLeasesRequest())[0] == grpc.StatusCode.OK
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (db,))
    try:
        for call, request in ((stub.ListLeases, pb.ListLeasesRequest()),
                              (stub.GetLease, pb.GetLeaseRequest(lease_id="l-1"))):
            code, details = _code(call, request)
            assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
            assert "psycopg" not in details and db not in details
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
    deadline = time.monotonic() + 10
    while _code(stub.ListLeases, pb.ListLeasesRequest())[0] != grpc.StatusCode.OK:
        assert time.monotonic() < deadline, "the server did not recover its database"
        time.sleep(0.1)


def test_open_streams_do_not_starve_unary_calls_or_health(tmp_path, mini_catalog_dir):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    cfg = {"catalog.path": str(mini_catalog_dir), "server.workers": 8}
    with running_server(tmp_path, config=cfg) as (addr, svc):
        assert svc.limits.max_streams == 4
        channels = [grpc.insecure_channel(addr) for _ in range(32)]
        streams = [pb_grpc.BrokerStub(ch).WatchLeases(pb.WatchLeasesRequest(), timeout=60) for ch in channels]
        try:
            # which four get a slot is up to the server's threads: wait until 28 are answered
            deadline = time.monotonic() + 30
            while sum(s.done() for s in streams) < 28:
                assert time.monotonic() < deadline, f"{sum(s.done() for s in streams)} streams answered"
                time.sleep(0.05)
            refused = [s for s in streams if s.done()]
            assert len(refused) == 28 and sum(not s.done() for s in streams) == 4
            for s in refused:
                assert s.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_streams" in s.details()
            with grpc.insecure_channel(addr) as ch:
                stub = pb_grpc.BrokerStub(ch)
                for _ in range(20):
                    stub.Quote(pb.QuoteRequest(demand=_demand()), timeout=5)
                    stub.ListLeases(pb.ListLeasesRequest(), timeout=5)
                    ok = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
                    assert ok.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            for s in streams:
                s.cancel()
            for ch in channels:
                ch.close()
        # the slots come back when streams end
        deadline = time.monotonic() + 10
        with grpc.insecure_channel(addr) as ch:
            while True:
                s = pb_grpc.BrokerStub(ch).WatchLeases(pb.WatchLeasesRequest(), timeout=0.5)
                try:
                    next(s)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        break
                    assert time.monotonic() < deadline, e
                time.sleep(0.05)


def test_result_caches_are_bounded_in_bytes(mini_catalog):
    """Distinct demands whose exclusion sentences echo long (but allowed) residency lists: the
    engine's cache stays within its byte budget however many come."""
    from broker.lru import SizedLRU
    from broker.quote import QuoteEngine
    from policies.demand import Demand

    engine = QuoteEngine(mini_catalog)
    engine._cache = SizedLRU(QuoteEngine.CACHE_SIZE, 256 * 1024, engine._cache.weigh)
    for i in range(200):
        residency = tuple(f"{i}-{j}-" + "z" * 56 for j in range(64))
        engine.quote(Demand(gpus=8, hours=1, gpu_model="H100", residency=residency).validate(engine.gpu_models))
        assert engine._cache.bytes <= 256 * 1024
    assert 0 < len(engine._cache) < 200
    big = SizedLRU(10, 1000, len)
    big.put("k", "x" * 2000)  # heavier than the whole budget: not kept
    assert big.get("k") is None and big.bytes == 0


def test_cache_budgets_are_limits_keys(tmp_path, mini_catalog_dir):
    """``[limits] quote_cache_entries``, ``quote_cache_bytes`` and ``derived_cache_bytes`` bound the
    engine's result cache and the caches derived from it (protobuf answers, launch targets), and
    hold after the live market re-prices (a new engine from the same config)."""
    from broker import config as cfgmod
    from broker.errors import ConfigError
    from broker.quote import engine_for

    limits = {"quote_cache_entries": 3, "quote_cache_bytes": 300_000, "derived_cache_bytes": 200_000}
    cfg = {"catalog.path": str(mini_catalog_dir), "limits": limits}
    with running_server(tmp_path, config=cfg) as (addr, svc):
        assert (svc.engine._cache.max_items, svc.engine._cache.max_bytes) == (3, 300_000)
        assert (svc._derived._items.max_items, svc._derived._items.max_bytes) == (3, 200_000)
        rebuilt = engine_for(svc.config, svc.engine.catalog)
        assert (rebuilt._cache.max_items, rebuilt._cache.max_bytes) == (3, 300_000)
        with grpc.insecure_channel(addr) as ch:
            stub = pb_grpc.BrokerStub(ch)
            for hours in range(1, 9):
                stub.Quote(pb.QuoteRequest(demand=_demand(hours=float(hours))), timeout=10)
        assert len(svc.engine._cache) == 3 and svc.engine._cache.bytes <= 300_000
        assert len(svc._derived._items) <= 3 and svc._derived._items.bytes <= 200_000
    off = cfgmod.load(None, environ={}, overrides={"limits.quote_cache_entries": 0})
    assert engine_for(off, svc.engine.catalog)._cache.max_items == 0
    for key, value in (("quote_cache_bytes", -1), ("quote_cache_entries", 10**7), ("derived_cache_bytes", "x")):
        with pytest.raises(ConfigError, match=f"limits.{key}"):
            cfgmod.load(None, environ={}, overrides={f"limits.{key}": value})


def test_a_sized_lru_lists_its_keys_most_recently_used_first():
    from broker.lru import SizedLRU

    c = SizedLRU(3, 10_000)
    for k in "abc":
        c.put(k, k)
    c.get("a")
    c.put("d", "d")  # "b" is the least recently used: it leaves
    assert c.keys() == ["d", "a", "c"]
