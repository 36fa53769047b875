"""Kubernetes/Kueue as a scheduler kind: the ``[kubernetes]`` table and its watcher
(broker.watchers.registry)."""
from __future__ import annotations

from typing import Any

from broker.kubernetes.settings import KubernetesSettings
from broker.watchers.base import SchedulerWatcher
from broker.watchers.registry import SchedulerKind


def build(settings: KubernetesSettings) -> SchedulerWatcher:
    """The Kubernetes watcher (list-then-watch starts at its first snapshot); joins burst nodes."""
    from broker.kubernetes.watcher import KubernetesWatcher

    return KubernetesWatcher.from_settings(settings)


def check(settings: KubernetesSettings, config: Any) -> None:
    """Burst nodes join with a boot template, which the server renders only from [bootstrap]."""
    if settings.bootstrap and not config.bootstrap.configured:
        raise ValueError(f"bootstrap names the boot template {settings.bootstrap!r}, but [bootstrap] is not "
                         "configured (burst nodes need [bootstrap.kubernetes] api_server, token and ca_cert_hash "
                         "to join); configure it, or set kubernetes.bootstrap = \"\"")


KIND = SchedulerKind(name="kubernetes", settings=KubernetesSettings, build=build, check=check,
                     summary="Kubernetes pods and Kueue Workloads by list-then-watch; burst nodes join with kubeadm")
