"""Quote over a real gRPC channel; health and reflection answer; bad input is INVALID_ARGUMENT."""
from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from providers.base import Market
from tests.grpc_server import running_server


@pytest.fixture
def server(tmp_path, mini_catalog_dir):
    with running_server(tmp_path, config={"catalog.path": str(mini_catalog_dir)}) as (addr, svc):
        with grpc.insecure_channel(addr) as ch:
            yield ch, svc


def test_quote_round_trip_is_persisted(server):
    ch, svc = server
    stub = pb_grpc.BrokerStub(ch)
    r = stub.Quote(pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=24, data_in_gb=500), top=3))
    q = r.quote
    assert len(q.offers) == 3
    assert [o.rank for o in q.offers] == [1, 2, 3]
    assert q.offers[0].market == pb.MARKET_ON_DEMAND
    assert q.offers[0].cost.total_usd
    assert any(e.market == pb.MARKET_SPOT and "interruptible" in e.reason and e.kind == pb.EXCLUSION_KIND_MARKET
               for e in q.excluded)
    stored = svc.store.get_quote(q.quote_id)
    assert stored is not None
    assert stored.demand.gpu_model == "H100" and stored.demand.data_in_gb == 500
    first = stored.targets[0]
    assert (first.provider, first.region, first.instance_type) == (q.offers[0].provider, q.offers[0].region,
                                                                    q.offers[0].instance_type)
    assert first.market is Market.ON_DEMAND


def test_a_stored_quote_reads_back_from_the_database_as_the_same_typed_value(tmp_path):
    from broker.store import Store
    from policies.demand import Demand

    with running_server(tmp_path) as (_, svc):
        q = svc.quote(Demand(gpus=16, hours=4, gpu_model="H100", interruptible=True, checkpoint_minutes=30,
                             residency=("us",), deadline=2e9))
        from_disk = Store(svc.config.db_url)  # a second process's view: nothing in memory
        try:
            stored = from_disk.get_quote(q.quote_id)
        finally:
            from_disk.close()
    assert stored == svc.store.get_quote(q.quote_id)
    assert stored.targets == q.targets()
    assert stored.demand == q.demand
    target, rest = stored.pick(2, now=q.created_at)
    assert target == q.targets()[1] and rest == [q.targets()[0], *q.targets()[2:]]


@pytest.mark.parametrize(
    "demand, field",
    [(pb.Demand(gpu_model="H100", gpus=0, hours=1), "demand.gpus"),
     (pb.Demand(gpu_model="H100", gpus=8, hours=0), "demand.hours"),
     (pb.Demand(gpu_model="NOPE", gpus=8, hours=1), "demand.gpu_model"),
     (pb.Demand(gpu_model="H100", gpus=8, hours=1, providers=["oracle"]), "demand.providers")],
)
def test_bad_demand_is_invalid_argument_naming_the_field(server, demand, field):
    ch, _ = server
    with pytest.raises(grpc.RpcError) as e:
        pb_grpc.BrokerStub(ch).Quote(pb.QuoteRequest(demand=demand))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(field)


def test_missing_demand_is_invalid_argument(server):
    ch, _ = server
    with pytest.raises(grpc.RpcError) as e:
        pb_grpc.BrokerStub(ch).Quote(pb.QuoteRequest())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_and_reflection(server):
    ch, _ = server
    h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="broker.v1.Broker"))
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(ch)
    responses = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {"broker.v1.Broker", "grpc.health.v1.Health"} <= names


def test_unknown_lease_is_not_found(server):
    ch, _ = server
    with pytest.raises(grpc.RpcError) as e:
        pb_grpc.BrokerStub(ch).GetLease(pb.GetLeaseRequest(lease_id="l-nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_watch_resumes_after_an_event_id(server):
    ch, svc = server
    svc.store.add_event("l-x", "budget", "first", 1.0)
    svc.store.add_event("l-x", "budget", "second", 2.0)
    stub = pb_grpc.BrokerStub(ch)
    stream = stub.WatchLeases(pb.WatchLeasesRequest(after_event_id=1), timeout=5)
    first = next(stream)
    stream.cancel()
    assert (first.message, first.event_id) == ("second", 2)
    with pytest.raises(grpc.RpcError) as e:
        next(stub.WatchLeases(pb.WatchLeasesRequest(after_event_id=-1), timeout=5))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_every_offer_shown_stays_launchable_when_a_demand_repeats(tmp_path):
    from policies.demand import Demand

    with running_server(tmp_path) as (_, svc):
        d = Demand(gpus=8, hours=4, gpu_model="H100", interruptible=True)
        svc.quote(d, top=3)  # the same demand again below, asking for more offers
        q = svc.quote(d, top=30)
        assert len(q.offers) == 30
        assert svc.store.get_quote(q.quote_id).targets == q.targets(30)


def test_a_quote_id_the_client_has_seen_is_launchable_on_every_replica(tmp_path):
    """Two replicas on one database: the moment a quote returns on one, the other finds it."""
    from broker.store import Store
    from policies.demand import Demand

    with running_server(tmp_path) as (_, svc):
        other = Store(svc.config.db_url)  # the second replica's store: nothing of the first in memory
        try:
            for i in range(30):
                q = svc.quote(Demand(gpus=8, hours=1 + i, gpu_model="H100"))
                seen = other.get_quote(q.quote_id)
                assert seen is not None, f"quote {i} was not on disk when its id was returned"
                assert seen.targets == q.targets()
        finally:
            other.close()


def test_a_quote_that_cannot_be_stored_is_unavailable_not_a_dangling_id(tmp_path):
    from broker.errors import Unavailable
    from policies.demand import Demand
    from sqlalchemy import text

    with running_server(tmp_path) as (addr, svc):
        with svc.store.engine.begin() as conn:
            conn.execute(text("DROP TABLE quotes"))
        with pytest.raises(Unavailable):
            svc.quote(Demand(gpus=8, hours=2, gpu_model="H100"))
        with grpc.insecure_channel(addr) as ch, pytest.raises(grpc.RpcError) as e:
            pb_grpc.BrokerStub(ch).Quote(pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=3)))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_watch_after_zero_replays_the_first_event_and_unset_means_only_new_ones(server):
    ch, svc = server
    svc.store.add_event("", "budget", "first", 1.0)
    stub = pb_grpc.BrokerStub(ch)
    stream = stub.WatchLeases(pb.WatchLeasesRequest(after_event_id=0), timeout=5)
    first = next(stream)
    stream.cancel()
    assert (first.message, first.event_id) == ("first", 1)
    import threading

    stream = stub.WatchLeases(pb.WatchLeasesRequest(), timeout=10)  # from now: the old event is not sent
    got = threading.Event()

    def tick():  # the stream starts at some point; keep writing until it has seen one
        n = 2
        while not got.wait(0.1):
            svc.store.add_event("", "budget", f"later {n}", float(n))
            n += 1

    writer = threading.Thread(target=tick)
    writer.start()
    try:
        nxt = next(stream)
    finally:
        got.set()
        writer.join()
        stream.cancel()
    assert nxt.event_id > 1 and nxt.message.startswith("later")


def test_watch_of_an_unknown_lease_is_not_found_before_any_event(server):
    ch, _ = server
    with pytest.raises(grpc.RpcError) as e:
        next(pb_grpc.BrokerStub(ch).WatchLeases(pb.WatchLeasesRequest(lease_id="l-nope"), timeout=10))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
