"""The Quote response path: money formatted from integer micro-dollars is the Decimal formatting
to the digit, and the pre-encoded QuoteResponse is byte for byte what protobuf would encode."""
from __future__ import annotations

import random
from decimal import Decimal

import grpc
import pytest

from broker import convert
from broker.quote import QuoteEngine, usd
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from policies.demand import Demand
from providers.catalog import bundled
from tests.grpc_server import running_server


def decimal_money(micros: int) -> str:
    return convert.money(usd(micros))


@pytest.mark.parametrize("micros", [0, 1, 49, 50, 51, 99, 100, 150, 250, 350, 12_340_000, 12_345_650,
                                    12_345_750, 999_999_950, 10**15 + 50, -1_000_050, -12_340_000,
                                    -150, -1, -50, -51])
def test_usd_text_rounds_half_to_even_as_decimal_does(micros):
    assert convert.usd_text(micros) == decimal_money(micros)


def test_usd_text_matches_decimal_over_random_amounts():
    rng = random.Random(7)
    for _ in range(20_000):
        m = rng.choice([rng.randrange(0, 10**6), rng.randrange(0, 10**12), rng.randrange(0, 10**4) * 100 + 50])
        assert convert.usd_text(m) == decimal_money(m), m


@pytest.fixture(scope="module")
def quotes():
    engine = QuoteEngine(bundled())
    demands = [Demand(gpus=8, hours=24, gpu_model="H100", data_in_gb=500, data_out_gb=50),
               Demand(gpus=8, hours=24, min_gpu_memory_gb=1, data_in_gb=500, interruptible=True),
               Demand(gpus=1, hours=0.5, gpu_model="A100", interruptible=True, checkpoint_minutes=7,
                      tenant="team-a")]
    return [engine.quote(engine.validate(d)) for d in demands]


def test_every_cost_line_and_total_is_the_decimal_figure(quotes):
    n = 0
    for q in quotes:
        m = convert.quote_to_pb(q)
        for offer, ranked in zip(m.offers, q.offers, strict=True):
            c = ranked.priced.cost
            assert offer.hourly_usd == decimal_money(ranked.offering.hourly_micros)
            assert offer.cost.compute_usd == decimal_money(c.compute)
            assert offer.cost.interruption_usd == decimal_money(c.interruption)
            assert offer.cost.storage_usd == decimal_money(c.storage)
            assert offer.cost.data_transfer_usd == decimal_money(c.data_transfer)
            assert offer.cost.sla_risk_usd == decimal_money(c.sla_risk)
            assert offer.cost.total_usd == convert.money(sum(usd(x) for x in c))
            assert Decimal(offer.cost.total_usd) == sum(Decimal(x) for x in (
                offer.cost.compute_usd, offer.cost.interruption_usd, offer.cost.storage_usd,
                offer.cost.data_transfer_usd, offer.cost.sla_risk_usd))
            n += 1
    assert n > 200  # the whole-catalog demand prices hundreds of offers


def test_the_pre_encoded_response_is_the_encoded_message(quotes):
    for q in quotes:
        body = convert.quote_body_pb(q).SerializeToString()
        whole = pb.QuoteResponse(quote=convert.quote_to_pb(q)).SerializeToString()
        assert convert.quote_response_bytes(q, body) == whole
        back = pb.QuoteResponse.FromString(convert.quote_response_bytes(q, body)).quote
        assert back.quote_id == q.quote_id and convert.from_ts(back.valid_until) == pytest.approx(q.valid_until)
        assert len(back.offers) == len(q.offers) and len(back.excluded) == len(q.excluded)


def test_repeated_quotes_over_grpc_share_one_encoded_body_but_not_ids(tmp_path):
    """The second answer to the same demand is served from the encoded cache: another quote id
    and validity, the same offers, and each id is stored for Launch."""
    with running_server(tmp_path) as (addr, svc), grpc.insecure_channel(addr) as ch:
        stub = pb_grpc.BrokerStub(ch)
        req = pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=24, data_in_gb=500), top=3)
        a, b = stub.Quote(req).quote, stub.Quote(req).quote
        assert a.quote_id != b.quote_id
        assert list(a.offers) == list(b.offers) and list(a.excluded) == list(b.excluded)
        assert b.valid_until.ToNanoseconds() >= a.valid_until.ToNanoseconds()
        assert svc.store.get_quote(a.quote_id) is not None and svc.store.get_quote(b.quote_id) is not None
        # another tenant's demand is its own result: its quote names its own demand
        other = stub.Quote(pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=24, data_in_gb=500,
                                                            tenant="team-b"), top=3)).quote
        assert other.demand.tenant == "team-b" and not a.demand.tenant
