"""A notice for a Slurm lease, against a real slurmctld/slurmd: the lease's nodes are drained and
the jobs running on them requeued through the Slurm command layer (``scontrol``), so Slurm puts
them back in the queue (and resumes other cloud nodes for them) while the node still runs."""
from __future__ import annotations

import time

import pytest

from broker import config as cfgmod
from broker.service import Service
from broker.slurm.commands import Scontrol
from broker.records import Job
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
    lease, _ = lc.create(idempotency_key=f"slurm-{node}", target=t, job=Job(node_names=(node,)))
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
        svc.notices.scontrol = lambda: Scontrol(BIN["scontrol"], c.env, 30)  # as [slurm] enabled sets it
        lease = slurm_lease(svc, "gpu-1", "i-0123456789abcdef0")
        (out,) = svc.notices.handle(Notice("aws", NoticeKind.PREEMPTION, ("i-0123456789abcdef0",),
                                           "aws.ec2: EC2 Spot Instance Interruption Warning"))
        assert out.requeued == [job] and out.acted and not out.replacement
        assert "DRAIN" in c.node_states()["gpu-1"].upper()
        deadline = time.monotonic() + 30
        while c.job_state(job)[0] == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.job_state(job)[0] in ("PENDING", "REQUEUED", "CONFIGURING"), c.job_state(job)
        assert c.job_state(other)[0] == "RUNNING"  # another node's job is left alone
        (ev,) = [e for e in svc.store.events_of(lease.lease_id) if e.kind == "interruption_notice"]
        assert f"Slurm jobs {job} requeued" in ev.message
        assert svc.store.get_lease(lease.lease_id).state == "running"  # until the cloud takes it
        assert "aws/us-east-1/g5.xlarge/spot" in svc.store.active_blocks(time.time())
        # Again (SQS delivers at least once): nothing more.
        (again,) = svc.notices.handle(Notice("aws", NoticeKind.PREEMPTION, ("i-0123456789abcdef0",), "x"))
        assert again.note == "notice already acted on"
    finally:
        svc.stop()
