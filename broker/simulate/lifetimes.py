"""Observed spot lifetimes read from a file (the data and its rules are
:mod:`policies.lifetimes`': the quote reads the same)."""
from __future__ import annotations

import csv
from pathlib import Path

from broker.simulate.trace import TraceError, unreadable
from providers.files import lines
from policies.lifetimes import Lifetimes, LifetimesError, lifetimes_from_rows

__all__ = ["Lifetimes", "load_lifetimes"]


def load_lifetimes(path: Path | str) -> Lifetimes:
    """Read ``spot_instance_lifetimes_aws_gcp_2020.csv``-shaped data: ``cloud``,
    ``observed_lifetime_s`` and ``ended_by`` (``still_running...`` marks censored rows)."""
    p = Path(path)
    try:
        f = p.open(newline="", encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"cannot read spot lifetimes {p}: {e.strerror or e}") from None
    with f:
        r = csv.DictReader(lines(f))
        try:
            return lifetimes_from_rows(r, r.fieldnames, p.name)
        except LifetimesError as e:
            raise TraceError(str(e)) from None
        except (csv.Error, UnicodeDecodeError) as e:
            raise unreadable(p, r.line_num, e) from None
        except OSError as e:
            raise TraceError(f"{p.name}: {e.strerror or e}") from None
