"""The three mocked clouds in a process of their own, for benchmarks that must not share a
process (and its GIL) with the clients or the broker they measure.

``python -m tests.clouds.serve`` starts :class:`tests.clouds.three.Clouds` on loopback (with the
market APIs, GCP's Cloud Billing Catalog included, so a broker's market refresh answers fully) and
writes one JSON line to stdout: ``{"providers": {...}, "env": {...}}``, the ``[providers.*]``
tables that point a broker at them and the environment it needs (fake credentials only). It then
answers one JSON line per command line read from stdin:

- ``alive``: the instances each cloud holds that are not terminated, counted per cloud;
- ``stats``: per cloud, the instances it holds in any state and the calls it has logged;
- ``reset``: forget every resource, fault and logged call (answers ``{}``).

End of input (the parent closed the pipe or died) stops the clouds and ends the process.
:class:`CloudsProcess` is the parent's side.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _answer(clouds: Any, command: str) -> dict[str, Any]:
    if command == "alive":
        return {c: len(v) for c, v in clouds.alive_instances().items()}
    if command == "stats":
        # Each registered cloud's own fake (the one named after it) counts its instances and calls.
        return {name: {"instances": len(fake.instances()), "calls": len(fake.calls)}
                for name, cloud in clouds.clouds.items() if (fake := cloud.fakes.get(name)) is not None}
    if command == "reset":
        clouds.reset()
        return {}
    return {"error": f"unknown command {command!r}"}


def main() -> None:
    from tests.clouds.three import Clouds

    clouds = Clouds(market=True)  # every API a broker's market refresh calls, Cloud Billing's too
    try:
        out = sys.stdout
        out.write(json.dumps({"providers": clouds.provider_tables(), "env": clouds.env}) + "\n")
        out.flush()
        for line in sys.stdin:
            if line.strip():
                out.write(json.dumps(_answer(clouds, line.strip())) + "\n")
                out.flush()
    finally:
        clouds.stop()


class CloudsProcess:
    """The parent's side: the clouds in a subprocess on loopback, with :class:`Clouds`' reading
    calls (``provider_tables``, ``alive_instances`` as counts) over its pipes."""

    def __init__(self, timeout: float = 120.0) -> None:
        from tests.clouds.aws import AwsCloud

        env = {**os.environ, **AwsCloud.client_env(), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.clouds.serve"], cwd=ROOT, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()
        first = self._read(timeout)
        self._providers = first["providers"]
        self.env: dict[str, str] = first["env"]  # what a broker process needs (fake credentials only)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, timeout: float) -> dict[str, Any]:
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not got or not got[0]:
            self.stop()
            raise RuntimeError(f"the mocked clouds' process did not answer within {timeout:.0f} s")
        return json.loads(got[0])

    def ask(self, command: str, timeout: float = 60.0) -> dict[str, Any]:
        with self._lock:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
            return self._read(timeout)

    def provider_tables(self) -> dict[str, dict[str, Any]]:
        return json.loads(json.dumps(self._providers))

    def alive_instances(self) -> dict[str, int]:
        return self.ask("alive")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


if __name__ == "__main__":
    main()
