"""Reading the files a person names, with a bound on what one read may take.

A path typed by mistake (``/dev/zero``, a disk image, a log that never ends, a 40 GB dump) must
end in one sentence, not in a process that reads until the machine runs out of memory. Two
bounds, one per way a file is read:

- a *document* read whole (a JSON snapshot or simulation, sacct output, a TOML configuration, a
  PEM file, a boot template): at most ``max_bytes`` (:data:`DOCUMENT_BYTES`, or the tighter
  :data:`SMALL_BYTES` for files that are a few kB when right);
- a *table* read line by line (a trace of millions of jobs, a price catalog, spot lifetimes): any
  length, but at most :data:`LINE_CHARS` characters on one line.

Either refusal is an :class:`OSError` with ``errno.EFBIG`` whose ``strerror`` is the reason, so
every caller's "cannot read X: <strerror>" says it as it says a missing file.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Iterator

DOCUMENT_BYTES = 256 * 1024 * 1024  # a snapshot of 100,000 pending jobs is about 30 MB
SMALL_BYTES = 16 * 1024 * 1024  # configuration, certificates, templates
LINE_CHARS = 1024 * 1024  # a CSV row; the csv module refuses a field past 128 kB anyway


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


def too_large(what: str) -> OSError:
    return OSError(errno.EFBIG, what)


def read_bytes(path: Path | str, max_bytes: int = DOCUMENT_BYTES, *, regular: bool = False) -> bytes:
    """The whole file, or :class:`OSError` (EFBIG) when it holds more than ``max_bytes``.
    ``regular``: only a regular file (a key or a certificate; a FIFO would block the open
    forever, a device never ends), else :class:`OSError` (EINVAL)."""
    if regular and not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, "it is not a regular file")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise too_large(f"it is larger than {_mib(max_bytes)}, more than such a file ever is")
    return data


def read_text(path: Path | str, max_bytes: int = DOCUMENT_BYTES) -> str:
    """:func:`read_bytes` decoded as UTF-8, a byte-order mark (Windows editors, Excel) left out
    (UnicodeDecodeError when it is not UTF-8)."""
    return read_bytes(path, max_bytes).decode("utf-8-sig")


def lines(f: IO[str], max_chars: int = LINE_CHARS) -> Iterator[str]:
    """The lines of a text file opened with ``newline=""`` (as the csv module wants), each
    whole, or :class:`OSError` (EFBIG) at the first line longer than ``max_chars``."""
    readline = f.readline
    n = 0
    while True:
        line = readline(max_chars + 2)  # room for the row and its "\r\n"
        if not line:
            return
        n += 1
        if len(line) > max_chars and len(line.rstrip("\r\n")) > max_chars:
            raise too_large(f"line {n:,} is longer than {max_chars:,} characters, which no table row is")
        yield line
