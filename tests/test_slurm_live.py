"""`broker diagnose` and the Slurm watcher against a real slurmctld/slurmd on loopback.

One cluster per session (tests/slurm/fixtures.py): gpu-[1-2] with 4 fake a100 GPUs each and the
CLOUD nodes burst-[1-2]. Each test starts from an empty queue with every node in service.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.slurm.watcher import SlurmWatcher
from tests.slurm.cluster import BIN, SlurmCluster
from tests.slurm.fixtures import slurm_cluster  # noqa: F401  (the session fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:  # noqa: F811
    c = slurm_cluster
    c.cancel_all(wait=15)
    # Only a drained or down node takes "state=resume": one whose jobs are still completing
    # (MIXED, COMPLETING) refuses it ("Invalid node state specified") and turns IDLE by itself.
    for spec in c.onprem:
        if c.node_states().get(spec.name, "").rstrip("*~#%!$@^-").startswith(("DRAIN", "DOWN", "FAIL")):
            c.resume(spec.name)
    c.wait_nodes([n.name for n in c.onprem], {"IDLE"}, timeout=30)
    return c


def watcher(c: SlurmCluster, *, prefer_json: bool = True) -> SlurmWatcher:
    return SlurmWatcher(squeue=BIN["squeue"], sinfo=BIN["sinfo"], scontrol=BIN["scontrol"],
                        source="slurm:live", env=c.env, prefer_json=prefer_json)


def run_cli(c: SlurmCluster, *args: str):
    r = CliRunner().invoke(app, ["diagnose", "--squeue-bin", BIN["squeue"], "--sinfo-bin",
                                 BIN["sinfo"], "--scontrol-bin", BIN["scontrol"], *args],
                           env={"SLURM_CONF": str(c.conf)})
    assert r.exit_code == 0, r.output
    return r


def wait_reasons(c: SlurmCluster, job_ids: list[str], timeout: float = 20.0) -> None:
    """Until slurmctld has evaluated each pending job once (a reason other than None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = {str(j["job_id"]): (j["job_state"], j["state_reason"]) for j in c.jobs()}
        if all(states.get(j, ("", ""))[0] == "PENDING" and states[j][1] != "None"
               for j in job_ids):
            return
        time.sleep(0.25)
    raise AssertionError(f"jobs {job_ids} not evaluated: {states}")


def test_resource_bound_on_a_full_cluster(cluster):
    c = cluster
    running = [c.sbatch("sleep 300", gres="gpu:4", name=f"train-{i}") for i in (1, 2)]
    for j in running:
        c.wait_job(j, {"RUNNING"})
    waiting = [c.sbatch("sleep 300", gres="gpu:2", name="train-more"),
               c.sbatch("sleep 300", gres="gpu:2", name="eval-suite"),
               c.sbatch("sleep 300", gres="gpu:1", name="tune-lr",
                        comment="broker:interruptible=1,checkpoint=10")]
    wait_reasons(c, waiting)

    doc = json.loads(run_cli(c, "--format", "json", "--source", "slurm:live").stdout)
    assert doc["verdict"] == "resource-bound", doc
    assert doc["allocation_rate"] == 1.0 and doc["gpus_total"] == 8
    assert doc["pending_gpus"] == 5
    causes = {x["kind"]: x for x in doc["causes"]}
    assert sorted(causes["capacity"]["jobs"]) == sorted(waiting)
    assert causes["offloadable-work"]["jobs"] == [waiting[1]] or \
        sorted(causes["offloadable-work"]["jobs"]) == sorted(waiting[1:])
    assert doc["actions"][0].startswith("Burst the capacity-bound jobs")

    table = run_cli(c).stdout
    assert "Verdict: resource-bound" in table and "Allocation rate: 100.0%" in table


def test_scheduling_bound_with_a_drained_node_and_a_whole_node_request(cluster):
    c = cluster
    c.drain("gpu-2", reason="ECC errors")
    small = c.sbatch("sleep 300", gres="gpu:1", name="train-small", extra=("--nodelist=gpu-1",))
    c.wait_job(small, {"RUNNING"})
    whole = c.sbatch("sleep 300", gres="gpu:2", exclusive=True, name="train-exclusive")
    four = c.sbatch("sleep 300", gres="gpu:4", name="train-four")
    wait_reasons(c, [whole, four])

    doc = json.loads(run_cli(c, "--format", "json").stdout)
    assert doc["verdict"] == "scheduling-bound", doc
    assert doc["allocation_rate"] == pytest.approx(1 / 8)
    causes = {x["kind"]: x for x in doc["causes"]}
    assert causes["drained-nodes"]["nodes"] == ["gpu-2"]
    assert "ECC errors" in causes["drained-nodes"]["summary"]
    assert four in causes["drained-nodes"]["jobs"]
    assert causes["fragmentation"]["jobs"] == [whole]
    assert "whole-node" in causes["fragmentation"]["summary"]
    assert "capacity" not in causes
    assert doc["actions"][0].startswith("Fix scheduling before buying capacity")

    table = run_cli(c).stdout
    assert "Verdict: scheduling-bound" in table and "gpu-2" in table


def test_watcher_json_and_text_agree_on_live_output(cluster):
    c = cluster
    run = c.sbatch("sleep 300", gres="gpu:a100:3", name="eval-x", time_limit="30:00",
                   comment="broker:kind=eval,data_gb=5")
    c.wait_job(run, {"RUNNING"})
    pend = [c.sbatch("sleep 300", extra=("--gpus=6",), name="big"),
            c.sbatch("sleep 300", gres="gpu:1", name="hpo-a", extra=("--array=0-1",
                                                                     "--hold"))]
    # Both formats read the same moment only once the cluster holds still: the running job's
    # node allocated, and slurmctld's scheduler has given the pending job its reason (until its
    # first pass it is "None", and a pass between the two reads changed one of them).
    c.wait_nodes([r.nodes[0] for r in watcher(c).snapshot().running if r.job_id == run], {"MIXED", "ALLOCATED"})
    wait_reasons(c, [pend[0]])
    c.wait_job(pend[1], {"PENDING"}, reasons={"JobHeldUser"})
    now = time.time()
    js = watcher(c).snapshot(now)
    tx = watcher(c, prefer_json=False).snapshot(now)
    assert js.extra["formats"] == {"squeue": "json", "sinfo": "json"}
    assert tx.extra["formats"] == {"squeue": "text", "sinfo": "text"}
    key = lambda j: j.job_id  # noqa: E731
    # squeue's text format carries no QOS or priority (the JSON does): compared without them
    plain = lambda jobs: sorted((replace(j, qos="", priority=0) for j in jobs), key=key)  # noqa: E731
    assert plain(js.pending) == plain(tx.pending)
    assert sorted(js.running, key=key) == sorted(tx.running, key=key)
    assert sorted(js.nodes, key=lambda n: n.name) == sorted(tx.nodes, key=lambda n: n.name)
    p = {j.job_id: j for j in js.pending}
    assert p[pend[0]].gpus == 6
    assert {f"{pend[1]}_0", f"{pend[1]}_1"} <= set(p)
    (r,) = [x for x in js.running if x.job_id == run]
    assert r.gpus == 3 and len(r.nodes) == 1
    detail = watcher(c).job(run)
    assert detail.gpus == 3 and detail.gpu_model == "a100" and detail.time_limit_s == 1800
    assert watcher(c).job("999999") is None


def test_cloud_node_resume_program_and_on_demand_slurmd(cluster):
    c = cluster
    job = c.sbatch("sleep 300", gres="gpu:h100:8", partition=c.cloud_partition, name="burst")
    log = c.root / "programs.log"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "resume burst-" not in (
            log.read_text() if log.exists() else ""):
        time.sleep(0.2)
    line = [ln for ln in log.read_text().splitlines() if ln.startswith("resume ")][-1]
    node = line.split()[1]
    assert node in c.cloud_names
    snap = watcher(c).snapshot()
    assert {n.name: n.state for n in snap.nodes}[node] == "cloud"
    assert all(n.name not in c.cloud_names for n in snap.onprem_nodes)
    c.start_cloud_node(node)
    c.wait_job(job, {"RUNNING", "CONFIGURING"}, timeout=20)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        flags = {n["name"]: n["state_flags"] for n in json.loads(
            c.cmd("sinfo", "--json").stdout)["nodes"]}
        if "POWERING_UP" not in flags[node] and "NOT_RESPONDING" not in flags[node]:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"{node} did not register: {flags[node]}")
    (r,) = [x for x in watcher(c).snapshot().running if x.job_id == job]
    assert r.nodes == (node,) and r.gpus == 8


def test_harness_stops_everything_by_pid_file(slurm_cluster, tmp_path):  # noqa: F811
    """A second, private cluster next to the session one: own ports, munge socket, state."""
    from tests.slurm.cluster import NodeSpec, _alive, _read_pid

    c = SlurmCluster(tmp_path / "solo", onprem=[NodeSpec("solo-1", gpus=2)])
    try:
        c.start()
        assert c.ctld_port != slurm_cluster.ctld_port
        job = c.sbatch("sleep 300", gres="gpu:2")
        c.wait_job(job, {"RUNNING"})
        pids = {k: _read_pid(p) for k, p in c.pid_files().items()}
        assert all(_alive(p) for p in pids.values()), pids
    finally:
        c.stop()
    assert not any(_alive(p) for p in pids.values())
    marker = f"SLURM_CONF={c.conf}".encode()
    leftovers = []
    for entry in __import__("pathlib").Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    leftovers.append(entry.name)
            except OSError:
                pass
    assert leftovers == []
    # the session cluster is untouched
    assert watcher(slurm_cluster).snapshot().nodes


def test_missing_slurm_is_reported_with_the_reason(monkeypatch):
    from tests.slurm import cluster as harness

    monkeypatch.setitem(harness.SBIN, "slurmctld", "/nonexistent/slurmctld")
    with pytest.raises(harness.SlurmUnavailable, match="/nonexistent/slurmctld"):
        harness.ensure_slurm_installed(install=False)
