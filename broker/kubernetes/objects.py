"""Kubernetes objects (plain JSON dicts, as the API server sends them) → the one queue model,
:class:`policies.queue.QueueSnapshot`, so a Kubernetes/Kueue queue is diagnosed and decided on
exactly as a Slurm queue is.

What each record becomes:

* **Waiting jobs** (:class:`~policies.queue.PendingJob`):

  - a *pod* in phase ``Pending`` with no ``spec.nodeName`` that requests the GPU resource
    (``nvidia.com/gpu``; a container's request, else its limit; init containers count as their
    largest). One pod is on one node: ``nodes = 1``. Pods that Kueue gates
    (``schedulingGates`` ``kueue.x-k8s.io/admission``) are left out: their Workload waits for
    them.
  - a Kueue *Workload* not admitted: no ``QuotaReserved=True`` and no ``Admitted=True`` (one
    that holds quota waits for its admission checks, not for GPUs; a ``Finished`` one waits for
    nothing). GPUs = the sum over pod sets of ``count`` x the pod's GPUs; ``nodes`` = the pod
    count when every pod asks the same GPUs (else 0, the scheduler's choice).

  Both: ``job_id`` ``NAMESPACE/NAME``; ``gpu_model`` from a ``nodeSelector`` on the GPU model
  label (as on nodes, below); ``user`` the namespace; ``waited_s`` since
  ``creationTimestamp``; ``job_class`` the priority class name (``spec.priorityClassName``);
  ``priority`` ``spec.priority``; no QOS. ``queue``: a pod's namespace, a Workload's
  ClusterQueue (through its LocalQueue ``spec.queueName``; the LocalQueue's name when it is not
  known). Time limit: ``spec.activeDeadlineSeconds`` (a Workload's
  ``spec.maximumExecutionTimeSeconds``). The broker's job hints (kind, interruptible,
  checkpoint, data_gb, gpu_mem, runtime; see :mod:`broker.slurm.records`) come from the
  annotation ``broker.io/hints`` (``kind=eval,interruptible=1``), the kind else from the name.

* **Why it waits** (``pending_reason``, in Slurm's words, which the diagnosis reads):
  ``PodScheduled=False`` ``Unschedulable`` naming ``Insufficient <gpu resource>`` → ``Resources``;
  one naming only node affinity/selector mismatches → ``BadConstraints``; other scheduling gates
  → ``JobHeldAdmin``; not yet seen by the scheduler → ``None``. A Workload: ``QuotaReserved=False``
  with Kueue's "insufficient quota" (or any ``Pending``) → ``Resources`` (Kueue's quota stands
  for the cluster's GPUs: a workload waiting for it waits for capacity); ``Inadmissible`` (its
  LocalQueue/ClusterQueue missing or stopped) → ``PartitionConfig``; ``spec.active = false`` →
  ``JobHeldUser``; a re-queue back-off still running (``status.requeueState.requeueAt``) →
  ``BeginTime``.

* **Nodes** (:class:`~policies.queue.ClusterNode`) with GPU allocatable: total = allocatable
  GPUs; allocated = the GPUs requested by the pods bound to it that have not finished
  (``spec.nodeName``, phase neither ``Succeeded`` nor ``Failed``). State: ``cloud`` for a node a
  burst joined (label ``broker.io/lease``, set by the kubeadm boot template); ``down`` when
  ``Ready`` is not ``True`` (reason: its message); ``drain`` when cordoned
  (``spec.unschedulable``); else ``idle``/``mix``/``alloc`` by allocation. GPU model: the
  ``nvidia.com/gpu.product`` label (GPU feature discovery) without its vendor prefix and
  suffixes (``NVIDIA-A100-SXM4-80GB`` → ``A100``).

* **Running jobs** (:class:`~policies.queue.RunningJob`): GPU pods bound to a node and not
  finished, running since ``status.startTime``, with their ``activeDeadlineSeconds`` as the time
  limit and the hints' runtime as the estimate (the wait predictor plays the queue forward from
  their expected ends).
"""
from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from broker.watchers.hints import parse_job_hints
from policies.queue import ClusterNode, PendingJob, RunningJob

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
LEASE_LABEL = "broker.io/lease"
HINTS_ANNOTATION = "broker.io/hints"
KUEUE_GATE = "kueue.x-k8s.io/admission"
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
_SUFFIX = {"k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18, "m": -3}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_VENDOR = re.compile(r"^(NVIDIA|Tesla|GeForce|Quadro)[-_ ]+", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Scope:
    """What the mapping reads: the GPU resource, the model label, the cloud-node label."""

    gpu_resource: str = GPU_RESOURCE
    gpu_model_label: str = PRODUCT_LABEL
    cloud_label: str = LEASE_LABEL


def quantity(raw: Any) -> int:
    """A Kubernetes quantity (``8``, ``"8"``, ``"1k"``, ``"2000m"``) as a whole count, rounded
    down; 0 when it cannot be read."""
    s = str(raw if raw is not None else "").strip()
    if not s:
        return 0
    exp, mult = 0, 1
    for suf, p in _BINARY.items():
        if s.endswith(suf):
            s, mult = s[:-2], 2 ** p
            break
    else:
        if s[-1] in _SUFFIX:
            s, exp = s[:-1], _SUFFIX[s[-1]]
    try:
        v = Decimal(s) * mult * (Decimal(10) ** exp)
    except InvalidOperation:
        return 0
    return max(0, int(v)) if v.is_finite() else 0


def pod_gpus(spec: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    """GPUs a pod (spec) requests: the containers' sum, or the largest init container's."""
    def one(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        req = (res.get("requests") or {}).get(resource)
        return quantity(req if req is not None else (res.get("limits") or {}).get(resource))

    main = sum(one(c) for c in spec.get("containers") or ())
    init = max((one(c) for c in spec.get("initContainers") or ()), default=0)
    return max(main, init)


def gpu_model(labels: Mapping[str, str] | None, label: str = PRODUCT_LABEL) -> str:
    """``NVIDIA-A100-SXM4-80GB`` → ``A100``, ``Tesla-T4`` → ``T4``, ``NVIDIA-L4`` → ``L4``."""
    raw = (labels or {}).get(label, "")
    rest = _VENDOR.sub("", raw.strip())
    return rest.split("-")[0].split("_")[0].upper() if rest else ""


def timestamp(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return c
    return None


def _key(obj: Mapping[str, Any]) -> str:
    m = obj.get("metadata") or {}
    return f"{m.get('namespace')}/{m.get('name')}" if m.get("namespace") else str(m.get("name"))


def _hinted(meta: Mapping[str, Any], now: float) -> tuple[Any, int]:
    hints = parse_job_hints(f"broker:{(meta.get('annotations') or {}).get(HINTS_ANNOTATION, '')}",
                            meta.get("name", ""))
    created = timestamp(meta.get("creationTimestamp"))
    return hints, max(0, int(now - created)) if created else 0


def pod_reason(pod: Mapping[str, Any], resource: str = GPU_RESOURCE) -> str:
    """Why a pending pod waits, in Slurm's words (see the module docstring)."""
    gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or ()]
    if gates:
        return "JobHeldAdmin"
    cond = condition(pod, "PodScheduled")
    if cond is None or cond.get("status") != "False":
        return "None"
    msg = cond.get("message") or ""
    if cond.get("reason") == "Unschedulable" and "Insufficient" not in msg and (
            "node affinity/selector" in msg or "didn't match" in msg):
        return "BadConstraints"
    return "Resources"


def pending_pod(pod: Mapping[str, Any], now: float, scope: Scope) -> PendingJob | None:
    """The pod as a waiting job, or None when it is not one (bound, finished, no GPUs, or
    gated by Kueue, whose Workload stands for it)."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") != "Pending" or spec.get("nodeName"):
        return None
    if any(g.get("name") == KUEUE_GATE for g in spec.get("schedulingGates") or ()):
        return None
    gpus = pod_gpus(spec, scope.gpu_resource)
    if gpus <= 0:
        return None
    hints, waited = _hinted(meta, now)
    limit = quantity(spec.get("activeDeadlineSeconds"))
    ns = meta.get("namespace", "")
    return PendingJob(
        job_id=_key(pod), gpus=gpus, user=ns, queue=ns, nodes=1, time_limit_s=limit,
        gpu_model=gpu_model(spec.get("nodeSelector"), scope.gpu_model_label),
        est_runtime_s=hints.runtime_s or limit, waited_s=waited,
        pending_reason=pod_reason(pod, scope.gpu_resource), min_gpu_memory_gb=hints.gpu_mem_gb,
        interruptible=hints.interruptible, checkpoint_minutes=hints.checkpoint_minutes,
        data_gb=hints.data_gb, kind=hints.kind, job_class=spec.get("priorityClassName", ""),
        priority=int(spec.get("priority") or 0))


def workload_reason(wl: Mapping[str, Any], now: float) -> str:
    """Why a Workload waits for admission, in Slurm's words (see the module docstring)."""
    if (wl.get("spec") or {}).get("active") is False:
        return "JobHeldUser"
    requeue_at = timestamp(((wl.get("status") or {}).get("requeueState") or {}).get("requeueAt"))
    if requeue_at is not None and requeue_at > now:
        return "BeginTime"
    cond = condition(wl, "QuotaReserved")
    if cond is None:
        return "None"
    if cond.get("reason") == "Inadmissible":
        return "PartitionConfig"
    return "Resources"


def waiting_workload(wl: Mapping[str, Any], now: float, cluster_queues: Mapping[str, str],
                     scope: Scope) -> PendingJob | None:
    """The Workload as a waiting job, or None when it is admitted, holds quota or finished."""
    for kind in ("Admitted", "QuotaReserved", "Finished"):
        c = condition(wl, kind)
        if c is not None and c.get("status") == "True":
            return None
    spec, meta = wl.get("spec") or {}, wl.get("metadata") or {}
    per_pod, pods, gpus, models = set(), 0, 0, set()
    for ps in spec.get("podSets") or ():
        count = quantity(ps.get("count", 1))
        pod_spec = (ps.get("template") or {}).get("spec") or {}
        g = pod_gpus(pod_spec, scope.gpu_resource)
        if g and count:
            per_pod.add(g)
            pods += count
            gpus += g * count
            models.add(gpu_model(pod_spec.get("nodeSelector"), scope.gpu_model_label))
    if gpus <= 0:
        return None
    ns, lq = meta.get("namespace", ""), spec.get("queueName", "")
    hints, waited = _hinted(meta, now)
    limit = quantity(spec.get("maximumExecutionTimeSeconds"))
    return PendingJob(
        job_id=_key(wl), gpus=gpus, user=ns, queue=cluster_queues.get(f"{ns}/{lq}", lq),
        nodes=pods if len(per_pod) == 1 else 0, time_limit_s=limit,
        gpu_model=models.pop() if len(models) == 1 else "",
        est_runtime_s=hints.runtime_s or limit, waited_s=waited,
        pending_reason=workload_reason(wl, now), min_gpu_memory_gb=hints.gpu_mem_gb,
        interruptible=hints.interruptible, checkpoint_minutes=hints.checkpoint_minutes,
        data_gb=hints.data_gb, kind=hints.kind, job_class=spec.get("priorityClassName", ""),
        priority=int(spec.get("priority") or 0))


def allocated(pods: Iterable[Mapping[str, Any]], scope: Scope) -> dict[str, int]:
    """GPUs requested per node by the pods bound to it that have not finished."""
    out: dict[str, int] = {}
    for p in pods:
        name = (p.get("spec") or {}).get("nodeName")
        if name and (p.get("status") or {}).get("phase") not in FINISHED_PHASES:
            out[name] = out.get(name, 0) + pod_gpus(p.get("spec") or {}, scope.gpu_resource)
    return out


def cluster_node(n: Mapping[str, Any], used: int, scope: Scope) -> ClusterNode | None:
    """A node with GPU allocatable as the queue model's node (None: no GPUs)."""
    meta, spec, status = n.get("metadata") or {}, n.get("spec") or {}, n.get("status") or {}
    total = quantity((status.get("allocatable") or {}).get(scope.gpu_resource))
    labels = meta.get("labels") or {}
    if total <= 0:
        return None
    ready = condition(n, "Ready")
    if scope.cloud_label in labels:
        state, reason = "cloud", ""
    elif ready is None or ready.get("status") != "True":
        state, reason = "down", (ready or {}).get("message") or "not Ready"
    elif spec.get("unschedulable"):
        state, reason = "drain", "cordoned (spec.unschedulable)"
    else:
        state, reason = ("idle" if used <= 0 else "alloc" if used >= total else "mix"), ""
    return ClusterNode(name=meta.get("name", ""), state=state, gpus_total=total, gpus_allocated=min(used, total),
                       gpu_model=gpu_model(labels, scope.gpu_model_label), reason=reason)


def running_pod(p: Mapping[str, Any], now: float, scope: Scope) -> RunningJob | None:
    spec, meta, status = p.get("spec") or {}, p.get("metadata") or {}, p.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in FINISHED_PHASES:
        return None
    gpus = pod_gpus(spec, scope.gpu_resource)
    if gpus <= 0:
        return None
    started = timestamp(status.get("startTime"))
    ns = meta.get("namespace", "")
    hints, _ = _hinted(meta, now)
    return RunningJob(job_id=_key(p), gpus=gpus, user=ns, queue=ns, nodes=(spec["nodeName"],),
                      runtime_s=max(0, int(now - started)) if started else 0,
                      time_limit_s=quantity(spec.get("activeDeadlineSeconds")), est_runtime_s=hints.runtime_s)


def queue_records(pods: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]],
                  workloads: Iterable[Mapping[str, Any]], local_queues: Iterable[Mapping[str, Any]],
                  now: float, scope: Scope = Scope()
                  ) -> tuple[list[PendingJob], list[ClusterNode], list[RunningJob]]:
    """(pending, nodes, running) of a cluster, oldest waiting first."""
    pods = list(pods)
    cqs = {_key(lq): (lq.get("spec") or {}).get("clusterQueue", "") for lq in local_queues}
    cqs = {k: v for k, v in cqs.items() if v}
    pending = [j for j in (pending_pod(p, now, scope) for p in pods) if j is not None]
    pending += [j for j in (waiting_workload(w, now, cqs, scope) for w in workloads) if j is not None]
    pending.sort(key=lambda j: (-j.waited_s, j.job_id))
    used = allocated(pods, scope)
    out_nodes = [c for c in (cluster_node(n, used.get((n.get("metadata") or {}).get("name", ""), 0), scope)
                             for n in nodes) if c is not None]
    out_nodes.sort(key=lambda c: c.name)
    running = [r for r in (running_pod(p, now, scope) for p in pods) if r is not None]
    return pending, out_nodes, running
