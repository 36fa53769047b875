"""What an operator reads from policies.diagnose: the signals, summaries and actions word for word,
and the verdict on each side of the marks it is read from."""
from __future__ import annotations

import pytest

from policies.diagnose import DiagnoseConfig, diagnose
from policies.queue import ClusterNode, GpuSample, PendingJob, QueueSnapshot, RunningJob

NOW = 10_000.0


def node(name, gpus=4, alloc=0, state=None, model="a100", reason=""):
    state = state or ("idle" if alloc == 0 else "alloc" if alloc >= gpus else "mix")
    return ClusterNode(name, state, gpus, alloc, model, ("gpu",), reason)


def job(jid, gpus, reason="Resources", **kw):
    kw.setdefault("queue", "gpu")
    return PendingJob(jid, gpus, nodes=1, pending_reason=reason, **kw)


def snap(nodes=(), pending=(), running=(), samples=(), extra=None):
    return QueueSnapshot("test", NOW, tuple(pending), tuple(nodes), tuple(samples), tuple(running), extra or {})


def busy(name, gpus=4, pct=95.0):
    return [GpuSample(name, i, pct) for i in range(gpus)]


def summaries(d):
    return [(c.kind, c.summary, c.jobs, c.nodes, c.gpus) for c in d.causes]


FULL32 = [node(f"g{i}", gpus=8, alloc=8) for i in range(4)]  # the long-queue mark: 10 % of 32 = 3.2 GPUs


# ------------------------------------------------------------------------------- the long-queue mark
def test_a_short_queue_says_how_much_waits_under_which_mark_and_for_how_long():
    d = diagnose(snap(FULL32, [job("1", 2, waited_s=125)]), now=NOW)
    assert d.verdict == "healthy"
    assert d.signals == ("1 GPU job (2 GPUs) wait, under the long-queue mark of 4 GPUs, longest 2 min",)
    assert d.actions == ("Nothing to do now: the queue is short.",)
    d = diagnose(snap(FULL32, [job("1", 1, waited_s=60), job("2", 2, waited_s=0)]), now=NOW)
    assert d.signals == ("2 GPU jobs (3 GPUs) wait, under the long-queue mark of 4 GPUs, longest 1 min",)
    d = diagnose(snap(FULL32, [job("cpu", 0, waited_s=9000)]), now=NOW)
    assert d.signals == ("0 GPU jobs (0 GPUs) wait, under the long-queue mark of 4 GPUs",)


@pytest.mark.parametrize("gpus,waited,verdict", [(3, 899, "healthy"), (3, 900, "resource-bound"),
                                                 (4, 0, "resource-bound"), (2, 899, "healthy")])
def test_a_queue_is_long_from_the_mark_in_gpus_or_from_the_long_wait(gpus, waited, verdict):
    assert diagnose(snap(FULL32, [job("j", gpus, waited_s=waited)]), now=NOW).verdict == verdict


@pytest.mark.parametrize("gpus,verdict", [(1, "healthy"), (2, "resource-bound")])
def test_the_mark_is_never_under_min_queue_gpus(gpus, verdict):
    # 8 GPUs: 10 % is 0.8, the floor of 2 GPUs decides
    nodes = [node("g1", alloc=4), node("g2", alloc=4)]
    d = diagnose(snap(nodes, [job("j", gpus)]), now=NOW, thresholds=DiagnoseConfig(min_queue_gpus=2))
    assert d.verdict == verdict
    if verdict == "healthy":
        assert d.signals == ("1 GPU job (1 GPUs) wait, under the long-queue mark of 2 GPUs, longest 0 min",)


def test_without_on_prem_gpus_the_waiting_gpus_are_named_and_every_job_is_listed():
    d = diagnose(snap([], [job("p", 3, waited_s=5000), job("q", 2)]), now=NOW)
    assert d.verdict == "resource-bound"
    assert d.signals == ("5 GPUs wait and there are no on-prem GPUs",)
    gpus = d.cause("no-onprem-gpus")
    assert (gpus.summary, gpus.jobs, gpus.nodes, gpus.gpus) == ("no on-prem node has GPUs", ("p", "q"), (), 5)


# ------------------------------------------------------------------------------- the signals
def test_low_allocation_without_history_is_not_called_persistent():
    nodes = [node("g1", alloc=1), node("g2", alloc=1)]
    d = diagnose(snap(nodes, [job("p1", 4, exclusive=True), job("p2", 4)]), now=NOW)
    assert d.verdict == "scheduling-bound"
    assert d.signals == ("allocation 25% under 70% with 8 GPUs waiting",
                         "8 of 8 waiting GPUs are held up by scheduling, not capacity")
    assert summaries(d) == [
        ("fragmentation", "1 whole-node (--exclusive) request and 1 multi-GPU request (8 GPUs) wait while 6 GPUs "
         "are free, scattered over 2 nodes none of which can hold them alone", ("p1", "p2"), ("g1", "g2"), 8)]


def test_whole_node_requests_alone_are_named_alone():
    nodes = [node("g1", alloc=1), node("g2", alloc=1)]
    d = diagnose(snap(nodes, [job("x", 4, exclusive=True)]), now=NOW)
    assert d.cause("fragmentation").summary == (
        "1 whole-node (--exclusive) request (4 GPUs) wait while 6 GPUs are free, scattered over 2 nodes none of "
        "which can hold them alone")


def _between(cap_gpus, sched_gpus, cfg=DiagnoseConfig()):
    """80 % allocated (8 of 10 GPUs), a job of ``cap_gpus`` GPUs of a model no node has, one of ``sched_gpus`` held."""
    pending = [job("c", cap_gpus, gpu_model="h100", waited_s=1000)] if cap_gpus else []
    pending += [job("h", sched_gpus, reason="JobHeldUser")] if sched_gpus else []
    return diagnose(snap([node("g1", gpus=10, alloc=8)], pending), now=NOW, thresholds=cfg)


@pytest.mark.parametrize("cap,sched,verdict", [(3, 1, "mixed"), (4, 1, "resource-bound"), (5, 0, "resource-bound")])
def test_between_the_marks_a_quarter_of_the_waiting_gpus_each_way_is_mixed(cap, sched, verdict):
    d = _between(cap, sched)
    assert d.verdict == verdict
    assert d.signals == (f"allocation 80% is between 70% and 90%; {cap} waiting GPUs need capacity, "
                         f"{sched} wait on scheduling",)


@pytest.mark.parametrize("cap,sched,verdict", [(1, 5, "scheduling-bound"), (2, 6, "mixed"), (3, 3, "mixed")])
def test_between_the_marks_more_held_than_needing_capacity_is_scheduling_bound(cap, sched, verdict):
    # with the scheduling share at 100 %, a share of held GPUs under it is read between the marks
    d = _between(cap, sched, DiagnoseConfig(scheduling_share=1.0))
    assert d.verdict == verdict
    if verdict == "scheduling-bound":
        assert d.actions[0] == ("Use the GPUs already there before buying more: allocation is low while the queue "
                                "is long.")


def test_held_gpus_from_exactly_the_scheduling_share_make_it_scheduling_bound():
    d = _between(2, 2)  # 2 of 4 held: exactly half
    assert d.verdict == "scheduling-bound"
    assert d.signals == ("2 of 4 waiting GPUs are held up by scheduling, not capacity",)
    assert d.actions[0] == ("Fix scheduling before buying capacity: bursting would not start most of the waiting "
                            "GPUs.")
    assert "Burst the capacity-bound jobs" not in " ".join(d.actions)
    assert _between(3, 2).verdict == "mixed"  # 2 of 5: under half, read between the marks


def _full_with_idle(idle_alloc, idle_pct=3.0, cfg=DiagnoseConfig()):
    """Ten nodes of 4 GPUs (40, mark 4 GPUs), nine busy and full; g0 with ``idle_alloc`` GPUs allocated."""
    nodes = [node("g0", alloc=idle_alloc)] + [node(f"g{i}", alloc=4) for i in range(1, 10)]
    samples = busy("g0", 4, idle_pct) + [s for i in range(1, 10) for s in busy(f"g{i}")]
    running = [RunningJob("idle", idle_alloc, nodes=("g0",)), RunningJob("cpu", 0, nodes=("g0",)),
               RunningJob("r1", 4, nodes=("g1",))]
    return diagnose(snap(nodes, [job("p", 4, waited_s=1000)], running, samples), now=NOW, thresholds=cfg)


def test_idle_allocations_from_the_mark_make_a_full_cluster_mixed():
    d = _full_with_idle(4)
    assert d.verdict == "mixed"
    assert d.signals == ("allocation 100% >= 90% and 4 GPUs of demand wait for capacity",
                         "4 allocated GPUs idle or held by half-started gangs")
    idle = d.cause("idle-allocated")
    assert (idle.summary, idle.jobs, idle.nodes, idle.gpus) == (
        "4 allocated GPUs on 1 node run under 30 % utilisation (g0 3 %)", ("idle",), ("g0",), 4)
    assert d.actions[0].startswith("Right-size GPU requests")
    d = _full_with_idle(3)  # 3 idle GPUs, under the mark of 4
    assert d.verdict == "resource-bound"
    assert d.signals == ("allocation 98% >= 90% and 4 GPUs of demand wait for capacity",)
    assert d.cause("idle-allocated").summary == "3 allocated GPUs on 1 node run under 30 % utilisation (g0 3 %)"


@pytest.mark.parametrize("pct,idle", [(29.9, True), (30.0, False)])
def test_a_node_is_idle_under_the_utilisation_mark_not_at_it(pct, idle):
    d = _full_with_idle(4, pct)
    assert (d.cause("idle-allocated") is not None) is idle
    assert d.verdict == ("mixed" if idle else "resource-bound")


def test_the_idle_mark_is_said_as_configured():
    d = _full_with_idle(4, 20.0, DiagnoseConfig(idle_utilization_pct=25.0))
    assert d.cause("idle-allocated").summary == "4 allocated GPUs on 1 node run under 25 % utilisation (g0 20 %)"


def test_one_idle_gpu_is_waste_on_a_small_cluster():
    # 9 GPUs: 10 % is 0.9, so one idle GPU is the mark
    nodes = [node("g1", alloc=4), node("g2", alloc=4), node("g3", gpus=1, alloc=1)]
    samples = busy("g1") + busy("g2") + busy("g3", 1, 5.0)
    d = diagnose(snap(nodes, [job("p", 4, waited_s=1000)], samples=samples), now=NOW)
    assert d.verdict == "mixed"
    assert d.signals[1] == "1 allocated GPU idle or held by half-started gangs"
    assert d.cause("idle-allocated").summary == "1 allocated GPU on 1 node run under 30 % utilisation (g3 5 %)"


def test_samples_of_a_node_with_nothing_allocated_count_nowhere():
    nodes = [node("g1", alloc=4), node("g2", alloc=0)]
    samples = busy("g1", 4, 80.0) + busy("g2", 4, 0.0)
    d = diagnose(snap(nodes, samples=samples), now=NOW)
    assert d.utilization == pytest.approx(80.0) and d.cause("idle-allocated") is None


# ------------------------------------------------------------------------------- gangs
def test_a_half_started_gang_names_its_members_nodes_and_gpus():
    nodes = [node("g1", alloc=4), node("g2", alloc=4), node("g3", alloc=4)]
    running = [RunningJob("a0", 4, nodes=("g1",)), RunningJob("a1", 4, nodes=("g2",)),
               RunningJob("7+0", 4, nodes=("g3",)), RunningJob("b0", 0, nodes=("g3",))]
    pending = [job("a2", 4, waited_s=100), job("7+1", 2, waited_s=50), job("7+2", 2, waited_s=40),
               job("c2", 4, waited_s=30)]
    gangs = {"ddp": ["a0", "a1", "a2"], 3: [41, 42], "cold": ["c0", "c2"], "done": ["b0"]}
    d = diagnose(snap(nodes, pending, running, extra={"gangs": gangs}), now=NOW)
    got = [(c.summary, c.jobs, c.nodes, c.gpus) for c in d.causes if c.kind == "half-allocated-gang"]
    assert got == [
        ("gang ddp: 2 members run holding 8 GPUs while 1 member wait", ("a0", "a1", "a2"), ("g1", "g2"), 8),
        ("gang het:7: 1 member run holding 4 GPUs while 2 members wait", ("7+0", "7+1", "7+2"), ("g3",), 4)]
    assert "12 allocated GPUs idle or held by half-started gangs" in d.signals


def test_to_dict_carries_the_counts_an_operator_reads():
    d = _full_with_idle(4)
    doc = d.to_dict()
    assert (doc["gpus_total"], doc["gpus_allocated"], doc["gpus_free"], doc["pending_jobs"], doc["pending_gpus"]) \
        == (40, 40, 0, 1, 4)
    assert doc["signals"] == list(d.signals) and doc["actions"] == list(d.actions)
