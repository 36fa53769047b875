"""One cluster described once, written twice: as Slurm's ``squeue --json``/``sinfo --json``
(read by the Slurm watcher through stand-in commands that print them) and as pods, Kueue
Workloads, LocalQueues and nodes on the fake Kubernetes API server. The two watchers must then
see the same queue, so the diagnosis and the decision must be the same."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from broker_sandbox.kubernetes import FakeKubeApi, iso, local_queue, node, pod, workload

PRODUCT = {"a100": "NVIDIA-A100-SXM4-80GB", "h100": "NVIDIA-H100-80GB-HBM3"}
NAMESPACE, LOCAL_QUEUE, CLUSTER_QUEUE, PARTITION = "ml", "team-a", "gpu", "gpu"


@dataclass(frozen=True)
class Node:
    name: str
    gpus: int = 8
    state: str = "up"  # up | drain | down
    model: str = "a100"


@dataclass(frozen=True)
class Job:
    """A job: pending unless ``on`` names the node it runs on. ``pods`` > 1 (or ``workload``)
    makes it a Kueue Workload on Kubernetes; a single pod otherwise."""

    id: int
    gpus_per_pod: int
    pods: int = 1
    waited_s: int = 600
    limit_min: int = 240
    on: str = ""
    label: str = ""  # Slurm QOS / Kubernetes priority class
    priority: int = 0
    hints: str = ""  # broker hints: Slurm comment "broker:<hints>", annotation broker.io/hints
    model: str = ""  # a GPU model the job asks for
    workload: bool = False
    held: bool = False  # Slurm JobHeldUser / Workload spec.active = false

    @property
    def kube_name(self) -> str:
        return f"job-{self.id}"


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...] = field(default=())

    def kube_id(self, job_id: str) -> str:
        """``ml/job-101`` → ``101`` (the Slurm id of the same job)."""
        return job_id.rsplit("/job-", 1)[-1]

    # -- Slurm -----------------------------------------------------------------------------------
    def slurm_documents(self, now: int) -> tuple[dict, dict]:
        jobs = []
        for j in self.jobs:
            gres = f"gres:gpu:{j.model + ':' if j.model else ''}{j.gpus_per_pod}"
            running = bool(j.on)
            jobs.append({
                "job_id": j.id, "job_state": "RUNNING" if running else "PENDING",
                "state_reason": "None" if running else ("JobHeldUser" if j.held else "Resources"),
                "partition": PARTITION, "user_name": NAMESPACE, "name": f"job-{j.id}",
                "submit_time": now - j.waited_s, "start_time": now - j.waited_s if running else 0,
                "time_limit": j.limit_min, "node_count": j.pods, "tasks": j.pods, "tres_per_node": gres,
                "tres_per_job": "", "tres_per_task": "", "qos": j.label, "priority": j.priority,
                "nodes": j.on if running else "", "comment": f"broker:{j.hints}" if j.hints else "",
                "shared": None, "array_job_id": 0, "het_job_id": 0})
        used = {n.name: sum(j.gpus_per_pod for j in self.jobs if j.on == n.name) for n in self.nodes}
        nodes = []
        for n in self.nodes:
            u = used[n.name]
            base = "idle" if not u else "allocated" if u >= n.gpus else "mixed"
            flags = {"up": [], "drain": ["DRAIN"], "down": ["NOT_RESPONDING"]}[n.state]
            nodes.append({
                "name": n.name, "hostname": n.name, "state": "down" if n.state == "down" else base,
                "state_flags": flags, "gres": f"gpu:{n.model}:{n.gpus}",
                "gres_used": f"gpu:{n.model}:{u}(IDX:{'0-' + str(u - 1) if u else 'N/A'})",
                "partitions": [PARTITION], "reason": {"up": "", "drain": "ECC errors",
                                                      "down": "Not responding"}[n.state]})
        meta = {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}}
        return {"meta": meta, "errors": [], "jobs": jobs}, {"meta": meta, "errors": [], "nodes": nodes}

    def slurm_table(self, root: Path, now: int, cluster: str = "eq") -> dict:
        """The ``[slurm]`` table of a Slurm whose squeue/sinfo print this cluster."""
        root.mkdir(parents=True, exist_ok=True)
        sq, si = self.slurm_documents(now)
        paths = {}
        for cmd, doc in (("squeue", sq), ("sinfo", si)):
            (root / f"{cmd}.json").write_text(json.dumps(doc))
            script = root / cmd
            script.write_text(f"#!/bin/sh\nexec /bin/cat {root / (cmd + '.json')}\n")
            script.chmod(0o755)
            paths[cmd] = str(script)
        return {"enabled": True, "cluster": cluster, "squeue": paths["squeue"], "sinfo": paths["sinfo"],
                "scontrol": "/bin/false"}

    # -- Kubernetes ------------------------------------------------------------------------------
    def load_into(self, api: FakeKubeApi, now: int) -> None:
        api.put("localqueues", local_queue(LOCAL_QUEUE, NAMESPACE, CLUSTER_QUEUE))
        for n in self.nodes:
            api.put("nodes", node(n.name, gpus=n.gpus, product=PRODUCT[n.model], unschedulable=n.state == "drain",
                                  ready=n.state != "down"))
        for j in self.jobs:
            api.put(*self._kube_object(j, now))

    def _kube_object(self, j: Job, now: int) -> tuple[str, dict]:
        selector = {"nvidia.com/gpu.product": PRODUCT[j.model]} if j.model else None
        if j.on or not (j.workload or j.pods > 1 or j.held):
            obj = pod(j.kube_name, NAMESPACE, gpus=j.gpus_per_pod, phase="Running" if j.on else "Pending",
                      node=j.on, created=now - j.waited_s, priority_class=j.label, priority=j.priority or None,
                      node_selector=selector)
            obj["spec"]["activeDeadlineSeconds"] = j.limit_min * 60
            if j.on:
                obj["status"]["startTime"] = iso(now - j.waited_s)
            kind = "pods"
        else:
            obj = workload(j.kube_name, NAMESPACE, queue=LOCAL_QUEUE, gpus_per_pod=j.gpus_per_pod, count=j.pods,
                           created=now - j.waited_s, priority_class=j.label, priority=j.priority or None,
                           active=not j.held)
            obj["spec"]["maximumExecutionTimeSeconds"] = j.limit_min * 60
            if selector:
                obj["spec"]["podSets"][0]["template"]["spec"]["nodeSelector"] = selector
            kind = "workloads"
        if j.hints:
            obj["metadata"]["annotations"] = {"broker.io/hints": j.hints}
        return kind, obj


NODES4 = tuple(Node(f"gpu-{i}") for i in range(1, 5))

# Every GPU allocated; jobs of several classes, shapes and ages wait: resource-bound, and the
# overdue ones burst.
RESOURCE_BOUND = Cluster(NODES4, (
    *(Job(900 + i, 8, on=f"gpu-{i}", waited_s=7200) for i in range(1, 5)),
    Job(101, 8, waited_s=3 * 3600, limit_min=240),
    Job(102, 8, pods=2, waited_s=2 * 3600, label="high", priority=1000),  # production: 30 min target
    Job(103, 2, waited_s=300, label="debug"),  # interactive: 15 min target, not overdue yet
    Job(104, 4, waited_s=3600, hints="kind=eval,interruptible=1,checkpoint=30", model="a100"),
    Job(105, 4, waited_s=5 * 3600, held=True),
    Job(106, 1, waited_s=900, workload=True, label="production", priority=500),
))

# GPUs free but scattered, a drained and a down node: scheduling-bound, nothing bursts.
SCHEDULING_BOUND = Cluster(
    (Node("gpu-1"), Node("gpu-2"), Node("gpu-3", state="drain"), Node("gpu-4", state="down")),
    (Job(901, 4, on="gpu-1", waited_s=3600), Job(902, 4, on="gpu-2", waited_s=3600),
     *(Job(200 + i, 8, waited_s=2 * 3600, limit_min=600) for i in range(3))),
)

# A short queue (under the threshold): only the overdue job goes out, by the wait trigger.
OVERDUE = Cluster(NODES4, (
    *(Job(900 + i, 8, on=f"gpu-{i}", waited_s=7200) for i in range(1, 5)),
    Job(301, 4, waited_s=2 * 3600, label="high", priority=1000),
    Job(302, 1, waited_s=60),
))
