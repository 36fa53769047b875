"""One spot choice: the live quote and the simulator pick the same offer for the same demand and
the same observed lifetimes (policies.spot_choice, used by both), and the quote says what it
judged spot by (``spot_model``)."""
from __future__ import annotations

import csv
import random
import time
from pathlib import Path

import pytest

from broker import config as cfgmod
from broker.service import Service
from broker.simulate import SimConfig, builtin_policies, load_lifetimes
from broker.simulate.chooser import Chooser, hours_bucket
from broker.simulate.trace import TraceJob
from policies.cost import ExclusionKind
from policies.demand import Demand
from providers.base import Market
from providers.catalog import bundled

REAL = "spot/spot_instance_lifetimes_aws_gcp_2020.csv"


def write_lifetimes(path: Path, seed: int) -> Path:
    """A generated lifetimes file, some rows censored (still running when the log ended), like
    the 2020 data's shape: odd seeds have AWS nodes live hours, GCP ones a day or more, Azure's
    between; even seeds have every cloud's nodes live a few hours."""
    rng = random.Random(seed)
    scale = {"aws": 3 * 3600, "gcp": 30 * 3600, "azure": 10 * 3600} if seed % 2 else \
        {"aws": 2 * 3600, "gcp": 5 * 3600, "azure": 3 * 3600}
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["cloud", "instance", "observed_lifetime_s", "ended_by"])
        for cloud, s in scale.items():
            for i in range(60 + seed % 40):
                censored = rng.random() < 0.15
                w.writerow([cloud, f"{cloud}-{i}", round(rng.expovariate(1 / s)) + 60,
                            "still_running_at_end" if censored else "not_running(preempted)"])
    return path


def lifetimes_files(tmp_path: Path, shared: Path | None) -> list[Path]:
    files = [write_lifetimes(tmp_path / f"gen-{seed}.csv", seed) for seed in (1, 2)]
    if shared is not None and (shared / REAL).exists():
        files.append(shared / REAL)
    return files


def service(tmp_path: Path, name: str, **market) -> Service:
    cfg = cfgmod.load(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path / name}.db",
                                                   "market": market})
    return Service(cfg, providers={})  # no cloud enabled: the quote prices every cloud's offers


def simulated_pick(lifetimes_path: Path, d: Demand):
    """Where the simulator's ``broker`` policy sends a trace job of demand ``d``, and its cost."""
    chooser = Chooser(bundled(), builtin_policies()["broker"], SimConfig(onprem_gpus=8),
                      load_lifetimes(lifetimes_path))
    job = TraceJob("j", 0.0, d.gpus, d.hours * 3600.0, interruptible=d.interruptible, gpu_model=d.gpu_model,
                   checkpoint_minutes=d.checkpoint_minutes)
    first = chooser.choose(job).first
    key = (d.gpus, d.interruptible, d.gpu_model, 0, hours_bucket(d.hours), d.checkpoint_minutes)
    (priced,) = [p for p in chooser.priced(key, d.hours) if p.offering == first.offering]
    return first, priced


# Runtimes the simulator prices exactly (its shape cache buckets hours by quarter powers of two).
HOURS = [2.0 ** (b / 4.0) for b in (8, 13, 17, 20, 24)]  # 4 h, 9.5 h, 19 h, 32 h, 64 h
DEMANDS = [Demand(gpus=g, hours=h, gpu_model=m, interruptible=True, checkpoint_minutes=c)
           for g, m in ((1, "A100"), (8, "A100"), (16, "A100"), (8, "H100"), (4, "V100"))
           for h in HOURS for c in (20, 60, 240)]


def test_the_live_quote_and_the_simulator_pick_the_same_offer(tmp_path, request):
    shared = None
    try:
        shared = request.getfixturevalue("shared_data")
    except pytest.skip.Exception:
        pass
    ruled_out = moved = 0
    for i, path in enumerate(lifetimes_files(tmp_path, shared)):
        svc = service(tmp_path, f"s{i}", spot_lifetimes=str(path))
        try:
            for d in DEMANDS:
                q = svc.quote(d)
                assert q.spot_model.startswith("observed lifetimes: ") and path.name in q.spot_model
                top = q.offers[0].priced
                first, priced = simulated_pick(path, d)
                where = (d, path.name)
                # The same offer up to ties: regions that sell it at the same price rank by name.
                assert (first.offering.provider, first.offering.instance.name, first.offering.market,
                        first.nodes) == (top.offering.provider, top.offering.instance.name, top.offering.market,
                                         top.nodes), where
                assert priced.cost.total == top.cost.total, where
                late = [e for e in q.excluded if e.kind is ExclusionKind.DEADLINE and "observed lifetimes" in e.reason]
                ruled_out += bool(late)
                cheapest = min((p for p in (r.priced for r in q.offers)), key=lambda p: p.cost.total)
                moved += any(e.offering.market is Market.SPOT for e in late) and top.offering.market is not Market.SPOT
                assert cheapest == top or cheapest.cost.total == top.cost.total
        finally:
            svc.stop()
    # Not vacuous: the lifetimes ruled spot offers out, and sent some jobs off spot altogether.
    assert ruled_out >= 10 and moved >= 1, (ruled_out, moved)


def test_a_job_that_would_not_finish_on_spot_is_not_sent_there(tmp_path, request):
    """A 20 h job with hourly checkpoints and a 21 h deadline: by the catalog's interruption
    rates spot looks fine (its mean loss fits); by observed lifetimes it does not finish in time
    with 90 % confidence, so the quote's first offer is on-demand, and says why spot is out."""
    shared = None
    try:
        shared = request.getfixturevalue("shared_data")
    except pytest.skip.Exception:
        pass
    path = shared / REAL if shared is not None and (shared / REAL).exists() else write_lifetimes(tmp_path / "g.csv", 1)
    now = time.time()
    d = Demand(gpus=1, hours=20, gpu_model="A100", interruptible=True, checkpoint_minutes=60,
               providers=("aws", "gcp"), deadline=now + 21 * 3600)
    rates, lives = service(tmp_path, "rates"), service(tmp_path, "lives", spot_lifetimes=str(path))
    try:
        by_rates, by_lives = rates.quote(d), lives.quote(d)
    finally:
        rates.stop()
        lives.stop()
    assert by_rates.spot_model == "interruption rates: aws, azure, gcp"
    assert by_rates.offers[0].offering.market is Market.SPOT
    assert by_lives.offers[0].offering.market is Market.ON_DEMAND
    assert all(r.offering.market is not Market.SPOT for r in by_lives.offers)
    spot_out = [e for e in by_lives.excluded if e.offering.market is Market.SPOT and e.kind is ExclusionKind.DEADLINE]
    # by the lifetimes' mean loss, or only at 90 % confidence: either way the reason names them
    assert spot_out and any("(observed lifetimes)" in e.reason for e in spot_out), [e.reason for e in spot_out]


def test_spot_model_reaches_the_grpc_answer_the_json_and_the_table(tmp_path):
    from broker.convert import quote_from_pb, quote_to_pb
    from broker.views import quote_to_dict

    path = write_lifetimes(tmp_path / "g.csv", 3)
    svc = service(tmp_path, "s", spot_lifetimes=str(path))
    try:
        q = svc.quote(Demand(gpus=1, hours=4, gpu_model="A100", interruptible=True, checkpoint_minutes=30))
    finally:
        svc.stop()
    assert "aws" in q.spot_model and "g.csv" in q.spot_model
    assert quote_to_pb(q).spot_model == q.spot_model
    assert quote_from_pb(quote_to_pb(q))["spot_model"] == quote_to_dict(q)["spot_model"] == q.spot_model


@pytest.mark.parametrize("body,needle", [
    ("", "cannot be read"),
    ("cloud,observed_lifetime_s\naws,abc\n", "line 2"),
    ("cloud,when\naws,1\n", "lacks column"),
    ("cloud,observed_lifetime_s\naws,-5\n", "positive lifetime"),
    ("cloud,observed_lifetime_s\naws,nan\n", "positive lifetime"),
])
def test_a_bad_lifetimes_file_is_a_config_error_naming_the_setting(tmp_path, body, needle):
    from broker.errors import ConfigError

    path = tmp_path / "l.csv"
    if body:
        path.write_text(body)
    with pytest.raises(ConfigError) as e:
        service(tmp_path, "bad", spot_lifetimes=str(path))
    assert "market.spot_lifetimes" in str(e.value) and needle in str(e.value)


def test_spot_model_refuses_a_confidence_at_either_end_and_a_negative_slack():
    from policies.spot_choice import SpotModel

    for bad in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"^confidence must be between 0 and 1 \(exclusive\), got "):
            SpotModel(confidence=bad)
    with pytest.raises(ValueError, match=r"^deadline_slack must be zero or more, got -0.5$"):
        SpotModel(deadline_slack=-0.5)
    assert SpotModel(confidence=0.01, deadline_slack=0.0).confidence == 0.01
    assert SpotModel(confidence=0.99).confidence == 0.99


def _priced_h100(cat):
    """A 10-hour 8-GPU job checkpointing every 30 minutes, priced on AWS spot and on-demand and
    GCP on-demand (the cheapest that is not spot)."""
    from policies.cost import Context, price

    d = Demand(gpus=8, hours=10, gpu_model="H100", interruptible=True, checkpoint_minutes=30).validate()
    ctx = Context(cat.terms, cat.regions, cat.gpu_perf, 0.0)
    return [price(d, cat.find(p, r, t, m), ctx) for p, r, t, m in (
        ("aws", "us-east-1", "p5.48xlarge", Market.SPOT), ("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND),
        ("gcp", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND))]


def test_a_spot_offer_late_for_the_given_deadline_is_excluded_with_the_full_reason(mini_catalog):
    from policies.spot import LifetimeDist
    from policies.spot_choice import SpotModel, first_choice, late_on_spot, verdict

    spot, od, gcp = _priced_h100(mini_catalog)
    model = SpotModel({"aws": LifetimeDist((0.4, 0.9, 2.0, 6.0))}, confidence=0.75)
    v = verdict(spot, model, 0.1, 0.5, None)
    assert v is not None and v.in_time and v.deadline_h == pytest.approx(0.1 + 10 * 2)
    assert 12.0 < v.finish_h < v.deadline_h
    keep, out = late_on_spot([spot, od, gcp], model, {"aws": 0.1}, 0.5, 12.0)
    assert keep == [od, gcp] and [e.kind for e in out] == [ExclusionKind.DEADLINE]
    assert out[0].offering == spot.offering and out[0].reason == (
        f"on spot it finishes by {v.finish_h:.1f} h with 75 % confidence (observed lifetimes), "
        "after the deadline of 12.0 h")
    assert first_choice([spot, od, gcp], model, {"aws": 0.1}, 0.5, 12.0) is gcp
    assert first_choice([spot, od, gcp], model, {"aws": 0.1}, 0.5) is spot  # by the implied deadline
    assert first_choice([spot], model, {"aws": 0.1}, 0.5, 12.0) is None
    never = SpotModel({"aws": LifetimeDist((0.1, 0.2))})
    assert late_on_spot([spot], never, {}, 0.5, None)[1][0].reason == (
        "on spot it never finishes: its nodes do not live to a checkpoint (observed lifetimes), "
        "and the deadline is 20.0 h")


def test_reserved_capacity_goes_first_even_when_it_costs_more(mini_catalog):
    import dataclasses

    from policies.spot_choice import SpotModel, first_choice

    spot, od, gcp = _priced_h100(mini_catalog)
    reserved = od._replace(offering=dataclasses.replace(od.offering, market=Market.RESERVED))
    assert reserved.cost.total > gcp.cost.total > spot.cost.total
    assert first_choice([spot, gcp, reserved], SpotModel(), {}, 0.5) is reserved
    assert first_choice([gcp, spot, od], SpotModel(), {}, 0.5) is spot


def test_the_spot_verdict_is_the_gangs_outlook_against_the_deadline_and_its_edge(mini_catalog):
    from policies.spot import LifetimeDist, outlook
    from policies.spot_choice import SpotModel, late_on_spot, verdict

    spot, od, _ = _priced_h100(mini_catalog)
    lives = LifetimeDist((0.4, 0.9, 2.0, 6.0))
    model = SpotModel({"aws": lives}, confidence=0.75)
    gang = spot._replace(nodes=2)
    v = verdict(gang, model, 0.2, 0.5, None)
    finish = outlook(lives, 10, 0.5, 0.2, 2).finish_by_h(0.75)
    assert v == (finish <= 20.2, finish, pytest.approx(20.2)) and finish != verdict(spot, model, 0.2, 0.5, None)[1]
    assert verdict(gang, model, 0.2, 0.5, finish) == (True, finish, finish)  # finishing on the deadline is in time
    assert verdict(od, model, 0.2, 0.5, None) is None  # not spot
    assert verdict(spot, SpotModel({"gcp": lives}), 0.2, 0.5, None) is None  # no lifetimes for AWS
    assert late_on_spot([spot, od], SpotModel(), {"aws": 0.2}, 0.5, 1.0) == ([spot, od], [])
    # the start-up is the offer's cloud's: the implied deadline is 2 h + 10 h x 2
    never = SpotModel({"aws": LifetimeDist((0.1, 0.2))})
    assert late_on_spot([spot], never, {"aws": 2.0, "gcp": 5.0}, 0.5, None)[1][0].reason.endswith(
        "and the deadline is 22.0 h")
