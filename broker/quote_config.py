"""The settings an in-process `broker quote` reads, remembered between processes.

Loading the configuration (:func:`broker.config.load`) checks the whole schema: every table, the
policies' own checks, the schedulers' and the clouds' tables. Importing that schema costs a cold
`broker quote` more than the quote itself, which reads a handful of settings: the store's URL,
``[catalog]``, ``[market]``, ``[quote]``, ``[limits]``, ``[[reservations]]`` and which clouds are
enabled in which regions. :func:`load` gives those:

- from a copy written beside the compiled catalog (:mod:`providers.catalog_cache`: the same
  directory, the same atomic write and the same trust rules) when the copy was made from the
  same configuration file (its exact bytes), the same environment (every ``BROKER_*`` variable and
  those the default paths read) and the same code (every module of the product the full load had
  loaded, by size, modification time and inode, and the interpreter's version). The file and the
  environment are kept as a BLAKE2 digest, never as text: they may hold tokens;
- else by loading the whole configuration as every command does (an error is reported exactly
  as before and never remembered), and writing the copy for the next quote.

A configuration this copy cannot stand for (GCP flex-start offerings, which need the cloud's
whole table) is loaded in full every time.
"""
from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

from providers import catalog_cache
from providers.files import SMALL_BYTES, read_bytes

FORMAT = 1
#: Besides every ``BROKER_*`` variable: what the default store path is made of.
ENVIRONMENT = ("XDG_STATE_HOME", "HOME")
PACKAGES = ("broker", "policies", "providers")
SECTIONS = {"catalog": ("path", "refresh_interval_s", "max_age_h"),
            "market": ("spot_lifetimes", "spot_confidence", "spot_deadline_slack", "buy_capacity_blocks"),
            "quote": ("ttl_s", "onprem_egress_usd_per_gb"),
            "limits": ("quote_cache_entries", "quote_cache_bytes", "max_nodes"),
            "store": ("url", "connect_timeout_s")}
RESERVATION = ("provider", "region", "instance_type", "reservation_id", "zone", "nodes", "hourly_usd")


class _Providers:
    """``config.providers`` as a quote reads it: the enabled clouds and their regions."""

    def __init__(self, enabled: Mapping[str, SimpleNamespace]) -> None:
        self._enabled = dict(enabled)

    def enabled(self) -> dict[str, SimpleNamespace]:
        return dict(self._enabled)


class QuoteConfig:
    """The settings a quote reads, under the names :class:`broker.config.Config` gives them."""

    def __init__(self, view: dict) -> None:
        for section in SECTIONS:
            setattr(self, section, SimpleNamespace(**view[section]))
        self.db_url: str = view["db_url"]
        self.reservations = [SimpleNamespace(**dict(zip(RESERVATION, r))) for r in view["reservations"]]
        self.providers = _Providers({name: SimpleNamespace(enabled=True, regions=tuple(regions), flex_start=False)
                                     for name, regions in view["providers"].items()})


def view_of(cfg: Any) -> dict | None:
    """What a quote reads of the loaded configuration ``cfg``, as plain data; None when the copy
    cannot stand for it."""
    enabled = cfg.providers.enabled()
    if getattr(enabled.get("gcp"), "flex_start", False):
        return None
    view: dict = {s: {k: getattr(getattr(cfg, s), k) for k in keys} for s, keys in SECTIONS.items()}
    view["db_url"] = cfg.db_url
    view["reservations"] = [tuple(getattr(r, k) for k in RESERVATION) for r in cfg.reservations]
    view["providers"] = {name: tuple(t.regions) for name, t in enabled.items()}
    return view


def _code() -> tuple:
    """Size, modification time and inode of every product module loaded so far."""
    roots = tuple(str(Path(sys.modules[p].__file__ or "").parent) + os.sep for p in PACKAGES if p in sys.modules)
    files = sorted(f for m in list(sys.modules.values())
                   if (f := getattr(m, "__file__", None)) and f.startswith(roots))
    return tuple((f, *catalog_cache.file_stamp(f)) for f in files)


def _current(code: Any) -> bool:
    try:
        return all(catalog_cache.file_stamp(f) == tuple(rest) for f, *rest in code)
    except (OSError, TypeError, ValueError):
        return False


def _digest(path: str, raw: bytes, env: tuple[tuple[str, str], ...]) -> bytes:
    """One digest of the file's name and bytes and the environment (which may hold secrets)."""
    try:
        from _blake2 import blake2b  # CPython's own; hashlib would start OpenSSL (~3 ms)
    except ImportError:  # pragma: no cover: another interpreter
        from hashlib import blake2b
    h = blake2b(digest_size=32)
    for part in (path.encode(errors="surrogateescape"), raw,
                 *(f"{k}={v}".encode(errors="surrogateescape") for k, v in env)):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def remembered(path: Path, key: tuple) -> dict | None:
    """The view in the copy at ``path`` when it was made under ``key`` from today's code."""
    data = catalog_cache.read(path)
    if isinstance(data, tuple) and len(data) == 3 and data[0] == key and isinstance(data[2], dict) \
            and _current(data[1]):
        return data[2]
    return None


def _read(path: str | None) -> bytes | None:
    """The configuration file's bytes (b"" for none), or None when it cannot be read."""
    try:
        return read_bytes(path, SMALL_BYTES) if path else b""
    except (OSError, ValueError):
        return None


def load(path: str | None = None, environ: Mapping[str, str] | None = None) -> Any:
    """The settings a quote reads from ``path`` (or ``$BROKER_CONFIG``) and the environment: a
    :class:`QuoteConfig`, or the whole :class:`broker.config.Config` where no copy can stand for
    it. Raises :class:`broker.errors.ConfigError` as :func:`broker.config.load` does."""
    environ = os.environ if environ is None else environ
    path = path or environ.get("BROKER_CONFIG") or None
    raw = _read(path)  # None: the full load says what is wrong with it
    env = tuple(sorted((k, v) for k, v in environ.items() if k.startswith("BROKER_") or k in ENVIRONMENT))
    where = str(Path(path).absolute()) if path else ""
    key = (FORMAT, sys.hexversion, _digest(where, raw or b"", env)) if raw is not None else None
    copy = catalog_cache.cache_dir(environ) / f"quote-config-{zlib.crc32(where.encode(errors='surrogateescape')):08x}.marshal"
    view = remembered(copy, key) if key is not None else None
    if view is not None:
        try:
            return QuoteConfig(view)
        except (KeyError, TypeError):
            pass  # a copy of another shape: loaded in full below, and replaced
    from broker.config import load as load_all

    cfg = load_all(path, environ)
    view = view_of(cfg)
    if view is None:
        return cfg
    if key is not None and _read(path) == raw:  # not changed meanwhile
        catalog_cache.write(copy, (key, _code(), view))
    return QuoteConfig(view)
