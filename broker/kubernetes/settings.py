"""The ``[kubernetes]`` section: the Kubernetes/Kueue watcher of ``broker serve``.

Configuration (every key optional)::

    [kubernetes]
    enabled = true                   # the autoscaler watches this cluster and bursts for it
    cluster = "prod"                 # source name "kubernetes:prod" in decisions and snapshots
    kubeconfig = ""                  # path ("" = $KUBECONFIG, else ~/.kube/config; in a pod
                                     # with neither, the service account)
    context = ""                     # kubeconfig context ("" = its current-context)
    namespaces = []                  # watch these namespaces only ([] = the whole cluster)
    kueue = true                     # also read Kueue Workloads and LocalQueues (v1beta1)
    gpu_resource = "nvidia.com/gpu"  # the extended resource pods request
    gpu_model_label = "nvidia.com/gpu.product"  # node label naming the GPU model
    watch_timeout_s = 60             # each watch call ends after this; the next resumes
    request_timeout_s = 30           # each list call
    sync_timeout_s = 30              # a snapshot waits this long for the first lists
    bootstrap = "kubernetes"         # boot template of the burst nodes: kubeadm join, labelled
                                     # broker.io/lease ([bootstrap.kubernetes] has its settings)
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from providers.settings import Seconds, SettingsError, Table, bad, convert

_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_RESOURCE = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9][-A-Za-z0-9_.]*")


class KubernetesSettings(Table):
    """``[kubernetes]``: see the module docstring."""

    enabled: bool = False
    cluster: str = "default"
    kubeconfig: str = ""
    context: str = ""
    namespaces: tuple[str, ...] = ()
    kueue: bool = True
    gpu_resource: str = "nvidia.com/gpu"
    gpu_model_label: str = "nvidia.com/gpu.product"
    watch_timeout_s: Seconds = 60.0
    request_timeout_s: Seconds = 30.0
    sync_timeout_s: Seconds = 30.0
    bootstrap: str = "kubernetes"

    def __post_init__(self) -> None:
        for k in ("cluster", "kubeconfig", "context", "gpu_resource", "gpu_model_label", "bootstrap"):
            setattr(self, k, getattr(self, k).strip())
        if not _NAME.fullmatch(self.cluster):
            raise bad("cluster", f"must be a name (letters, digits, '.', '_', '-'), got {self.cluster!r}")
        self.namespaces = tuple(dict.fromkeys(n.strip() for n in self.namespaces if n.strip()))
        for n in self.namespaces:
            if len(n) > 63 or not _DNS_LABEL.fullmatch(n):
                raise bad("namespaces", f"must hold namespace names (DNS labels), got {n!r}")
        if not _RESOURCE.fullmatch(self.gpu_resource):
            raise bad("gpu_resource", f"must be a resource name such as nvidia.com/gpu, got {self.gpu_resource!r}")
        if self.watch_timeout_s < 1:
            raise bad("watch_timeout_s", "must be at least 1 (the API server counts whole seconds)")

    @property
    def source(self) -> str:
        return f"kubernetes:{self.cluster}"


def settings_from_config(section: KubernetesSettings | Mapping[str, Any]) -> KubernetesSettings:
    """The typed ``[kubernetes]`` settings (a raw table is checked by the schema; ConfigError names the key)."""
    if isinstance(section, KubernetesSettings):
        return section
    from broker.errors import ConfigError

    try:
        return convert(dict(section), KubernetesSettings, "kubernetes")
    except SettingsError as e:
        raise ConfigError(f"config: {e}", field=e.key) from None
