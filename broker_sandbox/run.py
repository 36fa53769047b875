"""``broker sandbox``: the mocked clouds in this process and a ``broker serve`` configured
against them, in a state directory of its own, everything on 127.0.0.1.

The clouds keep their instances in memory, so the sandbox's store starts empty with them: a
lease of an earlier run would name instances no cloud knows.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from broker_sandbox.clouds import Clouds

#: What the sandbox writes in its state directory (and removes when it starts again).
STATE_FILES = ("broker.toml", "broker.db", "broker.db-wal", "broker.db-shm", "serve.log")
MARK = ".broker-sandbox"  # written at the first start: the state files here are the sandbox's own


def config(clouds: Clouds, home: Path) -> dict[str, Any]:
    """The broker's configuration: every cloud API (the market's included) on loopback, the
    store in ``home``, no background market refresh (the bundled catalog's prices, dated)."""
    return {
        "owner": "broker-sandbox",
        "store": {"url": f"sqlite:///{home / 'broker.db'}"},
        "catalog": {"refresh_interval_s": 0},
        "telemetry": {"metrics_listen": ""},
        "providers": clouds.provider_tables(),
    }


def _toml(doc: dict[str, Any]) -> str:
    import tomli_w

    return tomli_w.dumps(doc)


class Sandbox:
    """The clouds (their market APIs' fakes included) and one ``broker serve`` subprocess;
    :meth:`stop` ends all."""

    def __init__(self, home: Path, listen: str) -> None:
        self.home, self.listen = home, listen
        self.clouds: Clouds | None = None
        self.proc: subprocess.Popen | None = None
        self.log = home / "serve.log"

    def start(self, timeout: float = 120.0) -> "Sandbox":
        self.home.mkdir(parents=True, exist_ok=True)
        mark = self.home / MARK
        theirs = [n for n in STATE_FILES if (self.home / n).exists()]
        if theirs and not mark.exists():  # a directory of someone's own broker: never empty it
            raise OSError(errno.EEXIST, f"it holds {theirs[0]}, which the sandbox did not write; "
                                        "give --home an empty or new directory")
        mark.touch()
        for name in STATE_FILES:
            (self.home / name).unlink(missing_ok=True)
        try:
            self.clouds = Clouds(market=True)
            path = self.home / "broker.toml"
            path.write_text(_toml(config(self.clouds, self.home)))
            env = {**os.environ, **self.clouds.env, "BROKER_HOME": str(self.home)}
            env.pop("BROKER_CONFIG", None)
            with open(self.log, "ab") as logf:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "broker", "serve", "--config", str(path), "--listen", self.listen],
                    env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.listen) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise SandboxError(f"broker serve exited {self.proc.returncode}: {self.last_log_line()}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                            health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    time.sleep(0.2)
        raise SandboxError(f"broker serve was not serving within {timeout:.0f} s (its log: {self.log})")

    def last_log_line(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return f"no log at {self.log}"
        return lines[-1][:500] if lines else f"nothing in {self.log}"

    def wait(self) -> int:
        """Until the broker ends (its exit code)."""
        return self.proc.wait() if self.proc else 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.clouds is not None:
            self.clouds.stop()
        self.clouds = None


class SandboxError(RuntimeError):
    """The sandbox's broker did not come up: one sentence."""
