"""End to end on a real Slurm: `broker serve` (the autoscaler watching Slurm) against the three
mocked clouds, and slurmctld running the broker as its ResumeProgram / SuspendProgram /
ResumeFailProgram (deploy/slurm/*.sh, with their three variables pointed at this checkout).

The cluster: gpu-[1-2] on-prem (2 fake a100 each, partition gpu) and the CLOUD nodes burst-[1-2]
(1 l4 each, partition burst). The test plays the part of the cloud VM booting: when the mocked
cloud has an instance for node burst-N, it starts that node's slurmd (``slurmd -b -N burst-N``),
and stops it again once the instance is terminated. Loopback only: the mocked instances'
private IPs are not on this machine, so ``[slurm] set_node_addr = false`` (the nodes keep
NodeAddr=127.0.0.1).

(a) a resource-bound queue: a job that does not fit on-prem is burst, Slurm resumes a cloud node
    through `broker slurm resume`, the job runs there, and after SuspendTime the node is
    suspended through `broker slurm suspend` and its instance terminated;
(b) a scheduling-bound queue (a drained node, a whole-node request on a fragmented node) is held
    with the reason, and no job gets the burst partition;
(c) ... until one job's wait exceeds half its runtime: that one bursts all the same.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest

from broker.client import BrokerClient
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.clouds.three import ServeProcess, clouds, clouds_server, write_config  # noqa: F401
from tests.conftest import ROOT
from tests.slurm.cluster import BIN, NodeSpec, SlurmCluster, SlurmUnavailable, ensure_slurm_installed
from tests.slurm.fixtures import write_program

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

SUSPEND_TIME = 10
DEPLOY = ROOT / "deploy" / "slurm"


def render_program(src: Path, dest: Path, **values: str) -> str:
    """A deploy/slurm script with its top variables (NAME=value lines) set for this test."""
    text = src.read_text()
    for name, value in values.items():
        text, n = re.subn(rf"^{name}=\S+", f"{name}={value}", text, count=1, flags=re.M)
        assert n == 1, f"{src} has no {name}= line"
    dest.write_text(text)
    dest.chmod(0o755)
    return str(dest)


def broker_command(root: Path) -> str:
    """The broker console script of this venv (its shebang is the venv's python), or a wrapper."""
    script = Path(sys.executable).parent / "broker"
    if script.exists():
        return str(script)
    return write_program(root / "broker", f'exec {sys.executable} -m broker.cli "$@"\n')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the real-Slurm tests need root (slurmd, mknod for the fake GPUs)")
    try:
        ensure_slurm_installed()
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm is not available: {exc}")
    root = tmp_path_factory.mktemp("slurm-e2e")
    broker = broker_command(root)
    progs = {}
    for name in ("resume", "suspend", "resume_fail"):
        progs[name] = render_program(DEPLOY / f"{name}.sh", root / f"broker-{name}.sh", BROKER=broker,
                                     BROKER_CONFIG=str(root / "broker.toml"), BROKER_LOG=str(root / "slurm.log"))
    c = SlurmCluster(root, onprem=[NodeSpec("gpu-1", gpus=2), NodeSpec("gpu-2", gpus=2)], cloud_nodes=2,
                     cloud_spec=NodeSpec("burst", gpus=1, gpu_type="l4", cpus=4),
                     resume_program=progs["resume"], suspend_program=progs["suspend"],
                     resume_fail_program=progs["resume_fail"], suspend_time=SUSPEND_TIME,
                     suspend_timeout=5, resume_timeout=90)
    prolog = render_program(DEPLOY / "slurmctld-prolog.sh", root / "broker-prolog.sh",
                            SLURM_CONF=str(c.conf), MAX_WAIT="90")
    c.extra_conf = "\n".join(["SuspendExcParts=gpu", "SlurmctldParameters=idle_on_node_suspend",
                              f"PrologSlurmctld={prolog}",
                              # where tuning/eval/inference go off the training queue: the
                              # cloud nodes first ([slurm] offload_partition)
                              f"PartitionName=light Nodes={','.join(c.cloud_names)} MaxTime=INFINITE State=UP"])
    try:
        c.start()
        yield c
    finally:
        c.stop()


class Broker:
    """`broker serve` for one test, configured for this cluster and the mocked clouds."""

    def __init__(self, cluster: SlurmCluster, clouds, tmp_path: Path, **trigger) -> None:  # noqa: F811
        self.cluster, self.clouds = cluster, clouds
        self.config = cluster.root / "broker.toml"  # where the deploy scripts look
        self.serve = ServeProcess(self.config, tmp_path)
        write_config(
            self.config, clouds, f"sqlite:///{tmp_path / 'broker.db'}",
            autoscaler={"enabled": True, "interval_s": 1,
                        "trigger": {"stabilization_s": 0, "cooldown_s": 0, "pending_gpus_threshold": 0,
                                    **trigger},
                        "selection": {"min_wait_share": 0.0, "startup_s": 10}},
            slurm={"enabled": True, "cluster": "e2e", "squeue": BIN["squeue"], "sinfo": BIN["sinfo"],
                   "scontrol": BIN["scontrol"], "slurm_conf": str(cluster.conf), "burst_partition": "burst",
                   "onprem_partitions": ["gpu"], "server": self.serve.address, "set_node_addr": False,
                   "log": str(cluster.root / "slurm.log"), "shapes": {"burst": {"gpu": "L4", "gpus": 1}},
                   "offload_partition": "light"},
        )
        self.address = self.serve.address

    def start(self) -> "Broker":
        self.serve.start()
        return self

    def decisions(self) -> list[pb.Decision]:
        with grpc.insecure_channel(self.address) as ch:
            return list(pb_grpc.BrokerStub(ch).ListDecisions(pb.ListDecisionsRequest(limit=500), timeout=10).decisions)

    def diagnosis(self) -> pb.Diagnosis:
        with grpc.insecure_channel(self.address) as ch:
            return pb_grpc.BrokerStub(ch).Diagnose(pb.DiagnoseRequest(), timeout=10).diagnosis

    def leases(self) -> list[dict[str, Any]]:
        with BrokerClient(self.address, timeout=10) as c:
            return c.list_leases()

    def cloud_nodes(self) -> dict[str, str]:
        """Alive instances in the mocked clouds that carry a Slurm cloud node name: {node: cloud}."""
        alive = self.clouds.alive_instances()
        names = {(i.get("tags") or {}).get("Name", ""): "aws" for i in alive["aws"]}
        names.update({i["name"]: "gcp" for i in alive["gcp"]})
        names.update({i["name"]: "azure" for i in alive["azure"]})
        return {n: c for n, c in names.items() if n in self.cluster.cloud_names}

    def log_events(self) -> list[dict]:
        path = self.cluster.root / "slurm.log"
        return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.3, why: Callable[[], str] = str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s. {why()}")


def partitions(c: SlurmCluster, job_id: str) -> set[str]:
    out = c.scontrol("show", "job", "-o", job_id)
    return set(re.search(r"\bPartition=(\S+)", out).group(1).split(","))


def job_nodes(c: SlurmCluster, job_id: str) -> str:
    return next(str(j.get("nodes", "")) for j in c.jobs() if str(j["job_id"]) == job_id)


@pytest.fixture
def broker(request, cluster, clouds, tmp_path):  # noqa: F811
    """A fresh broker per test (``[autoscaler.trigger]`` keys as the indirect parameter);
    afterwards every cloud node is powered down again (through the broker, which releases what is
    left), its slurmd stopped, and the on-prem nodes resumed."""
    c = cluster
    b = Broker(c, clouds, tmp_path, **getattr(request, "param", {}))
    yield b
    c.cancel_all(wait=15)
    up = [n for n, s in c.node_states().items() if n in c.cloud_names and not s.endswith("~")]
    if up and b.serve.proc is not None:
        c.cmd("scontrol", "update", f"nodename={','.join(up)}", "state=power_down_force", check=False)
        try:
            wait_for("cloud nodes powered down", lambda: all(
                c.node_states().get(n, "").endswith("~") for n in up), 30, why=c.node_states)
        finally:
            for n in c.cloud_names:
                c.stop_slurmd(n)
    for n in c.cloud_names:
        c.stop_slurmd(n)
    code = b.serve.stop() if b.serve.proc is not None else 0
    for spec in c.onprem:
        if c.node_states().get(spec.name, "").rstrip("*~#%!$@^-") != "IDLE":
            c.resume(spec.name)
    c.wait_nodes([n.name for n in c.onprem], {"IDLE"}, timeout=20)
    assert code == 0, b.serve.log.read_text()[-3000:]


def test_resource_bound_job_bursts_to_a_cloud_node_and_is_suspended_after(broker, cluster):
    c, b = cluster, broker
    full = [c.sbatch("sleep 600", gres="gpu:2", partition="gpu", name=f"train-{i}") for i in (1, 2)]
    for j in full:
        c.wait_job(j, {"RUNNING"})
    job = c.sbatch("sleep 3", gres="gpu:1", partition="gpu", time_limit="30", name="train-more")
    # it does not fit on-prem: it waits, and only on the on-prem partition
    c.wait_job(job, {"PENDING"}, reasons={"Resources"}, timeout=20)
    assert partitions(c, job) == {"gpu"} and b.cloud_nodes() == {}

    b.start()
    burst = wait_for("a burst decision for the job", lambda: [
        d for d in b.decisions() if d.action == "burst" and job in d.job_ids], 30,
        why=lambda: str([(d.action, d.reason) for d in b.decisions()]))
    # the verdict that drove the decision is in its reason; the live diagnosis is not asserted here:
    # once the job is offered the burst partition the queue is short again and the next tick may
    # already say healthy (a loaded machine showed exactly that)
    assert "resource-bound" in burst[0].reason, burst[0].reason

    # Slurm ran ResumeProgram = `broker slurm resume`: an instance named after the node
    nodes = wait_for("a cloud instance for a burst node", b.cloud_nodes, 45,
                     why=lambda: f"slurm.log: {b.log_events()[-5:]}; nodes: {c.node_states()}")
    (node,) = nodes
    # the instance exists a moment before the Launch that made it returns: wait for the lease
    (lease,) = wait_for("the lease running", lambda: [l for l in b.leases() if l["state"] == "running"], 30,
                        why=lambda: str([(l["state"], l["state_reason"]) for l in b.leases()]))
    assert len(b.leases()) == 1 and lease["job"]["job_id"] == job
    assert [i["node_name"] for i in lease["instances"]] == [node]
    assert lease["idempotency_key"].startswith(f"slurm-{node}-")
    assert "burst" in partitions(c, job)

    # the VM boots: its slurmd registers, the job runs there and completes
    c.start_cloud_node(node)
    c.wait_job(job, {"COMPLETED"}, timeout=60)
    assert job_nodes(c, job) == node
    assert all(c.job_state(j)[0] == "RUNNING" for j in full)  # on-prem work untouched

    # idle for SuspendTime: SuspendProgram = `broker slurm suspend` releases the lease
    wait_for("the lease released", lambda: b.leases()[0]["state"] == "released", SUSPEND_TIME + 45,
             why=lambda: f"{b.leases()[0]['state']}; nodes {c.node_states()}; log {b.log_events()[-3:]}")
    assert b.cloud_nodes() == {}, "the instance is terminated in the mocked cloud"
    c.stop_slurmd(node)  # the VM is gone
    assert "suspended" in b.leases()[0]["state_reason"]
    events = [(e["command"], e["event"]) for e in b.log_events()]
    assert ("resume", "launched") in events and ("suspend", "released") in events
    wait_for(f"{node} powered down", lambda: c.node_states()[node].endswith("~"), 20, why=c.node_states)


def _scheduling_bound_queue(c: SlurmCluster, b: Broker) -> tuple[str, str, float]:
    """A drained node and a whole-node job on a half-used cluster: the broker holds, naming why.
    Returns (the short whole-node job, the 2-GPU job, when they were submitted)."""
    c.drain("gpu-2", reason="ECC errors")
    small = c.sbatch("sleep 600", gres="gpu:1", partition="gpu", name="train-small", extra=("--nodelist=gpu-1",))
    c.wait_job(small, {"RUNNING"})
    # a short whole-node job (runtime 1 min) and a 2-GPU job: 3 of 4 on-prem GPUs are free or
    # drained, the queue waits on scheduling, not on capacity
    short = c.sbatch("sleep 3", gres="gpu:1", partition="gpu", exclusive=True, name="eval-short",
                     time_limit="10", comment="broker:runtime=1")
    wide = c.sbatch("sleep 3", gres="gpu:2", partition="gpu", name="train-wide", time_limit="30")
    submitted = time.monotonic()
    for j in (short, wide):
        c.wait_job(j, {"PENDING"}, reasons={"Resources", "Priority"}, timeout=20)

    b.start()
    hold = wait_for("a hold decision", lambda: [d for d in b.decisions() if d.action == "hold"], 20,
                    why=lambda: str([(d.action, d.reason) for d in b.decisions()]))
    assert "scheduling-bound" in hold[0].reason and "did not burst, because" in hold[0].reason, hold[0].reason
    diag = b.diagnosis()
    assert diag.verdict == pb.VERDICT_SCHEDULING_BOUND
    causes = {x.kind: x for x in diag.causes}
    assert list(causes["drained-nodes"].nodes) == ["gpu-2"] and wide in causes["drained-nodes"].jobs
    assert list(causes["fragmentation"].jobs) == [short]
    time.sleep(2)
    assert b.leases() == [] and b.cloud_nodes() == {}
    assert partitions(c, short) == {"gpu"} and partitions(c, wide) == {"gpu"}
    assert not [d for d in b.decisions() if d.action == "burst"]
    return short, wide, submitted


def test_scheduling_bound_queue_is_held_even_when_a_job_is_overdue(broker, cluster):
    """Schedule first: the short job waits past half its runtime and still stays home; the hold
    says why, with the drain reason and the fix."""
    c, b = cluster, broker
    short, wide, submitted = _scheduling_bound_queue(c, b)
    overdue = wait_for("a hold that names the overdue job", lambda: [
        d for d in b.decisions() if d.action == "hold" and "burst_overdue_when_scheduling_bound" in d.reason],
        60, why=lambda: str([(d.action, d.reason) for d in b.decisions()]))
    assert time.monotonic() - submitted >= 30
    reason = overdue[0].reason
    assert reason.startswith("did not burst, because scheduling-bound: "), reason
    assert "gpu-2: ECC errors" in reason and "Fix: Repair the drained nodes" in reason, reason
    assert "1 job (1 GPU) waits past the wait target (class default 4.0 h; the lesser of the class target and " \
        "0.5 x runtime)" in reason, reason
    assert not [d for d in b.decisions() if d.action == "burst"]
    assert b.leases() == [] and b.cloud_nodes() == {}
    assert partitions(c, short) == {"gpu"} and partitions(c, wide) == {"gpu"}


@pytest.mark.parametrize("broker", [{"burst_overdue_when_scheduling_bound": True}], indirect=True)
def test_opt_in_bursts_the_overdue_job_of_a_scheduling_bound_queue(broker, cluster):
    c, b = cluster, broker
    short, wide, submitted = _scheduling_bound_queue(c, b)
    # the short job has now waited over half its 60 s runtime: with the opt-in it bursts
    burst = wait_for("a burst decision for the overdue job", lambda: [
        d for d in b.decisions() if d.action == "burst"], 60,
        why=lambda: str([(d.action, d.reason) for d in b.decisions()]))
    assert time.monotonic() - submitted >= 30
    assert list(burst[0].job_ids) == [short], burst[0].reason
    assert "the wait exceeds the wait target (class default 4.0 h" in burst[0].reason
    (node,) = wait_for("a cloud instance for the overdue job", b.cloud_nodes, 45,
                       why=lambda: f"slurm.log: {b.log_events()[-5:]}")
    c.start_cloud_node(node)
    c.wait_job(short, {"COMPLETED"}, timeout=60)
    assert job_nodes(c, short) == node
    # the rest of the scheduling-bound queue stays home
    assert c.job_state(wide)[0] == "PENDING" and partitions(c, wide) == {"gpu"}
    assert [l["job"]["job_id"] for l in b.leases()] == [short]
    assert not [d for d in b.decisions() if d.action == "burst" and wide in d.job_ids]


@pytest.mark.parametrize("broker", [{"threshold_trigger": False, "wait_trigger": False}], indirect=True)
def test_eval_jobs_blocking_training_move_to_the_offload_partition_and_training_starts_on_prem(broker, cluster):
    """Offloadable work moves first: two eval jobs queued ahead of a training job go to the
    offload partition (scontrol update, a decision saying so), and when an on-prem node frees
    up the training job starts there instead of behind them."""
    c, b = cluster, broker
    long = c.sbatch("sleep 600", gres="gpu:2", partition="gpu", name="train-long", extra=("--nodelist=gpu-1",))
    short = c.sbatch("sleep 600", gres="gpu:2", partition="gpu", name="train-short", extra=("--nodelist=gpu-2",))
    for j in (long, short):
        c.wait_job(j, {"RUNNING"})
    evals = [c.sbatch("sleep 600", gres="gpu:2", partition="gpu", name=f"eval-{i}", time_limit="30",
                      comment="broker:kind=eval") for i in (1, 2)]
    train = c.sbatch("sleep 600", gres="gpu:2", partition="gpu", name="train-next", time_limit="30")
    for j in (*evals, train):
        c.wait_job(j, {"PENDING"}, reasons={"Resources", "Priority"}, timeout=20)

    b.start()
    moved = wait_for("an offload decision", lambda: [d for d in b.decisions() if d.action == "offload"], 30,
                     why=lambda: str([(d.action, d.reason) for d in b.decisions()]))
    assert sorted(moved[0].job_ids) == sorted(evals), moved[0].reason
    assert moved[0].reason.startswith("moved 2 tuning/eval/inference jobs (4 GPUs) to partition light before "
                                      "bursting training"), moved[0].reason
    assert [partitions(c, j) for j in evals] == [{"light"}, {"light"}], [c.scontrol("show", "job", "-o", j) for j in evals]
    assert partitions(c, train) == {"gpu"}
    # gpu-2 frees up: the training job starts on-prem, not behind the eval jobs
    c.cmd("scancel", short)
    c.wait_job(short, {"CANCELLED", "COMPLETED"}, timeout=60)
    c.wait_job(train, {"RUNNING"}, timeout=60)
    assert job_nodes(c, train) == "gpu-2"
    assert not [d for d in b.decisions() if d.action == "burst"]
