"""A compiled copy of a price catalog, so a short-lived process (a cold `broker quote`) does not
parse its CSV files and every price in them again.

Parsing the bundled catalog (CSV rows, every price as a ``Decimal`` into micro-dollars) is most of
what loading it costs; the copy holds the parsed rows as plain tuples, written with :mod:`marshal`
and read back in a fraction of that. It is only a copy: any doubt about it and the catalog is
parsed from its files, as without it.

- **Invalidation.** The copy is used only when its key equals the key of what it would replace:
  the catalog directory, each of its files' size, modification time (ns) and inode, the same of
  the modules that parse and define the catalog and of the cloud registry (a new version of the
  code never reads an older copy), this format's number and the interpreter's version (marshal's
  format is the interpreter's).
- **Where.** ``$BROKER_HOME/cache`` when ``BROKER_HOME`` is set, else ``$XDG_CACHE_HOME/broker``
  (``~/.cache/broker``); one file per catalog directory.
- **Written atomically**: to a temporary file in the same directory, then renamed over the copy.
  A directory that cannot be written (read-only, full) is not an error: the catalog was parsed.
- **Corrupt or stale copies are ignored** (and replaced): anything that fails to read, does not
  have the expected shape or does not build the catalog's types falls back to parsing.
- **Trust.** marshal reads plain data (tuples, strings, numbers) and never runs code, but it is
  not hardened against crafted input; pickle, by contrast, runs code by design, so it is not used.
  The copy is also read only if the file and its directory belong to this user and neither is
  writable by group or others: prices from a file someone else can write are not trusted.
"""
from __future__ import annotations

import marshal
import os
import sys
import zlib
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

from providers import base as _base
from providers.base import InstanceType, Market, Offering

FORMAT = 1
FILES = ("instances.csv", "regions.csv", "prices.csv", "network.toml")


def cache_dir(environ: Any = None) -> Path:
    """Where compiled catalogs live (see the module's docstring)."""
    environ = os.environ if environ is None else environ
    if environ.get("BROKER_HOME"):
        return Path(environ["BROKER_HOME"]) / "cache"
    return Path(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "broker"


def file_stamp(path: Path | str) -> tuple[int, int, int]:
    """A file's size, modification time (ns) and inode: what says it is the same file."""
    s = os.stat(path)
    return (s.st_size, s.st_mtime_ns, s.st_ino)


def key(data_dir: Path, code: tuple[str, ...] = ()) -> tuple:
    """What a copy must have been made from to stand for the catalog in ``data_dir`` (``code``:
    the modules that parse it besides this one and :mod:`providers.base`); OSError when a file
    cannot be seen (the parse then says which)."""
    modules = tuple(file_stamp(m) for m in (__file__, _base.__file__, *code))
    files = tuple((name, *file_stamp(data_dir / name)) for name in FILES)
    return (FORMAT, sys.hexversion, str(data_dir.resolve()), modules, files)


def path_for(data_dir: Path, environ: Any = None) -> Path:
    name = f"{zlib.crc32(str(data_dir.resolve()).encode()):08x}"  # a clash only costs a parse
    return cache_dir(environ) / f"catalog-{name}.marshal"


def _trusted(fd: int, directory: Path) -> bool:
    """The file and its directory belong to this user and no one else can write them."""
    uid = os.geteuid()
    for s in (os.fstat(fd), os.stat(directory)):
        if s.st_uid != uid or s.st_mode & 0o022:
            return False
    return True


def read(path: Path) -> Any:
    """The data in the copy at ``path``, or None (missing, unreadable, untrusted, corrupt)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not _trusted(f.fileno(), path.parent):
                return None
            return marshal.loads(f.read())
    except (OSError, ValueError, EOFError, TypeError):
        return None


def write(path: Path, data: Any) -> bool:
    """Write ``data`` to ``path`` atomically; False (nothing left behind) when it cannot be."""
    tmp = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(marshal.dumps(data))
        os.replace(tmp, path)
        return True
    except (OSError, ValueError):
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def dump(catalog: Any, k: tuple) -> tuple:
    """``catalog`` (a :class:`providers.catalog.Catalog`) as plain tuples, under key ``k``."""
    inst = list(catalog.instances.values())
    index = {id(it): i for i, it in enumerate(inst)}
    row = _names(InstanceType)
    offer = _names(Offering)[1:]  # the instance is stored as its index
    return (k, [tuple(getattr(it, n) for n in row) for it in inst],
            [(r.provider, r.name, r.geo, r.location, r.zones) for r in catalog.regions.values()],
            [tuple(getattr(t, f.name) for f in fields(t)) for t in catalog.terms.values()],
            dict(catalog.gpu_perf),
            [(index[id(o.instance)], *(getattr(o, n).value if n == "market" else getattr(o, n) for n in offer))
             for o in catalog.offerings],
            dict(catalog.committed_micros), catalog.as_of)


def build(data: Any, k: tuple, types: tuple[type, type, type]) -> Any:
    """The catalog in ``data`` when it was made under key ``k``, else None; ``types``: the
    catalog's, its regions' and its terms' classes (:mod:`providers.catalog`)."""
    Catalog, Region, Terms = types
    if not isinstance(data, tuple) or len(data) != 8 or data[0] != k:
        return None
    _, inst, regs, terms, perf, offers, committed, as_of = data
    try:
        its = [InstanceType(*r) for r in inst]
        markets = {m.value: m for m in Market}
        offerings = tuple(Offering(its[r[0]], r[1], r[2], markets[r[3]], *r[4:]) for r in offers)
        regions = {(r[0], r[1]): Region(*r) for r in regs}
        by_provider = {t[0]: Terms(*t) for t in terms}
        if not all(isinstance(x, dict) for x in (perf, committed)) or not isinstance(as_of, str):
            return None
        return Catalog({(it.provider, it.name): it for it in its}, regions, by_provider, perf, offerings,
                       committed, as_of)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        return None


def cached(data_dir: Path, parse: Callable[[Path], Any], types: tuple[type, type, type],
           code: tuple[str, ...] = ()) -> Any:
    """The catalog in ``data_dir``: from its compiled copy when that is current and trusted, else
    ``parse(data_dir)`` (and the copy written for the next process)."""
    try:
        k = key(data_dir, code)
    except OSError:
        return parse(data_dir)
    path = path_for(data_dir)
    got = build(read(path), k, types)
    if got is not None:
        return got
    catalog = parse(data_dir)
    write(path, dump(catalog, k))
    return catalog
