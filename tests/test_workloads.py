"""The wait rule judged on generated workloads (long services, short bursts, mixed classes,
unknown runtimes) and on jobs derived from a queue-depth series: the broker keeps the price-only
burst's waits and never pays more than it, nor much more than its own hindsight."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from broker.simulate import SimConfig
from broker.simulate.model import builtin_policies
from broker.simulate.replay import simulate
from broker.simulate.trace import TraceError
from broker.simulate.workloads import PROFILES, generate, queue_depth_jobs
from providers.catalog import bundled

CAT = bundled()


def replay(w):
    cfg = SimConfig(onprem_gpus=w.onprem_gpus, gpus_per_node=w.gpus_per_node, default_gpu_model="A100")
    pols = builtin_policies()
    return {n: simulate(w.jobs, CAT, pols[n], cfg).to_dict() for n in ("ondemand-cheapest", "broker")}


def targets_missed(r) -> list[str]:
    """The issue's targets against the price-only burst of the same run, as sentences."""
    b, po = r["broker"], r["ondemand-cheapest"]
    out = []
    if b["wait_p95_s"] > 1.05 * po["wait_p95_s"] + 60:
        out.append(f"p95 {b['wait_p95_s']} over 1.05 x {po['wait_p95_s']} + 60")
    if b["wait_p99_s"] > 3 * po["wait_p99_s"] + 60:
        out.append(f"p99 {b['wait_p99_s']} over 3 x {po['wait_p99_s']} + 60")
    if b["cloud_cost_usd"] > po["cloud_cost_usd"] + 0.01:
        out.append(f"cost {b['cloud_cost_usd']} over the price-only {po['cloud_cost_usd']}")
    if b["hindsight_cost_usd"] and b["cloud_cost_usd"] > 1.10 * b["hindsight_cost_usd"] + 0.01:
        out.append(f"cost {b['cloud_cost_usd']} over 1.10 x hindsight {b['hindsight_cost_usd']}")
    return out


def test_an_overloaded_pool_of_week_long_services_keeps_the_price_only_waits_for_less():
    """The issue's case: 12 % week-long services on a small overloaded pool. The runtime rule
    alone let the p95 reach 163 h; with the class targets every target holds."""
    r = replay(generate("services-overloaded", 0, 600))
    assert targets_missed(r) == []
    assert r["broker"]["cloud_cost_usd"] <= 0.5 * r["ondemand-cheapest"]["cloud_cost_usd"]
    assert r["broker"]["classes"]["latency-sensitive"]["wait_p95_s"] <= 600 + 300  # its target + a start-up


@pytest.mark.xfail(strict=True, reason="a known miss (README, 'Workloads'): on this 'mixed' workload the broker "
                                       "pays more than the price-only burst; strict, so it goes when the policy "
                                       "holds the targets")
def test_a_known_miss_on_a_mixed_workload():
    assert targets_missed(replay(generate("mixed", 0, 486))) == []


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=st.sampled_from(PROFILES), seed=st.integers(0, 2**31), jobs=st.integers(40, 160))
def test_every_generated_job_is_served_and_counted_in_its_class(profile, seed, jobs):
    w = generate(profile, seed, jobs, days=3.0)
    r = replay(w)
    b, po = r["broker"], r["ondemand-cheapest"]
    assert b["unserved_jobs"] <= po["unserved_jobs"] and b["jobs"] == jobs
    assert sum(c["jobs"] for c in b["classes"].values()) == b["jobs"] - b["unserved_jobs"]
    assert all(0 <= c["wait_p95_s"] <= c["wait_p99_s"] for c in b["classes"].values())


def test_the_generator_makes_what_it_says():
    w = generate("services-overloaded", 3, 1000)
    services = [j for j in w.jobs if j.job_id.startswith("svc")]
    assert len(services) == 120 and all(5 * 86400 <= j.duration_s <= 9 * 86400 for j in services)
    assert w.onprem_gpus == 24 and len({j.job_class for j in w.jobs}) >= 5
    assert 0.05 < sum(not j.runtime_known for j in w.jobs) / len(w.jobs) < 0.4
    assert generate("mixed", 1, 50).jobs == generate("mixed", 1, 50).jobs  # seeded
    assert [j.submit_s for j in w.jobs] == sorted(j.submit_s for j in w.jobs)


@pytest.mark.parametrize("args,words", [(("nope", 0, 10), "unknown workload"), (("mixed", 0, 0), "jobs must be"),
                                        (("mixed", 0, 10, float("nan")), "days must be")])
def test_careless_generator_arguments_are_refused(args, words):
    with pytest.raises(ValueError, match=words):
        generate(*args)


def test_jobs_are_derived_from_a_queue_depth_series(tmp_path):
    p = tmp_path / "q.csv"
    rows = ["vc,minute,total_gpu,running_gpu,pending_gpu,running_jobs,pending_jobs",
            "v,0,16,0,0,0,0", "v,1,16,8,0,1,0", "v,2,16,16,4,2,1", "v,3,16,8,4,1,1", "v,4,16,12,0,2,0"]
    p.write_text("\n".join(rows) + "\n")
    w = queue_depth_jobs(p, 0)
    # arrivals: +1 job (8 GPUs) at minute 1, +2 jobs (12 GPUs) at 2, +0 at 3, +0 at 4
    assert [round(j.submit_s // 60) for j in w.jobs] == [1, 2, 2] and [j.gpus for j in w.jobs] == [8, 6, 6]
    assert w.onprem_gpus == 16 and "Little's law" in w.note
    (tmp_path / "bad.csv").write_text("job_id,submit\n1,2\n")
    with pytest.raises(TraceError, match="not a queue-depth series"):
        queue_depth_jobs(tmp_path / "bad.csv")


def test_offload_plan_moves_the_light_jobs_that_block_training():
    from policies.diagnose import diagnose
    from policies.offload import plan
    from policies.queue import ClusterNode, PendingJob, QueueSnapshot

    snap = QueueSnapshot("s", 0, pending=(
        PendingJob("e1", 2, kind="eval", queue="gpu", pending_reason="Resources"),
        PendingJob("i1", 1, kind="inference", queue="gpu", pending_reason="Priority"),
        PendingJob("held", 1, kind="tuning", queue="gpu", pending_reason="JobHeldUser"),
        PendingJob("t1", 2, kind="training", queue="gpu", pending_reason="Priority")),
        nodes=(ClusterNode("n1", "alloc", 4, 4),))
    p = plan(snap, diagnose(snap, [], now=0), "light")
    assert p is not None and p.job_ids == ("e1", "i1") and p.gpus == 3 and p.training_jobs == 1
    assert p.reason.startswith("offload 2 tuning/eval/inference jobs (3 GPUs) to partition light before bursting")
    assert plan(snap, diagnose(snap, [], now=0), "light", frozenset({"e1", "i1"})) is None  # already moved
    no_training = QueueSnapshot("s", 0, pending=snap.pending[:3], nodes=snap.nodes)
    assert plan(no_training, diagnose(no_training, [], now=0), "light") is None  # nothing blocked


def test_simulate_reads_a_class_column_and_reports_waits_per_class(tmp_path):
    import csv
    import json

    from typer.testing import CliRunner

    from broker.cli import app

    w = generate("mixed", 0, 120)
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["job_id", "submit_time_s", "num_gpus", "duration_s", "QoS", "kind", "runtime_known"])
        for j in w.jobs:
            out.writerow([j.job_id, j.submit_s, j.gpus, j.duration_s, j.job_class, j.kind, j.runtime_known])
    r = CliRunner().invoke(app, ["simulate", "--trace", str(path), "--onprem-gpus", "48", "--gpu-model", "A100",
                                 "--policy", "broker", "--spot-lifetimes", "catalog", "-o", "json"])
    assert r.exit_code == 0, r.output
    classes = json.loads(r.stdout)["policies"]["broker"]["classes"]
    assert {"default", "interactive", "latency-sensitive", "production"} <= set(classes)
    assert sum(c["jobs"] for c in classes.values()) == 120
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_time_s,num_gpus,duration_s,runtime_known\n1,0,1,60,maybe\n")
    r = CliRunner().invoke(app, ["simulate", "--trace", str(bad), "--onprem-gpus", "8", "--gpu-model", "A100"])
    assert r.exit_code == 2 and "runtime_known must be true or false" in r.stderr
