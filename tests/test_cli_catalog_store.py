"""`broker catalog refresh` and `broker catalog show` honour `[store] connect_timeout_s`: a database
that refuses, or never answers, is exit 7 with one sentence within the timeout, as `broker db` and
`broker tokens` say for the same database."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import tomli_w

from tests.conftest import ROOT

TIMEOUT_S = 2  # libpq's least connect_timeout


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A loopback port that takes connections (the kernel completes them) and never answers."""
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def closed_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when this returns: nothing listens there


def config(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "broker.toml"
    path.write_bytes(tomli_w.dumps({
        "owner": "broker-test",
        "store": {"url": f"postgresql+psycopg://broker@127.0.0.1:{port}/broker", "connect_timeout_s": TIMEOUT_S},
        "providers": {"aws": {"enabled": True, "regions": ["us-east-1"], "image_id": "ami-0123456789abcdef0",
                              "endpoint_url": "http://127.0.0.1:9", "credentials": "anonymous"}},
    }).encode())
    return path


def run(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    return r, time.monotonic() - start


def said(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.strip().splitlines() if not line.startswith("{")]


@pytest.mark.parametrize("command", [["catalog", "refresh"], ["catalog", "show"]])
@pytest.mark.parametrize("database", ["silent", "closed"])
def test_an_unreachable_database_is_exit_7_within_connect_timeout(tmp_path, command, database):
    with (silent_port() if database == "silent" else contextlib.nullcontext(closed_port())) as port:
        r, took = run(*command, "--config", str(config(tmp_path, port)))
    assert r.returncode == 7, (r.stdout, r.stderr)
    [sentence] = said(r)
    assert sentence.startswith("broker: cannot open the store at postgresql+psycopg://broker@127.0.0.1:"), sentence
    assert "Traceback" not in r.stderr and r.stdout == ""
    # the Python start-up and imports take a few seconds on a loaded machine; libpq waits at most
    # connect_timeout_s per attempt, never the default 10 s, twice, or the OS's minutes
    assert took < TIMEOUT_S + 12, took
    if database == "silent":
        assert "timeout" in sentence.lower(), sentence
