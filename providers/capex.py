"""What an on-prem server of each GPU model costs to buy and power: ``capex.csv`` beside the
price catalog (``gpu_model, gpus_per_server, server_capex_usd, kw_per_server, as_of, source``),
one dated, sourced row per model. A catalog directory without one uses the bundled file."""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from providers.files import lines

BUNDLED = Path(__file__).resolve().parent / "data" / "capex.csv"


class CapexError(ValueError):
    """capex.csv is unusable; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class ServerCapex:
    gpu_model: str
    gpus_per_server: int
    server_capex_usd: float
    kw_per_server: float
    as_of: str
    source: str


def load_capex(directory: Path | None = None) -> dict[str, ServerCapex]:
    """Server capex per GPU model (upper case) from ``directory/capex.csv`` or the bundled one."""
    path = directory / "capex.csv" if directory is not None and (directory / "capex.csv").exists() else BUNDLED
    out: dict[str, ServerCapex] = {}
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            for line, r in enumerate(csv.DictReader(lines(f)), start=2):
                try:
                    row = ServerCapex(r["gpu_model"].strip().upper(), int(r["gpus_per_server"]),
                                      float(r["server_capex_usd"]), float(r["kw_per_server"]),
                                      r["as_of"].strip(), r["source"].strip())
                except (KeyError, TypeError, ValueError, AttributeError):
                    raise CapexError(f"{path.name} line {line}: gpu_model, gpus_per_server, server_capex_usd, "
                                     "kw_per_server, as_of and source must all be there, the numbers numbers") from None
                if not (row.gpu_model and row.gpus_per_server > 0 and math.isfinite(row.server_capex_usd)
                        and row.server_capex_usd > 0 and math.isfinite(row.kw_per_server) and row.kw_per_server >= 0):
                    raise CapexError(f"{path.name} line {line}: the GPU model must be named and the numbers positive")
                out[row.gpu_model] = row
    except OSError as e:
        raise CapexError(f"cannot read {path}: {e.strerror or e}") from None
    return out
