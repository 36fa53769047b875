"""``[bootstrap]``: the boot templates' settings (part of the one settings schema in
:mod:`broker.config`)."""
from __future__ import annotations

from typing import Any, Union

import msgspec

from providers.settings import Table, bad

_Scalar = Union[str, int, float, bool, list[str]]


class SlurmBootSettings(Table):
    conf_server: str = ""
    munge_key: str = ""
    munge_key_path: str = ""
    slurmd_args: list[str] = []


class KubernetesBootSettings(Table):
    api_server: str = ""
    token: str = ""
    ca_cert_hash: str = ""
    node_labels: dict[str, str] = {}
    kubelet_defaults_path: str = ""


class ContainerBootSettings(Table):
    image: str = ""
    command: Union[str, list[str]] = ""
    callback_url: str = ""
    marker_path: str = ""
    workdir: str = ""
    notice_metadata_url: str = ""  # the node's metadata server for notices (default: the cloud's)


_BOOT_TABLES = {"slurm": SlurmBootSettings, "kubernetes": KubernetesBootSettings,
                "container": ContainerBootSettings}
_BOOT_KEYS = {k for t in _BOOT_TABLES.values() for k in t.__struct_fields__}


class BootstrapSettings(Table):
    """``[bootstrap]``: settings of the boot templates. Flat keys apply to every template, a
    table named like a built-in template wins for it; ``vars`` holds the variables of operator
    templates (``$name`` in a file from ``templates``)."""

    secret_keys: list[str] = []
    templates: dict[str, str] = {}
    vars: dict[str, _Scalar] = {}
    slurm: Union[SlurmBootSettings, None] = None
    kubernetes: Union[KubernetesBootSettings, None] = None
    container: Union[ContainerBootSettings, None] = None
    # the built-in templates' keys, flat
    conf_server: Union[str, None] = None
    munge_key: Union[str, None] = None
    munge_key_path: Union[str, None] = None
    slurmd_args: Union[list[str], None] = None
    api_server: Union[str, None] = None
    token: Union[str, None] = None
    ca_cert_hash: Union[str, None] = None
    node_labels: Union[dict[str, str], None] = None
    kubelet_defaults_path: Union[str, None] = None
    image: Union[str, None] = None
    command: Union[str, list[str], None] = None
    callback_url: Union[str, None] = None
    marker_path: Union[str, None] = None
    workdir: Union[str, None] = None

    def __post_init__(self) -> None:
        overlap = sorted(set(self.vars) & (set(self.__struct_fields__) | _BOOT_KEYS))
        if overlap:
            raise bad(f"vars.{overlap[0]}", "is a built-in setting: set it in [bootstrap] itself")
        import os
        import re

        for name, path in self.templates.items():  # a launch names one: say now, not at its launch
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
                raise bad("templates", f"names a template {name[:64]!r}; a name is letters, digits, '.', '_', '-'")
            if not os.path.isfile(path):
                raise bad(f"templates.{name}", f"is {path[:200]!r}, which is no readable file")

    @property
    def configured(self) -> bool:
        return self != BootstrapSettings()

    def template_settings(self) -> dict[str, Any]:
        """The flat mapping :func:`providers.bootstrap.render` reads: set keys and ``vars`` flat,
        each built-in template's table nested under its name (its set keys only)."""
        out: dict[str, Any] = {}
        for k in self.__struct_fields__:
            v = getattr(self, k)
            if k in ("templates", "vars") or v is None:
                continue
            out[k] = {n: x for n, x in msgspec.structs.asdict(v).items() if x not in ("", [], {})} \
                if isinstance(v, Table) else v
        out.update(self.vars)
        return out
