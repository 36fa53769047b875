"""A job's ``broker:k=v,...`` hints, as any scheduler carries them (a Slurm job's comment, a
Kubernetes workload's annotation): its kind (training, tuning, eval, inference), whether it may be
interrupted, its checkpoint interval, data size, GPU memory, runtime and gang. A hint that cannot
be read is kept as a problem sentence, never an exception, so one bad job never blinds a watcher.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from policies.queue import JOB_KINDS


@dataclass(frozen=True, slots=True)
class JobHints:
    kind: str = "training"
    interruptible: bool = False
    checkpoint_minutes: int = 0
    data_gb: float = 0.0
    gpu_mem_gb: int = 0
    runtime_s: int = 0
    gang: str = ""
    problems: tuple[str, ...] = ()



_TRUE = {"1", "true", "yes", "y", "on"}
_FALSE = {"0", "false", "no", "n", "off"}
_KIND_ALIASES = {
    "train": "training", "training": "training", "pretrain": "training", "finetune": "training",
    "tune": "tuning", "tuning": "tuning", "hpo": "tuning", "sweep": "tuning",
    "eval": "eval", "evaluation": "eval", "bench": "eval",
    "infer": "inference", "inference": "inference", "serve": "inference", "serving": "inference",
}
_NAME_KIND = re.compile(r"^(eval|evaluation|tune|tuning|hpo|sweep|infer|inference|serve|serving|"
                        r"train|training)(?:[-_.:]|$)", re.I)
_HINTS = re.compile(r"broker:((?:[A-Za-z_]+=[^,\s;]*)(?:,[A-Za-z_]+=[^,\s;]*)*)")


def parse_job_hints(comment: str, name: str = "") -> JobHints:
    """Read the ``broker:k=v,...`` hints of a job's comment, falling back to its name for kind."""
    kind, problems = "", []
    values: dict[str, Any] = {}
    m = _HINTS.search(comment or "")
    if m:
        for pair in m.group(1).split(","):
            key, _, raw = pair.partition("=")
            key = key.lower()
            raw = raw.strip()
            try:
                if key == "kind":
                    k = _KIND_ALIASES.get(raw.lower())
                    if k is None:
                        raise ValueError(f"kind must be one of {', '.join(JOB_KINDS)}")
                    kind = k
                elif key == "interruptible":
                    if raw.lower() not in _TRUE | _FALSE:
                        raise ValueError("interruptible must be 1/0, true/false or yes/no")
                    values["interruptible"] = raw.lower() in _TRUE
                elif key in ("checkpoint", "gpu_mem", "runtime"):
                    if not raw.isdigit():
                        unit = "GB" if key == "gpu_mem" else "minutes"
                        raise ValueError(f"{key} must be a whole number of {unit}")
                    values[key] = int(raw)
                elif key == "data_gb":
                    try:
                        v = float(raw)
                    except ValueError:
                        v = -1.0
                    if not math.isfinite(v) or v < 0:
                        raise ValueError("data_gb must be a non-negative number")
                    values[key] = v
                elif key == "gang":
                    if not raw:
                        raise ValueError("gang needs a name")
                    values[key] = raw
                else:
                    raise ValueError("unknown hint")
            except ValueError as exc:
                problems.append(f"{pair!r}: {exc}")
    elif "broker:" in (comment or ""):
        problems.append(f"cannot read the broker hints in comment {comment!r}")
    if not kind:
        nm = _NAME_KIND.match(name or "")
        kind = _KIND_ALIASES[nm.group(1).lower()] if nm else "training"
    return JobHints(
        kind=kind,
        interruptible=values.get("interruptible", False),
        checkpoint_minutes=values.get("checkpoint", 0),
        data_gb=values.get("data_gb", 0.0),
        gpu_mem_gb=values.get("gpu_mem", 0),
        runtime_s=values.get("runtime", 0) * 60,
        gang=values.get("gang", ""),
        problems=tuple(problems),
    )
