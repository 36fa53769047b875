"""Issue #17: the nodes' callback, end to end. A real `broker serve` on the mocked clouds launches
two leases with the container boot template; the boot script EC2 was given is run by a real
bash with the real curl (a stand-in `docker` that exits 0), reports to the broker's HTTP
endpoint with its lease's own credential, and the lease is released by the broker's own
reconciler. Another lease's credential, a revoked one, none or a forged one is refused before
anything is looked up; the endpoint bounds what it reads."""
from __future__ import annotations

import base64
import http.client
import json
import re
import stat
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.clouds.three import ServeProcess, clouds, clouds_server, write_config  # noqa: F401
from tests.lease_kit import offering, wait_until

pytestmark = pytest.mark.timeout(240)


def _script_of(clouds, lease_id: str) -> str:  # noqa: F811
    """The boot script EC2 holds for the lease's instance (its user data)."""
    (inst,) = [i for i in clouds.aws.instances() if i["tags"].get("broker:lease") == lease_id]
    return base64.b64decode(inst["user_data_b64"]).decode()


def _callback_of(script: str) -> tuple[str, str]:
    """(URL, credential) as the rendered script holds them."""
    url = re.search(r"^export BROKER_CALLBACK_URL=(\S+)$", script, re.M).group(1).strip("'")
    token = re.search(r"^export BROKER_CALLBACK_TOKEN=(\S+)$", script, re.M).group(1).strip("'")
    return url, token


def _post(url: str, body: bytes | None, token: str | None = None, headers: dict | None = None,
          method: str = "POST") -> tuple[int, dict]:
    m = re.match(r"http://([^/:]+):(\d+)(/.*)", url)
    conn = http.client.HTTPConnection(m.group(1), int(m.group(2)), timeout=10)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, m.group(3), body=body, headers=hdrs)
        r = conn.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw else {})
    finally:
        conn.close()


def _run(script: str, tmp: Path) -> subprocess.CompletedProcess:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    docker = bindir / "docker"
    docker.write_text("#!/bin/bash\nexit 0\n")
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    path = tmp / "boot.sh"
    path.write_text(script)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp)}
    return subprocess.run(["bash", str(path)], cwd=tmp, env=env, capture_output=True, text=True, timeout=120)


def test_the_rendered_container_script_reports_to_a_real_broker_and_its_lease_ends(clouds, tmp_path):  # noqa: F811
    cfg = write_config(tmp_path / "broker.toml", clouds, f"sqlite:///{tmp_path / 'broker.db'}",
                       server={"callback_listen": "127.0.0.1:0"},
                       reconciler={"interval_s": 1, "orphan_grace_s": 0},
                       bootstrap={"container": {"image": "busybox:1.36", "command": ["sh", "-c", "exit 0"],
                                                "marker_path": str(tmp_path / "done")}})
    serve = ServeProcess(cfg, tmp_path).start()
    try:
        with grpc.insecure_channel(serve.address) as ch:
            stub = pb_grpc.BrokerStub(ch)
            leases = {}
            for name in ("a", "b"):
                leases[name] = stub.Launch(pb.LaunchRequest(
                    idempotency_key=name, bootstrap="container", job=pb.Job(job_id=f"train-{name}"),
                    offering=offering("aws", "us-west-2", "g5.xlarge")), timeout=120).lease
                assert leases[name].state == pb.LEASE_STATE_RUNNING, leases[name].state_reason
            scripts = {n: _script_of(clouds, l.lease_id) for n, l in leases.items()}
            (url_a, token_a), (url_b, token_b) = _callback_of(scripts["a"]), _callback_of(scripts["b"])
            assert url_a.endswith(f"/v1/leases/{leases['a'].lease_id}/job") and token_a.startswith("brl_")
            assert token_a != token_b

            # Refused before any lookup: another lease's credential, a forged one, none.
            body = json.dumps({"job_id": "train-a", "state": "succeeded", "exit_code": 0}).encode()
            assert _post(url_a, body, token_b)[0] == 403
            assert _post(url_a, body, "brl_" + "x" * 43)[0] == 401
            assert _post(url_a, body, None)[0] == 401
            assert _post(url_a, body, token_a, method="GET")[0] == 405
            assert _post(url_a.replace("/job", "/../../etc/passwd"), body, token_a)[0] == 404
            # Bounded: a body over the limit is not read; a report that is not one is refused.
            assert _post(url_b, b"{" + b" " * 20000 + b"}", token_b)[0] == 413
            assert _post(url_b, b"[1, 2]", token_b)[0] == 400
            status, answer = _post(url_b, json.dumps({"job_id": "train-b", "state": "done"}).encode(), token_b)
            assert status == 400 and "state" in answer["error"]

            result = _run(scripts["a"], tmp_path)
            assert result.returncode == 0, result.stderr
            assert "failed" not in result.stderr, result.stderr

            def released():
                got = stub.GetLease(pb.GetLeaseRequest(lease_id=leases["a"].lease_id), timeout=10).lease
                return got if got.state == pb.LEASE_STATE_RELEASED else None

            ended = wait_until(released, timeout=60, what="lease a released by the reconciler")
            assert ended.state_reason == "job train-a succeeded (exit code 0)"
            assert ended.job.state == pb.JOB_STATE_SUCCEEDED
            b = stub.GetLease(pb.GetLeaseRequest(lease_id=leases["b"].lease_id), timeout=10).lease
            assert b.state == pb.LEASE_STATE_RUNNING  # its job has not reported an end

            # The ended lease's credential was revoked with it.
            assert _post(url_a, body, token_a)[0] == 401
            stub.Release(pb.ReleaseRequest(lease_id=leases["b"].lease_id), timeout=120)
            assert _post(url_b, json.dumps({"job_id": "train-b", "state": "running"}).encode(), token_b)[0] == 401
    finally:
        assert serve.stop() == 0


def test_a_notice_records_the_event_and_starts_the_replacement_while_the_node_runs(clouds, tmp_path):  # noqa: F811
    """POST /notice (the node's own, or a cloud watcher's): interruption_notice, the job told to
    checkpoint, a replacement launched at once; the old node is still running meanwhile."""
    from broker.convert import demand_to_pb
    from policies.demand import Demand

    cfg = write_config(tmp_path / "broker.toml", clouds, f"sqlite:///{tmp_path / 'broker.db'}",
                       server={"callback_listen": "127.0.0.1:0"},
                       reconciler={"interval_s": 3600, "orphan_grace_s": 0},
                       bootstrap={"container": {"image": "busybox:1.36", "command": "exit 0"}})
    serve = ServeProcess(cfg, tmp_path).start()
    try:
        with grpc.insecure_channel(serve.address) as ch:
            stub = pb_grpc.BrokerStub(ch)
            demand = Demand(gpus=1, hours=4, gpu_model="A10G", interruptible=True, checkpoint_minutes=20,
                            regions=("us-east-1", "us-west-2"))
            quote = stub.Quote(pb.QuoteRequest(demand=demand_to_pb(demand)), timeout=30).quote
            rank = next(o.rank for o in quote.offers if o.provider == "aws" and o.market == pb.MARKET_SPOT)
            lease = stub.Launch(pb.LaunchRequest(idempotency_key="spot", bootstrap="container",
                                                 job=pb.Job(job_id="train-n", checkpoint_uri="s3://c/n"),
                                                 quote_offer=pb.QuoteOffer(quote_id=quote.quote_id, rank=rank)),
                                timeout=120).lease
            url, token = _callback_of(_script_of(clouds, lease.lease_id))
            notice = {"node_name": lease.instances[0].node_name, "kind": "preemption", "source": "aws:imds",
                      "not_before": time.time() + 120}
            status, answer = _post(url.replace("/job", "/notice"), json.dumps(notice).encode(), token)
            assert status == 202 and answer["action"] == "checkpoint" and answer["replacement"], answer

            def replaced():
                got = stub.GetLease(pb.GetLeaseRequest(lease_id=answer["replacement"]), timeout=10).lease
                return got if got.state == pb.LEASE_STATE_RUNNING else None

            new = wait_until(replaced, timeout=90, what="the replacement running")
            old = stub.GetLease(pb.GetLeaseRequest(lease_id=lease.lease_id), timeout=10).lease
            assert old.state == pb.LEASE_STATE_RUNNING  # still running: the replacement came first
            assert new.job.job_id == "train-n" and new.job.restarts == 1 and new.job.checkpoint_uri == "s3://c/n"
            status, answer = _post(url, json.dumps({"job_id": "train-n", "state": "running"}).encode(), token)
            assert (status, answer["action"]) == (200, "checkpoint")
            kinds = []
            for ev in stub.WatchLeases(pb.WatchLeasesRequest(lease_id=lease.lease_id, after_event_id=0), timeout=3):
                kinds.append(ev.kind)
                if ev.kind == pb.LEASE_EVENT_KIND_REQUEUE:
                    break
            assert pb.LEASE_EVENT_KIND_INTERRUPTION_NOTICE in kinds and pb.LEASE_EVENT_KIND_REQUEUE in kinds
            for lid in (lease.lease_id, new.lease_id):
                stub.Release(pb.ReleaseRequest(lease_id=lid), timeout=120)
    finally:
        assert serve.stop() == 0
