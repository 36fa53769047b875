"""What one cloud tells the broker about itself: :class:`CloudRegistration`.

A cloud's package (``providers/<cloud>/__init__.py``) builds one record; :mod:`providers.registry`
lists them, and every list of clouds, the settings schema, each dispatch and the catalog's
tables derive from that list. This module imports no cloud and no SDK: a record names the heavy
parts (the provider class, the market source, the sandbox's fake) by import path, loaded only
when used, so ``broker quote`` and ``broker serve``'s start-up never load a cloud SDK.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Callable

from providers.settings import Table

_NAME = re.compile(r"[a-z][a-z0-9]{1,15}\Z")
_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")


@dataclass(frozen=True, slots=True)
class BootHooks:
    """What a cloud's node does at boot on its own (shell, in :mod:`providers.bootstrap`'s script).

    ``whoami``: sets ``BROKER_NODE_NAME`` to this node's name from the cloud's metadata, so the
    nodes of a multi-node lease, which share one script, tell themselves apart ("": a lease of
    more than one node on this cloud is refused at boot-script time).
    ``notice_watch``: defines ``broker_watch_notices()``, which polls the metadata service at
    ``$notice_md`` (``metadata_url`` unless the template's ``notice_metadata_url`` says otherwise)
    and calls ``broker_notice KIND SOURCE`` once ("": the broker reads this cloud's interruption
    notices itself)."""

    whoami: str = ""
    metadata_url: str = ""
    notice_watch: str = ""
    # ``fabric_env``: (fabric, shell) pairs: the NCCL / libfabric environment a node of a multi-node
    # gang exports for the fabric its launch wired (a :class:`providers.base.Fabric` value); the
    # shell sets ``broker_fabric_vars`` to the names it exported (the container template passes
    # them on).
    fabric_env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.notice_watch and not self.metadata_url:
            raise RegistrationError("a boot notice watch needs the metadata service's URL")


class RegistrationError(ValueError):
    """A registration lacks a part or names one wrongly (one sentence naming the cloud and part)."""


@dataclass(frozen=True, slots=True)
class CloudRegistration:
    """One cloud, every part the broker needs of it.

    ``name``: the cloud's name everywhere: the ``[providers.NAME]`` table, the ``provider``
    column of the catalog's CSV files and ``network.toml``'s ``[NAME]`` terms, lease records,
    metrics, ``--providers``.
    ``provider``: ``"module:Class"`` of the :class:`providers.base.Provider`, built by its
    ``from_config(settings, owner=...)``.
    ``settings``: the ``[providers.NAME]`` schema, a :class:`providers.settings.Table` with an
    ``enabled`` key (false by default) and ``regions`` (the regions quotes may use; empty: any).
    ``market``: ``"module:OBJECT"`` of its :class:`providers.market.MarketSource`: price list,
    spot history, placement scores, zones, quotas and reservations, each as far as the cloud has it.
    ``node_name_problem``: the cloud's rule for the node names a client may give: why it would
    refuse a name ("" when it takes it).
    ``sdk_modules``: the module roots of the cloud's SDK (``"boto3"``); only the modules of
    ``provider`` and ``market`` may import them at module level (``()`` when it speaks plain HTTP).
    ``sandbox``: ``"module:function"`` that starts the cloud's fakes for ``broker sandbox`` and the
    tests (a :class:`broker_sandbox.SandboxCloud`).
    ``title``: how sentences name it ("AWS").
    ``boot``: what its node does at boot on its own (:class:`BootHooks`).
    """

    name: str
    title: str
    provider: str
    settings: type[Table]
    market: str
    node_name_problem: Callable[[str], str]
    sdk_modules: tuple[str, ...]
    sandbox: str
    boot: BootHooks = BootHooks()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise RegistrationError(f"a cloud's name must be 2-16 lowercase letters and digits, got {self.name!r}")
        for part in ("provider", "market", "sandbox"):
            if not _PATH.match(getattr(self, part) or ""):
                raise RegistrationError(f"cloud {self.name}: {part} must be an import path 'module:name', "
                                        f"got {getattr(self, part)!r}")
        if not (isinstance(self.settings, type) and issubclass(self.settings, Table)):
            raise RegistrationError(f"cloud {self.name}: settings must be a providers.settings.Table schema")
        keys = self.settings.__struct_fields__
        if "enabled" not in keys or "regions" not in keys or self.settings().enabled is not False:
            raise RegistrationError(f"cloud {self.name}: its settings need an `enabled` key, false by default, "
                                    "and a `regions` list (the regions quotes may use)")
        if not callable(self.node_name_problem):
            raise RegistrationError(f"cloud {self.name}: node_name_problem must be a function of a name")
        if not isinstance(self.boot, BootHooks):
            raise RegistrationError(f"cloud {self.name}: boot must be a BootHooks")
        if not self.title or any(not m or not isinstance(m, str) for m in self.sdk_modules):
            raise RegistrationError(f"cloud {self.name}: title and each SDK module name must be non-empty")

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules that may import the SDK at module level: the provider's package and the
        market source's module."""
        package = self.provider.split(":")[0].rsplit(".", 1)[0]
        return (package, self.market.split(":")[0])

    def load(self, part: str) -> Any:
        """The object ``part`` ("provider", "market", "sandbox") names, imported now."""
        module, attr = getattr(self, part).split(":")
        return getattr(importlib.import_module(module), attr)
