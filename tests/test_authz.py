"""The authorization matrix: every RPC × every role (none, a bad token, tenant, scheduler,
operator) × its own and another tenant's objects, streams filtered per event included; the
config file's tokens (clear and ``sha256:``) and the store's (revoked and expired ones refused)."""
from __future__ import annotations

import time

import grpc
import pytest

from broker.auth import TABLE, Auth, Principal, Role, parse_spec, principal_for
from broker.errors import ConfigError
from broker.lease import Lease
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from broker.records import Job
from tests.grpc_server import running_server

pytestmark = pytest.mark.timeout(180)

OK = grpc.StatusCode.OK
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
MISSING = grpc.StatusCode.NOT_FOUND
INVALID = grpc.StatusCode.INVALID_ARGUMENT
CONFLICT = grpc.StatusCode.FAILED_PRECONDITION

TOKENS = {"tok-a": "team-a", "tok-b": "team-b", "tok-sched-a": "scheduler:team-a",
          "sha256:" + "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8": "*"}  # "password"
#: Tokens issued into the store (broker.tokens): caller → (role, tenants, expires_at, revoked_at).
STORE_TOKENS = {"store-tenant-a": ("tenant", "team-a", None, None),
                "store-scheduler-a": ("scheduler", "team-a", 4e9, None),
                "store-operator": ("operator", "*", None, None),
                "store-revoked": ("operator", "*", None, 1.0),
                "store-expired": ("tenant", "team-a", 1.0, None)}
#: Lease callback credentials (broker.jobs), as launches mint them: caller → (lease, revoked at).
#: A lease's ends when it is released, so the one of a released lease is refused.
LEASE_CREDENTIALS = {"lease-a": ("l-a", None), "lease-b": ("l-b", None), "lease-a-old": ("l-a-old", 5.0)}
CALLERS = {"none": None, "bad": "nope", "tenant-a": "tok-a", "tenant-b": "tok-b",
           "scheduler-a": "tok-sched-a", "operator": "password",
           **{caller: f"brk_{caller}-token" for caller in STORE_TOKENS},
           **{caller: f"brl_{caller}-credential" for caller in LEASE_CREDENTIALS}}
SECRET = {"a": "SECRET_OF_A_17", "b": "SECRET_OF_B_42"}


def _lease(tenant: str, lid: str, state: str = "running") -> Lease:
    side = tenant[-1]
    return Lease(
        lease_id=lid, tenant=tenant, idempotency_key=lid, state=state, provider="aws", region="us-east-1",
        instance_type="p5.48xlarge", market="on_demand", nodes=1, hourly_micros=1, client_token="t",
        created_at=1, updated_at=1, state_since=1,
        instances=[{"instance_id": f"i-{side * 3}", "node_name": f"n-{side}", "zone": "us-east-1a",
                    "private_ip": "10.0.0.1", "state": "running"}],
        job=Job(job_id=f"j-{side}", env={"TOKEN": SECRET[side]}))


@pytest.fixture(scope="module")
def world(tmp_path_factory, mini_catalog_dir):
    tmp = tmp_path_factory.mktemp("authz")
    with running_server(tmp, config={"catalog.path": str(mini_catalog_dir), "auth.tokens": TOKENS}) as (addr, svc):
        store = svc.store
        _issue(store.engine)
        _mint(store.engine)
        store.add_event("", "state_changed", "the watch starts after this", 1.0)
        start = store.last_event_id()
        for tenant in ("team-a", "team-b"):
            side = tenant[-1]
            store.create_lease(_lease(tenant, f"l-{side}"))
            store.create_lease(_lease(tenant, f"l-{side}-old", state="released"))
            store.add_event(f"l-{side}", "requeue", f"requeue of {side}", 2.0,
                            data={"job": {"job_id": f"j-{side}", "env": {"TOKEN": SECRET[side]}}})
            store.record_decision(f"d-{side}", 3.0, "burst", f"burst for {side}", [f"j-{side}"],
                                  lease_id=f"l-{side}")
        store.record_decision("d-none", 3.0, "hold", "did not burst, because of team-b's queue", ["j-b"])
        with grpc.insecure_channel(addr) as ch:
            stub = pb_grpc.BrokerStub(ch)
            quotes = {}
            for side in "ab":
                r = stub.Quote(pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=1)),
                               metadata=_md(f"tok-{side}"))
                quotes[side] = r.quote.quote_id
            yield stub, quotes, start


def _issue(engine) -> None:
    """The store's tokens of :data:`STORE_TOKENS`, written as ``broker tokens create`` writes them."""
    from sqlmodel import Session

    from broker.tokens import TokenRecord, digest_hex

    with Session(engine) as s:
        for caller, (role, tenants, expires_at, revoked_at) in STORE_TOKENS.items():
            s.add(TokenRecord(id=f"tok-{caller}", role=role, tenants=tenants, digest=digest_hex(CALLERS[caller]),
                              created_at=0.5, expires_at=expires_at, revoked_at=revoked_at))
        s.commit()


def _mint(engine) -> None:
    """The lease credentials of :data:`LEASE_CREDENTIALS`, kept as a launch keeps them (digest only)."""
    from sqlmodel import Session

    from broker.store import LeaseCredentialRecord
    from broker.tokens import digest_hex

    with Session(engine) as s:
        for caller, (lease_id, revoked_at) in LEASE_CREDENTIALS.items():
            s.add(LeaseCredentialRecord(digest=digest_hex(CALLERS[caller]), lease_id=lease_id, created_at=0.5,
                                        revoked_at=revoked_at))
        s.commit()


def _md(token):
    return () if token is None else (("authorization", f"Bearer {token}"),)


def _call(stub, method: str, request, token):
    try:
        getattr(stub, method)(request, metadata=_md(token), timeout=10)
        return OK
    except grpc.RpcError as e:
        return e.code()


def _snapshot(queue: str) -> pb.QueueSnapshot:
    s = pb.QueueSnapshot(source=f"kueue:{queue}")
    s.pending.add(job_id="p1", queue=queue, gpus=8, gpu_model="H100", est_runtime_s=3600, waited_s=7200)
    s.nodes.add(name="n1", state="alloc", gpus_total=8, gpus_allocated=8, gpu_model="H100")
    return s


def _requests(quotes, own: str, other: str):
    """(rpc, case, request, which side's object) for every unary RPC."""
    job = pb.Job(job_id="j-new")
    offering = pb.Offering(provider="aws", region="us-east-1", instance_type="p5.48xlarge",
                           market=pb.MARKET_ON_DEMAND, count=1)
    return [
        ("Quote", "own", pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=1))),
        ("Quote", "other", pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=1,
                                                            tenant=f"team-{other}"))),
        # rank 99 does not exist: INVALID_ARGUMENT proves the call got past every wall
        ("Launch", "own", pb.LaunchRequest(idempotency_key="k", quote_offer=pb.QuoteOffer(
            quote_id=quotes[own], rank=99))),
        ("Launch", "other", pb.LaunchRequest(idempotency_key="k", quote_offer=pb.QuoteOffer(
            quote_id=quotes[other], rank=99))),
        ("Launch", "other-tenant", pb.LaunchRequest(idempotency_key="k", offering=offering, tenant=f"team-{other}")),
        ("Launch", "missing", pb.LaunchRequest(idempotency_key="k", quote_offer=pb.QuoteOffer(
            quote_id="q-missing", rank=1))),
        ("GetLease", "own", pb.GetLeaseRequest(lease_id=f"l-{own}")),
        ("GetLease", "other", pb.GetLeaseRequest(lease_id=f"l-{other}")),
        ("GetLease", "missing", pb.GetLeaseRequest(lease_id="l-missing")),
        ("ListLeases", "own", pb.ListLeasesRequest()),
        ("ListLeases", "other", pb.ListLeasesRequest(tenant=f"team-{other}")),
        ("Release", "own", pb.ReleaseRequest(lease_id=f"l-{own}-old")),
        ("Release", "other", pb.ReleaseRequest(lease_id=f"l-{other}-old")),
        ("Release", "missing", pb.ReleaseRequest(lease_id="l-missing")),
        ("Handoff", "own", pb.HandoffRequest(lease_id=f"l-{own}", job=pb.Job(job_id=f"j-{own}"))),
        ("Handoff", "other", pb.HandoffRequest(lease_id=f"l-{other}", job=pb.Job(job_id=f"j-{other}"))),
        ("Handoff", "missing", pb.HandoffRequest(lease_id="l-missing", job=job)),
        ("ReportQueue", "own", pb.ReportQueueRequest(snapshot=_snapshot(f"team-{own}"))),
        ("ReportQueue", "other", pb.ReportQueueRequest(snapshot=_snapshot(f"team-{other}"))),
        ("Diagnose", "own", pb.DiagnoseRequest(snapshot=_snapshot(f"team-{own}"))),
        ("Diagnose", "other", pb.DiagnoseRequest(snapshot=_snapshot(f"team-{other}"))),
        ("Diagnose", "latest", pb.DiagnoseRequest()),
        ("ListDecisions", "own", pb.ListDecisionsRequest()),
        ("ReportJob", "own", pb.ReportJobRequest(lease_id=f"l-{own}", job_id=f"j-{own}", state=pb.JOB_STATE_RUNNING)),
        ("ReportJob", "other", pb.ReportJobRequest(lease_id=f"l-{other}", job_id=f"j-{other}",
                                                   state=pb.JOB_STATE_RUNNING)),
        ("ReportJob", "missing", pb.ReportJobRequest(lease_id="l-missing", job_id="j", state=pb.JOB_STATE_RUNNING)),
        # past every wall: the lease runs another job
        ("ReportJob", "wrong-job", pb.ReportJobRequest(lease_id=f"l-{own}", job_id="j-new", state=pb.JOB_STATE_RUNNING)),
    ]


# What each role gets: by (rpc, case); anything not listed for a role that may call the RPC is OK.
TENANT = {("Quote", "other"): DENIED, ("Launch", "own"): INVALID, ("Launch", "other"): MISSING,
          ("Launch", "other-tenant"): DENIED, ("Launch", "missing"): MISSING,
          ("GetLease", "other"): MISSING, ("GetLease", "missing"): MISSING, ("ListLeases", "other"): DENIED,
          ("Release", "other"): MISSING, ("Release", "missing"): MISSING,
          ("Handoff", "other"): MISSING, ("Handoff", "missing"): MISSING,
          ("ReportJob", "other"): MISSING, ("ReportJob", "missing"): MISSING, ("ReportJob", "wrong-job"): CONFLICT}
SCHEDULER = {("ReportQueue", "other"): DENIED, ("Diagnose", "other"): DENIED, ("Diagnose", "latest"): DENIED}
OPERATOR = {("Launch", "own"): INVALID, ("Launch", "other"): INVALID, ("Launch", "other-tenant"): INVALID,
            ("Launch", "missing"): MISSING, ("GetLease", "missing"): MISSING, ("Release", "missing"): MISSING,
            ("Handoff", "missing"): MISSING, ("ReportJob", "missing"): MISSING, ("ReportJob", "wrong-job"): CONFLICT}
#: A lease's credential: ReportJob on its own lease only; another lease (or none) is refused
#: without being looked up.
LEASE = {("ReportJob", "other"): DENIED, ("ReportJob", "missing"): DENIED, ("ReportJob", "wrong-job"): CONFLICT}
ROLE_OF = {"none": Role.NONE, "bad": Role.NONE, "tenant-a": Role.TENANT, "tenant-b": Role.TENANT,
           "scheduler-a": Role.SCHEDULER, "operator": Role.OPERATOR,
           "store-tenant-a": Role.TENANT, "store-scheduler-a": Role.SCHEDULER, "store-operator": Role.OPERATOR,
           "store-revoked": Role.NONE, "store-expired": Role.NONE,
           "lease-a": Role.LEASE, "lease-b": Role.LEASE, "lease-a-old": Role.NONE}


def expected(caller: str, rpc: str, case: str):
    role = ROLE_OF[caller]
    if role is Role.NONE:
        return UNAUTH  # before any lookup: a missing id and an existing one look the same
    if role not in TABLE[rpc]:
        return DENIED
    table = {Role.TENANT: TENANT, Role.SCHEDULER: SCHEDULER, Role.OPERATOR: OPERATOR, Role.LEASE: LEASE}[role]
    return table.get((rpc, case), OK)


def test_the_table_names_every_rpc_of_the_service():
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["Broker"].methods}
    assert set(TABLE) == methods


@pytest.mark.parametrize("caller", list(CALLERS))
def test_every_unary_rpc_for_every_role_and_object(world, caller):
    stub, quotes, _ = world
    own, other = ("b", "a") if caller in ("tenant-b", "lease-b") else ("a", "b")
    got, want = {}, {}
    for rpc, case, request in _requests(quotes, own, other):
        got[rpc, case] = _call(stub, rpc, request, CALLERS[caller])
        want[rpc, case] = expected(caller, rpc, case)
    assert got == want


@pytest.mark.parametrize("token", [None, "nope"])
def test_no_token_is_unauthenticated_before_the_request_is_even_read(world, token):
    """Authentication comes first: an unauthenticated caller learns nothing from its request,
    neither whether an id exists nor whether the request is well formed."""
    stub, _, start = world
    for rpc, request in (("GetLease", pb.GetLeaseRequest(lease_id="l-\x00")),
                         ("Release", pb.ReleaseRequest(lease_id="l-" + "9" * 5000)),
                         ("Launch", pb.LaunchRequest(offering=pb.Offering(count=2**31 - 1))),
                         ("Quote", pb.QuoteRequest()),
                         ("ListDecisions", pb.ListDecisionsRequest(limit=-1)),
                         ("Diagnose", pb.DiagnoseRequest(snapshot=pb.QueueSnapshot(source="x" * 1000)))):
        assert _call(stub, rpc, request, token) == UNAUTH, rpc
    with pytest.raises(grpc.RpcError) as e:
        _watch(stub, token, -1, lease_id="l-\x00")
    assert e.value.code() == UNAUTH


def test_list_leases_shows_only_the_callers_leases(world):
    stub, _, _ = world
    ids = lambda tok, **kw: sorted(l.lease_id for l in stub.ListLeases(pb.ListLeasesRequest(**kw),  # noqa: E731
                                                                        metadata=_md(tok)).leases)
    assert ids("tok-a") == ["l-a", "l-a-old"] and ids("tok-b") == ["l-b", "l-b-old"]
    assert ids("password") == ["l-a", "l-a-old", "l-b", "l-b-old"]
    assert ids("password", tenant="team-b") == ["l-b", "l-b-old"]


def _watch(stub, token, after: int, **kw) -> list[pb.WatchLeasesResponse]:
    out = []
    call = stub.WatchLeases(pb.WatchLeasesRequest(after_event_id=after, **kw), metadata=_md(token), timeout=2.5)
    try:
        for ev in call:
            out.append(ev)
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    return out


@pytest.mark.parametrize("caller,sees", [("tenant-a", "a"), ("tenant-b", "b"), ("scheduler-a", "a"),
                                         ("operator", "ab"), ("store-tenant-a", "a"),
                                         ("store-scheduler-a", "a"), ("store-operator", "ab")])
def test_watch_leases_filters_every_event(world, caller, sees):
    stub, _, start = world
    events = _watch(stub, CALLERS[caller], start)
    leases = {e.lease.lease_id for e in events if e.lease.lease_id}
    assert leases == {f"l-{s}" for s in sees} | {f"l-{s}-old" for s in sees}
    decisions = {e.decision.decision_id for e in events if e.kind == pb.LEASE_EVENT_KIND_DECISION}
    assert decisions == {f"d-{s}" for s in sees} | ({"d-none"} if ROLE_OF[caller] is Role.OPERATOR else set())
    blob = b"".join(e.SerializeToString() for e in events)
    for side in "ab":
        assert (SECRET[side].encode() in blob) == (side in sees)
        assert (f"i-{side * 3}".encode() in blob) == (side in sees)


@pytest.mark.parametrize("caller", ["none", "bad", "tenant-a", "scheduler-a", "operator", "store-revoked",
                                    "store-operator"])
def test_watch_leases_of_one_lease(world, caller):
    stub, _, start = world
    token = CALLERS[caller]
    role = ROLE_OF[caller]
    for lid, visible in (("l-a", role is not Role.NONE), ("l-b", role is Role.OPERATOR), ("l-missing", False)):
        try:
            events = _watch(stub, token, start, lease_id=lid)
        except grpc.RpcError as e:
            assert not visible
            assert e.code() == (UNAUTH if ROLE_OF[caller] is Role.NONE else MISSING)
            continue
        assert visible and events and {e.lease.lease_id for e in events} == {lid}


def test_a_scheduler_report_cannot_charge_another_tenant(world):
    stub, _, _ = world
    snap = _snapshot("team-a")
    snap.pending.add(job_id="p2", queue="team-b", gpus=8, gpu_model="H100", est_runtime_s=3600, waited_s=7200)
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportQueue(pb.ReportQueueRequest(snapshot=snap), metadata=_md("tok-sched-a"))
    assert e.value.code() == DENIED and "snapshot.pending[1].queue" in e.value.details()


def test_token_specs_parse_and_fail_closed():
    assert parse_spec("team-a") == Principal(Role.TENANT, frozenset({"team-a"}))
    assert parse_spec("*").operator and parse_spec("operator").operator
    assert parse_spec("scheduler:team-a, team-c").tenants == {"team-a", "team-c"}
    assert parse_spec("tenant:team-a").tenant == "team-a"
    for bad in ("", "scheduler:", "admin:x", "tenant:a,b", "team a", "x" * 64, "none:x"):
        with pytest.raises(ValueError):
            parse_spec(bad)
    for tokens in ({"": "team-a"}, {"  ": "team-a"}, {"t": ""}, {"t": "scheduler:"}):
        with pytest.raises(ConfigError):
            Auth(tokens)
    auth = Auth({"t1": "team-a"})
    for md in ((), (("authorization", "Bearer "),), (("authorization", "Bearer t2"),),
               (("authorization", "Basic t1"),), (("authorization", "t1"),)):
        with pytest.raises(Exception) as e:
            auth.authenticate(md)
        assert type(e.value).__name__ == "Unauthenticated"
    assert auth.authenticate((("authorization", "Bearer t1"),)).tenant == "team-a"
    assert not Auth({}).enabled and Auth({}).authenticate(()).operator
    import hashlib

    kept = {hashlib.sha256(b"issued-1").digest(): principal_for("scheduler", ["team-c"])}
    both = Auth({"t1": "team-a"}, issued=kept.get)
    assert both.authenticate((("authorization", "Bearer issued-1"),)).tenants == {"team-c"}
    assert both.authenticate((("authorization", "Bearer t1"),)).tenant == "team-a"
    assert Auth(issued=kept.get).enabled
    with pytest.raises(Exception, match="bearer token"):
        both.authenticate((("authorization", "Bearer issued-2"),))


def test_a_tenant_token_named_like_an_operator_is_a_tenant(tmp_path, mini_catalog_dir):
    with running_server(tmp_path, config={"catalog.path": str(mini_catalog_dir),
                                          "auth.tokens": {"t-star": "tenant:operator-team"}}) as (addr, svc):
        svc.store.create_lease(_lease("team-b", "l-b"))
        with grpc.insecure_channel(addr) as ch:
            stub = pb_grpc.BrokerStub(ch)
            assert _call(stub, "ListDecisions", pb.ListDecisionsRequest(), "t-star") == DENIED
            assert _call(stub, "GetLease", pb.GetLeaseRequest(lease_id="l-b"), "t-star") == MISSING
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not svc.store.last_event_id():
                time.sleep(0.05)
            assert _watch(stub, "t-star", 0) == []


def test_a_scheduler_reports_only_under_its_own_sources(tmp_path, mini_catalog_dir):
    """Snapshots are kept (and decided on) per source: a scheduler naming another's source gets its
    own scope of it, so the other queue, its history and its idle leases stay as they were."""
    tokens = {"tok-sched-a": "scheduler:team-a", "tok-sched-b": "scheduler:team-b", "tok-op": "*"}
    with running_server(tmp_path, config={"catalog.path": str(mini_catalog_dir), "auth.tokens": tokens}) as (addr, svc):
        with grpc.insecure_channel(addr) as ch:
            stub = pb_grpc.BrokerStub(ch)
            stub.ReportQueue(pb.ReportQueueRequest(snapshot=_snapshot("team-b")), metadata=_md("tok-op"))
            stub.ReportQueue(pb.ReportQueueRequest(snapshot=_snapshot("team-b")), metadata=_md("tok-sched-b"))
            hijack = _snapshot("team-a")
            hijack.source = "kueue:team-b"
            stub.ReportQueue(pb.ReportQueueRequest(snapshot=hijack), metadata=_md("tok-sched-a"))
            assert _call(stub, "Diagnose", pb.DiagnoseRequest(snapshot=hijack), "tok-sched-a") == OK
    queues = lambda source: [j["queue"] for j in svc.store.latest_snapshot(source)["pending"]]  # noqa: E731
    assert queues("kueue:team-b") == ["team-b"]  # the operator's, as it sent it
    assert queues("team-b/kueue:team-b") == ["team-b"]  # scheduler b's, untouched by a
    assert queues("team-a/kueue:team-b") == ["team-a"]
    assert Principal(Role.SCHEDULER, frozenset({"team-c", "team-a"})).source("") == "team-a,team-c/default"
    assert parse_spec("*").source("slurm:main") == "slurm:main"


@pytest.mark.parametrize("caller", ["lease-a", "lease-b"])
def test_a_lease_credential_streams_nothing(world, caller):
    """A node's credential reports its own job and nothing else: no events, not even its lease's."""
    stub, _, start = world
    for lid in ("", "l-a", "l-b"):
        with pytest.raises(grpc.RpcError) as e:
            _watch(stub, CALLERS[caller], start, lease_id=lid)
        assert e.value.code() == DENIED


def test_a_lease_role_cannot_be_issued_as_a_token():
    with pytest.raises(ValueError, match="minted"):
        principal_for("lease", ["team-a"])


def test_a_schedulers_empty_snapshot_scales_in_nothing_of_another_tenant(tmp_path, mini_catalog_dir):
    """A scheduler:team-a token reporting an empty queue made the autoscaler release team-b's idle
    lease ("scale-in: idle cloud capacity") and said how many idle nodes others held: every lease
    without a ``job.source`` was taken for the reporting source's."""
    from broker.lease import LeaseState
    from tests.fake_provider import FakeProvider

    tokens = {"tok-sched-a": "scheduler:team-a", "tok-op": "*"}
    autoscaler = {"enabled": True, "trigger": {"stabilization_s": 0, "cooldown_s": 0, "scale_in_idle_s": 60}}
    config = {"catalog.path": str(mini_catalog_dir), "auth.tokens": tokens, "autoscaler": autoscaler}
    with running_server(tmp_path, providers={"aws": FakeProvider("aws")}, config=config) as (addr, svc):
        now = time.time()
        idle = dict(state="running", idle_since=now - 3600, started_at=now - 3600)
        for lid, tenant, job in (("l-b-idle", "team-b", {}), ("l-a-direct", "team-a", {}),
                                 ("l-b-sourced", "team-b", {"source": "kueue:team-b"})):
            from dataclasses import replace

            svc.store.create_lease(replace(_lease(tenant, lid), **idle, job=job, instances=[]))
        empty = pb.QueueSnapshot(source="kueue:team-a")
        empty.nodes.add(name="n1", state="idle", gpus_total=8, gpus_allocated=0, gpu_model="H100")
        with grpc.insecure_channel(addr) as ch:
            stub = pb_grpc.BrokerStub(ch)
            answer = stub.ReportQueue(pb.ReportQueueRequest(snapshot=empty), metadata=_md("tok-sched-a"))
        for lid in ("l-b-idle", "l-a-direct", "l-b-sourced"):
            assert svc.store.get_lease(lid).state is LeaseState.RUNNING, lid
        assert all(d.action != "scale_in" for d in answer.decisions), answer
        text = str(answer)
        assert "idle cloud node" not in text and "l-b" not in text
        assert not [d for d in svc.store.list_decisions(limit=100) if d.action == "scale_in"]
