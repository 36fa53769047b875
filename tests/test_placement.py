"""Where a waiting job would fit (policies/placement.py), rule by rule: the spread and node-count
plans, the nodes a job may use, the tallies a diagnosis claims from, and the shapes whose
refusals are remembered (a job is never refused for another shape's failure)."""
from __future__ import annotations

from policies.placement import Placer, Tally, plan
from policies.queue import ClusterNode, PendingJob


def job(gpus: int, **kw) -> PendingJob:
    return PendingJob(f"j{gpus}", gpus, **kw)


def node(name: str, total: int = 8, allocated: int = 0, state: str = "", **kw) -> ClusterNode:
    return ClusterNode(name, state or ("idle" if allocated == 0 else "mix"), total, allocated, **kw)


def test_a_spread_job_takes_the_freest_nodes_first_until_it_has_its_gpus():
    free, whole = {"a": 4, "b": 6, "c": 1}, {"a": False, "b": False, "c": False}
    assert plan(job(8), ["a", "b", "c"], free, whole) == [("b", 6), ("a", 2)]
    assert plan(job(12), ["a", "b", "c"], free, whole) is None  # 11 free in all


def test_a_node_count_job_takes_the_best_fitting_nodes_of_its_share_each():
    free, whole = {"a": 8, "b": 4, "c": 5}, {"a": True, "b": False, "c": False}
    assert plan(job(8, nodes=2), ["a", "b", "c"], free, whole) == [("b", 4), ("c", 4)]  # 4 each: b fits exactly
    assert plan(job(4, nodes=1), ["a", "b", "c"], free, whole) == [("b", 4)]  # best fit, not the first
    assert plan(job(9, nodes=1), ["a", "b", "c"], free, whole) is None
    assert plan(job(4, nodes=3), ["a", "b", "c"], free, whole) == [("b", 2), ("c", 2), ("a", 2)]


def test_an_exclusive_job_needs_whole_nodes_and_holds_all_their_gpus():
    free, whole = {"a": 8, "b": 8}, {"a": True, "b": False}
    assert plan(job(4, exclusive=True), ["a", "b"], free, whole) == [("a", 8)]
    assert plan(job(4, nodes=2, exclusive=True), ["a", "b"], free, whole) is None


def test_the_nodes_a_job_may_use_by_partition_and_model():
    nodes = [node("a", partitions=("p1",), gpu_model="A100"), node("b", partitions=("p2",), gpu_model="H100"),
             node("c", gpu_model="A100"), node("d", partitions=("p1",)), node("cpu", total=0)]
    p = Placer(nodes)
    assert p.eligible(job(1)) == ("a", "b", "c", "d")  # any GPU node; never a CPU-only one
    assert p.eligible(job(1, queue="p1")) == ("a", "c", "d")  # no partition listed: any
    assert p.eligible(job(1, queue="p1,p2")) == ("a", "b", "c", "d")
    assert p.eligible(job(1, gpu_model="a100")) == ("a", "c", "d")  # no model listed: any
    assert p.eligible(job(1, queue="p2", gpu_model="A100")) == ("c",)


def test_the_tallies_free_now_and_with_drained_and_down_nodes_back():
    nodes = [node("idle"), node("mix", allocated=2), node("busy", allocated=0, state="mix"),
             node("drained", allocated=0, state="drain"), node("down", allocated=3, state="down"),
             node("full", allocated=8, state="drain")]
    p = Placer(nodes)
    assert p.now.free == {"idle": 8, "mix": 6, "busy": 8, "drained": 0, "down": 0, "full": 0}
    assert p.now.whole == {"idle": True, "mix": False, "busy": False, "drained": False, "down": False,
                           "full": False}
    assert p.if_up.free == {"idle": 8, "mix": 6, "busy": 8, "drained": 8, "down": 5, "full": 0}
    assert p.if_up.whole == {"idle": True, "mix": False, "busy": False, "drained": True, "down": False,
                             "full": False}
    # with nothing running, an exclusive job fits on any node
    assert p.fits_empty(job(8, exclusive=True), Placer.shape(job(8, exclusive=True)))


def test_a_claim_takes_gpus_and_wholeness_and_counts_once():
    t = Tally({"a": 2, "b": 4}, {"a": True, "b": True})
    t.take([("a", 3)], floor=True)
    assert t.free["a"] == 0 and t.whole["a"] is False and t.version == 1
    t.take([("b", 5)], floor=False)  # the tally of now may go below zero (over-claimed)
    assert t.free["b"] == -1 and t.whole["b"] is False and t.version == 2


def test_free_gpus_of_a_jobs_nodes_follow_the_claims():
    p = Placer([node("a"), node("b", allocated=4)])
    assert p.free_now(job(1)) == 12
    p.now.take([("a", 8)], floor=True)
    assert p.free_now(job(1)) == 4


def test_a_refusal_is_remembered_for_its_own_shape_only():
    p = Placer([node("a", allocated=4), node("b", allocated=4)])  # 4 free on each, neither whole

    def place(j: PendingJob):
        return p.place(j, Placer.shape(j), p.now)

    assert place(job(4, exclusive=True)) is None  # no whole node
    assert place(job(4)) == [("a", 4)]  # a spread of the same GPUs is another question
    assert place(job(8, nodes=1)) is None  # no node has 8 free
    assert place(job(8, nodes=2)) == [("a", 4), ("b", 4)]  # placing claims nothing (the caller takes)
    p2 = Placer([node("a", allocated=4), node("b", allocated=4)])
    assert p2.place(job(8, nodes=1), Placer.shape(job(8, nodes=1)), p2.now) is None
    assert p2.place(job(8), Placer.shape(job(8)), p2.now) == [("a", 4), ("b", 4)]
    p3 = Placer([node("a", allocated=4), node("b", allocated=4)])
    assert p3.place(job(8, nodes=1), Placer.shape(job(8, nodes=1)), p3.now) is None
    assert p3.place(job(8, nodes=2), Placer.shape(job(8, nodes=2)), p3.now) == [("a", 4), ("b", 4)]
    # a job that fits leaves its shape open for the next one
    p4 = Placer([node("a"), node("b")])
    assert p4.place(job(4), Placer.shape(job(4)), p4.now) is not None
    assert p4.place(job(4), Placer.shape(job(4)), p4.now) is not None


def test_free_gpus_are_counted_per_set_of_nodes_and_again_after_each_claim():
    p = Placer([node("a", allocated=7, partitions=("p1",)), node("b", allocated=2, partitions=("p2",))])
    assert (p.free_now(job(1, queue="p1")), p.free_now(job(1, queue="p2"))) == (1, 6)
    p.now.take([("a", 1)], floor=True)  # the claim's count (1) equals the sum it makes stale
    assert p.free_now(job(1, queue="p1")) == 0
