"""The one wait predictor (policies.waits), used by the service's trigger and the simulator:
the running jobs' expected ends where the scheduler reports them, else the queue-ahead estimate."""
from __future__ import annotations

import json
import math

import pytest

from broker.watchers.snapshot_json import dumps, snapshot_from_dict
from policies.queue import ClusterNode, PendingJob, QueueSnapshot, RunningJob
from policies.triggers import (BURST, HOLD, Signals, TriggerConfig, TriggerState,
                               candidates_from_snapshot, evaluate)
from policies.waits import fluid_wait_s, forecast, snapshot_waits, typical_runtime_s


def test_a_queued_job_starts_when_the_running_jobs_ahead_of_it_end():
    # 8 GPUs: 6 run for 600 s more, 2 for 1,800 s more; the queue asks 4, then 8
    assert forecast([(4, 300), (8, 60)], [(6, 100, 700), (2, 0, 1800)], 0, 8) == [600.0, 1800.0]
    # the 4-GPU job fits in the 6 released at 600 s; the 8-GPU one needs the other 2 and the 4
    assert forecast([(4, 1500), (8, 60)], [(6, 100, 700), (2, 0, 1800)], 0, 8) == [600.0, 2100.0]


def test_a_small_job_is_backfilled_around_a_bigger_one_ahead():
    # the 16-GPU head waits for both running jobs; the 1-GPU job behind it starts when the
    # first ends (strict order would have it wait for the head's hour too)
    assert forecast([(16, 3600), (1, 60)], [(8, 0, 600), (8, 0, 1200)], 0, 16) == [1200.0, 600.0]
    # a job of the same size ahead still goes first
    assert forecast([(8, 3600), (8, 60)], [(8, 0, 600), (8, 0, 1200)], 0, 16) == [600.0, 1200.0]


def test_a_job_that_fits_in_the_free_gpus_waits_nothing_and_one_bigger_than_the_pool_forever():
    assert forecast([(2, 60)], [(6, 10, 600)], 2, 8) == [0.0]
    assert forecast([(16, 60)], [(6, 10, 600)], 2, 8) == [math.inf]


def test_after_an_idle_spell_the_prediction_is_the_running_jobs_ends_not_a_release_rate():
    """The simulator once divided the GPUs ahead by the GPUs released in the last hour: after
    an idle spell near zero, so a burst of short jobs was predicted to wait hours. The running
    jobs' ends say minutes."""
    queue = [(8, 900)] * 4
    running = [(8, 60, 600)] * 8  # the pool filled a minute ago with 10-minute jobs
    assert max(forecast(queue, running, 0, 64)) == 540.0


def test_no_end_times_reported_falls_back_to_the_queue_ahead_estimate():
    queue = [(4, 600), (4, 1200), (8, 0)]
    got = forecast(queue, [(8, 100, 0)], 0, 8)
    assert got == [fluid_wait_s(4, 0, 0, 8), fluid_wait_s(4, 2400, 0, 8), fluid_wait_s(8, 7200, 0, 8)]
    assert got == [0.0, 300.0, 900.0]
    assert forecast(queue, [], 0, 8) == got  # GPUs allocated, no running job reported at all


def test_runtimes_nobody_reports_are_taken_from_the_ones_reported():
    # median reported runtime: 1,000 s. A running job without one runs as long again as it
    # has run, at least to the median; a queued one holds its GPUs for the median.
    assert forecast([(4, 0)], [(4, 300, 0), (4, 0, 1000)], 0, 8) == [700.0]
    assert forecast([(4, 0)], [(4, 5000, 0), (4, 0, 1000)], 0, 8) == [1000.0]
    # (the lower median of 600 and 1,000)
    assert forecast([(8, 0), (8, 600)], [(8, 0, 1000)], 0, 8) == [1000.0, 1600.0]


def test_the_typical_runtime_is_not_the_running_services_length():
    """The jobs running at one moment are a length-biased sample: 10 week-long services and 6
    90-minute jobs on the pool say the jobs run 90 minutes, not 161 hours (the plain median),
    so a job with no runtime that has just started is expected to end within the hour and
    a half, not in a week."""
    services, batch = [580_000] * 10, [5_400] * 6
    assert typical_runtime_s([], services + batch) == 5_400
    running = [(1, 300_000, 580_000)] * 10 + [(1, 0, 5_400)] * 6 + [(2, 60, 0)]
    # 8 GPUs: the six batch jobs' and the unknown job's (the plain median: 280,000 s, a service's end)
    assert forecast([(8, 600)], running, 0, 18) == [5_400.0]


@pytest.mark.parametrize("queued,running,typical", [
    ([], [], 0),
    ([300, 100, 200], [], 200),  # the queue alone: its median
    ([100, 200, 300, 400], [], 200),  # the lower median, as before
    ([], [7_200], 7_200),
    ([], [1_000, 1_000, 9_000], 1_000),
    ([600], [1_000], 600),  # one running job weighs as one queued job: the lower median
    ([], [100, 10_000], 100),  # the short one weighs 100 times the long one
    # a 100-second job running beside three services stands for most of what arrives
    ([5_000, 5_000, 5_000], [100, 600_000, 600_000, 600_000], 100),
    ([5_000, 5_000, 5_000], [600_000, 600_000, 600_000], 5_000),  # 3 and 3: the lower median
])
def test_the_typical_runtime_at_its_edges(queued, running, typical):
    assert typical_runtime_s(list(queued), list(running)) == typical


def test_gpus_held_by_work_nobody_reported_fall_back_for_the_jobs_they_block():
    # 8 of 16 GPUs allocated, only 4 reported (ending in 100 s): a 16-GPU job cannot be placed
    # by the reported ends; it waits at least for all of them (the 4-GPU job ahead ends at
    # 600 s), and at least the queue-ahead estimate
    got = forecast([(4, 600), (16, 60)], [(4, 0, 100)], 8, 16)
    assert got == [0.0, 600.0]
    assert forecast([(4, 60000), (16, 60)], [(4, 0, 100)], 8, 16)[1] == 60000.0


def snap(running=(), pending=(), nodes=None):
    return QueueSnapshot("t", 0.0, pending=tuple(pending), running=tuple(running),
                         nodes=nodes or (ClusterNode("n1", "alloc", 8, 8),))


def test_the_service_predicts_from_the_running_jobs_reported_ends():
    s = snap([RunningJob("r1", 8, nodes=("n1",), runtime_s=3000, time_limit_s=3600)],
             [PendingJob("p1", 8, est_runtime_s=600, waited_s=120)])
    (c,) = candidates_from_snapshot(s)
    assert c.predicted_wait_s == 120 + 600  # waited so far + the running job's time left
    # an estimate wins over the time limit, as for pending jobs
    s2 = snap([RunningJob("r1", 8, nodes=("n1",), runtime_s=3000, time_limit_s=3600, est_runtime_s=3100)],
              s.pending)
    assert candidates_from_snapshot(s2)[0].predicted_wait_s == 120 + 100
    # running jobs on cloud nodes free no on-prem GPUs
    cloud = snap([RunningJob("c1", 8, nodes=("burst-1",), runtime_s=0, time_limit_s=60)], s.pending,
                 (ClusterNode("n1", "alloc", 8, 8), ClusterNode("burst-1", "cloud", 8, 8)))
    assert snapshot_waits(cloud, cloud.pending) == [fluid_wait_s(8, 0, 0, 8)]


def test_a_job_past_its_target_bursts_whatever_the_prediction():
    """Predicted to start at once (the running job ends now), but it has waited past half its
    runtime: the wait rule sends it. And one predicted far past it goes before waiting."""
    cfg = TriggerConfig(threshold_trigger=False)
    sig = Signals(pending_gpus=8, gpus_total=8, gpus_allocated=8)
    late = snap([RunningJob("r1", 8, nodes=("n1",), runtime_s=3600, time_limit_s=3600)],
                [PendingJob("p1", 8, est_runtime_s=7200, waited_s=3700)])
    (c,) = candidates_from_snapshot(late)
    assert c.predicted_wait_s == 3700
    d, _ = evaluate(cfg, TriggerState(), 0.0, sig, [c])
    assert d.action == BURST and d.job_ids == ("p1",) and d.trigger == "wait"
    early = snap([RunningJob("r1", 8, nodes=("n1",), runtime_s=0, time_limit_s=86400)],
                 [PendingJob("p1", 8, est_runtime_s=7200, waited_s=0)])
    d, _ = evaluate(cfg, TriggerState(), 0.0, sig, candidates_from_snapshot(early))
    assert d.action == BURST and d.job_ids == ("p1",)
    soon = snap([RunningJob("r1", 8, nodes=("n1",), runtime_s=0, time_limit_s=600)],
                [PendingJob("p1", 8, est_runtime_s=7200, waited_s=0)])
    d, _ = evaluate(cfg, TriggerState(), 0.0, sig, candidates_from_snapshot(soon))
    assert d.action == HOLD


def test_a_snapshot_document_carries_the_running_jobs_ends():
    s = snap([RunningJob("r1", 8, nodes=("n1",), runtime_s=30, time_limit_s=3600, est_runtime_s=600)])
    back = snapshot_from_dict(json.loads(dumps(s)))
    assert back == s and back.running[0].remaining_s == 570
    assert snapshot_from_dict({"taken_at": 0, "running": [{"job_id": "r", "gpus": 1}]}).running[0].remaining_s is None
    with pytest.raises(ValueError, match=r"running\[0\]\.time_limit_s must not be negative"):
        snapshot_from_dict({"taken_at": 0, "running": [{"job_id": "r", "gpus": 1, "time_limit_s": -1}]})


def test_a_pushed_snapshot_carries_the_running_jobs_ends():
    from broker import queue_pb
    from broker.queue_api import checked_snapshot
    from broker.v1 import broker_pb2 as pb

    def msg(**run):
        return pb.QueueSnapshot(source="s", running=[pb.RunningJob(job_id="r", gpus=8, nodes=["n1"], **run)],
                                nodes=[pb.ClusterNode(name="n1", state="alloc", gpus_total=8, gpus_allocated=8)])

    m = msg(runtime_s=30, time_limit_s=3600, est_runtime_s=600)
    fast = queue_pb.fast_snapshot(m, 0.0)
    assert fast is not None and fast.running[0].remaining_s == 570
    assert checked_snapshot(m, 0.0).running == fast.running  # the validator's path agrees
    bad = msg(time_limit_s=-1)
    assert queue_pb.fast_snapshot(bad, 0.0) is None
    with pytest.raises(ValueError, match=r"running\[0\]\.time_limit_s"):
        checked_snapshot(bad, 0.0)


def test_the_queue_ahead_estimate_at_its_edges():
    assert fluid_wait_s(1, 0, 0, 0) == math.inf  # no pool: never
    assert fluid_wait_s(1, 100, 0, 1) == 100.0  # a one-GPU pool drains the work ahead alone
    assert fluid_wait_s(1, 0, 4, 8) == 0.0  # it fits and nothing is ahead
    assert fluid_wait_s(1, 100, 4, 8) == 12.5  # it fits, but work is ahead of it
    assert fluid_wait_s(1, 1, 4, 8) == 0.125
    # GPUs allocated and no end reported: a job bigger than the pool never starts; a job that
    # reports no runtime adds no work ahead
    assert forecast([(4, 0), (4, 60), (16, 60)], [(8, 100, 0)], 0, 8) == [0.0, 0.0, math.inf]
    # a job too big for the pool never starts, so its work is not ahead of the jobs behind it,
    # as the played forecast has it
    behind = forecast([(2, 600), (4, 60)], [(8, 100, 0)], 0, 8)
    assert behind[1] > 0
    assert forecast([(2, 600), (16, 6000), (4, 60)], [(8, 100, 0)], 0, 8) == [behind[0], math.inf, behind[1]]


def test_the_typical_runtime_is_the_lower_median_of_every_reported_one():
    # reported: 5,000 and 60 queued, 100 running: the median is 100 (not 60 or 5,000)
    assert forecast([(8, 5000), (8, 0), (8, 60)], [(8, 0, 100)], 0, 8) == [100.0, 5100.0, 5200.0]
    assert forecast([(8, 0), (8, 0)], [], 8, 8) == [0.0, 0.0]  # nothing reported: held for no time
    assert forecast([(8, 1), (8, 0), (8, 0)], [], 8, 8) == [0.0, 1.0, 2.0]  # a 1 s runtime is reported
    assert forecast([(8, 0), (8, 0)], [(8, 0, 1)], 0, 8) == [1.0, 2.0]
    assert forecast([(8, 1), (8, 60), (8, 60)], [], 8, 8) == [0.0, 1.0, 61.0]


def test_which_path_the_forecast_takes_and_the_running_jobs_it_counts():
    # nothing allocated: the queue is played (the 8-GPU job waits for the 4-GPU one to end)
    assert forecast([(4, 100), (8, 60)], [], 8, 8) == [0.0, 100.0]
    # one GPU allocated and no end reported: the queue-ahead estimate
    assert forecast([(4, 100), (8, 60)], [], 7, 8) == [0.0, 50.0]
    assert forecast([(8, 60)], [(8, 0, 1)], 0, 8) == [1.0]  # a 1 s runtime is an end reported
    assert forecast([(8, 60)], [(8, 5, 1)], 0, 8) == [0.0]  # past its runtime: it ends now
    assert forecast([(8, 60)], [(8, 700, 600)], 0, 8) == [0.0]
    assert forecast([(1, 60)], [(1, 0, 100)], 0, 1) == [100.0]  # a one-GPU job frees its GPU
    # a running job with no GPU frees none and does not move the clock
    assert forecast([(8, 60)], [(4, 0, 100), (0, 0, 500)], 0, 8) == [100.0]


def test_the_play_goes_on_past_a_job_too_big_for_the_pool_and_counts_the_work_it_could_not_place():
    inf = math.inf
    assert forecast([(16, 60), (9, 60), (16, 60)], [], 8, 8) == [inf, inf, inf]
    # the running job ends at once; nothing is queued ahead of the 16-GPU job: no wait
    assert forecast([(16, 60)], [(4, 100, 100)], 8, 16) == [0.0]
    # two GPUs' releases add up before the 12-GPU job starts (then the second one starts after it)
    assert forecast([(12, 60), (12, 60)], [(4, 0, 100), (4, 0, 200)], 4, 12) == [200.0, 260.0]
    # 4 of 16 GPUs held by work nobody reported: the 16-GPU jobs that cannot be placed count
    # each other's work ahead (96,000 GPU-s each, over 16 GPUs)
    assert forecast([(16, 6000), (16, 6000), (16, 60)], [(4, 0, 100)], 8, 16) == [100.0, 6000.0, 12000.0]


def test_the_service_counts_every_gpu_job_running_on_prem_and_no_gpu_free_one():
    one = QueueSnapshot("t", 0.0, pending=(PendingJob("p1", 1, est_runtime_s=60),),
                        running=(RunningJob("r1", 1, nodes=("n1",), runtime_s=0, time_limit_s=600),),
                        nodes=(ClusterNode("n1", "alloc", 1, 1),))
    assert snapshot_waits(one, one.pending) == [600.0]
    # a job holding no GPU reports a time limit: the 8-GPU one reports none, so the
    # queue-ahead estimate stands
    s = snap([RunningJob("r1", 8, nodes=("n1",), runtime_s=100),
              RunningJob("r0", 0, nodes=("n1",), runtime_s=10, time_limit_s=3600)],
             [PendingJob("p1", 8, est_runtime_s=600), PendingJob("p2", 8, est_runtime_s=60)])
    assert snapshot_waits(s, s.pending) == [0.0, 600.0]


def test_the_typical_runtime_weighs_each_running_job_against_its_length():
    from policies.waits import typical_runtime_s

    assert typical_runtime_s([], []) == 0
    assert typical_runtime_s([30, 10, 20], []) == 20
    # running jobs of 1 min, 10 min and 100 min: the minute-long ones are the most jobs as
    # submitted (weights 2.70, 0.27, 0.03 of 3), not the plain median's 10 minutes
    assert typical_runtime_s([], [60, 600, 6000]) == 60
    # weights 1.98 and 0.02 for the running 100 s and 10,000 s; half of 4 is passed at 1,000 s
    assert typical_runtime_s([1000, 3000], [100, 10000]) == 1000
    # the running job alone is one of four: the half is passed at the first queued one
    assert typical_runtime_s([5000, 6000, 7000], [100]) == 5000
    assert typical_runtime_s([10, 20, 30], [1000]) == 20  # each queued job weighs one
    assert typical_runtime_s([10, 20, 30, 40, 50], [1000]) == 30
    # weights 1.64, 0.82, 0.55: the three running jobs together are exactly the half of 6
    assert typical_runtime_s([10000, 20000, 30000], [100, 200, 300]) == 300
