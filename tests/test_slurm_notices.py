"""A notice for a Slurm lease, against a real slurmctld/slurmd: the lease's nodes are drained and
the jobs running on them requeued through the Slurm command layer (``scontrol``), so Slurm puts
them back in the queue (and resumes other cloud nodes for them) while the node still runs."""
from __future__ import annotations

import time

import pytest

from broker import config as cfgmod
from broker.service import Service
from broker.slurm.watcher import slurm_source
from providers.base import Instance, InstanceState, Market
from providers.notices import Notice, NoticeKind
from tests.slurm.cluster import BIN, SlurmCluster
from tests.slurm.fixtures import slurm_cluster  # noqa: F401  (the session fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:  # noqa: F811
    c = slurm_cluster
    c.cancel_all(wait=15)
    for spec in c.onprem:
        if c.node_states().get(spec.name, "").rstrip("*~#%!$@^-") not in ("IDLE",):
            c.resume(spec.name)
    c.wait_nodes([n.name for n in c.onprem], {"IDLE"}, timeout=20)
    yield c
    c.cancel_all(wait=15)
    for spec in c.onprem:  # back in service (a node that was not drained refuses: no matter)
        c.cmd("scontrol", "update", f"nodename={spec.name}", "state=resume", check=False)


def slurm_lease(svc: Service, node: str, iid: str):
    """A running spot lease whose node is the Slurm node ``node`` (as a resume launches one)."""
    from broker.lifecycle import Target

    lc = svc.lifecycle
    t = Target("aws", "us-east-1", "us-east-1a", "g5.xlarge", Market.SPOT, 1, 500_000)
    lease, _ = lc.create(idempotency_key=f"slurm-{node}", target=t, job={"node_names": [node]})
    lease = lc._begin_attempt(lease, t, [])
    return lc.adopt(lease, [Instance("aws", iid, "us-east-1", "us-east-1a", "g5.xlarge", Market.SPOT,
                                     InstanceState.RUNNING, lease.lease_id, node)])


def test_a_notice_drains_the_slurm_node_and_requeues_its_jobs(cluster, tmp_path):
    c = cluster
    job = c.sbatch("sleep 300", gres="gpu:1", extra=("--nodelist=gpu-1", "--requeue"))
    other = c.sbatch("sleep 300", gres="gpu:1", extra=("--nodelist=gpu-2",))
    c.wait_job(job, {"RUNNING"})
    c.wait_job(other, {"RUNNING"})
    cfg = cfgmod.load(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path / 'b.db'}"})
    svc = Service(cfg, providers={})
    try:
        # as [slurm] enabled builds it (the commands of this test cluster)
        slurm = slurm_source({"enabled": True, "scontrol": BIN["scontrol"], "squeue": BIN["squeue"],
                              "sinfo": BIN["sinfo"], "slurm_conf": c.env["SLURM_CONF"]})
        svc.schedulers = {slurm.source: slurm}
        lease = slurm_lease(svc, "gpu-1", "i-0123456789abcdef0")
        (out,) = svc.notices.handle(Notice("aws", NoticeKind.PREEMPTION, ("i-0123456789abcdef0",),
                                           "aws.ec2: EC2 Spot Instance Interruption Warning"))
        assert out.requeued == [job] and out.acted and not out.replacement
        assert "DRAIN" in c.node_states()["gpu-1"].upper()
        deadline = time.monotonic() + 30
        # a requeued job passes through COMPLETING on its way back to PENDING
        while c.job_state(job)[0] in ("RUNNING", "COMPLETING") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.job_state(job)[0] in ("PENDING", "REQUEUED", "CONFIGURING"), c.job_state(job)
        assert c.job_state(other)[0] == "RUNNING"  # another node's job is left alone
        (ev,) = [e for e in svc.store.events_of(lease.lease_id) if e.kind == "interruption_notice"]
        assert f"slurm:default jobs {job} requeued" in ev.message and out.scheduler == "slurm:default"
        assert svc.store.get_lease(lease.lease_id).state == "running"  # until the cloud takes it
        assert "aws/us-east-1/g5.xlarge/spot" in svc.store.active_blocks(time.time())
        # Again (SQS delivers at least once): nothing more.
        (again,) = svc.notices.handle(Notice("aws", NoticeKind.PREEMPTION, ("i-0123456789abcdef0",), "x"))
        assert again.note == "notice already acted on"
    finally:
        svc.stop()


def test_a_node_slurm_does_not_know_is_not_slurms(cluster, tmp_path):
    """Slurm answers for its own nodes only: a lease of nodes it has never heard of goes on to
    the next scheduler, and with none left the notice says so."""
    c = cluster
    slurm = slurm_source({"enabled": True, "scontrol": BIN["scontrol"], "squeue": BIN["squeue"],
                          "sinfo": BIN["sinfo"], "slurm_conf": c.env["SLURM_CONF"]})
    from broker.watchers.base import UnknownNodes

    with pytest.raises(UnknownNodes, match="slurm:default has no node elsewhere-7"):
        slurm.drain_and_requeue(["elsewhere-7"], "broker: test")
    cfg = cfgmod.load(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path / 'b.db'}"})
    svc = Service(cfg, providers={})
    try:
        svc.schedulers = {slurm.source: slurm}
        slurm_lease(svc, "elsewhere-7", "i-0aaaaaaaaaaaaaaa0")
        (out,) = svc.notices.handle(Notice("aws", NoticeKind.PREEMPTION, ("i-0aaaaaaaaaaaaaaa0",), "x"))
        assert out.requeued == [] and out.note == "no watched scheduler knows nodes elsewhere-7"
        assert all(s.rstrip("*~#%!$@^-") == "IDLE" for s in c.node_states().values() if s)  # nothing drained
    finally:
        svc.stop()
