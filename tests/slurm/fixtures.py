"""pytest fixtures for a real Slurm on loopback (see tests/slurm/cluster.py).

Import the fixture into a test module (``from tests.slurm.fixtures import slurm_cluster``); it is
session-scoped: one cluster per test session and module, stopped by PID files at the end. It
skips, with the reason, when Slurm can be neither found nor installed, or when not root
(slurmd and the fake GPU device nodes need root).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.slurm.cluster import NodeSpec, SlurmCluster, SlurmUnavailable, ensure_slurm_installed

ONPREM = [NodeSpec("gpu-1", gpus=4, gpu_type="a100"), NodeSpec("gpu-2", gpus=4, gpu_type="a100")]
CLOUD_NODES = 2


def write_program(path: Path, body: str) -> str:
    """A Resume/Suspend program: a /bin/sh script (it gets no PATH; use absolute paths)."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def make_cluster(root: Path) -> SlurmCluster:
    """The standard test topology: gpu-[1-2] (4 × a100 each, partition gpu) and burst-[1-2]
    (CLOUD, 8 × h100, partition burst) whose Resume/Suspend/ResumeFail programs log their
    arguments to ``root/programs.log``."""
    root.mkdir(parents=True, exist_ok=True)
    log = root / "programs.log"
    progs = {}
    for name in ("resume", "suspend", "resume_fail"):
        progs[name] = write_program(root / f"{name}.sh",
                                    f'/bin/echo "{name} $1" >> {log}\nexit 0\n')
    return SlurmCluster(root, onprem=list(ONPREM), cloud_nodes=CLOUD_NODES,
                        resume_program=progs["resume"], suspend_program=progs["suspend"],
                        resume_fail_program=progs["resume_fail"])


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the real-Slurm tests need root (slurmd, mknod for the fake GPUs)")
    try:
        ensure_slurm_installed()
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm is not available: {exc}")
    cluster = make_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()
