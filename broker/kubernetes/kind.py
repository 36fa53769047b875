"""Kubernetes/Kueue as a scheduler kind: the ``[kubernetes]`` table and its watcher
(broker.watchers.registry)."""
from __future__ import annotations

from broker.kubernetes.settings import KubernetesSettings
from broker.watchers.base import SchedulerWatcher
from broker.watchers.registry import SchedulerKind


def build(settings: KubernetesSettings) -> SchedulerWatcher:
    """The Kubernetes watcher (list-then-watch starts at its first snapshot); joins burst nodes."""
    from broker.kubernetes.watcher import KubernetesWatcher

    return KubernetesWatcher.from_settings(settings)


KIND = SchedulerKind(name="kubernetes", settings=KubernetesSettings, build=build,
                     summary="Kubernetes pods and Kueue Workloads by list-then-watch; burst nodes join with kubeadm")
