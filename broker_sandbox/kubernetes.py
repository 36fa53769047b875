"""A fake Kubernetes API server (core v1 and Kueue v1beta1) on loopback, for tests.

It speaks the wire the official ``kubernetes`` Python client sends and reads, after the API
reference ("API concepts": efficient detection of changes, watch bookmarks, 410 Gone):

* Resources: ``pods`` and ``nodes`` (``/api/v1/...``), Kueue's ``workloads`` and ``localqueues``
  (``/apis/kueue.x-k8s.io/v1beta1/...``); namespaced kinds also under
  ``.../namespaces/NS/KIND``. Anything else is a 404 ``Status``.
* Lists: ``{"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "N"},
  "items": [...]}``; every object carries ``metadata.resourceVersion`` (the store's counter when
  it last changed), ``uid`` and ``creationTimestamp``. ``fieldSelector`` on pods
  (``status.phase``, ``spec.nodeName``, ``metadata.namespace``, ``metadata.name`` with ``=``,
  ``==`` and ``!=``, comma = and).
* Watches: ``?watch=1&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=S`` answers 200
  with ``Transfer-Encoding: chunked`` and one JSON event a line: ``ADDED``/``MODIFIED``/
  ``DELETED`` for every change after N, then as they happen (an object that stops matching the
  field selector is ``DELETED``); ``BOOKMARK`` events (only
  ``metadata.resourceVersion`` filled) every ``bookmark_interval_s`` when asked for; the stream
  ends after ``timeoutSeconds``. No ``resourceVersion`` (or ``0``): synthetic ``ADDED`` events for
  what exists now, then changes.
* History is kept until :meth:`FakeKubeApi.compact`. A watch from a resourceVersion older than
  the compaction is "410 Gone": by default as the API server sends it, HTTP 200 and one ``ERROR``
  event whose object is a ``Status`` with ``code: 410, reason: Expired``; with
  ``gone_as = "http"`` as an HTTP 410 answer carrying that ``Status``.
* Auth: ``Authorization: Bearer TOKEN`` (401 ``Status`` otherwise). :meth:`kubeconfig` writes a
  kubeconfig (JSON, which is YAML) naming this server, the token and a context.

Use ``FakeKubeApi().start()`` (``.url``, ``.stop()``); ``pod``, ``node``, ``workload`` and
``local_queue`` build objects of the real shapes.
"""
from __future__ import annotations

import copy
import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from broker_sandbox.loopback import LoopbackServer

KUEUE = "kueue.x-k8s.io/v1beta1"
# kind -> (API prefix, namespaced, list kind, item kind, apiVersion)
KINDS = {
    "pods": ("/api/v1", True, "PodList", "Pod", "v1"),
    "nodes": ("/api/v1", False, "NodeList", "Node", "v1"),
    "workloads": (f"/apis/{KUEUE}", True, "WorkloadList", "Workload", KUEUE),
    "localqueues": (f"/apis/{KUEUE}", True, "LocalQueueList", "LocalQueue", KUEUE),
}
TOKEN = "fake-kube-token"


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubeApi(LoopbackServer):
    thread_name = "fake-kube"

    def __init__(self, *, token: str = TOKEN, bookmark_interval_s: float = 0.2,
                 max_watch_s: float = 30.0, gone_as: str = "event") -> None:
        self.token = token
        self.bookmark_interval_s = bookmark_interval_s
        self.max_watch_s = max_watch_s
        self.gone_as = gone_as
        self._cv = threading.Condition()
        self._rv = 100
        self._objects: dict[str, dict[tuple[str, str], dict]] = {k: {} for k in KINDS}
        self._history: dict[str, list[tuple[int, str, dict]]] = {k: [] for k in KINDS}
        self._floor = 0  # events at or below this resourceVersion are compacted away
        self._stopping = False
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query) of every request

    # -- the store -------------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        with self._cv:
            return self._rv

    def put(self, kind: str, obj: dict) -> dict:
        """Create or replace an object (ADDED or MODIFIED); returns the stored copy."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "") if KINDS[kind][1] else ""
        key = (ns, meta["name"])
        with self._cv:
            self._rv += 1
            old = self._objects[kind].get(key)
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"] if old else iso(time.time()))
            meta["resourceVersion"] = str(self._rv)
            obj.setdefault("kind", KINDS[kind][3])
            obj.setdefault("apiVersion", KINDS[kind][4])
            self._objects[kind][key] = obj
            self._history[kind].append((self._rv, "MODIFIED" if old else "ADDED", obj))
            self._cv.notify_all()
        return copy.deepcopy(obj)

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        with self._cv:
            obj = self._objects[kind].pop((namespace if KINDS[kind][1] else "", name))
            self._rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._history[kind].append((self._rv, "DELETED", obj))
            self._cv.notify_all()

    def compact(self) -> int:
        """Forget every change so far (etcd compaction): a watch from an older resourceVersion
        gets 410 Gone. Returns the resourceVersion compacted to."""
        with self._cv:
            self._floor = self._rv
            for h in self._history.values():
                h.clear()
            return self._rv

    def objects(self, kind: str) -> list[dict]:
        with self._cv:
            return copy.deepcopy(list(self._objects[kind].values()))

    def watch_requests(self, kind: str) -> list[dict[str, str]]:
        return [q for p, q in list(self.requests) if p.endswith("/" + kind) and _true(q.get("watch"))]

    # -- serving ---------------------------------------------------------------------------------
    def handler(self) -> type[_Handler]:
        return type("KubeApiHandler", (_Handler,), {"fake": self})

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        super().stop()

    def kubeconfig(self, path: Path, *, context: str = "fake", token: str | None = None) -> Path:
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "fake-cluster", "cluster": {"server": self.url}}],
            "users": [{"name": "fake-user", "user": {"token": self.token if token is None else token}}],
            "contexts": [{"name": context, "context": {"cluster": "fake-cluster", "user": "fake-user"}}],
        }
        Path(path).write_text(json.dumps(doc, indent=1))
        return Path(path)

    # -- what the handler asks -------------------------------------------------------------------
    def list_doc(self, kind: str, namespace: str | None, selector: str) -> dict:
        with self._cv:
            items = [copy.deepcopy(o) for (ns, _), o in sorted(self._objects[kind].items())
                     if (namespace is None or ns == namespace) and _selected(o, selector)]
            rv = self._rv
        for o in items:  # list items carry no kind/apiVersion of their own
            o.pop("kind", None)
            o.pop("apiVersion", None)
        return {"kind": KINDS[kind][2], "apiVersion": KINDS[kind][4],
                "metadata": {"resourceVersion": str(rv)}, "items": items}

    def too_old(self, rv: int) -> dict | None:
        with self._cv:
            if rv < self._floor:
                return _status(410, "Expired", f"too old resource version: {rv} ({self._floor})")
        return None

    def events(self, kind: str, namespace: str | None, selector: str, since: int | None,
               bookmarks: bool, timeout_s: float) -> Iterator[dict]:
        """Watch events after ``since`` (None: ADDED for what exists), until ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        mine = (lambda o: (namespace is None or o["metadata"].get("namespace", "") == namespace)
                and _selected(o, selector))
        with self._cv:
            if since is None:
                since = self._rv
                pending = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in self._objects[kind].values()
                           if mine(o)]
            else:
                pending = []
        yield from pending
        next_bookmark = time.monotonic() + self.bookmark_interval_s
        while True:
            with self._cv:
                while True:
                    new = [(rv, t, o) for rv, t, o in self._history[kind] if rv > since]
                    now = time.monotonic()
                    if new or self._stopping or now >= deadline or (bookmarks and now >= next_bookmark):
                        break
                    self._cv.wait(min(deadline, next_bookmark if bookmarks else deadline) - now)
                current = self._rv
            if self._stopping:
                return
            for rv, t, o in new:
                since = rv
                if mine(o):
                    yield {"type": t, "object": copy.deepcopy(o)}
                elif t == "MODIFIED" and (namespace is None or o["metadata"].get("namespace", "") == namespace):
                    # no longer selected (a pod that finished, under status.phase!=...): the API
                    # server says DELETED
                    yield {"type": "DELETED", "object": copy.deepcopy(o)}
            if time.monotonic() >= deadline:
                return
            if bookmarks and time.monotonic() >= next_bookmark:
                since = max(since, current)
                yield {"type": "BOOKMARK", "object": {"kind": KINDS[kind][3], "apiVersion": KINDS[kind][4],
                                                      "metadata": {"resourceVersion": str(since)}}}
                next_bookmark = time.monotonic() + self.bookmark_interval_s


def _true(raw: str | None) -> bool:
    """A boolean query parameter as the API server reads it (Go's strconv.ParseBool)."""
    return (raw or "") in ("1", "t", "T", "TRUE", "true", "True")


def _selected(obj: dict, selector: str) -> bool:
    """A field selector (``a=b,c!=d``) over the fields the API server indexes for pods."""
    for term in filter(None, (selector or "").split(",")):
        neg = "!=" in term
        key, _, want = term.partition("!=" if neg else ("==" if "==" in term else "="))
        node: Any = obj
        for part in key.strip().split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if ((node or "") == want.strip()) == neg:
            return False
    return True


_SELECTABLE = {"status.phase", "spec.nodeName", "metadata.namespace", "metadata.name"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeKubeApi

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send_json(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self, path: str) -> tuple[str, str | None] | None:
        """(kind, namespace or None) for a collection path, else None."""
        for kind, (prefix, namespaced, *_rest) in KINDS.items():
            if path == f"{prefix}/{kind}":
                return kind, None
            head, _, tail = path.partition(f"{prefix}/namespaces/")
            if namespaced and not head and tail.count("/") == 1 and tail.endswith("/" + kind):
                return kind, tail.split("/")[0]
        return None

    def do_GET(self) -> None:
        u = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        self.fake.requests.append((u.path, q))
        if self.headers.get("Authorization") != f"Bearer {self.fake.token}":
            return self._send_json(401, _status(401, "Unauthorized", "Unauthorized"))
        route = self._route(u.path)
        if route is None:
            return self._send_json(404, _status(404, "NotFound", "the server could not find the requested resource"))
        kind, ns = route
        selector = q.get("fieldSelector", "")
        bad = [t for t in filter(None, selector.split(",")) if t.replace("!", "=").split("=")[0] not in _SELECTABLE]
        if bad or (selector and kind != "pods"):
            return self._send_json(400, _status(400, "BadRequest",
                                                f'"{(bad or [selector])[0]}" is not a known field selector'))
        if not _true(q.get("watch")):
            return self._send_json(200, self.fake.list_doc(kind, ns, selector))
        self._watch(kind, ns, selector, q)

    def _watch(self, kind: str, ns: str | None, selector: str, q: dict[str, str]) -> None:
        raw = q.get("resourceVersion", "")
        try:
            since = int(raw) if raw not in ("", "0") else None
        except ValueError:
            return self._send_json(400, _status(400, "BadRequest", f"invalid resourceVersion {raw!r}"))
        gone = self.fake.too_old(since) if since is not None else None
        if gone is not None and self.fake.gone_as == "http":
            return self._send_json(410, gone)
        timeout_s = min(float(q.get("timeoutSeconds") or self.fake.max_watch_s), self.fake.max_watch_s)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = iter([{"type": "ERROR", "object": gone}]) if gone is not None else self.fake.events(
            kind, ns, selector, since, _true(q.get("allowWatchBookmarks")), timeout_s)
        try:
            for ev in events:
                line = json.dumps(ev).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


# ---------------------------------------------------------------------------------------------
# objects of the real shapes
def _resources(gpus: int, resource: str) -> dict:
    return {"requests": {"cpu": "1", resource: str(gpus)}, "limits": {resource: str(gpus)}} if gpus else \
        {"requests": {"cpu": "1"}}


def pod(name: str, namespace: str = "default", *, gpus: int = 1, phase: str = "Pending", node: str = "",
        created: float | None = None, reason: str = "Unschedulable", message: str = "",
        priority_class: str = "", priority: int | None = None, labels: dict | None = None,
        gates: tuple[str, ...] = (), resource: str = "nvidia.com/gpu", node_selector: dict | None = None) -> dict:
    """A pod; a Pending one with no node carries ``PodScheduled=False`` (``reason``/``message``)."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "trainer:1",
                                            "resources": _resources(gpus, resource)}],
                            "schedulerName": "default-scheduler"}
    if node:
        spec["nodeName"] = node
    if priority_class:
        spec["priorityClassName"] = priority_class
    if priority is not None:
        spec["priority"] = priority
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if node_selector:
        spec["nodeSelector"] = node_selector
    status: dict[str, Any] = {"phase": phase}
    if phase == "Pending" and not node:
        if gates:
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                                     "message": "Scheduling is blocked due to non-empty scheduling gates"}]
        elif reason:
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": reason,
                                     "message": message or f"0/4 nodes are available: 4 Insufficient {resource}. "
                                                "preemption: 0/4 nodes are available: 4 No preemption victims "
                                                "found for incoming pod."}]
    elif phase == "Running":
        status["startTime"] = iso(created or time.time())
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if created is not None:
        meta["creationTimestamp"] = iso(created)
    return {"metadata": meta, "spec": spec, "status": status}


def node(name: str, *, gpus: int = 8, product: str = "NVIDIA-A100-SXM4-80GB", ready: bool = True,
         unschedulable: bool = False, labels: dict | None = None, ready_message: str = "",
         resource: str = "nvidia.com/gpu") -> dict:
    lab = {"kubernetes.io/hostname": name, **({"nvidia.com/gpu.product": product} if product else {}),
           **(labels or {})}
    res = {"cpu": "96", "memory": "1031591944Ki", "pods": "110", **({resource: str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
        spec["taints"] = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
    cond = {"type": "Ready", "status": "True" if ready else "Unknown",
            "reason": "KubeletReady" if ready else "NodeStatusUnknown",
            "message": ready_message or ("kubelet is posting ready status" if ready
                                         else "Kubelet stopped posting node status.")}
    return {"metadata": {"name": name, "labels": lab}, "spec": spec,
            "status": {"capacity": dict(res), "allocatable": res, "conditions": [cond]}}


def workload(name: str, namespace: str = "default", *, queue: str = "team-a", gpus_per_pod: int = 1,
             count: int = 1, created: float | None = None, priority_class: str = "", priority: int | None = None,
             quota_reserved: bool = False, admitted: bool = False, cluster_queue: str = "",
             message: str = "", reason: str = "Pending", active: bool = True,
             resource: str = "nvidia.com/gpu") -> dict:
    """A Kueue Workload of one pod set; not admitted: ``QuotaReserved=False`` with ``reason``
    (``Pending`` / ``Inadmissible``) and ``message`` (default: Kueue's insufficient-quota text)."""
    spec: dict[str, Any] = {"queueName": queue, "active": active, "podSets": [{
        "name": "main", "count": count,
        "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "trainer:1", "resources": _resources(gpus_per_pod, resource)}]}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
        spec["priorityClassSource"] = "scheduling.k8s.io/priorityclass"
    if priority is not None:
        spec["priority"] = priority
    t = iso(created or time.time())
    conds = [{"type": "QuotaReserved", "status": "True" if quota_reserved else "False",
              "reason": "QuotaReserved" if quota_reserved else reason, "lastTransitionTime": t,
              "message": message or (f"Quota reserved in ClusterQueue {cluster_queue}" if quota_reserved else
                                     f"couldn't assign flavors to pod set main: insufficient unused quota for "
                                     f"{resource} in flavor default-flavor, {gpus_per_pod * count} more needed")}]
    if admitted:
        conds.append({"type": "Admitted", "status": "True", "reason": "Admitted", "lastTransitionTime": t,
                      "message": "The workload is admitted"})
    status: dict[str, Any] = {"conditions": conds}
    if quota_reserved:
        status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": [
            {"name": "main", "count": count, "flavors": {resource: "default-flavor"},
             "resourceUsage": {resource: str(gpus_per_pod * count)}}]}
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {"kueue.x-k8s.io/queue-name": queue}}
    if created is not None:
        meta["creationTimestamp"] = iso(created)
    return {"metadata": meta, "spec": spec, "status": status}


def local_queue(name: str, namespace: str, cluster_queue: str) -> dict:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cluster_queue},
            "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Ready",
                                       "message": "Can submit new workloads to localQueue"}]}}
