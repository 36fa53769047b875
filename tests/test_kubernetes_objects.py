"""Kubernetes objects → the one queue model (broker/kubernetes/objects.py): which pods and
Kueue Workloads wait, with what GPUs, class and reason; node states and allocation from the pods
bound to them."""
from __future__ import annotations

import pytest

from broker.kubernetes.objects import (
    Scope,
    gpu_model,
    pending_pod,
    quantity,
    queue_records,
    waiting_workload,
)
from broker_sandbox.kubernetes import iso, local_queue, node, pod, workload
from policies.causes import CauseKind, reason_kind

NOW = 1_767_225_600.0
S = Scope()


@pytest.mark.parametrize("raw,want", [("8", 8), (4, 4), ("1k", 1000), ("2000m", 2), ("1500m", 1), ("1Ki", 1024),
                                      ("", 0), (None, 0), ("eight", 0), ("-3", 0), ("1e3", 1000)])
def test_quantities(raw, want):
    assert quantity(raw) == want


@pytest.mark.parametrize("label,want", [("NVIDIA-A100-SXM4-80GB", "A100"), ("NVIDIA-H100-80GB-HBM3", "H100"),
                                        ("Tesla-T4", "T4"), ("NVIDIA-L4", "L4"), ("", "")])
def test_gpu_model_from_the_product_label(label, want):
    assert gpu_model({"nvidia.com/gpu.product": label} if label else {}) == want


def test_a_pending_gpu_pod_is_a_waiting_job_with_its_class_priority_hints_and_wait():
    p = pod("eval-7", "ml", gpus=2, created=NOW - 900, priority_class="high", priority=1000,
            node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    p["metadata"]["annotations"] = {"broker.io/hints": "interruptible=1,checkpoint=30,data_gb=50,runtime=90"}
    p["spec"]["activeDeadlineSeconds"] = 7200
    j = pending_pod(p, NOW, S)
    assert (j.job_id, j.gpus, j.nodes, j.user, j.queue) == ("ml/eval-7", 2, 1, "ml", "ml")
    assert (j.job_class, j.priority, j.qos, j.gpu_model) == ("high", 1000, "", "H100")
    assert (j.waited_s, j.time_limit_s, j.est_runtime_s) == (900, 7200, 5400)
    assert (j.kind, j.interruptible, j.checkpoint_minutes, j.data_gb) == ("eval", True, 30, 50.0)
    assert j.pending_reason == "Resources"


@pytest.mark.parametrize("p", [
    pod("cpu-only", gpus=0),
    pod("bound", gpus=1, node="gpu-1"),
    pod("running", gpus=1, phase="Running", node="gpu-1"),
    pod("gated-by-kueue", gpus=1, gates=("kueue.x-k8s.io/admission",)),
    pod("other-gpu", gpus=1, resource="amd.com/gpu"),
], ids=lambda p: p["metadata"]["name"])
def test_pods_that_do_not_wait_for_gpus_are_not_waiting_jobs(p):
    assert pending_pod(p, NOW, S) is None


def test_init_containers_count_as_their_largest_and_limits_stand_for_requests():
    p = pod("x", gpus=1)
    p["spec"]["containers"].append({"name": "side", "resources": {"limits": {"nvidia.com/gpu": "2"}}})
    p["spec"]["initContainers"] = [{"name": "warm", "resources": {"requests": {"nvidia.com/gpu": "2"}}}]
    assert pending_pod(p, NOW, S).gpus == 3
    p["spec"]["initContainers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "4"
    assert pending_pod(p, NOW, S).gpus == 4


@pytest.mark.parametrize("kw,reason,kind", [
    ({}, "Resources", CauseKind.CAPACITY),
    ({"message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."},
     "BadConstraints", CauseKind.JOB_CONFIG),
    ({"message": "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node "
                 "affinity/selector."}, "Resources", CauseKind.CAPACITY),
    ({"gates": ("example.com/hold",)}, "JobHeldAdmin", CauseKind.HELD),
    ({"reason": ""}, "None", CauseKind.CAPACITY),
])
def test_why_a_pod_waits_in_the_words_the_diagnosis_reads(kw, reason, kind):
    j = pending_pod(pod("p", **kw), NOW, S)
    assert j.pending_reason == reason and reason_kind(j.pending_reason) == kind


def test_a_workload_waiting_for_quota_is_one_job_of_all_its_pods_in_its_cluster_queue():
    wl = workload("job-train-1", "ml", queue="team-a", gpus_per_pod=8, count=4, created=NOW - 3600,
                  priority_class="production", priority=500)
    wl["spec"]["maximumExecutionTimeSeconds"] = 36000
    j = waiting_workload(wl, NOW, {"ml/team-a": "cq-gpu"}, S)
    assert (j.job_id, j.gpus, j.nodes, j.queue, j.user) == ("ml/job-train-1", 32, 4, "cq-gpu", "ml")
    assert (j.job_class, j.priority, j.waited_s, j.time_limit_s) == ("production", 500, 3600, 36000)
    assert j.pending_reason == "Resources"
    # a LocalQueue the watcher does not know: its own name stands for the queue
    assert waiting_workload(wl, NOW, {}, S).queue == "team-a"


def test_pod_sets_of_different_sizes_leave_the_node_count_to_the_scheduler():
    wl = workload("mixed", gpus_per_pod=8, count=2)
    driver = {"name": "driver", "count": 1, "template": {"spec": {"containers": [
        {"name": "d", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    wl["spec"]["podSets"].append(driver)
    j = waiting_workload(wl, NOW, {}, S)
    assert (j.gpus, j.nodes) == (17, 0)


@pytest.mark.parametrize("kw", [{"quota_reserved": True, "cluster_queue": "cq"},
                                {"quota_reserved": True, "admitted": True, "cluster_queue": "cq"},
                                {"gpus_per_pod": 0}])
def test_admitted_or_quota_holding_or_gpu_less_workloads_do_not_wait(kw):
    assert waiting_workload(workload("w", **kw), NOW, {}, S) is None


def test_a_finished_workload_does_not_wait():
    wl = workload("w")
    wl["status"]["conditions"].append({"type": "Finished", "status": "True", "reason": "Succeeded"})
    assert waiting_workload(wl, NOW, {}, S) is None


@pytest.mark.parametrize("change,reason,kind", [
    (lambda w: w["status"]["conditions"][0].update(reason="Inadmissible",
                                                   message="LocalQueue team-a doesn't exist"),
     "PartitionConfig", CauseKind.JOB_CONFIG),
    (lambda w: w["spec"].update(active=False), "JobHeldUser", CauseKind.HELD),
    (lambda w: w["status"].update(requeueState={"count": 1, "requeueAt": iso(NOW + 600)}),
     "BeginTime", CauseKind.BEGIN_TIME),
    (lambda w: w["status"].update(requeueState={"count": 1, "requeueAt": iso(NOW - 600)}),
     "Resources", CauseKind.CAPACITY),
    (lambda w: w["status"].pop("conditions"), "None", CauseKind.CAPACITY),
])
def test_why_a_workload_waits(change, reason, kind):
    wl = workload("w")
    change(wl)
    j = waiting_workload(wl, NOW, {}, S)
    assert j.pending_reason == reason and reason_kind(reason) == kind


def test_nodes_states_and_allocation_from_the_pods_bound_to_them():
    nodes = [node("gpu-1"), node("gpu-2"), node("gpu-3"), node("gpu-4", unschedulable=True),
             node("gpu-5", ready=False), node("cpu-1", gpus=0),
             node("burst-1", gpus=8, product="NVIDIA-H100-80GB-HBM3", labels={"broker.io/lease": "l-1"})]
    pods = [pod("a", gpus=8, phase="Running", node="gpu-1"),
            pod("b", gpus=2, phase="Running", node="gpu-2"),
            pod("c", gpus=1, phase="Pending", node="gpu-2"),  # bound, still starting: holds its GPU
            pod("d", gpus=8, phase="Succeeded", node="gpu-3"),  # finished: holds nothing
            pod("e", gpus=4, phase="Running", node="burst-1")]
    pending, out, running = queue_records(pods, nodes, [], [], NOW)
    by = {n.name: n for n in out}
    assert "cpu-1" not in by
    assert (by["gpu-1"].state, by["gpu-1"].gpus_allocated) == ("alloc", 8)
    assert (by["gpu-2"].state, by["gpu-2"].gpus_allocated, by["gpu-2"].gpus_free) == ("mix", 3, 5)
    assert (by["gpu-3"].state, by["gpu-3"].gpus_allocated) == ("idle", 0)
    assert (by["gpu-4"].state, by["gpu-4"].reason) == ("drain", "cordoned (spec.unschedulable)")
    assert by["gpu-5"].state == "down" and "Kubelet stopped posting" in by["gpu-5"].reason
    assert (by["burst-1"].state, by["burst-1"].gpu_model) == ("cloud", "H100")
    assert by["gpu-1"].gpu_model == "A100"
    assert sorted(r.job_id for r in running) == ["default/a", "default/b", "default/c", "default/e"]
    assert pending == []


def test_waiting_jobs_come_oldest_first_and_local_queues_name_cluster_queues():
    pods = [pod("young", "ml", created=NOW - 10), pod("old", "ml", created=NOW - 1000)]
    wls = [workload("mid", "ml", queue="team-a", created=NOW - 500)]
    pending, _, _ = queue_records(pods, [], wls, [local_queue("team-a", "ml", "cq-gpu")], NOW)
    assert [j.job_id for j in pending] == ["ml/old", "ml/mid", "ml/young"]
    assert pending[1].queue == "cq-gpu"
