"""The clouds the broker knows: one :class:`providers.registration.CloudRegistration` each, in
:data:`REGISTRY`, and everything that derives from that list: the ``[providers]`` settings
table, the names (``--providers``, the catalog's clouds, reservations), building a provider,
its market source and its node-name rule. A name no registration carries is an error here
(:class:`UnknownCloud`), never a fall-through to some other cloud.

Reading the registry imports no cloud SDK: a registration names its provider class and market
source by import path, and :func:`build` / :func:`market_source` import them when first used.
"""
from __future__ import annotations

import threading
from typing import Any, Mapping

import msgspec

from providers import aws, azure, gcp, lambda_cloud
from providers.base import AuthError, Provider
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


def build_enabled(tables: Any, owner: str, *, lazy: bool = False) -> dict[str, Provider]:
    """Every provider whose settings say ``enabled = true`` (typed ``[providers]``, or raw tables).
    ``lazy``: each a :class:`LazyProvider`, its SDK imported on first use (or :meth:`LazyProvider.build`)."""
    enabled = (tables.enabled() if isinstance(tables, _Providers) else
               {n: t for n, t in tables.items() if t.get("enabled", False)})
    if lazy:
        for n in enabled:
            get(n)  # an unknown cloud is still refused at once
        return {n: LazyProvider(n, s, owner) for n, s in enabled.items()}  # type: ignore[misc]
    return {n: build(n, s, owner) for n, s in enabled.items()}


class LazyProvider:
    """Cloud ``name``'s provider, built (its SDK imported, its clients made) when first used.

    `broker serve` with AWS, GCP and Azure enabled spends ~3 s of CPU importing their SDKs
    (``google.cloud.compute_v1`` most of it): built lazily, the service answers on the bundled
    prices first and builds them behind it (:meth:`build`, from a background thread). Any
    attribute is the built provider's. Settings or credentials it cannot be built from are a
    :class:`providers.base.AuthError` (the whole cloud) on every use, with the reason.
    """

    def __init__(self, name: str, settings: Table | Mapping[str, Any], owner: str) -> None:
        self.name = name
        self._settings, self._owner = settings, owner
        self._lock = threading.Lock()
        self._built: Provider | None = None
        self._error: str = ""

    def build(self) -> Provider:
        """The provider, built now if it is not yet (once: callers meanwhile wait for it)."""
        built = self._built
        if built is not None:
            return built
        with self._lock:
            if self._built is None and not self._error:
                try:
                    self._built = build(self.name, self._settings, self._owner)
                except ValueError as e:
                    self._error = str(e) or type(e).__name__
        if self._built is None:
            raise AuthError(f"providers.{self.name} cannot be used: {self._error}", provider=self.name,
                            code="ProviderSettings")
        return self._built

    @property
    def built(self) -> bool:
        return self._built is not None

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # copy, pickle and the like probe dunders: not the provider's
            raise AttributeError(attr)
        return getattr(self.build(), attr)

    def __repr__(self) -> str:
        return f"LazyProvider({self.name!r}, {'built' if self.built else 'not built'})"


def market_source(name: str) -> Any:
    """Cloud ``name``'s :class:`providers.market.MarketSource` (imports its SDK)."""
    return get(name).load("market")


def node_name_problem(provider: str, name: str) -> str:
    """Why cloud ``provider`` would refuse ``name`` as a node's name ("" when it takes it)."""
    return get(provider).node_name_problem(name)
