"""`broker sandbox` as a newcomer runs it: a real process with the mocked clouds and a broker,
driven through the command line (quote, launch, hand-off, watch, release), then stopped."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.clouds.three import _free_port
from tests.conftest import ROOT
from tests.lease_kit import wait_until

pytestmark = pytest.mark.timeout(300)


def broker(*args: str, server: str, timeout: float = 120, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "BROKER_SERVER": server, "PYTHONPATH": str(ROOT)}
    env.pop("BROKER_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_quote_launch_handoff_watch_release_against_the_sandbox(tmp_path):
    port = _free_port()
    server = f"127.0.0.1:{port}"
    home, out = tmp_path / "sandbox", tmp_path / "sandbox.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "broker", "sandbox", "--listen", server, "--home", str(home)],
                                cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: "Sandbox ready" in out.read_text() or proc.poll() is not None, timeout=180)
        text = out.read_text()
        assert proc.poll() is None and f"export BROKER_SERVER={server}" in text, text

        r = broker("quote", "--server", server, "--gpu", "H100:8", "--hours", "2", "-o", "json", server=server)
        assert r.returncode == 0, r.stderr
        q = json.loads(r.stdout)
        assert q["offers"] and q["prices_only"] is False  # providers are enabled: launchable offers
        # Lambda Cloud is in the sandbox too, and its on-demand 8 x H100 is the cheapest: the launch,
        # hand-off and release below run against the fake Lambda Cloud API through a real broker.
        assert q["offers"][0]["provider"] == "lambda", q["offers"][0]
        r = broker("launch", "--quote-id", q["quote_id"], "--offer", "1", "-o", "json", server=server)
        assert r.returncode == 0, r.stderr
        lease = json.loads(r.stdout)
        assert lease["state"] == "running" and lease["provider"] == q["offers"][0]["provider"]
        lid = lease["lease_id"]
        r = broker("handoff", lid, "--job-id", "train-1", "-o", "json", server=server)
        assert r.returncode == 0 and json.loads(r.stdout)["job"]["job_id"] == "train-1", r.stderr

        watch = subprocess.Popen([sys.executable, "-m", "broker", "watch", "--lease", lid, "--after", "0"], cwd=ROOT,
                                 env={**os.environ, "BROKER_SERVER": server}, stdout=subprocess.PIPE, text=True)
        try:
            kinds = [json.loads(watch.stdout.readline())["kind"] for _ in range(4)]
        finally:
            watch.terminate()
            watch.wait(10)
        assert "handoff" in kinds, kinds

        r = broker("release", lid, "-o", "json", server=server)
        assert r.returncode == 0, r.stderr
        done = json.loads(r.stdout)
        assert done["state"] == "released" and all(i["state"] == "terminated" for i in done["instances"]), done
        r = broker("leases", "-o", "json", server=server)
        assert [(l["lease_id"], l["state"]) for l in json.loads(r.stdout)] == [(lid, "released")]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, out.read_text()[-2000:]
    assert _port_free(port)  # the broker it started is gone too
    assert (home / "broker.db").exists() and (home / "broker.toml").exists()


def test_the_sandbox_refuses_a_port_in_use_and_an_address_beyond_loopback(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = f"127.0.0.1:{s.getsockname()[1]}"
        r = broker("sandbox", "--listen", busy, "--home", str(tmp_path), server=busy)
    assert r.returncode == 2 and "the port is already in use" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = broker("sandbox", "--listen", "0.0.0.0:50051", "--home", str(tmp_path), server=busy)
    assert r.returncode == 2 and "must be a loopback address" in r.stderr, r.stderr


def test_the_sandbox_never_empties_a_directory_it_did_not_make(tmp_path):
    """`--home ""` is refused (it would be the current directory), and a directory holding an
    operator's own broker.toml keeps it: the sandbox deletes only state files it wrote there."""
    free = f"127.0.0.1:{_free_port()}"
    empty = tmp_path / "cwd"
    empty.mkdir()
    r = broker("sandbox", "--listen", free, "--home", "", server=free, cwd=empty)
    assert r.returncode == 2 and "--home is empty" in r.stderr, r.stderr
    assert not any(empty.iterdir())
    mine = tmp_path / "broker.toml"
    mine.write_text("# an operator's own configuration\n")
    r = broker("sandbox", "--listen", free, "--home", str(tmp_path), server=free)
    assert r.returncode == 2 and "holds broker.toml, which the sandbox did not write" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 2 and "Traceback" not in r.stderr  # "starting..." + the refusal
    assert mine.read_text() == "# an operator's own configuration\n"
