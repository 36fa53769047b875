"""`broker serve --processes N` as a user runs it: N real processes on one port, each answering;
the leader's work in one of them; /metrics served once with every process's samples; SIGTERM
stopping all; a process that dies stopping the rest with exit 1; careless values exit 2."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.clouds.three import _free_port
from tests.lease_kit import wait_until

ROOT = Path(__file__).resolve().parents[1]
START_S = 180.0  # two processes building their service one after the other, on a loaded machine


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_", "PROMETHEUS_"))}
    env.update({"PYTHONPATH": str(ROOT), "BROKER_HOME": str(tmp)})
    return env


class Served:
    """`broker serve --processes 2`, its log (JSON lines on stderr) and its children."""

    def __init__(self, tmp: Path, processes: int = 2, db: str = "", leader: str = "") -> None:
        self.port, self.metrics_port = _free_port(), _free_port()
        cfg = tmp / "broker.toml"
        cfg.write_text(f'owner = "broker-test"\n[catalog]\nrefresh_interval_s = 0\n'
                       f'[reconciler]\ninterval_s = 0.5\n'
                       f'[telemetry]\nmetrics_listen = "127.0.0.1:{self.metrics_port}"\n' + leader)
        self.log = tmp / "serve.log"
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "serve", "--processes", str(processes), "--config", str(cfg),
             "--listen", f"127.0.0.1:{self.port}", "--db", db or f"sqlite:///{tmp / 'b.db'}"],
            cwd=ROOT, env=_env(tmp), stdout=subprocess.DEVNULL, stderr=self._logf, stdin=subprocess.DEVNULL)
        self.processes = processes

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def events(self, name: str) -> list[dict]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") == name:
                out.append(doc)
        return out

    def wait_serving(self) -> dict[int, int]:
        """{process index: pid} once every process says it serves."""
        def ready():
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            got = {e["process"]: e["pid"] for e in self.events("process_serving")}
            return got if len(got) == self.processes else None

        return wait_until(ready, timeout=START_S, interval=0.2, what="every serving process")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._logf.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().split(")")[-1].split()[1])


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path)
    try:
        yield s
    finally:
        s.stop()
        for e in s.events("process_serving"):  # nothing outlives the test
            if _alive(e["pid"]):
                os.kill(e["pid"], signal.SIGKILL)


def _quote_on_new_connection(address: str) -> tuple[str, int]:
    """One Quote on a connection of its own; (the process that answered, health status there)."""
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        r, call = pb_grpc.BrokerStub(ch).Quote.with_call(
            pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=24), top=2),
            metadata=(("broker-replica", "1"),), timeout=30)
        assert len(r.quote.offers) == 2
        health = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="broker.v1.Broker"), timeout=30)
        return dict(call.initial_metadata())["broker-replica"], health.status


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_two_processes_share_one_port_both_answer_and_the_leader_work_runs_once(served):
    pids = served.wait_serving()
    assert set(pids) == {0, 1} and len(set(pids.values())) == 2
    assert all(_parent_of(p) == served.proc.pid for p in pids.values())

    answered = [_quote_on_new_connection(served.address) for _ in range(32)]
    # The kernel spreads new connections over both (each is missed with odds 2^-32).
    assert {int(name.rsplit(":", 1)[1]) for name, _ in answered} == set(pids.values())
    assert {status for _, status in answered} == {health_pb2.HealthCheckResponse.SERVING}

    started = served.events("background_started")
    assert len(started) == 2
    # Each process warms up once, before it serves (a later process before it joins the port).
    assert sorted(e["process"] for e in served.events("warmed_up")) == [0, 1]
    # ... and then moves what start-up built out of the collector's view (tens of thousands of
    # objects: the clouds' SDKs, the catalog), so a full collection does not scan them again.
    assert all(e["frozen_objects"] > 10_000 for e in served.events("warmed_up"))
    # and once more after its first market poll (the live market's engine).
    end = time.monotonic() + 60
    while len(served.events("heap_frozen")) < 2 and time.monotonic() < end:
        time.sleep(0.1)
    frozen = served.events("heap_frozen")
    assert sorted(e["process"] for e in frozen) == [0, 1] and {e["after"] for e in frozen} == {"market"}
    leading = [e for e in started if e["contends"]]
    assert len(leading) == 1 and "reconciler" in leading[0]["loops"]
    other = next(e for e in started if not e["contends"])
    assert "reconciler" not in other["loops"] and "autoscaler" not in other["loops"]

    # /metrics is served by one process and counts both processes' calls.
    m = _metrics(served.metrics_port)
    assert m['broker_rpc_duration_seconds_count{code="OK",method="Quote"}'] == 32
    assert m["broker_leader"] == 1
    assert m['broker_loop_alive{loop="reconciler"}'] == 1 and m['broker_loop_alive{loop="market"}'] == 1

    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(60) == 0
    wait_until(lambda: not any(_alive(p) for p in pids.values()), timeout=30, what="children gone")
    assert len(served.events("stopped")) == 2


@pytest.mark.parametrize("which", [0, 1])
def test_a_process_that_dies_stops_the_others_and_serve_exits_1(served, which):
    pids = served.wait_serving()
    os.kill(pids[which], signal.SIGKILL)
    assert served.proc.wait(60) == 1
    wait_until(lambda: not any(_alive(p) for p in pids.values()), timeout=30, what="children gone")
    died = served.events("process_died")
    assert len(died) == 1 and died[0]["pid"] == pids[which]
    with pytest.raises(ConnectionRefusedError):  # nothing is left on the port
        import socket

        socket.create_connection(("127.0.0.1", served.port), timeout=5).close()


def test_on_postgresql_only_the_first_process_ever_holds_leadership(tmp_path):
    """Every process could reach the leadership row; only process 0 contends, so the row names
    it, in term 1, through renewals, and nobody else ever took it."""
    from sqlalchemy import create_engine, text

    from tests.stores import pg_url_or_skip

    gen = pg_url_or_skip()
    url = next(gen)
    s = Served(tmp_path, db=url, leader="[leader]\nttl_s = 30\nrenew_s = 0.3\n")
    engine = create_engine(url)
    try:
        pids = s.wait_serving()

        def holder():
            with engine.connect() as c:
                return c.execute(text("SELECT holder, term FROM broker_leader")).first()

        first = wait_until(holder, timeout=60, what="a leadership row")
        for _ in range(10):  # renewals keep it with process 0 in the same term
            h, term = holder()
            assert f":{pids[0]}:" in h and term == first[1] == 1, (h, term, pids)
            time.sleep(0.3)  # one renewal period between samples
        assert [e["contends"] for e in s.events("background_started")].count(True) == 1
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0
    finally:
        s.stop()
        engine.dispose()
        next(gen, None)


def _serve(tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", "serve", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**_env(tmp_path), **(env or {})}, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "65", "100000000000000000000", "2.5", ""])
def test_careless_processes_is_one_sentence_and_exit_2(tmp_path, value):
    r = _serve(tmp_path, "--processes", value, "--listen", f"127.0.0.1:{_free_port()}")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"broker: --processes must be a whole number from 1 to 64, got {value!r}."


@pytest.mark.parametrize("args, env, words", [
    ((), {"BROKER_SERVER__PROCESSES": "0"}, "server.processes) must be a whole number >= 1, got 0"),
    ((), {"BROKER_SERVER__PROCESSES": "many"}, "BROKER_SERVER__PROCESSES"),
    (("--processes", "2", "--listen", "127.0.0.1:0"), {},
     "server.processes is 2, but serving processes share one fixed port"),
])
def test_careless_processes_settings_are_one_sentence_and_exit_2(tmp_path, args, env, words):
    r = _serve(tmp_path, *args, env=env)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_config_key_is_read_from_the_file(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text('[server]\nprocesses = 65\n')
    r = _serve(tmp_path, "--config", str(cfg))
    assert r.returncode == 2 and "server.processes" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_start_up_error_under_processes_is_said_once_and_exit_2(tmp_path):
    """The first serving process meets the error and says it; the parent starts no other and
    returns its exit code."""
    r = _serve(tmp_path, "--processes", "2", "--listen", f"127.0.0.1:{_free_port()}", "--log-level", "warning",
               "--db", "postgresql+psycopg://nobody@127.0.0.1:1/broker")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("broker: cannot open the store at 127.0.0.1:1/broker"), r.stderr
