"""The clouds the broker knows: one :class:`providers.registration.CloudRegistration` each, in
:data:`REGISTRY`, and everything that derives from that list: the ``[providers]`` settings
table, the names (``--providers``, the catalog's clouds, reservations), building a provider,
its market source and its node-name rule. A name no registration carries is an error here
(:class:`UnknownCloud`), never a fall-through to some other cloud.

Reading the registry imports no cloud SDK: a registration names its provider class and market
source by import path, and :func:`build` / :func:`market_source` import them when first used.
"""
from __future__ import annotations

from typing import Any, Mapping

import msgspec

from providers import aws, azure, gcp, lambda_cloud
from providers.base import Provider
from providers.registration import CloudRegistration
from providers.settings import SettingsError, Table, provider_table

#: Every cloud, in the order the broker lists them. Adding a cloud is one line here.
REGISTRY: tuple[CloudRegistration, ...] = (
    aws.REGISTRATION,
    gcp.REGISTRATION,
    azure.REGISTRATION,
    lambda_cloud.REGISTRATION,
)


class UnknownCloud(SettingsError):
    """A name that no registration carries (a ValueError; one sentence naming the known ones)."""


def names() -> tuple[str, ...]:
    """The registered clouds' names, in registry order."""
    return tuple(r.name for r in REGISTRY)


def choices(last: str = "or") -> str:
    """The names as a sentence's list: ``"aws, gcp or azure"``."""
    n = names()
    return f"{', '.join(n[:-1])} {last} {n[-1]}" if len(n) > 1 else n[0]


def get(name: str) -> CloudRegistration:
    """The registration of ``name``, or :class:`UnknownCloud`."""
    for r in REGISTRY:
        if r.name == name:
            return r
    raise UnknownCloud(f"{name!r} is not a known cloud (known: {', '.join(names())})", "provider")


# ---------------------------------------------------------------------------------------------
# settings


class _Providers(Table):
    def enabled(self) -> dict[str, Table]:
        """Name → settings of every enabled provider."""
        return {n: s for n in self.__struct_fields__ if (s := getattr(self, n)).enabled}


#: ``[providers]``: one table per registered cloud, each disabled unless it says ``enabled = true``.
ProvidersSettings: type[_Providers] = msgspec.defstruct(
    "ProvidersSettings", [(r.name, r.settings, msgspec.field(default_factory=r.settings)) for r in REGISTRY],
    bases=(_Providers,), module=__name__, kw_only=True, forbid_unknown_fields=True)
ProvidersSettings.__doc__ = "``[providers]``: one table per registered cloud, each disabled unless it says ``enabled = true``."


def provider_settings(name: str, raw: Any) -> Table:
    """The typed settings of cloud ``name`` from a raw ``[providers.NAME]`` table (``enabled``
    defaults to true: a table handed to a provider is one it is built from)."""
    return provider_table(get(name).settings, name, raw)


def configured(providers: Any, name: str) -> bool:
    """Whether ``[providers.NAME]`` says anything (a table left at its defaults does not)."""
    reg = get(name)
    return getattr(providers, name) != reg.settings()


# ---------------------------------------------------------------------------------------------
# dispatch


def build(name: str, settings: Table | Mapping[str, Any], owner: str) -> Provider:
    """The provider ``name`` from its settings (typed, or a raw ``[providers.NAME]`` table).

    Raises ValueError (a :class:`providers.settings.SettingsError` for the schema's findings)
    when the cloud is unknown, or the settings or the credentials they name are unusable."""
    if name not in names():
        raise ValueError(f"providers.{name} is not a known provider ({', '.join(names())})")
    reg = get(name)
    return reg.load("provider").from_config(provider_table(reg.settings, name, settings), owner=owner)


def build_enabled(tables: Any, owner: str) -> dict[str, Provider]:
    """Every provider whose settings say ``enabled = true`` (typed ``[providers]``, or raw tables)."""
    if isinstance(tables, _Providers):
        return {n: build(n, s, owner) for n, s in tables.enabled().items()}
    return {n: build(n, t, owner) for n, t in tables.items() if t.get("enabled", False)}


def market_source(name: str) -> Any:
    """Cloud ``name``'s :class:`providers.market.MarketSource` (imports its SDK)."""
    return get(name).load("market")


def node_name_problem(provider: str, name: str) -> str:
    """Why cloud ``provider`` would refuse ``name`` as a node's name ("" when it takes it)."""
    return get(provider).node_name_problem(name)
