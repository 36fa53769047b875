"""All three mocked clouds at once, and a `broker serve` subprocess pointed at them."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w

from broker_sandbox.aws import AwsCloud
from broker_sandbox.clouds import AZ_SUB, AZ_SUBNET, SSH_KEY, Clouds  # noqa: F401  (re-exported)
from tests.conftest import ROOT


@pytest.fixture(scope="session")
def clouds_server() -> Iterator[Clouds]:
    c = Clouds()
    yield c
    c.stop()


@pytest.fixture
def clouds(clouds_server: Clouds, monkeypatch: pytest.MonkeyPatch) -> Iterator[Clouds]:
    for k, v in AwsCloud.client_env().items():
        monkeypatch.setenv(k, v)
    clouds_server.reset()
    yield clouds_server
    clouds_server.reset()


def write_config(path: Path, clouds: Clouds, db_url: str, **sections: Any) -> Path:
    cfg: dict[str, Any] = {"owner": "broker-test", "store": {"url": db_url},
                           "providers": clouds.provider_tables()}
    for k, v in sections.items():
        cfg[k] = v
    path.write_bytes(tomli_w.dumps(cfg).encode())
    return path


class ServeProcess:
    """`broker serve` as a user starts it: a real process, its own port, SIGTERM or SIGKILL."""

    def __init__(self, config: Path, workdir: Path, port: int = 0) -> None:
        self.config, self.workdir = config, workdir
        self.port = port or _free_port()
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "serve.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> "ServeProcess":
        # SERVING waits for the three clouds' SDKs and a new store's schema: tens of seconds on a
        # loaded 2-core machine. A serve that dies is seen at once (the wait polls the process).
        env = {**os.environ, **AwsCloud.client_env(), "BROKER_HOME": str(self.workdir)}
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", "--config", str(self.config), "--listen", self.address,
             "--log-level", "info"], cwd=ROOT, env=env, stdout=self._logf, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(timeout)
        except BaseException:  # not ready (or the test timed out): no caller will stop it, so stop it here
            self.kill()
            self._logf.close()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker serve exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with grpc.insecure_channel(self.address) as ch:
                    r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            except grpc.RpcError:
                time.sleep(0.1)
        raise TimeoutError(f"broker serve not ready:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._logf.close()
        return self.proc.returncode if self.proc else 0


def _free_port() -> int:
    import socket

    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str, server: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "BROKER_SERVER": server}
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
