"""Configuration: one TOML file, overridden by ``BROKER_<SECTION>__<KEY>`` environment variables.

Read with the standard library's ``tomllib`` into plain dataclasses: the file is small, and
keeping a validation framework out of the import path keeps every ``broker`` command fast.
Errors name the key: ``config: reconciler.interval_s must be a positive number``.

Example (every key optional)::

    owner = "broker-prod"                 # written in every cloud resource's broker:owner tag

    [server]
    listen = "127.0.0.1:50051"
    workers = 32

    [store]
    url = "sqlite:////var/lib/broker/broker.db"   # or postgresql+psycopg://user@host/db

    [quote]
    ttl_s = 900
    onprem_egress_usd_per_gb = 0.0

    [[reservations]]
    provider = "aws"
    region = "us-east-1"
    instance_type = "p5.48xlarge"
    nodes = 2
    reservation_id = "cr-0123456789abcdef0"
    hourly_usd = 0

    [providers.aws]
    enabled = true
    regions = ["us-east-1", "us-west-2"]

    [reconciler]
    interval_s = 30
    orphan_grace_s = 120

    [budgets.default]
    usd_per_hour = 500
    usd_per_month = 100000
"""
from __future__ import annotations

import os
import socket
import tomllib
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Mapping

ENV_PREFIX = "BROKER_"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key."""


def default_state_dir() -> Path:
    base = os.environ.get("BROKER_HOME") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "broker")
    return Path(base)


def default_db_url() -> str:
    return f"sqlite:///{default_state_dir() / 'broker.db'}"


@dataclass(frozen=True)
class Budget:
    tenant: str
    usd_per_hour: Decimal | None = None
    usd_per_month: Decimal | None = None


@dataclass(frozen=True)
class Config:
    owner: str = field(default_factory=lambda: f"broker-{socket.gethostname()}"[:63])
    listen: str = "127.0.0.1:50051"
    workers: int = 32
    db_url: str = field(default_factory=default_db_url)
    quote_ttl_s: int = 900
    onprem_egress_usd_per_gb: Decimal = Decimal(0)
    catalog_path: str = ""
    reservations: tuple[dict, ...] = ()
    providers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reconciler: Mapping[str, Any] = field(default_factory=dict)
    lifecycle: Mapping[str, Any] = field(default_factory=dict)
    autoscaler: Mapping[str, Any] = field(default_factory=dict)
    bootstrap: Mapping[str, Any] = field(default_factory=dict)
    slurm: Mapping[str, Any] = field(default_factory=dict)
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def section(self, name: str) -> Mapping[str, Any]:
        v = self.raw.get(name, {})
        return v if isinstance(v, Mapping) else {}

    def budget(self, tenant: str) -> Budget | None:
        return self.budgets.get(tenant) or self.budgets.get("default")


def _parse_env_value(text: str) -> Any:
    """Environment values are TOML values when they parse as one, else plain strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply_env(data: dict, environ: Mapping[str, str]) -> dict:
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or "__" not in key[len(ENV_PREFIX):] and key != "BROKER_OWNER":
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX):].split("__")]
        node = data
        for p in path[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment {key} overrides a value that is not a table")
        node[path[-1]] = _parse_env_value(value)
    return data


def _num(data: Mapping, key: str, where: str, default, kind=int, positive=True):
    v = data.get(key, default)
    try:
        n = kind(v) if kind is not Decimal else Decimal(str(v))
    except (TypeError, ValueError, InvalidOperation):
        raise ConfigError(f"config: {where}.{key} must be a number, got {v!r}") from None
    if positive and n <= 0 or n < 0:
        raise ConfigError(f"config: {where}.{key} must be {'positive' if positive else 'zero or more'}, got {v!r}")
    return n


def load(path: str | Path | None = None, environ: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Config:
    """Load ``path`` (or ``$BROKER_CONFIG``; none = defaults), then env, then ``overrides``."""
    environ = os.environ if environ is None else environ
    path = path or environ.get("BROKER_CONFIG")
    data: dict = {}
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    data = _apply_env(data, environ)
    for k, v in (overrides or {}).items():
        if v is not None:
            sect, _, key = k.rpartition(".")
            (data.setdefault(sect, {}) if sect else data)[key] = v

    server, store, quote = data.get("server", {}), data.get("store", {}), data.get("quote", {})
    budgets = {}
    for tenant, b in (data.get("budgets") or {}).items():
        if not isinstance(b, Mapping):
            raise ConfigError(f"config: budgets.{tenant} must be a table")
        budgets[tenant] = Budget(
            tenant,
            _num(b, "usd_per_hour", f"budgets.{tenant}", None, Decimal) if "usd_per_hour" in b else None,
            _num(b, "usd_per_month", f"budgets.{tenant}", None, Decimal) if "usd_per_month" in b else None,
        )
    reservations = tuple(data.get("reservations") or ())
    for i, r in enumerate(reservations):
        for k in ("provider", "region", "instance_type", "reservation_id"):
            if not r.get(k):
                raise ConfigError(f"config: reservations[{i}].{k} is required")
    providers = data.get("providers") or {}
    for name in providers:
        if name not in ("aws", "gcp", "azure"):
            raise ConfigError(f"config: providers.{name} is not a known provider (aws, gcp, azure)")
    rec = dict(data.get("reconciler") or {})
    rec["interval_s"] = _num(rec, "interval_s", "reconciler", 30, float)
    rec["orphan_grace_s"] = _num(rec, "orphan_grace_s", "reconciler", 120, float, positive=False)
    cfg = Config(
        owner=str(data.get("owner") or Config().owner),
        listen=str(server.get("listen", "127.0.0.1:50051")),
        workers=_num(server, "workers", "server", 32),
        db_url=str(store.get("url") or default_db_url()),
        quote_ttl_s=_num(quote, "ttl_s", "quote", 900),
        onprem_egress_usd_per_gb=_num(quote, "onprem_egress_usd_per_gb", "quote", 0, Decimal, positive=False),
        catalog_path=str((data.get("catalog") or {}).get("path", "")),
        reservations=reservations,
        providers=providers,
        reconciler=rec,
        lifecycle=data.get("lifecycle") or {},
        autoscaler=data.get("autoscaler") or {},
        bootstrap=data.get("bootstrap") or {},
        slurm=data.get("slurm") or {},
        budgets=budgets,
        raw=data,
    )
    return cfg
