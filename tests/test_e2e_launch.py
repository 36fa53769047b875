"""Issue scenario: `broker serve` pointed at the three mocked clouds; launch, inspect, release."""
from __future__ import annotations

import json

import pytest

from tests.clouds.three import ServeProcess, cli, clouds, clouds_server, write_config  # noqa: F401

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def serve(clouds, tmp_path):  # noqa: F811
    cfg = write_config(tmp_path / "broker.toml", clouds, f"sqlite:///{tmp_path / 'broker.db'}",
                       reconciler={"interval_s": 3600})
    p = ServeProcess(cfg, tmp_path).start()
    yield p
    assert p.stop() == 0, p.log.read_text()[-2000:]


def launch(serve, *args):
    r = cli("launch", *args, "--format", "json", server=serve.address)
    return r, (json.loads(r.stdout) if r.returncode == 0 else None)


def test_gcp_spot_two_nodes_then_release(clouds, serve):  # noqa: F811
    r, lease = launch(serve, "--provider", "gcp", "--region", "us-central1", "--instance-type", "a3-highgpu-8g",
                      "--market", "spot", "--count", "2", "--idempotency-key", "k-gcp")
    assert r.returncode == 0, r.stderr
    assert lease["state"] == "running" and lease["market"] == "spot" and lease["nodes"] == 2
    names = {i["node_name"] for i in lease["instances"]}
    server_side = {i["name"]: i for i in clouds.gcp.instances()}
    assert names <= set(server_side)
    for n in names:
        inst = server_side[n]
        assert inst["scheduling"]["provisioningModel"] == "SPOT"
        assert inst["scheduling"]["instanceTerminationAction"] == "DELETE"
        assert inst["machineType"].endswith("/a3-highgpu-8g")
        assert inst["labels"]["broker-owner"] == "broker-test"
        assert "broker-lease" in inst["labels"]
    # the same key again: the same lease, nothing new launched
    inserts = clouds.gcp.insert_count
    r2, again = launch(serve, "--provider", "gcp", "--region", "us-central1", "--instance-type", "a3-highgpu-8g",
                       "--market", "spot", "--count", "2", "--idempotency-key", "k-gcp")
    assert again["lease_id"] == lease["lease_id"] and clouds.gcp.insert_count == inserts
    rel = cli("release", lease["lease_id"], "--format", "json", server=serve.address)
    assert rel.returncode == 0, rel.stderr
    assert json.loads(rel.stdout)["state"] == "released"
    assert not [i for i in clouds.gcp.instances() if i["name"] in names]


def test_aws_on_demand_with_tags(clouds, serve):  # noqa: F811
    r, lease = launch(serve, "--provider", "aws", "--region", "us-east-1", "--instance-type", "p5.48xlarge",
                      "--market", "on_demand", "--count", "2")
    assert r.returncode == 0, r.stderr
    ids = {i["instance_id"] for i in lease["instances"]}
    mine = [i for i in clouds.aws.instances() if i["id"] in ids]
    assert len(mine) == 2
    for i in mine:
        assert i["instance_type"] == "p5.48xlarge"
        assert i["tags"]["broker:lease"] == lease["lease_id"]
        assert i["tags"]["broker:owner"] == "broker-test"
        assert i.get("lifecycle") in (None, "", "on-demand", "normal")
    rel = cli("release", lease["lease_id"], server=serve.address)
    assert rel.returncode == 0, rel.stderr
    states = {i["id"]: i["state"] for i in clouds.aws.instances() if i["id"] in ids}
    assert set(states.values()) <= {"terminated", "shutting-down"}


def test_azure_spot_and_list(clouds, serve):  # noqa: F811
    r, lease = launch(serve, "--provider", "azure", "--region", "eastus", "--instance-type",
                      "Standard_NC24ads_A100_v4", "--market", "spot", "--count", "1")
    assert r.returncode == 0, r.stderr
    vms = clouds.azure.instances()
    assert len(vms) == 1
    props = vms[0]["properties"]
    assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
    assert vms[0]["tags"]["broker:lease"] == lease["lease_id"]
    ls = cli("leases", "--format", "json", server=serve.address)
    rows = json.loads(ls.stdout)
    assert [x["lease_id"] for x in rows] == [lease["lease_id"]]
    assert rows[0]["hourly_usd"] > 0
    assert cli("release", lease["lease_id"], server=serve.address).returncode == 0
    assert clouds.azure.instances() == []


def test_capacity_error_names_code_and_scope(clouds, serve):  # noqa: F811
    clouds.gcp.inject("capacity", times=5)
    r, _ = launch(serve, "--provider", "gcp", "--region", "us-central1", "--instance-type", "a3-highgpu-8g",
                  "--market", "on_demand", "--count", "1")
    # every zone refused: the lease failed for good, so a retry of the same call cannot help
    # (FAILED_PRECONDITION in the errors table; the client quotes and launches again)
    assert r.returncode == 6
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in r.stderr
    assert "gcp/us-central1" in r.stderr
    assert "Traceback" not in r.stderr
    ls = json.loads(cli("leases", "--format", "json", server=serve.address).stdout)
    assert ls[0]["state"] == "failed"


def test_bad_launch_input_exits_2(clouds, serve):  # noqa: F811
    r, _ = launch(serve, "--provider", "gcp", "--region", "us-central1", "--instance-type", "nope-8g")
    assert r.returncode == 2 and "instance_type" in r.stderr
    r, _ = launch(serve, "--provider", "gcp", "--region", "mars-1", "--instance-type", "a3-highgpu-8g")
    assert r.returncode == 2 and "region" in r.stderr
    r = cli("release", "l-does-not-exist", server=serve.address)
    assert r.returncode == 4 and "does not exist" in r.stderr


def _watch_lines(serve, *args, want: int, timeout: float = 60) -> list[dict]:
    """The first ``want`` JSON lines `broker watch` prints (then it is stopped)."""
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    env = {**os.environ, "BROKER_SERVER": serve.address}
    p = subprocess.Popen([sys.executable, "-m", "broker.cli", "watch", *args], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            out.append(json.loads(line))
    finally:
        p.kill()
        p.wait(10)
    return out


def test_leases_lease_and_watch_print_one_json_dialect(clouds, serve, monkeypatch):  # noqa: F811
    r, lease = launch(serve, "--provider", "aws", "--region", "us-east-1", "--instance-type", "p5.48xlarge",
                      "--market", "on_demand", "--count", "1")
    assert r.returncode == 0, r.stderr
    listed = [x for x in json.loads(cli("leases", "--format", "json", server=serve.address).stdout)
              if x["lease_id"] == lease["lease_id"]][0]
    one = json.loads(cli("lease", lease["lease_id"], "--format", "json", server=serve.address).stdout)
    events = _watch_lines(serve, "--lease", lease["lease_id"], "--after", "0", want=3)
    assert events and events[0]["event_id"] == 1 and events[0]["kind"] == "state_changed"  # --after 0 replays it
    watched = events[-1]["lease"]
    assert watched["state"] == "running" and events[-1]["at"].endswith("Z")
    for doc in (listed, watched):
        assert set(doc) == set(one)
        for k, v in one.items():
            assert type(doc[k]) is type(v), (k, doc[k], v)
    assert one["state"] == "running" and one["market"] == "on_demand"
    assert isinstance(one["hourly_usd"], float) and one["created_at"].endswith("Z")
    assert watched["hourly_usd"] == one["hourly_usd"] and watched["created_at"] == one["created_at"]

    monkeypatch.setenv("COLUMNS", "80")
    table = cli("leases", server=serve.address)
    assert table.returncode == 0, table.stderr
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
    assert lease["lease_id"] in table.stdout.split()  # the whole id, pasteable into `broker release`
    assert f"{one['cost_so_far_usd']:.2f}" in table.stdout or "cost so far" in table.stdout
    assert cli("release", lease["lease_id"], server=serve.address).returncode == 0


def test_watch_of_an_unknown_lease_is_not_found_at_once(serve):
    import time

    started = time.monotonic()
    r = cli("watch", "--lease", "l-nope", server=serve.address, timeout=30)
    assert r.returncode == 4 and "l-nope" in r.stderr, (r.returncode, r.stderr)
    assert time.monotonic() - started < 20
