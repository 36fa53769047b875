"""The registry of scheduler kinds: which schedulers the broker can watch, each with its
settings table and the function that builds its watcher.

Each kind registers itself from its own package (``broker/<name>/kind.py`` holds ``KIND``) and
is listed once, in :data:`KIND_MODULES`; the configuration schema (:mod:`broker.config`) gets
one top-level table per kind (``[slurm]``), and the service builds the watcher of every kind
whose table says ``enabled = true`` (:func:`build_watchers`). How to add a scheduler:
:mod:`broker.watchers.base`.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable, Mapping

from broker.watchers.base import SchedulerWatcher

#: The modules that define a ``KIND``, one per scheduler, in the order the watchers are read.
KIND_MODULES: tuple[str, ...] = (
    "broker.slurm.kind",
    "broker.kubernetes.kind",
)

_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class SchedulerKind:
    """One scheduler the broker can watch.

    ``name`` is its configuration table (``[slurm]``); ``settings`` that table's schema, a
    :class:`providers.settings.Table` with an ``enabled`` flag; ``build`` makes the watcher
    from enabled settings (import the scheduler's client inside it, not at module level)."""

    name: str
    settings: type
    build: Callable[[Any], SchedulerWatcher]
    summary: str = ""
    #: (its settings, the whole configuration) -> None, for an enabled kind: checks that span
    #: tables; raises ValueError("KEY sentence") with KEY in the kind's own table.
    check: Callable[[Any, Any], None] | None = None

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"scheduler kind name {self.name!r} must be a lower-case TOML key")
        fields = getattr(self.settings, "__struct_fields__", ())
        if "enabled" not in fields:
            raise ValueError(f"scheduler kind {self.name}: its settings {self.settings.__name__} "
                             "need an `enabled` key")


@cache
def kinds() -> tuple[SchedulerKind, ...]:
    """Every registered kind, in :data:`KIND_MODULES` order (names are unique)."""
    out: list[SchedulerKind] = []
    for module in KIND_MODULES:
        kind = importlib.import_module(module).KIND
        if not isinstance(kind, SchedulerKind):
            raise TypeError(f"{module}.KIND is not a SchedulerKind")
        if any(k.name == kind.name for k in out):
            raise ValueError(f"scheduler kind {kind.name!r} is registered twice ({module})")
        out.append(kind)
    return tuple(out)


def kind(name: str) -> SchedulerKind:
    """The registered kind called ``name`` (KeyError naming the known ones otherwise)."""
    for k in kinds():
        if k.name == name:
            return k
    raise KeyError(f"no scheduler kind {name!r} (known: {', '.join(k.name for k in kinds())})")


def enabled_settings(config: Any) -> dict[str, Any]:
    """kind name -> its settings table, for every kind whose table says ``enabled = true``."""
    return {k.name: s for k in kinds() if (s := getattr(config, k.name)).enabled}


def build_watchers(config: Any) -> dict[str, SchedulerWatcher]:
    """source -> watcher, for every enabled kind (none run anything until asked)."""
    out: dict[str, SchedulerWatcher] = {}
    for name, settings in enabled_settings(config).items():
        w = kind(name).build(settings)
        if not isinstance(w, SchedulerWatcher):
            raise TypeError(f"scheduler kind {name}: build returned {type(w).__name__}, not a watcher")
        if w.source in out:
            raise ValueError(f"two schedulers report as source {w.source!r}; give them distinct names")
        out[w.source] = w
    return out


def check(config: Any) -> None:
    """Every enabled kind's cross-table check; ValueError("<kind>.KEY sentence")."""
    for name, settings in enabled_settings(config).items():
        k = kind(name)
        if k.check is not None:
            try:
                k.check(settings, config)
            except ValueError as e:
                raise ValueError(f"{name}.{e}") from None


def stop_watchers(watchers: Mapping[str, Any]) -> None:
    """Stop every watcher that runs threads of its own (:class:`~broker.watchers.base.Stoppable`)."""
    from broker.watchers.base import Stoppable

    for w in watchers.values():
        if isinstance(w, Stoppable):
            w.stop()


def settings_struct(module: str = __name__) -> type:
    """A settings table holding one top-level table per kind (``[slurm]``, ...), defaults
    included: the base of the configuration's schema (:class:`broker.config.Config`)."""
    import msgspec

    from providers.settings import Table

    fields = [(k.name, k.settings, msgspec.field(default_factory=k.settings)) for k in kinds()]
    return msgspec.defstruct("SchedulerTables", fields, bases=(Table,), kw_only=True,
                             forbid_unknown_fields=True, module=module)


def settings_of(config: Any) -> Mapping[str, Any]:
    """kind name -> its settings table (enabled or not)."""
    return {k.name: getattr(config, k.name) for k in kinds()}
