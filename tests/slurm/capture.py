"""Capture the Slurm fixtures in tests/fixtures/slurm/ from a real Slurm started here.

    /work/main/.venv/bin/python -m tests.slurm.capture [OUTDIR]   # as root; ~30 s

Starts the standard test cluster (tests/slurm/fixtures.py: gpu-[1-2] with 4 fake a100 each,
CLOUD burst-[1-2] with 8 h100 each), builds one scenario with every state the parsers must read
(running jobs with per-node, per-job and typed GPU requests and broker hints, pending jobs for
Resources/Priority, Dependency, BeginTime, held, exclusive, two-node, a job array, a bad hint,
a job on a powering-up CLOUD node, a finished job, a draining node, powered-down cloud nodes),
and writes exactly what the watcher's commands print, plus ``meta.json`` (capture time, time
zone, Slurm version, and which job id plays which role).
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from broker.slurm.records import SINFO_FORMAT, SQUEUE_FORMAT, SQUEUE_STATES
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import make_cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def build_scenario(c: SlurmCluster) -> dict[str, str]:
    """Submit the fixture scenario on a fresh cluster; returns {role: job id}."""
    roles: dict[str, str] = {}
    roles["done"] = c.sbatch("/bin/true", name="quick-check", partition="gpu")
    c.wait_job(roles["done"], {"COMPLETED"}, timeout=30)
    roles["train"] = c.sbatch(
        "sleep 600", gres="gpu:a100:3", name="train-llm", time_limit="2:00:00",
        comment="broker:kind=training,interruptible=1,checkpoint=30,data_gb=200",
        extra=("--nodelist=gpu-1",))
    roles["eval"] = c.sbatch("sleep 600", gres="gpu:1", name="eval-nightly", time_limit="1:00:00",
                             comment="broker:runtime=20", extra=("--nodelist=gpu-1",))
    roles["tune"] = c.sbatch("sleep 600", name="tune-sweep", extra=("--gpus=2",
                                                                    "--nodelist=gpu-2"))
    for role in ("train", "eval", "tune"):
        c.wait_job(roles[role], {"RUNNING"}, timeout=30)
    c.drain(c.onprem[1].name, reason="fan failure")
    roles["whole_node"] = c.sbatch("sleep 600", gres="gpu:4", exclusive=True, name="big-exclusive")
    roles["four_gpu"] = c.sbatch("sleep 600", gres="gpu:4", name="train-4gpu",
                                 comment="broker:interruptible=yes,checkpoint=15")
    roles["dependency"] = c.sbatch("sleep 600", gres="gpu:1", name="infer-after-train",
                                   extra=(f"--dependency=afterok:{roles['train']}",))
    roles["begin"] = c.sbatch("sleep 600", gres="gpu:1", name="eval-later",
                              extra=("--begin=now+1hour",))
    roles["held"] = c.sbatch("sleep 600", gres="gpu:1", name="held-job", extra=("--hold",))
    roles["two_node"] = c.sbatch("sleep 600", gres="gpu:2", nodes=2, name="ddp-2node",
                                 comment="broker:gang=ddp")
    roles["array"] = c.sbatch("sleep 600", gres="gpu:1", name="hpo-trials",
                              extra=("--array=1-3",))
    roles["bad_hint"] = c.sbatch("sleep 600", gres="gpu:1", name="oddly-hinted",
                                 comment="broker:kind=bogus,checkpoint=abc")
    roles["burst"] = c.sbatch("sleep 600", gres="gpu:h100:8", partition=c.cloud_partition,
                              name="burst-train")
    c.wait_job(roles["burst"], {"CONFIGURING", "RUNNING"}, timeout=30)
    c.wait_job(roles["whole_node"], {"PENDING"}, reasons={"Resources", "Priority"}, timeout=30)
    time.sleep(3)  # one more scheduling pass, so every pending job has its reason
    return roles


def capture(c: SlurmCluster, out: Path, roles: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    taken_at = time.time()
    files = {
        "squeue.json": ("squeue", "--json"),
        "sinfo.json": ("sinfo", "--json"),
        "squeue.txt": ("squeue", "--noheader", f"--states={SQUEUE_STATES}",
                       f"--Format={SQUEUE_FORMAT}"),
        "squeue_header.txt": ("squeue", f"--states={SQUEUE_STATES}", f"--Format={SQUEUE_FORMAT}"),
        "sinfo.txt": ("sinfo", "--noheader", "--Node", f"--Format={SINFO_FORMAT}"),
        "scontrol_job_oneliner.txt": ("scontrol", "show", "job", "-o"),
        "scontrol_job.txt": ("scontrol", "show", "job"),
    }
    for name, argv in files.items():
        (out / name).write_text(c.cmd(*argv).stdout)
    version = c.cmd("sinfo", "--version").stdout.strip()
    meta = {"taken_at": taken_at, "tz": time.strftime("%z"), "tzname": time.tzname[0],
            "slurm": version, "roles": roles,
            "nodes": {"onprem": [n.name for n in c.onprem], "cloud": c.cloud_names}}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else FIXTURES
    with tempfile.TemporaryDirectory(prefix="slurm-capture-") as tmp:
        cluster = make_cluster(Path(tmp))
        try:
            cluster.start()
            roles = build_scenario(cluster)
            capture(cluster, out, roles)
        finally:
            cluster.stop()
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
