"""``broker serve`` with ``[kubernetes] enabled = true`` against the fake API server and the fake
clouds: the autoscaler reads the cluster, decides as it does for the equivalent Slurm queue, and
launches a lease for the chosen job whose node joins with the kubeadm boot template (the script
the cloud received, run against a stand-in kubeadm); the joined node is burst capacity, not
on-prem, and the job is not burst twice."""
from __future__ import annotations

import base64
import time

import pytest

from broker import config as cfgmod
from broker.lease import LeaseState
from broker.watchers.registry import build_watchers
from broker_sandbox.kubernetes import FakeKubeApi, node, pod
from providers.registry import build_enabled
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.grpc_server import running_server
from tests.kube_equivalent import OVERDUE
from tests.test_bootstrap import RECORD, recorded, run
from tests.test_kubernetes_equivalence import decide

pytestmark = pytest.mark.timeout(240)

TOKEN = "abcdef.0123456789abcdef"
CA_HASH = "sha256:" + "ab" * 32
AUTOSCALER = {"enabled": True, "default_gpu_model": "L4", "trigger": {"stabilization_s": 0, "cooldown_s": 0}}


def boot_scripts(clouds) -> list[str]:  # noqa: F811
    """The user data of every live instance, decoded, whichever cloud holds it."""
    alive = clouds.alive_instances()
    out = [base64.b64decode(i["user_data_b64"]).decode() for i in alive["aws"] if i["user_data_b64"]]
    for i in alive["gcp"]:
        out += [m["value"] for m in (i.get("metadata") or {}).get("items") or () if m["key"] == "startup-script"]
    for vm in alive["azure"]:
        ud = (vm.get("properties") or {}).get("userData")
        if ud:
            out.append(base64.b64decode(ud).decode())
    return out


@pytest.fixture
def kube():
    api = FakeKubeApi(bookmark_interval_s=0.2).start()
    yield api
    api.stop()


def test_kubernetes_enabled_bursts_like_slurm_and_the_node_joins_with_kubeadm(clouds, kube, tmp_path):  # noqa: F811
    now = int(time.time())
    OVERDUE.load_into(kube, now)
    defaults = tmp_path / "node" / "kubelet"
    cfg = {"autoscaler": AUTOSCALER, "providers": clouds.provider_tables(),
           "kubernetes": {"enabled": True, "cluster": "prod", "watch_timeout_s": 2,
                          "kubeconfig": str(kube.kubeconfig(tmp_path / "kubeconfig"))},
           "bootstrap": {"kubernetes": {"api_server": "127.0.0.1:6443", "token": TOKEN, "ca_cert_hash": CA_HASH,
                                        "node_labels": {"broker.io/pool": "burst"},
                                        "kubelet_defaults_path": str(defaults)}}}
    providers = build_enabled(cfg["providers"], "broker-test")
    with running_server(tmp_path, providers=providers, config=cfg) as (_, svc):
        assert set(svc.schedulers) == {"kubernetes:prod"}
        decisions = svc.autoscaler.tick()
        assert len(decisions) == 1
        d = decisions[0]

        # the decision the same queue gets on Slurm
        slurm_cfg = cfgmod.load(None, environ={}, overrides={
            "autoscaler": AUTOSCALER, "slurm": OVERDUE.slurm_table(tmp_path / "slurm", now)})
        sdiag, sdec = decide(slurm_cfg, build_watchers(slurm_cfg)["slurm:eq"].snapshot(now), now)
        assert (d.action, d.trigger) == (sdec.action, sdec.trigger) == ("burst", "wait")
        assert [OVERDUE.kube_id(c.job.job_id) for c in d.jobs] == [c.job.job_id for c in sdec.jobs] == ["301", "302"]
        assert svc.diagnose(None).verdict == sdiag.verdict

        # one lease per job, launched with the kubeadm template
        leases = {l.job["job_id"]: l for l in svc.store.list_leases()}
        assert set(leases) == {"ml/job-301", "ml/job-302"}, [r.reason for r in svc.decisions()]
        assert {(l.bootstrap, l.job["source"], l.state) for l in leases.values()} == {
            ("kubernetes", "kubernetes:prod", LeaseState.RUNNING)}
        lease = leases["ml/job-301"]
        scripts = boot_scripts(clouds)
        assert len(scripts) == 2
        script = next(s for s in scripts if f"BROKER_LEASE_ID={lease.lease_id}" in s)
        node_name = lease.instances[0]["node_name"]
        result = run(script, tmp_path, {"kubeadm": RECORD})
        assert result.returncode == 0, result.stderr
        args, _ = recorded(tmp_path, "kubeadm")
        assert args == ["join", "127.0.0.1:6443", "--token", TOKEN, "--discovery-token-ca-cert-hash", CA_HASH,
                        "--node-name", node_name]
        labels = dict(kv.split("=") for kv in defaults.read_text().strip().split("--node-labels=")[1].split(","))
        assert labels["broker.io/lease"] == lease.lease_id and labels["broker.io/pool"] == "burst"
        assert labels["broker.io/provider"] == lease.provider

        # the node joins (labelled by the script) and the pod runs on it
        kube.put("nodes", node(node_name, gpus=4, product="NVIDIA-L4", labels=labels))
        kube.put("pods", pod("job-301", "ml", gpus=4, phase="Running", node=node_name, created=now - 7200))
        watcher = svc.schedulers["kubernetes:prod"]

        def joined_and_running():
            s = watcher.snapshot()
            return s if any(n.name == node_name for n in s.nodes) and s.running and \
                not any(j.job_id == "ml/job-301" for j in s.pending) else None

        snap = _until(joined_and_running)
        joined = next(n for n in snap.nodes if n.name == node_name)
        assert joined.state == "cloud" and snap.gpus_total == 32  # burst capacity is not on-prem
        svc.autoscaler.tick()
        assert len(svc.store.list_leases()) == 2  # not burst twice


def _until(pred, timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out waiting for the joined node")
