"""The ``[slurm]`` section: one configuration for the in-server half and the power-saving programs.

Configuration (``[slurm]``; every key optional except the shapes a resume needs)::

    [slurm]
    enabled = true                    # the autoscaler watches this Slurm and bursts through it
    cluster = "prod"                  # source name "slurm:prod" in decisions and snapshots
    squeue = "/usr/bin/squeue"        # absolute paths: the programs run with no PATH
    sinfo = "/usr/bin/sinfo"
    scontrol = "/usr/bin/scontrol"
    slurm_conf = ""                   # SLURM_CONF for those commands ("" = inherited)
    burst_partition = "burst"         # the partition of the CLOUD nodes
    onprem_partitions = []            # partitions whose jobs may burst ([] = any but burst);
                                      # onprem_partition = "gpu" is the one-partition spelling
    server = "127.0.0.1:50051"        # broker for resume/suspend (--server, $BROKER_SERVER win)
    set_node_addr = true              # scontrol update nodename=N nodeaddr=IP after a launch;
                                      # false when cloud nodes resolve by name (DNS, cloud_dns)
    tenant = "default"                # tenant charged for the cloud nodes
    bootstrap = "slurm"               # boot template for the instances ("" = none); rendered
                                      # by the server only when it has a [bootstrap] section
    log = "/var/log/broker/slurm.log" # default: $BROKER_HOME/slurm.log, else this path
    command_timeout_s = 30            # for each squeue/sinfo/scontrol call
    rpc_timeout_s = 600               # for each Launch (a launch may fail over across clouds)

    [slurm.shapes.burst]              # nodes named burst-1, burst-2, … (prefix, "-", number)
    gpu = "L4"                        # GPU model of one node (or min_gpu_memory_gb)
    gpus = 1                          # GPUs per node: must equal the node's Gres count
    min_gpu_memory_gb = 0
    hours = 1.0                       # quoted hours when the job has no time limit
    providers = []                    # restrict the offers (e.g. ["gcp"]); [] = any enabled
    regions = []

A node's shape is the ``[slurm.shapes.<prefix>]`` whose prefix its name starts with, followed by
digits or ``-``/``_`` and digits (the longest prefix wins). A node of no shape is not the
broker's: resume leaves it alone (and says so in the log); exclude such nodes from power saving
with ``SuspendExcNodes``/``SuspendExcParts``.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

DEFAULT_LOG = "/var/log/broker/slurm.log"

# ---------------------------------------------------------------------------------------------
# configuration
@dataclass(frozen=True)
class Shape:
    """What one cloud node of a name prefix is: GPU model and count, and quoting defaults."""

    prefix: str
    gpu: str = ""
    gpus: int = 1
    min_gpu_memory_gb: int = 0
    hours: float = 1.0
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmSettings:
    enabled: bool = False
    cluster: str = "default"
    squeue: str = "/usr/bin/squeue"
    sinfo: str = "/usr/bin/sinfo"
    scontrol: str = "/usr/bin/scontrol"
    slurm_conf: str = ""
    burst_partition: str = "burst"
    onprem_partitions: tuple[str, ...] = ()
    server: str = ""
    set_node_addr: bool = True
    tenant: str = "default"
    bootstrap: str = "slurm"
    log: str = ""
    command_timeout_s: float = 30.0
    rpc_timeout_s: float = 600.0
    shapes: Mapping[str, Shape] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return f"slurm:{self.cluster}"

    @property
    def env(self) -> dict[str, str] | None:
        """Environment for the Slurm commands: this process's, with SLURM_CONF when configured."""
        if not self.slurm_conf:
            return None
        return {**os.environ, "SLURM_CONF": self.slurm_conf}

    def shape_for(self, node: str) -> Shape | None:
        best = None
        for prefix, shape in self.shapes.items():
            if re.fullmatch(re.escape(prefix) + r"[-_]?\d+", node) and (
                    best is None or len(prefix) > len(best.prefix)):
                best = shape
        return best

    def log_path(self, environ: Mapping[str, str] | None = None) -> str:
        environ = os.environ if environ is None else environ
        if self.log:
            return self.log
        if environ.get("BROKER_HOME"):
            return str(Path(environ["BROKER_HOME"]) / "slurm.log")
        return DEFAULT_LOG


_KEYS = {f.name for f in dataclasses.fields(SlurmSettings)} | {"onprem_partition"}
_SHAPE_KEYS = {f.name for f in dataclasses.fields(Shape)} - {"prefix"}


def settings_from_config(section: Mapping[str, Any]) -> SlurmSettings:
    """``[slurm]`` → :class:`SlurmSettings`; a bad key raises ConfigError naming it."""
    from broker.config import ConfigError

    def bad(key: str, msg: str) -> ConfigError:
        return ConfigError(f"config: slurm.{key} {msg}")

    for k in section:
        if k not in _KEYS:
            raise bad(k, f"is not a known key ({', '.join(sorted(_KEYS))})")
    out: dict[str, Any] = {}
    for k in ("enabled", "set_node_addr"):
        if k in section:
            if not isinstance(section[k], bool):
                raise bad(k, f"must be true or false, got {section[k]!r}")
            out[k] = section[k]
    for k in ("cluster", "squeue", "sinfo", "scontrol", "slurm_conf", "burst_partition", "server",
              "tenant", "bootstrap", "log"):
        if k in section:
            if not isinstance(section[k], str):
                raise bad(k, f"must be a string, got {section[k]!r}")
            out[k] = section[k].strip()
    for k in ("squeue", "sinfo", "scontrol"):
        if k in out and not os.path.isabs(out[k]):
            raise bad(k, f"must be an absolute path (Slurm runs the programs with no PATH), got {out[k]!r}")
    if "burst_partition" in out and not re.fullmatch(r"[A-Za-z0-9_.-]+", out["burst_partition"]):
        raise bad("burst_partition", f"must be one partition name, got {out['burst_partition']!r}")
    if "cluster" in out and not out["cluster"]:
        raise bad("cluster", "must not be empty")
    parts: list[str] = []
    if "onprem_partition" in section:
        v = section["onprem_partition"]
        if not isinstance(v, str):
            raise bad("onprem_partition", f"must be a string, got {v!r}")
        parts.append(v)
    if "onprem_partitions" in section:
        v = section["onprem_partitions"]
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise bad("onprem_partitions", f"must be a list of partition names, got {v!r}")
        parts.extend(v)
    parts = [p.strip() for p in parts if p.strip()]
    if parts:
        burst = out.get("burst_partition", SlurmSettings.burst_partition)
        if burst in parts:
            raise bad("onprem_partitions", f"must not name the burst partition {burst!r}")
        out["onprem_partitions"] = tuple(dict.fromkeys(parts))
    for k in ("command_timeout_s", "rpc_timeout_s"):
        if k in section:
            v = section[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise bad(k, f"must be a positive number, got {v!r}")
            out[k] = float(v)
    shapes = section.get("shapes", {})
    if not isinstance(shapes, Mapping):
        raise bad("shapes", "must be a table of [slurm.shapes.<node name prefix>] tables")
    parsed: dict[str, Shape] = {}
    for prefix, s in shapes.items():
        parsed[prefix] = _shape_from_config(prefix, s, bad)
    out["shapes"] = parsed
    return SlurmSettings(**out)


def _shape_from_config(prefix: str, s: Any, bad) -> Shape:
    """``[slurm.shapes.<prefix>]`` → :class:`Shape`; ``bad(key, message)`` makes the error."""
    where = f"shapes.{prefix}"
    if not isinstance(s, Mapping):
        raise bad(where, "must be a table (gpu, gpus, min_gpu_memory_gb, hours, providers, regions)")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", prefix):
        raise bad(where, "must be a node name prefix (letters, digits, - and _)")
    for k in s:
        if k not in _SHAPE_KEYS:
            raise bad(f"{where}.{k}", f"is not a known key ({', '.join(sorted(_SHAPE_KEYS))})")
    gpu = s.get("gpu", "")
    if not isinstance(gpu, str):
        raise bad(f"{where}.gpu", f"must be a GPU model name, got {gpu!r}")
    ints = {}
    for k, lo in (("gpus", 1), ("min_gpu_memory_gb", 0)):
        v = s.get(k, 1 if k == "gpus" else 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise bad(f"{where}.{k}", f"must be a whole number of at least {lo}, got {v!r}")
        ints[k] = v
    hours = s.get("hours", 1.0)
    if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not (
            math.isfinite(hours) and hours > 0):
        raise bad(f"{where}.hours", f"must be a positive number, got {hours!r}")
    if not gpu.strip() and not ints["min_gpu_memory_gb"]:
        raise bad(where, "needs gpu (a model such as \"L4\") or min_gpu_memory_gb")
    lists = {}
    for k in ("providers", "regions"):
        v = s.get(k, [])
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise bad(f"{where}.{k}", f"must be a list of names, got {v!r}")
        lists[k] = tuple(x.strip() for x in v if x.strip())
    return Shape(prefix, gpu.strip().upper(), ints["gpus"], ints["min_gpu_memory_gb"],
                 float(hours), lists["providers"], lists["regions"])
