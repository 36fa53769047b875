"""The lease's inner records are typed (Instance, Job, Attempt; the demand and its alternatives)
and stored by one codec, in the JSON layout of earlier releases: rows written before the types
load unchanged on SQLite and PostgreSQL, and what is written now keeps the same keys and strings."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import insert

from broker import records
from broker.lease import Lease, LeaseState
from broker.quote import StoredQuote
from broker.records import Attempt, Instance, Job, LaunchPlan, Target
from broker.store import LeaseRecord, QuoteRecord, Store
from policies.demand import Demand
from providers.base import InstanceState, Market
from tests.stores import db_url  # noqa: F401  (fixture)

# A lease row as the release before the typed records wrote it (json.dumps of hand-made dicts;
# the demand by views.demand_to_dict, its deadline as RFC 3339 text).
OLD_JOB = {"job_id": "train-7", "owner": "ana", "queue": "gpu", "checkpoint_uri": "s3://ck/7",
           "dataset_uri": "", "env": {"EPOCHS": "3"}, "state": "running", "restarts": 1, "max_restarts": 3,
           "base_done_s": 600.0, "total_hours": 10.0, "attached_at": 5.0, "checkpoint_requested": True,
           "replaced_by": "l-2", "progress": 0.25}
OLD_INSTANCES = [{"instance_id": "i-0abc", "node_name": "l-1-1-0", "zone": "us-east-1a",
                  "private_ip": "10.0.0.4", "state": "running", "region": "us-east-1"},
                 {"instance_id": "i-0def", "node_name": "l-1-1-1", "zone": "us-east-1a",
                  "private_ip": "10.0.0.5", "state": "terminated", "region": "us-east-1"}]
OLD_ATTEMPTS = [{"provider": "gcp", "region": "us-central1", "zone": "us-central1-a", "instance_type": "a3-highgpu-8g",
                 "market": "spot", "code": "ZONE_RESOURCE_POOL_EXHAUSTED", "scope": "gcp/us-central1/us-central1-a",
                 "kind": "capacity", "message": "no capacity"}]
OLD_DEMAND = {"gpu_model": "H100", "min_gpu_memory_gb": 0, "gpus": 16, "nodes": 2, "hours": 8.0, "data_in_gb": 0.0,
              "data_location": "onprem", "data_out_gb": 0.0, "interruptible": True, "checkpoint_minutes": 30,
              "providers": ["aws", "gcp"], "regions": [], "residency": ["us"], "min_sla_pct": 0.0,
              "deadline": "2026-12-04T06:00:00Z", "tenant": "team-a",
              "alternatives": [{"provider": "gcp", "region": "us-central1", "zone": "us-central1-a",
                                "instance_type": "a3-highgpu-8g", "market": "spot", "nodes": 2,
                                "hourly_micros": 30_000_000, "reservation": ""}]}


def old_row(**kw) -> dict:
    row = dict(lease_id="l-1", tenant="team-a", idempotency_key="k-1", state="running", state_reason="", version=3,
               provider="aws", region="us-east-1", zone="us-east-1a", instance_type="p5.48xlarge", market="spot",
               nodes=2, hourly_micros=40_000_000, reservation="", client_token="l-1-1", attempt=1, quote_id="q-1",
               offer_rank=1, bootstrap="", job=json.dumps(OLD_JOB), instances=json.dumps(OLD_INSTANCES),
               demand=json.dumps(OLD_DEMAND), attempts=json.dumps(OLD_ATTEMPTS), created_at=1.0, updated_at=2.0,
               state_since=2.0, started_at=2.0, ended_at=0.0, accrued_micros=0, accrued_at=2.0, max_lifetime_s=0,
               idle_since=0.0, replaces="", job_state="running")
    return {**row, **kw}


def test_a_lease_row_written_in_the_old_shape_loads_as_typed_records(db_url):  # noqa: F811
    store = Store(db_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(insert(LeaseRecord.__table__).values(**old_row()))
            conn.execute(insert(LeaseRecord.__table__).values(**old_row(
                lease_id="l-x", idempotency_key="k-x", job="{}", instances="[]", demand="{}", attempts="[]")))
        lease = store.get_lease("l-1")
        assert lease.job == Job(job_id="train-7", owner="ana", queue="gpu", checkpoint_uri="s3://ck/7",
                                env={"EPOCHS": "3"}, state="running", restarts=1, max_restarts=3, base_done_s=600.0,
                                total_hours=10.0, attached_at=5.0, checkpoint_requested=True, replaced_by="l-2",
                                progress=0.25)
        assert lease.instances == (
            Instance(instance_id="i-0abc", node_name="l-1-1-0", zone="us-east-1a", private_ip="10.0.0.4",
                     state=InstanceState.RUNNING, region="us-east-1"),
            Instance(instance_id="i-0def", node_name="l-1-1-1", zone="us-east-1a", private_ip="10.0.0.5",
                     state=InstanceState.TERMINATED, region="us-east-1"))
        assert lease.attempts == (Attempt(provider="gcp", region="us-central1", zone="us-central1-a",
                                          instance_type="a3-highgpu-8g", market=Market.SPOT,
                                          code="ZONE_RESOURCE_POOL_EXHAUSTED", scope="gcp/us-central1/us-central1-a",
                                          kind="capacity", message="no capacity"),)
        assert lease.demand == Demand(gpus=16, hours=8.0, gpu_model="H100", nodes=2, interruptible=True,
                                      checkpoint_minutes=30, providers=("aws", "gcp"), residency=("us",),
                                      deadline=1796364000.0, tenant="team-a")
        assert lease.alternatives == (Target("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", Market.SPOT,
                                             2, 30_000_000),)
        assert lease.market is Market.SPOT and lease.target.market is Market.SPOT
        bare = store.get_lease("l-x")  # an explicit launch, no job: the empty records
        assert (bare.job, bare.instances, bare.demand, bare.alternatives, bare.attempts) == (Job(), (), None, (), ())
        assert not bare.job and lease.job
    finally:
        store.engine.dispose()


def test_what_is_written_now_keeps_the_old_keys_and_strings(db_url):  # noqa: F811
    store = Store(db_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(insert(LeaseRecord.__table__).values(**old_row()))
        lease = store.get_lease("l-1")
        lease = store.update_lease(lease, now=3.0, job=lease.job.with_(notice_at=3.0), instances=lease.instances,
                                   attempts=lease.attempts)
        with store.engine.connect() as conn:
            row = conn.execute(LeaseRecord.__table__.select().where(LeaseRecord.__table__.c.lease_id == "l-1")).one()
        # the same keys and values; a field at its default ("" dataset_uri) is left out, and reads back the same
        assert json.loads(row.job) == {k: v for k, v in {**OLD_JOB, "notice_at": 3.0}.items() if v != ""}
        assert json.loads(row.instances) == OLD_INSTANCES and json.loads(row.attempts) == OLD_ATTEMPTS
        assert (row.market, row.state) == ("spot", "running")
        assert store.get_lease("l-1").job.notice_at == 3.0
    finally:
        store.engine.dispose()


def test_a_new_lease_stores_its_demand_and_alternatives_in_the_one_column(db_url):  # noqa: F811
    store = Store(db_url)
    demand = Demand(gpus=8, hours=2.0, gpu_model="H100", deadline=1796364000.0, providers=("aws",))
    alt = Target("gcp", "us-central1", "us-central1-b", "a3-highgpu-8g", Market.ON_DEMAND, 1, 88_000_000)
    try:
        lease, _ = store.create_lease(Lease(
            lease_id="l-n", idempotency_key="k-n", state=LeaseState.REQUESTED, provider="aws", region="us-east-1",
            instance_type="p5.48xlarge", market=Market.ON_DEMAND, nodes=1, hourly_micros=98_000_000,
            client_token="l-n-1", created_at=1.0, updated_at=1.0, state_since=1.0, demand=demand,
            alternatives=(alt,), job=Job(job_id="j-1", env={"A": "b"})))
        back = store.get_lease("l-n")
        assert (back.demand, back.alternatives, back.job) == (demand, (alt,), Job(job_id="j-1", env={"A": "b"}))
        with store.engine.connect() as conn:
            row = conn.execute(LeaseRecord.__table__.select().where(LeaseRecord.__table__.c.lease_id == "l-n")).one()
        stored = json.loads(row.demand)
        assert stored["gpus"] == 8 and stored["alternatives"][0]["market"] == "on_demand"
        assert json.loads(row.job) == {"job_id": "j-1", "env": {"A": "b"}} and row.market == "on_demand"
    finally:
        store.engine.dispose()


def test_a_quote_stored_by_the_previous_codec_still_loads(db_url):  # noqa: F811
    from pydantic import TypeAdapter  # the previous release's codec of stored quotes

    demand = Demand(gpus=8, hours=2.0, gpu_model="H100", deadline=1796364000.0, tenant="team-a")
    targets = (Target("aws", "us-east-1", "us-east-1a", "p5.48xlarge", Market.SPOT, 1, 40_000_000),
               Target("azure", "eastus", "", "Standard_ND96isr_H100_v5", Market.ON_DEMAND, 1, 98_000_000, "r-1"))
    q = StoredQuote("q-old", 1.0, 9e9, demand, targets)
    store = Store(db_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(insert(QuoteRecord.__table__).values(
                quote_id="q-old", created_at=1.0, valid_until=9e9, body=TypeAdapter(StoredQuote).dump_json(q).decode()))
        assert store.get_quote("q-old") == q
        assert StoredQuote.from_json(q.to_json()) == q  # and the one codec reads its own
    finally:
        store.engine.dispose()


@pytest.mark.parametrize("body", ['{"quote_id": "q", "targets": 7}', "not json", '{"demand": {"gpus": "x"}}'])
def test_a_stored_quote_of_another_layout_is_refused_with_a_value_error(body):
    with pytest.raises(ValueError):
        StoredQuote.from_json(body)


def test_a_record_that_does_not_fit_names_the_field():
    with pytest.raises(ValueError, match=r"instance_id"):
        records.decode('[{"zone": "a"}]', tuple[Instance, ...])
    with pytest.raises(ValueError, match=r"market"):
        records.decode('[{"provider": "aws", "region": "r", "market": "cheap"}]', tuple[Attempt, ...])
    with pytest.raises(ValueError, match=r"restarts"):
        records.decode('{"restarts": "many"}', Job)


def test_the_plan_column_round_trips_and_an_explicit_launch_stores_an_empty_object():
    plan = LaunchPlan(demand=Demand(gpus=1, hours=1.0), alternatives=(
        Target("aws", "r", "z", "t", Market.RESERVED, 1, 5, "res-1"),))
    assert records.plan_from(records.plan_to_json(plan)) == plan
    assert records.plan_to_json(LaunchPlan()) == "{}" and records.plan_from("{}") == LaunchPlan()


def test_event_kinds_and_decision_actions_are_enums_that_keep_the_stored_strings(db_url):  # noqa: F811
    from broker.convert import EVENT_FROM_PB, EVENT_TO_PB
    from broker.lease import EventKind
    from broker.v1 import broker_pb2 as pb
    from policies.triggers import DecisionAction

    assert set(EVENT_TO_PB) == set(EventKind)  # every kind has its protobuf value, and back
    assert set(EVENT_TO_PB.values()) == set(pb.LeaseEventKind.values()) - {pb.LEASE_EVENT_KIND_UNSPECIFIED}
    assert {EVENT_FROM_PB[v] for v in EVENT_TO_PB.values()} == {k.value for k in EventKind}
    assert [a.value for a in DecisionAction] == ["burst", "hold", "scale_in", "burst_failed", "offload",
                                                 "offload_failed"]
    store = Store(db_url)
    try:
        store.record_decision("d-1", 5.0, DecisionAction.BURST_FAILED, "no offer", ["j-1"], "l-1")
        store.add_event("l-1", EventKind.BUDGET_WARNING, "80 %", 6.0, {"job": Job(job_id="j-1")})
        (d,) = store.list_decisions()
        assert type(d.action) is str and d.action == "burst_failed"
        kinds = [(type(e.kind), e.kind) for e in store.events_of("l-1")]
        assert kinds == [(str, "decision"), (str, "budget_warning")]
        assert json.loads(store.events_of("l-1")[1].data) == {"job": {"job_id": "j-1"}}
    finally:
        store.engine.dispose()
