"""The wait rule judged on generated workloads (long services, short bursts, mixed classes,
unknown runtimes) and on jobs derived from a queue-depth series: the broker keeps the price-only
burst's waits and never pays more than it, nor much more than its own hindsight."""
from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

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


def test_bursts_after_idle_spells_are_predicted_from_the_running_jobs_ends():
    """The 'bursty' workload (bursts of short jobs after idle spells, a pool not overloaded):
    predicted from the GPUs released in the last hour, the waits after an idle spell looked
    like hours and nearly every burst was needless (0.48x). From the running jobs' ends every
    target holds, 0.45x included."""
    r = replay(generate("bursty", 0, 600))
    assert targets_missed(r) == []
    assert r["broker"]["cloud_cost_usd"] <= 0.45 * r["ondemand-cheapest"]["cloud_cost_usd"]


@functools.lru_cache(maxsize=None)
def bursty(seed: int) -> dict:
    return replay(generate("bursty", seed, 600))


@pytest.mark.parametrize("seed", [1, 2])
def test_bursty_workloads_of_other_seeds_keep_the_waits_and_the_price_only_cost(seed):
    assert targets_missed(bursty(seed)) == []


@pytest.mark.xfail(strict=True, reason="a known miss (README, 'Workloads'): on seeds 1 and 2 the 'bursty' workload "
                                       "costs 0.55x and 0.61x the price-only burst (catalog interruption rates); "
                                       "strict, so it goes when the policy holds 0.45x")
@pytest.mark.parametrize("seed", [1, 2])
def test_a_known_miss_on_bursty_workloads_of_other_seeds(seed):
    r = bursty(seed)
    assert r["broker"]["cloud_cost_usd"] <= 0.45 * r["ondemand-cheapest"]["cloud_cost_usd"]


@pytest.mark.xfail(strict=True, reason="a known miss (README, 'Workloads'): on this 'mixed' workload the broker "
                                       "pays more than 0.45x the price-only burst; strict, so it goes when the policy "
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


def decisions_both_ways(jobs, cfg):
    """Replay ``jobs`` under the broker policy; at every tick hand the replay's queue to the
    service's path (a snapshot with the running jobs' time run and runtimes as a scheduler
    reports them, the diagnosis' capacity jobs under a mixed verdict, candidates_from_snapshot
    predicting the waits itself, evaluate) and record both decisions and both predictions:
    (time, verdict, service action, service job ids, replay action, replay job ids,
    service predictions, replay predictions)."""
    from dataclasses import replace as dc_replace

    import broker.simulate.replay as rp
    from broker.simulate.model import PENDING
    from policies.causes import Verdict
    from policies.diagnose import diagnose
    from policies.queue import ClusterNode, PendingJob, QueueSnapshot, RunningJob
    from policies.triggers import candidates_from_snapshot, signals_from_snapshot

    pol = builtin_policies()["broker"]
    seen: list = []
    real_eval = rp.evaluate

    class Both(rp.Replay):
        def snapshot(self, t):
            cl, G = self.onprem, self.cfg.gpus_per_node
            nodes = tuple(ClusterNode(f"n{k}", "mix" if cl.free[k] else "alloc", G, G - cl.free[k])
                          for k in range(cl.nodes))
            pend = tuple(PendingJob(j.job_id, j.gpus, est_runtime_s=int(-(-j.duration_s // 1)) if j.runtime_known
                                    else 0, waited_s=int(t - j.submit_s), pending_reason="Resources",
                                    interruptible=self.jobs[i].interruptible, kind=j.kind, job_class=j.job_class)
                         for i in cl.fifo_iter() for j in [self.jobs[i]])
            run = tuple(RunningJob(j.job_id, j.gpus, runtime_s=int(t - cl.start[i]),
                                   est_runtime_s=int(-(-j.duration_s // 1)) if j.runtime_known else 0)
                        for i in sorted(cl.running) for j in [self.jobs[i]])
            return QueueSnapshot("sim", t, pending=pend, nodes=nodes, running=run)

        def tick(self, t):
            before, snap = self.tstate, self.snapshot(t)
            at = {self.jobs[i].job_id: i for i in range(self.n) if self.state[i] == PENDING}
            sig = dc_replace(signals_from_snapshot(snap), cloud_gpus_in_flight=self.cloud.gpus)
            verdict = rp.allocation_verdict(sig)
            every = candidates_from_snapshot(snap, classes=pol.trigger.classes)
            cands = [dc_replace(c, price_ratio=ch.price_ratio, startup_s=ch.startup_s)
                     for c in every
                     for ch in [self.cloud.chooser.for_job(at[c.job.job_id])]
                     if at[c.job.job_id] not in self.no_offer]
            capacity = diagnose(snap, [], now=t).capacity_jobs if verdict == Verdict.MIXED else None
            service, _ = real_eval(pol.trigger, before, t, sig, cands, verdict, capacity_jobs=capacity)
            captured: list = []

            def replay_eval(*a, **kw):
                captured.append(real_eval(*a, **kw))
                return captured[-1]

            rp.evaluate = replay_eval
            try:
                super().tick(t)
            finally:
                rp.evaluate = real_eval
            mine = captured[0][0]
            seen.append((t, str(verdict), service.action, set(service.job_ids), mine.action, set(mine.job_ids),
                         {c.job.job_id: c.predicted_wait_s for c in every},
                         {k: self.pred[i] for k, i in at.items()}))

    Both(jobs, CAT, pol, cfg, None, None).run()
    return seen


def test_the_service_path_and_the_simulator_decide_the_same_on_the_same_queue():
    """Two nodes of 8 GPUs with 7 taken on each for hours; a 2-GPU job then waits beside the 2
    scattered free GPUs (the diagnosis' fragmentation: scheduling, not capacity) and whole-node
    jobs wait for capacity, a mixed queue. At every tick both paths send the same jobs; the
    whole-node ones go, the 2-GPU job stays (schedule first) until its wait passes its class
    target (default: 4 hours), then goes too."""
    from broker.simulate.trace import TraceJob

    jobs = [TraceJob(*a, gpu_model="A100", **kw) for a, kw in (
        (("a", 0, 7, 36000.0), {}), (("b", 0, 7, 36000.0), {}), (("frag", 10, 2, 7200.0), {}),
        (("w1", 20, 8, 7200.0), {"interruptible": True}), (("w2", 30, 8, 7200.0), {}),
        (("w3", 40, 8, 14400.0), {"job_class": "production"}), (("w4", 900, 8, 3000.0), {"kind": "eval"}))]
    seen = decisions_both_ways(jobs, SimConfig(onprem_gpus=16, gpus_per_node=8, default_gpu_model="A100"))
    assert any(v == "mixed" for _, v, *_ in seen)
    # w1 (8 GPUs, behind frag) starts when a or b ends at 36,000 s, the ends the running jobs
    # report: 35,980 s in all at the first tick (60 s), 40 of them waited
    assert seen[0][0] == 60 and seen[0][6]["w1"] == 35980
    sent = set().union(*(s[3] for s in seen))
    assert {"w1", "w2", "w3"} <= sent, seen
    frag_at = [s[0] for s in seen if "frag" in s[3]]
    assert len(frag_at) == 1 and 10 + 14400 < frag_at[0] <= 10 + 14400 + 60, frag_at
    assert_alike(seen)


def assert_alike(seen):
    """Both paths predicted the same wait for every pending job and made the same decision."""
    for t, verdict, s_act, s_ids, m_act, m_ids, s_pred, m_pred in seen:
        assert s_pred == m_pred, (t, s_pred, m_pred)
        assert (s_act, s_ids) == (m_act, m_ids), (t, verdict, s_act, s_ids, m_act, m_ids)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=st.sampled_from(PROFILES), seed=st.integers(0, 2**31), jobs=st.integers(10, 40))
def test_on_generated_workloads_the_service_path_and_the_simulator_burst_alike(profile, seed, jobs):
    """Long services, short bursts, mixed classes and unknown runtimes (the generator's), on a
    quarter of its pool so the queue builds: the replay sends what the service would."""
    w = generate(profile, seed, jobs, days=0.5)
    pool = max(8, w.onprem_gpus // 4 // 8 * 8)
    seen = decisions_both_ways(w.jobs, SimConfig(onprem_gpus=pool, gpus_per_node=8, default_gpu_model="A100"))
    assert_alike(seen)


def test_a_production_job_shorter_than_a_start_up_goes_out_when_predicted_past_its_class_target():
    """Two nodes held for a week by services; a 2-minute production job needing a whole node
    then waits behind them (the services-overloaded workload's longest production wait: a
    6-minute whole-node eval job queued for 166 h). It runs shorter than any cloud start-up, so
    a wait of its runtime share (0.5 x 2 min) is not worth a start-up, but its predicted wait
    (the services' ends, a week) is far past its class's 30-minute target: at the first tick
    both paths send it, and a default job of the same shape (4-hour target) with it."""
    from broker.simulate.trace import TraceJob

    week = 7 * 86400.0
    jobs = [TraceJob("svc1", 0, 8, week, gpu_model="A100", job_class="LS"),
            TraceJob("svc2", 0, 8, week, gpu_model="A100", job_class="LS"),
            TraceJob("prod", 100, 8, 120.0, gpu_model="A100", job_class="production", kind="eval"),
            TraceJob("dflt", 200, 8, 120.0, gpu_model="A100", kind="eval")]
    cfg = SimConfig(onprem_gpus=16, gpus_per_node=8, default_gpu_model="A100")
    seen = decisions_both_ways(jobs, cfg)
    sent = {k: min((s[0] for s in seen if k in s[3]), default=None) for k in ("prod", "dflt")}
    assert sent == {"prod": 120.0, "dflt": 240.0}, sent  # the first tick after each arrives
    assert_alike(seen)
    r = simulate(jobs, CAT, builtin_policies()["broker"], cfg).to_dict()
    assert r["jobs_burst"] == 2
    assert r["classes"]["production"]["wait_p99_s"] <= 1800
    assert r["classes"]["default"]["wait_p99_s"] <= 1800


def test_a_short_job_predicted_under_its_class_target_stays_home():
    """The same 2-minute whole-node job behind services ending in 20 minutes: predicted under
    its 30-minute target, a start-up is not worth it (it runs shorter than one), so it waits."""
    from broker.simulate.trace import TraceJob

    jobs = [TraceJob("svc1", 0, 8, 1200.0, gpu_model="A100", job_class="LS"),
            TraceJob("svc2", 0, 8, 1200.0, gpu_model="A100", job_class="LS"),
            TraceJob("prod", 100, 8, 120.0, gpu_model="A100", job_class="production", kind="eval")]
    cfg = SimConfig(onprem_gpus=16, gpus_per_node=8, default_gpu_model="A100")
    seen = decisions_both_ways(jobs, cfg)
    assert seen and not any("prod" in s[3] for s in seen), seen
    assert_alike(seen)
    r = simulate(jobs, CAT, builtin_policies()["broker"], cfg).to_dict()
    assert r["jobs_burst"] == 0 and r["classes"]["production"]["wait_p99_s"] == 1100


def test_schedule_first_holds_a_class_no_longer_than_its_target():
    """Two nodes with 6 of 8 GPUs taken each for a week; a 4-GPU production job then finds 4
    GPUs free, 2 on each node: scheduling-bound. Nobody defragments the simulated pool, so the
    job would wait the week; schedule first holds it only up to its 30-minute class target,
    then it goes, as with ``burst_overdue_when_scheduling_bound``, and the class's report
    names no hold past the target."""
    from dataclasses import replace as dc_replace

    from broker.simulate.trace import TraceJob

    week = 7 * 86400.0
    jobs = [TraceJob("svc1", 0, 6, week, gpu_model="A100"), TraceJob("svc2", 0, 6, week, gpu_model="A100"),
            TraceJob("prod", 100, 4, 3600.0, gpu_model="A100", job_class="production")]
    cfg = SimConfig(onprem_gpus=16, gpus_per_node=8, default_gpu_model="A100")
    pol = builtin_policies()["broker"]
    for p in (pol, dc_replace(pol, trigger=dc_replace(pol.trigger, burst_overdue_when_scheduling_bound=True))):
        r = simulate(jobs, CAT, p, cfg).to_dict()
        prod = r["classes"]["production"]
        assert r["jobs_burst"] == 1 and prod["target_s"] == 1800
        assert 1800 < prod["wait_p99_s"] <= 1800 + 60 + 300  # the target, a tick, a cloud start-up
        assert prod["past_target_held_by_schedule_first"] == 0


def _offload_diag(verdict, offloadable):
    from policies.causes import CauseKind
    from policies.diagnose import Cause, Diagnosis

    causes = (Cause(CauseKind.OFFLOADABLE_WORK, "light jobs wait"),) if offloadable else ()
    return Diagnosis(verdict, 1.0, None, 0, causes)


def test_offload_plan_is_made_only_for_offloadable_work_or_a_want_of_capacity():
    from policies.causes import Verdict
    from policies.offload import plan
    from policies.queue import PendingJob, QueueSnapshot

    snap = QueueSnapshot("s", 0, pending=(PendingJob("e1", 1, kind="eval", queue="gpu"),
                                          PendingJob("t1", 8, kind="training", queue="gpu")))
    made = {(v.value, off): plan(snap, _offload_diag(v, off)) is not None for v in Verdict for off in (False, True)}
    assert made == {("healthy", False): False, ("healthy", True): True,
                    ("resource-bound", False): True, ("resource-bound", True): True,
                    ("scheduling-bound", False): False, ("scheduling-bound", True): True,
                    ("mixed", False): True, ("mixed", True): True}


def test_offload_plan_reason_in_full_and_which_jobs_stay():
    from policies.causes import Verdict
    from policies.offload import plan
    from policies.queue import PendingJob, QueueSnapshot

    diag = _offload_diag(Verdict.RESOURCE_BOUND, False)

    def snap(*jobs):
        return QueueSnapshot("s", 0, pending=jobs)

    one = plan(snap(PendingJob("i1", 1, kind="inference"), PendingJob("t1", 8, kind="training")), diag)
    assert one is not None and one.reason == (
        "offload 1 tuning/eval/inference job (1 GPU) to a queue of their own before bursting training: "
        "it waits for capacity in the training queue, where 1 training job waits too")
    assert one.job_ids == ("i1",) and one.gpus == 1 and one.training_jobs == 1
    two = plan(snap(PendingJob("e1", 2, kind="eval", queue="gpu,light"), PendingJob("u1", 3, kind="tuning"),
                    PendingJob("t1", 8, kind="training"), PendingJob("t2", 8, kind="training")), diag, "light")
    assert two is not None and two.reason == (
        "offload 1 tuning/eval/inference job (3 GPUs) to partition light before bursting training: "
        "it waits for capacity in the training queue, where 2 training jobs wait too")
    assert two.job_ids == ("u1",)  # e1 may already run in the light partition
    many = plan(snap(PendingJob("e1", 2, kind="eval"), PendingJob("u1", 3, kind="tuning", queue="gpu"),
                     PendingJob("t1", 8, kind="training")), diag, "light")
    assert many is not None and many.reason == (
        "offload 2 tuning/eval/inference jobs (5 GPUs) to partition light before bursting training: "
        "they wait for capacity in the training queue, where 1 training job waits too")
    # a reason list whose first entry is a hold or a dependency: the job does not wait in the queue
    held = plan(snap(PendingJob("e1", 2, kind="eval", pending_reason="JobHeldUser,Priority"),
                     PendingJob("t1", 8, kind="training", pending_reason="Dependency,Resources"),
                     PendingJob("t2", 8, kind="training", pending_reason="Priority,Resources")), diag)
    assert held is None
    waits = plan(snap(PendingJob("e1", 2, kind="eval", pending_reason="Priority,JobHeldUser"),
                      PendingJob("t1", 8, kind="training", pending_reason="Resources,Dependency")), diag)
    assert waits is not None and waits.job_ids == ("e1",) and waits.training_jobs == 1
