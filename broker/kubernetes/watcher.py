"""The Kubernetes/Kueue watcher of ``broker serve``: pods, nodes, Kueue Workloads and
LocalQueues kept by list-then-watch (:mod:`broker.kubernetes.informer`), read into the one
queue model on each tick (:mod:`broker.kubernetes.objects`), so the same diagnosis and decisions
apply as to Slurm.

A burst for this source is the broker's own launch (Kubernetes has no power-saving hand-off):
the autoscaler launches a lease per chosen job with the boot template ``bootstrap``
(``kubernetes``: ``kubeadm join`` with ``[bootstrap.kubernetes]``'s API server, token and CA hash,
the node labelled ``broker.io/lease``). The new node joins, kube-scheduler places the pending pod
on it, and the watcher sees it as a ``cloud`` node, never as on-prem capacity.

The ``kubernetes`` client is imported when the watcher first connects, so ``broker serve``
without ``[kubernetes] enabled`` never loads it.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from broker.kubernetes.informer import Informer
from broker.kubernetes.objects import Scope, queue_records
from broker.kubernetes.settings import KubernetesSettings
from broker.watchers.base import JoinSpec
from policies.queue import PendingJob, QueueSnapshot

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
# pods that can no longer hold GPUs are not worth sending
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class KubernetesUnavailable(RuntimeError):
    """The API server could not be read (the autoscaler logs it and tries again next tick)."""


def api_client(s: KubernetesSettings) -> Any:
    """An ApiClient from the kubeconfig (``kubeconfig``, else $KUBECONFIG or ~/.kube/config), or
    the pod's service account when there is none and the process runs in a cluster."""
    from kubernetes import client, config

    cfg = client.Configuration()
    path = s.kubeconfig or os.environ.get("KUBECONFIG", "") or os.path.expanduser("~/.kube/config")
    if not s.kubeconfig and not os.path.exists(path.split(os.pathsep)[0]) and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        try:
            config.load_kube_config(config_file=path, context=s.context or None, client_configuration=cfg,
                                    persist_config=False)
        except (config.ConfigException, OSError) as e:
            raise KubernetesUnavailable(f"kubeconfig {path}: {e}") from None
    return client.ApiClient(cfg)


class KubernetesWatcher:
    """Keeps the cluster's pods, nodes, Workloads and LocalQueues; :meth:`snapshot` reads them.
    A scheduler watcher (:mod:`broker.watchers.base`) with one capability, ``JoinNodes``: the
    leases launched for its jobs boot with ``bootstrap``."""

    def __init__(self, settings: KubernetesSettings, client_factory: Callable[[KubernetesSettings], Any] = api_client
                 ) -> None:
        self.settings = settings
        self.source = settings.source
        self.bootstrap = settings.bootstrap
        self.scope = Scope(gpu_resource=settings.gpu_resource, gpu_model_label=settings.gpu_model_label)
        self._client_factory = client_factory
        self.informers: dict[str, list[Informer]] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: KubernetesSettings) -> KubernetesWatcher:
        return cls(settings)

    def join_spec(self, job: PendingJob) -> JoinSpec:
        """A burst node boots with the kubeadm template (``bootstrap``), labelled with its lease."""
        return JoinSpec(bootstrap=self.bootstrap)

    # -- the collections -------------------------------------------------------------------------
    def build_informers(self) -> dict[str, list[Informer]]:
        from kubernetes import client

        s = self.settings
        api = self._client_factory(s)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        calls: dict[str, list[Callable[..., Any]]] = {
            "nodes": [core.list_node],
            "pods": ([functools.partial(core.list_namespaced_pod, ns, field_selector=ACTIVE_PODS)
                      for ns in s.namespaces]
                     or [functools.partial(core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS)]),
        }
        if s.kueue:
            for plural in ("workloads", "localqueues"):
                calls[plural] = ([functools.partial(custom.list_namespaced_custom_object, KUEUE_GROUP,
                                                    KUEUE_VERSION, ns, plural) for ns in s.namespaces]
                                 or [functools.partial(custom.list_cluster_custom_object, KUEUE_GROUP,
                                                       KUEUE_VERSION, plural)])
        return {kind: [Informer(kind, c, watch_timeout_s=int(s.watch_timeout_s),
                                request_timeout_s=s.request_timeout_s) for c in cs]
                for kind, cs in calls.items()}

    def start(self) -> None:
        """Start one watch thread per collection (once)."""
        with self._lock:
            if self.informers:
                return
            self.informers = self.build_informers()
            for kind, infs in self.informers.items():
                for i, inf in enumerate(infs):
                    t = threading.Thread(target=inf.run, name=f"k8s-{kind}-{i}", daemon=True)
                    t.start()
                    self._threads.append(t)

    def stop(self, timeout_s: float = 5.0) -> None:
        for infs in self.informers.values():
            for inf in infs:
                inf.stop()
        for t in self._threads:
            t.join(timeout_s)

    def _items(self, kind: str) -> list[dict]:
        return [o for inf in self.informers.get(kind, ()) for o in inf.items()]

    # -- the snapshot ----------------------------------------------------------------------------
    def snapshot(self, now: float | None = None) -> QueueSnapshot:
        """The cluster's queue as the watch caches hold it now. The first call starts the
        watches and waits up to ``sync_timeout_s`` for their first lists."""
        self.start()
        deadline = time.monotonic() + self.settings.sync_timeout_s
        for kind, infs in self.informers.items():
            for inf in infs:
                if not inf.synced.wait(max(0.0, deadline - time.monotonic())):
                    why = inf.last_error or "no answer yet"
                    raise KubernetesUnavailable(f"{self.source}: {kind} not listed within "
                                                f"{self.settings.sync_timeout_s:g} s ({why})")
        now = time.time() if now is None else now
        pending, nodes, running = queue_records(self._items("pods"), self._items("nodes"), self._items("workloads"),
                                                self._items("localqueues"), now, self.scope)
        extra = {"resource_versions": {k: [i.resource_version for i in infs] for k, infs in self.informers.items()},
                 "relists": sum(i.relists for infs in self.informers.values() for i in infs)}
        return QueueSnapshot(source=self.source, taken_at=now, pending=tuple(pending), nodes=tuple(nodes),
                             running=tuple(running), extra=extra)
