"""Configuration: ONE schema for the TOML file and its ``BROKER_<SECTION>__<KEY>`` overrides.

The schema is a tree of msgspec ``Struct``s (:class:`providers.settings.Table`: typed keys with
defaults, unknown keys refused). Why msgspec: it checks types and refuses unknown keys for
~15 ms of imports; pydantic-settings does the same for ~270 ms, paid by every command that reads
the configuration (figures in the README). :func:`load` reads the file with ``tomllib``, lays the
environment over it, and converts the whole tree at once: every unknown key, unknown ``BROKER_*``
variable, wrong type, NaN/inf or out-of-range number is a :class:`broker.errors.ConfigError`
whose message is one sentence naming the full dotted key (and the key probably meant)::

    config: budgets.default.usd_per_hr is not a setting (did you mean usd_per_hour?)

What comes out is typed: ``cfg.lifecycle`` is a :class:`LifecycleSettings`, ``cfg.providers.aws``
an :class:`providers.aws.settings.AwsSettings`, ``cfg.autoscaler.trigger_config()`` a
:class:`policies.triggers.TriggerConfig`; nothing downstream parses a table again.
``deploy/broker.example.toml`` documents every key (a test loads it through this schema).
"""
from __future__ import annotations

import dataclasses
import os
import re
import socket
import tomllib
import typing
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Union

import msgspec
from msgspec import Meta, field

from broker.bootstrap_settings import BootstrapSettings
from broker.errors import ConfigError
from broker.job_classes import JobClassTable, ClassName
from broker.market_settings import CatalogSettings, MarketSettings
from broker.watchers import registry as scheduler_registry
from broker.fields import TENANT, bad_character
from broker.server_settings import MAX_PROCESSES, ServerSettings, is_loopback_host, split_host_port  # noqa: F401 (MAX_PROCESSES: re-exported)
from providers.files import SMALL_BYTES, read_text
from providers.registry import ProvidersSettings, names as registered_clouds
from providers.settings import NUMBER_LIMIT, Seconds, SettingsError, Table, bad, convert

__all__ = ["Config", "ConfigError", "Budget", "LifecycleSettings", "AutoscalerSettings", "load",
           "default_db_url", "default_state_dir"]

ENV_PREFIX = "BROKER_"
#: ``BROKER_*`` variables that are not settings: read by the CLI and the client, or set by the
#: boot script on a cloud node (``BROKER_SHARED_DATA``: where `simulate` and the tests look for the
#: shared traces and spot lifetimes). Any other ``BROKER_X`` (no ``__``) is refused as a typo.
PROCESS_VARIABLES = frozenset({
    "BROKER_CONFIG", "BROKER_HOME", "BROKER_SERVER", "BROKER_TOKEN", "BROKER_TLS_CA", "BROKER_LOG",
    "BROKER_LEASE_ID", "BROKER_NODE_NAME", "BROKER_PROVIDER", "BROKER_REGION", "BROKER_JOB_ID",
    "BROKER_CHECKPOINT_URI", "BROKER_DATASET_URI", "BROKER_SHARED_DATA",
})

NonNegative = Annotated[float, Meta(ge=0, le=NUMBER_LIMIT)]
Usd = Annotated[float, Meta(ge=0, le=NUMBER_LIMIT)]


def default_state_dir() -> Path:
    base = os.environ.get("BROKER_HOME") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "broker")
    return Path(base)


def default_db_url() -> str:
    return f"sqlite:///{default_state_dir() / 'broker.db'}"


def _default_owner() -> str:
    return f"broker-{socket.gethostname()}"[:63]


# ---------------------------------------------------------------------------------------------
# the tables


class StoreSettings(Table):
    """``[store]``: the SQLAlchemy URL (SQLite by default, PostgreSQL for several replicas)."""

    url: str = ""
    #: How long opening a PostgreSQL connection may take before the store counts as unreachable
    #: (libpq's connect_timeout, whole seconds, at least 2); SQLite opens a file.
    connect_timeout_s: Annotated[float, Meta(ge=1, le=3600)] = 10.0
    #: Connections the store keeps open per serving process (PostgreSQL, and a SQLite file); 0 = one
    #: per [server] workers thread and 8 for the background threads (broker.engine). Each serving
    #: process has its own: processes × (pool_size + max_overflow) must fit PostgreSQL's max_connections.
    pool_size: Annotated[int, Meta(ge=0, le=4096)] = 0
    #: Connections opened past pool_size for a burst, each closed again when its call returns.
    max_overflow: Annotated[int, Meta(ge=0, le=4096)] = 8

    def __post_init__(self) -> None:
        if self.url and not re.match(r"(sqlite|postgresql(\+psycopg)?)://", self.url):
            scheme = self.url.split("://", 1)[0][:32] if "://" in self.url else "no scheme"
            raise bad("url", f"must be sqlite:///PATH or postgresql+psycopg://USER@HOST/DB, got {scheme}://"
                      f"{self.url.split('@')[-1].split('://')[-1][:200]}")
        if self.connect_timeout_s < 2 or not float(self.connect_timeout_s).is_integer():
            raise bad("connect_timeout_s", f"is whole seconds, at least 2 (libpq's connect_timeout), "
                      f"got {self.connect_timeout_s:g}")
        if re.fullmatch(r"sqlite:///?(:memory:)?(\?.*)?", self.url):
            raise bad("url", "names an in-memory SQLite database, which every connection sees empty and which "
                      "loses every lease at exit: give a file, sqlite:///PATH")


class QuoteSettings(Table):
    ttl_s: Annotated[int, Meta(ge=1, le=NUMBER_LIMIT)] = 900
    onprem_egress_usd_per_gb: Usd = 0.0


class ReservationSettings(Table):
    """``[[reservations]]``: capacity the organisation already holds."""

    provider: Literal[registered_clouds()]  # type: ignore[valid-type]
    region: Annotated[str, Meta(min_length=1)]
    instance_type: Annotated[str, Meta(min_length=1)]
    reservation_id: Annotated[str, Meta(min_length=1)]
    zone: str = ""
    nodes: Annotated[int, Meta(ge=1, le=100000)] = 1
    hourly_usd: Usd = 0.0


class ReconcilerSettings(Table):
    interval_s: Seconds = 30.0
    orphan_grace_s: NonNegative = 120.0


class LeaderSettings(Table):
    """``[leader]``: the leader's lease in the store, renewed well inside its time to live."""

    ttl_s: Seconds = 10.0
    renew_s: Seconds = 2.0

    def __post_init__(self) -> None:
        if self.renew_s * 2 > self.ttl_s:
            raise bad("renew_s", f"({self.renew_s:g}) must be at most half of leader.ttl_s ({self.ttl_s:g})")


class LifecycleSettings(Table):
    """``[lifecycle]``: failover, retries and timeouts of a lease."""

    block_s: NonNegative = 900.0  # how long a capacity/quota scope stays blocked
    interruption_block_s: NonNegative = 1800.0  # how long an interrupted offering stays blocked
    max_failover: Annotated[int, Meta(ge=1, le=1000)] = 4  # offers tried per launch
    retries: Annotated[int, Meta(ge=0, le=100)] = 3  # attempts per offer on throttling / transient errors
    backoff_s: NonNegative = 1.0  # first backoff; doubles
    provision_timeout_s: NonNegative = 900.0
    resume_after_s: NonNegative = 60.0  # a launch this old with no process working on it is resumed
    # Release a running lease that is idle (no job, no scheduler's nodes: lifecycle.has_work)
    # after this long (0 = never).
    idle_timeout_s: NonNegative = 3600.0
    # Every lease's lifetime unless its launch asks for another (0 = unlimited): a safety net
    # against capacity nobody remembers.
    max_lifetime_s: NonNegative = 7 * 86400.0
    max_restarts: Annotated[int, Meta(ge=0, le=1000)] = 3  # requeues of a job before it is failed
    # At max_lifetime_s a running job is requeued (or its lease extended); idle capacity released.
    lifetime_with_job: Literal["requeue", "extend"] = "requeue"
    lifetime_warning_s: NonNegative = 1800.0  # the job is warned (lifetime_warning) this long before

    def __post_init__(self) -> None:
        if self.max_lifetime_s and self.lifetime_warning_s >= self.max_lifetime_s:
            raise bad("lifetime_warning_s", f"({self.lifetime_warning_s:g}) must be shorter than "
                      f"lifecycle.max_lifetime_s ({self.max_lifetime_s:g}), or every job is warned at its start")


def _table_of(cls: type, exclude: tuple[str, ...] = ()) -> type[Table]:
    """A Table with the fields and defaults of the policy dataclass ``cls`` (one definition: the
    policy's), every number bounded to zero or more."""
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        t = hints[f.name]
        if t is float or t is int:
            t = Annotated[t, Meta(ge=0, le=NUMBER_LIMIT)]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        fields.append((f.name, t, default))
    return msgspec.defstruct(f"{cls.__name__}Table", fields, bases=(Table,), kw_only=True,
                             forbid_unknown_fields=True, module=__name__)


def _policy_tables() -> tuple[type[Table], type[Table], type[Table]]:
    from policies.diagnose import DiagnoseConfig
    from policies.selection import SelectionConfig
    from policies.triggers import TriggerConfig

    return (_table_of(TriggerConfig, exclude=("selection", "classes")), _table_of(DiagnoseConfig),
            _table_of(SelectionConfig))


TriggerTable, DiagnoseTable, SelectionTable = _policy_tables()


def _as(cls: type, table: Table, key: str):
    """The policy dataclass ``cls`` from its table; its own checks raise ``ValueError("KEY ...")``."""
    try:
        return cls(**msgspec.structs.asdict(table))
    except (TypeError, ValueError) as e:
        text = str(e)
        first = text.split(" ", 1)[0]
        if first in table.__struct_fields__:
            raise bad(f"{key}.{first}", text.split(" ", 1)[1]) from None
        raise bad(key, f"is not valid: {text}") from None


class AutoscalerSettings(Table):
    """``[autoscaler]`` and its ``trigger`` / ``diagnose`` / ``selection`` / ``classes`` tables."""

    enabled: bool = False
    interval_s: Seconds = 30.0
    default_gpu_model: str = ""  # for jobs that name no GPU model or memory
    default_min_gpu_memory_gb: Annotated[int, Meta(ge=0, le=100000)] = 16
    runtime_margin: Annotated[float, Meta(gt=0, le=1000)] = 1.2  # hours quoted = expected runtime x this
    default_runtime_s: Annotated[int, Meta(gt=0, le=NUMBER_LIMIT)] = 3600  # jobs with no limit or estimate
    data_location: str = "onprem"
    history_s: Seconds = 3600.0
    tenant_from_queue: bool = False  # charge bursts to the job's queue instead of "default"
    trigger: TriggerTable = field(default_factory=TriggerTable)  # type: ignore[valid-type]
    diagnose: DiagnoseTable = field(default_factory=DiagnoseTable)  # type: ignore[valid-type]
    selection: SelectionTable = field(default_factory=SelectionTable)  # type: ignore[valid-type]
    classes: Annotated[dict[ClassName, JobClassTable], Meta(max_length=64)] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.trigger_config(), self.diagnose_config()  # the policies' own cross-checks

    def trigger_config(self):
        """The :class:`policies.triggers.TriggerConfig` (with its selection thresholds)."""
        from policies.selection import SelectionConfig
        from policies.triggers import TriggerConfig

        from policies.classes import merge_classes

        selection = _as(SelectionConfig, self.selection, "selection")
        trig = _as(TriggerConfig, self.trigger, "trigger")
        classes = {}
        for name, t in self.classes.items():
            try:
                classes[name] = t.job_class(name)
            except ValueError as e:
                raise bad(f"classes.{name}", f"is not valid: {e}") from None
        return dataclasses.replace(trig, selection=selection, classes=merge_classes(classes))

    def diagnose_config(self):
        from policies.diagnose import DiagnoseConfig

        return _as(DiagnoseConfig, self.diagnose, "diagnose")


class BudgetSettings(Table):
    usd_per_hour: Union[Usd, None] = None
    usd_per_month: Union[Usd, None] = None


class BudgetPolicy(Table):  # [budgets] on_exhausted: what running jobs do once a budget is spent
    on_exhausted: Literal["finish_running", "checkpoint_and_stop"] = "finish_running"


@dataclasses.dataclass(frozen=True)
class Budget:
    """A tenant's spending caps (None = no cap)."""

    tenant: str
    usd_per_hour: Decimal | None = None
    usd_per_month: Decimal | None = None


class AuthSettings(Table):
    """``[auth]``: with this section present, every Broker RPC needs a bearer token.

    ``tokens``: token (or ``"sha256:<hex>"`` of it) = tenant (``"*"``: an operator acting for
    any tenant). The tokens issued into the store with ``broker tokens create`` are honoured
    too, unless ``store_tokens = false``; each replica remembers a lookup for ``store_cache_s``,
    so a revocation reaches every replica within it. An empty token or tenant is refused, and so
    is an empty table unless ``store_tokens = true`` says the store's tokens are the only ones:
    auth never silently turns itself off."""

    tokens: dict[str, str] = {}
    store_tokens: Union[bool, None] = None  # None: honoured (but not enough for an empty table)
    store_cache_s: Annotated[float, Meta(ge=0, le=300)] = 2.0

    def __post_init__(self) -> None:
        if not self.tokens and self.store_tokens is not True:
            raise bad("tokens", "is empty: with an [auth] section every call needs a bearer token, "
                      "so list at least one (token = tenant), or set auth.store_tokens = true to "
                      "take them from the store only (broker tokens create)")
        for token, tenant in self.tokens.items():
            if not token.strip():
                raise bad("tokens", "holds an empty token")
            if token[:7].lower() == "sha256:" and not re.fullmatch(r"[0-9A-Fa-f]{64}", token[7:]):
                raise bad("tokens", "holds a \"sha256:\" key that is not a SHA-256 digest (64 hex digits "
                          "after the colon: printf %s \"$TOKEN\" | sha256sum)")
            if not tenant.strip():
                raise bad("tokens", "maps a token to an empty tenant (use \"*\" for an operator)")

    @property
    def honours_store(self) -> bool:
        """Whether tokens issued into the store are honoured."""
        return self.store_tokens is not False


class LimitsSettings(Table):
    """``[limits]``: the API's bounds at its edge (enforced by :mod:`broker.limits`)."""

    #: One request or response, in bytes (gRPC's own cap, both ways).
    max_message_bytes: Annotated[int, Meta(ge=1024, le=NUMBER_LIMIT)] = 4 * 1024 * 1024
    #: Any string field (names and ids have tighter bounds of their own).
    max_string_chars: Annotated[int, Meta(ge=64, le=NUMBER_LIMIT)] = 4096
    #: Any list or map field (a demand's filters have tighter bounds of their own).
    max_list_items: Annotated[int, Meta(ge=16, le=NUMBER_LIMIT)] = 100_000
    #: Nodes of one lease, launch or demand.
    max_nodes: Annotated[int, Meta(ge=1, le=1_000_000)] = 1024
    #: Open WatchLeases streams (each holds a worker thread); 0 = half of server.workers.
    max_streams: Annotated[int, Meta(ge=0, le=4096)] = 0
    #: Calls that wait on a cloud's API (Launch, Release; ReportQueue under the autoscaler) running
    #: at once; one more is UNAVAILABLE at once (retry), so the other RPCs always find a worker.
    #: 0 = a quarter of server.workers.
    max_cloud_calls: Annotated[int, Meta(ge=0, le=4096)] = 0
    #: Quote results kept for repeated demands, and entries of each cache derived from them
    #: (protobuf answers, launch targets); 0 = no caching.
    quote_cache_entries: Annotated[int, Meta(ge=0, le=1_000_000)] = 1024
    #: Bytes (estimated) the quote result cache may hold; the oldest results leave first.
    quote_cache_bytes: Annotated[int, Meta(ge=0, le=NUMBER_LIMIT)] = 64 * 1024 * 1024
    #: Bytes (estimated) each cache derived from quote results may hold.
    derived_cache_bytes: Annotated[int, Meta(ge=0, le=NUMBER_LIMIT)] = 64 * 1024 * 1024


class TelemetrySettings(Table):
    #: Prometheus /metrics HOST:PORT; empty = off. Loopback unless ``metrics_public`` is set.
    metrics_listen: str = ""
    metrics_public: bool = False

    def __post_init__(self) -> None:
        if not self.metrics_listen:
            return
        try:
            host, _ = split_host_port(self.metrics_listen)
        except ValueError as e:
            raise bad("metrics_listen", str(e)) from None
        if not self.metrics_public and not is_loopback_host(host):
            raise bad("metrics_listen", f"binds {host}, beyond loopback: /metrics shows spend by "
                      "provider; set telemetry.metrics_public = true to serve it there")


# ---------------------------------------------------------------------------------------------
# the whole file

#: One top-level table per registered scheduler kind (``[slurm]``, ...): broker.watchers.registry.
SchedulerTables = scheduler_registry.settings_struct(__name__)


class Config(SchedulerTables):  # type: ignore[misc,valid-type]
    """The whole configuration file, checked. Every table is optional; the schedulers' tables
    come from the scheduler registry (:attr:`schedulers`)."""

    owner: Annotated[str, Meta(min_length=1, max_length=63)] = field(default_factory=_default_owner)
    server: ServerSettings = field(default_factory=ServerSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    quote: QuoteSettings = field(default_factory=QuoteSettings)
    catalog: CatalogSettings = field(default_factory=CatalogSettings)
    market: MarketSettings = field(default_factory=MarketSettings)
    reservations: list[ReservationSettings] = []
    providers: ProvidersSettings = field(default_factory=ProvidersSettings)
    reconciler: ReconcilerSettings = field(default_factory=ReconcilerSettings)
    leader: LeaderSettings = field(default_factory=LeaderSettings)
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    autoscaler: AutoscalerSettings = field(default_factory=AutoscalerSettings)
    bootstrap: BootstrapSettings = field(default_factory=BootstrapSettings)
    budget_tables: dict[str, BudgetSettings] = field(default_factory=dict, name="budgets")
    budget_policy: BudgetPolicy = field(default_factory=BudgetPolicy)  # [budgets] on_exhausted
    auth: Union[AuthSettings, None] = None
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)

    def __post_init__(self) -> None:
        if not self.owner.strip():
            raise bad("owner", "must not be empty (it is written in every cloud resource's broker:owner tag)")
        for name in self.budget_tables:
            if not TENANT.match(name):
                raise bad("budgets", f"has a table for {name[:64]!r}, which is no tenant's name (letters, digits, "
                                     "'.', '_', '-'; at most 63): no token could ever spend it")
        held: set[tuple[str, str]] = set()
        for r in self.reservations:
            if (r.provider, r.reservation_id) in held:
                raise bad("reservations", f"list {r.provider} reservation {r.reservation_id[:64]!r} twice: its "
                                          "nodes would be counted twice")
            held.add((r.provider, r.reservation_id))
        odd = bad_character(self.owner)
        if odd or len(self.owner) > 128 or self.owner != self.owner.strip():
            raise bad("owner", f"must be at most 128 characters with no {odd or 'spaces around it'}: it is "
                               "written in every cloud resource's broker:owner tag, which a cloud reads back")
        if self.server.callback_listen:
            chost, _ = split_host_port(self.server.callback_listen)
            if not (is_loopback_host(chost) or self.server.insecure or self.server.callback_url.startswith("https://")):
                raise ValueError(
                    f"server.callback_listen {self.server.callback_listen} is beyond loopback, and the nodes' "
                    "reports carry their lease's credential in plain HTTP: put TLS in front and set "
                    "server.callback_url = \"https://...\", or set server.insecure = true for a trusted network")
        scheduler_registry.check(self)  # what an enabled scheduler needs of the other tables
        host, _ = split_host_port(self.server.listen)
        if not is_loopback_host(host) and not self.server.insecure and not (self.server.tls and self.auth):
            raise ValueError(
                f"server.listen {self.server.listen} is beyond loopback without "
                f"{'TLS' if not self.server.tls else ''}{' and ' if not self.server.tls and not self.auth else ''}"
                f"{'[auth] tokens' if not self.auth else ''}; configure them, or set "
                "server.insecure = true for a trusted network")

    # -- shorthands --------------------------------------------------------------------------
    @property
    def listen(self) -> str:
        return self.server.listen

    @property
    def workers(self) -> int:
        return self.server.workers

    @property
    def db_url(self) -> str:
        return self.store.url or default_db_url()

    @property
    def budgets(self) -> dict[str, Budget]:
        def dec(v: float | None) -> Decimal | None:
            return None if v is None else Decimal(str(v))

        return {t: Budget(t, dec(b.usd_per_hour), dec(b.usd_per_month)) for t, b in self.budget_tables.items()}

    def budget(self, tenant: str) -> Budget | None:
        b = self.budgets
        return b.get(tenant) or b.get("default")

    @property
    def schedulers(self) -> Mapping[str, Any]:
        """Scheduler kind name -> its settings table (enabled or not)."""
        return scheduler_registry.settings_of(self)

    @property
    def auth_tokens(self) -> dict[str, str]:
        """token → tenant; empty when there is no [auth] section (the API is open)."""
        return dict(self.auth.tokens) if self.auth else {}


# ---------------------------------------------------------------------------------------------
# loading


def _parse_env_value(text: str) -> Any:
    """Environment values are TOML values when they parse as one, else plain strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply_env(data: dict, environ: Mapping[str, str]) -> dict[str, str]:
    """Lay ``BROKER_<SECTION>__<KEY>`` variables over ``data``; returns dotted key → variable."""
    sources: dict[str, str] = {}
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in PROCESS_VARIABLES:
            continue
        rest = name[len(ENV_PREFIX):]
        if "__" not in rest and name != "BROKER_OWNER":
            import difflib  # a typo's suggestion: off the path of every good configuration

            close = difflib.get_close_matches(name, [*PROCESS_VARIABLES, "BROKER_OWNER"], n=1, cutoff=0.88)
            hint = (f"did you mean {close[0]}?" if close else
                    "settings are BROKER_<SECTION>__<KEY>, e.g. BROKER_SERVER__LISTEN")
            raise ConfigError(f"config: environment variable {name} is not a broker setting ({hint})", field=name)
        path = [p.lower() for p in rest.split("__")]
        if not all(path):
            raise ConfigError(f"config: environment variable {name} has an empty level (write one \"__\" "
                              "between levels)", field=name)
        node = data
        for i, p in enumerate(path[:-1]):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config: environment variable {name} sets a key inside "
                                  f"{'.'.join(path[:i + 1])}, which is not a table", field=name)
        node[path[-1]] = _parse_env_value(value)
        sources[".".join(path)] = name
    return sources


def load(path: str | Path | None = None, environ: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Config:
    """Load ``path`` (or ``$BROKER_CONFIG``; none = defaults), then the environment, then
    ``overrides`` (dotted keys, e.g. ``{"server.listen": ...}``; None values are skipped)."""
    environ = os.environ if environ is None else environ
    path = path or environ.get("BROKER_CONFIG")
    data: dict = {}
    if path:
        try:
            data = tomllib.loads(read_text(path, SMALL_BYTES))
        except FileNotFoundError:
            raise ConfigError(f"config file {str(path)[:200]} does not exist") from None
        except OSError as e:  # a directory, no permission, larger than a configuration is
            raise ConfigError(f"config file {str(path)[:200]} cannot be read: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {str(path)[:200]} is not valid TOML: {e}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {str(path)[:200]} is not UTF-8 text") from None
    sources = _apply_env(data, environ)
    for k, v in (overrides or {}).items():
        if v is not None:
            node = data
            *parents, key = k.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[key] = v
    if isinstance(data.get("budgets"), dict) and "on_exhausted" in data["budgets"]:
        budget_policy(data)  # [budgets] on_exhausted, beside the tenants' tables
    try:
        return convert(data, Config, "", sources)
    except SettingsError as e:
        raise ConfigError(f"config: {e}", field=e.key) from None


#: ``[budgets] on_exhausted``: what a tenant's running jobs do once its budget is spent (new spend
#: is refused either way). ``finish_running``: they finish (its idle leases are released);
#: ``checkpoint_and_stop``: they are requeued from their checkpoint and their leases released.
ON_EXHAUSTED = ("finish_running", "checkpoint_and_stop")


def budget_policy(data: dict) -> None:
    """``[budgets]`` holds tenants' tables and the one policy key ``on_exhausted``: move the key
    to where the schema reads it (``budget_policy``), checked here so the error names it as typed."""
    budgets = data.get("budgets")
    if not isinstance(budgets, dict) or "on_exhausted" not in budgets:
        return
    value = budgets.pop("on_exhausted")
    if value not in ON_EXHAUSTED:
        raise ConfigError(f"config: budgets.on_exhausted must be {' or '.join(ON_EXHAUSTED)}, got {str(value)[:64]!r}",
                          field="budgets.on_exhausted")
    data["budget_policy"] = {"on_exhausted": value}
