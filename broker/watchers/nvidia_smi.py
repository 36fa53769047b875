"""nvidia-smi → GPU utilisation samples.

Reads the CSV of ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv``
(any column order and any extra columns when a header is present; ``,noheader`` and ``,nounits``
variants too; without a header the columns must be exactly ``index, utilization.gpu,
memory.used``). The query section may be embedded in a larger capture (the nvidia_gpu_exporter
capture files hold several commands' output, ``#`` banner lines between them): every CSV
section whose header has ``utilization.gpu`` is read, the rest of the file is ignored.

Several readings of one GPU (``nvidia-smi ... -l 10`` appends a row per GPU per interval, a
capture holds an idle and a load section) are averaged: what matters for diagnosis is how busy
a GPU is over time, not at one instant.

A GPU whose utilisation is ``[N/A]`` / ``[Not Supported]`` (MIG mode: the whole-GPU counter is
not reported) yields no sample, so its utilisation stays unknown rather than counting as idle.
A row that cannot be read raises :class:`broker.watchers.ParseError` naming its line.
"""
from __future__ import annotations

import csv
import re

from broker.watchers import ParseError
from policies.queue import GpuSample

QUERY = "index,utilization.gpu,memory.used"
COMMAND = ("nvidia-smi", f"--query-gpu={QUERY}", "--format=csv")
_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
_NUM = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(%|MiB|MB|GiB|KiB)?\s*$")
_MEM_SCALE = {None: 1.0, "MiB": 1.0, "MB": 1.0, "GiB": 1024.0, "KiB": 1 / 1024}


def _base(column: str) -> str:
    return _UNIT.sub("", column).strip().lower()


def _value(text: str) -> tuple[float | None, str | None, bool]:
    """→ (number, unit, known). ``[N/A]``-style bracketed values are unknown, not errors."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]") or t in ("N/A", "ERR!", ""):
        return None, None, False
    m = _NUM.match(t)
    if not m:
        raise ValueError(f"cannot read {t!r} as a number")
    return float(m.group(1)), m.group(2), True


def _is_header(cells: list[str]) -> bool:
    return len(cells) >= 2 and "utilization.gpu" in {_base(c) for c in cells}


def parse_nvidia_smi_csv(text: str, node: str = "") -> list[GpuSample]:
    """nvidia-smi query CSV (or a capture file holding it) → one sample per GPU.

    ``node`` names the host the output came from; a non-empty ``hostname`` column wins.
    """
    readings: dict[tuple[str, int], list[tuple[float, float]]] = {}
    order: list[tuple[str, int]] = []
    cols: dict[str, int] | None = None  # current section's header
    width = 0
    headerless = None  # decided at the first data row outside any section
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            cols = None  # a blank or banner line ends a CSV section
            continue
        cells = next(csv.reader([line], skipinitialspace=True))
        if _is_header(cells):
            cols = {_base(c): i for i, c in enumerate(cells)}
            width = len(cells)
            continue
        if cols is None:
            if headerless is None:
                headerless = not any(_is_header(next(csv.reader([ln], skipinitialspace=True)))
                                     for ln in lines if ln.strip() and not ln.startswith("#"))
            if not headerless:
                continue  # other output in a capture file
            if len(cells) != 3:
                raise ParseError(f"expected 3 values ({QUERY}) without a header, found "
                                 f"{len(cells)}", line=lineno)
            idx_s, util_s, mem_s, host = cells[0], cells[1], cells[2], ""
        else:
            if len(cells) != width:
                raise ParseError(f"expected {width} values like the header, found {len(cells)}",
                                 line=lineno)
            idx_s = cells[cols["index"]] if "index" in cols else ""
            util_s = cells[cols["utilization.gpu"]]
            mem_s = cells[cols["memory.used"]] if "memory.used" in cols else "0"
            host = cells[cols["hostname"]] if "hostname" in cols else ""
        try:
            if idx_s:
                if not idx_s.strip().isdigit():
                    raise ValueError(f"cannot read the GPU index {idx_s!r}")
                index = int(idx_s)
            else:  # no index column: position within the node's readings
                index = sum(1 for k in readings if k[0] == (host or node))
            util, unit, known = _value(util_s)
            if known and (unit not in (None, "%") or not 0 <= util <= 100):
                raise ValueError(f"utilization.gpu {util_s!r} is not a percentage")
            mem, mem_unit, mem_known = _value(mem_s)
            if mem_known and (mem < 0 or mem_unit == "%"):
                raise ValueError(f"memory.used {mem_s!r} is not an amount of memory")
        except ValueError as exc:
            raise ParseError(str(exc), line=lineno) from None
        if not known:
            continue
        name = host if host and not host.startswith("[") else node
        key = (name, index)
        if key not in readings:
            readings[key] = []
            order.append(key)
        readings[key].append((util, (mem or 0.0) * _MEM_SCALE[mem_unit] if mem_known else 0.0))
    samples = []
    for key in order:
        vals = readings[key]
        samples.append(GpuSample(node=key[0], index=key[1],
                                 utilization_pct=round(sum(v[0] for v in vals) / len(vals), 2),
                                 memory_used_mb=round(sum(v[1] for v in vals) / len(vals), 1)))
    return samples


def count_gpu_rows(text: str) -> int:
    """How many GPU rows (known or not) the query sections hold — to tell "no GPUs" from
    "utilisation not reported" (MIG)."""
    n, in_section = 0, False
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            in_section = False
            continue
        cells = next(csv.reader([line], skipinitialspace=True))
        if _is_header(cells):
            in_section = True
        elif in_section:
            n += 1
    return n


__all__ = ["COMMAND", "QUERY", "count_gpu_rows", "parse_nvidia_smi_csv"]
