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
    offload_partition = ""            # tuning/eval/inference jobs blocking training move here
                                      # (scontrol update jobid=... partition=...) before training
                                      # bursts; "" = the diagnosis names them, nothing moves
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

import os
import re
from pathlib import Path
from typing import Annotated, Any, Mapping

from msgspec import Meta

from providers.settings import NUMBER_LIMIT, Seconds, SettingsError, Table, bad, convert

DEFAULT_LOG = "/var/log/broker/slurm.log"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


# ---------------------------------------------------------------------------------------------
# configuration: tables of the one settings schema (broker.config)
class Shape(Table, dict=True):
    """``[slurm.shapes.<prefix>]``: what one cloud node of a name prefix is (GPU model and count)
    and its quoting defaults. ``prefix`` is the table's name."""

    gpu: str = ""
    gpus: Annotated[int, Meta(ge=1, le=1024)] = 1
    min_gpu_memory_gb: Annotated[int, Meta(ge=0, le=100_000)] = 0
    hours: Annotated[float, Meta(gt=0, le=NUMBER_LIMIT)] = 1.0
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.gpu = self.gpu.strip().upper()
        self.providers = tuple(x.strip() for x in self.providers if x.strip())
        self.regions = tuple(x.strip() for x in self.regions if x.strip())
        self.prefix = ""
        if not self.gpu and not self.min_gpu_memory_gb:
            raise bad("gpu", "or min_gpu_memory_gb is required (a model such as \"L4\", or the memory per GPU)")


class SlurmSettings(Table):
    """``[slurm]``: see the module docstring."""

    enabled: bool = False
    cluster: str = "default"
    squeue: str = "/usr/bin/squeue"
    sinfo: str = "/usr/bin/sinfo"
    scontrol: str = "/usr/bin/scontrol"
    slurm_conf: str = ""
    burst_partition: str = "burst"
    onprem_partitions: tuple[str, ...] = ()
    onprem_partition: str = ""  # the one-partition spelling of onprem_partitions
    # Where tuning/eval/inference jobs blocking training are moved before training bursts
    # (policies.offload); "" = they are not moved, the diagnosis only names them.
    offload_partition: str = ""
    server: str = ""
    set_node_addr: bool = True
    tenant: str = "default"
    bootstrap: str = "slurm"
    log: str = ""
    command_timeout_s: Seconds = 30.0
    rpc_timeout_s: Seconds = 600.0
    shapes: dict[str, Shape] = {}

    def __post_init__(self) -> None:
        for k in ("cluster", "squeue", "sinfo", "scontrol", "slurm_conf", "burst_partition", "offload_partition",
                  "server",
                  "tenant", "bootstrap", "log"):
            setattr(self, k, getattr(self, k).strip())
        for k in ("squeue", "sinfo", "scontrol"):
            if not os.path.isabs(getattr(self, k)):
                raise bad(k, f"must be an absolute path (Slurm runs the programs with no PATH), got {getattr(self, k)!r}")
        if not _NAME.fullmatch(self.burst_partition):
            raise bad("burst_partition", f"must be one partition name, got {self.burst_partition!r}")
        if self.offload_partition and not _NAME.fullmatch(self.offload_partition):
            raise bad("offload_partition", f"must be one partition name, got {self.offload_partition!r}")
        if not self.cluster:
            raise bad("cluster", "must not be empty")
        parts = [p.strip() for p in (self.onprem_partition, *self.onprem_partitions) if p.strip()]
        if self.burst_partition in parts:
            raise bad("onprem_partitions", f"must not name the burst partition {self.burst_partition!r}")
        self.onprem_partitions, self.onprem_partition = tuple(dict.fromkeys(parts)), ""
        for prefix, shape in self.shapes.items():
            if not _PREFIX.fullmatch(prefix):
                raise bad(f"shapes.{prefix}", "must be a node name prefix (letters, digits, - and _)")
            shape.prefix = prefix

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


def settings_from_config(section: SlurmSettings | Mapping[str, Any]) -> SlurmSettings:
    """The typed ``[slurm]`` settings (a raw table is checked by the schema; ConfigError names the key)."""
    if isinstance(section, SlurmSettings):
        return section
    from broker.errors import ConfigError

    try:
        return convert(dict(section), SlurmSettings, "slurm")
    except SettingsError as e:
        raise ConfigError(f"config: {e}", field=e.key) from None
