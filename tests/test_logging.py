"""The log is one JSON object per line: the broker's events and every library's stdlib logging
(grpcio, the Azure SDK), tracebacks included, through the same structlog renderer."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import pytest
import tomli_w

from tests.clouds.three import ServeProcess
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(120)


def _records(text: str) -> list[dict]:
    lines = [l for l in text.splitlines() if l.strip()]
    bad = [l for l in lines if not _is_object(l)]
    assert not bad, f"{len(bad)} raw line(s) in the log, first: {bad[0]!r}"
    return [json.loads(l) for l in lines]


def _is_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_grpcio_tracebacks_from_a_real_server_are_json_lines(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_bytes(tomli_w.dumps({"owner": "broker-test", "store": {"url": f"sqlite:///{tmp_path / 'b.db'}"},
                                   "reconciler": {"interval_s": 3600}}).encode())
    serve = ServeProcess(cfg, tmp_path).start()
    try:
        with grpc.insecure_channel(serve.address) as ch:
            raw = ch.unary_unary("/broker.v1.Broker/Quote")  # bytes in, bytes out
            with pytest.raises(grpc.RpcError):
                raw(b"\xff\xff\xff\xff not a protobuf", timeout=10)
        deadline = time.monotonic() + 20
        while "deserializing" not in serve.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        assert serve.stop() == 0
    records = _records(serve.log.read_text())
    grpc_errors = [r for r in records if r.get("logger", "").startswith("grpc")]
    assert grpc_errors, records
    assert "Traceback" in grpc_errors[0]["exception"] and grpc_errors[0]["level"] == "error"
    assert any(r.get("event") == "serving" for r in records)


SCRIPT = """
import logging, threading, warnings
from broker.telemetry import configure
import structlog
configure("info")
structlog.get_logger("broker.server").info("own_event", lease_id="l-1")
logging.getLogger("broker.store").debug("hidden at info")
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").info("third-party info is quiet")
try:
    raise ConnectionError("Connection aborted.\\nRemoteDisconnected('Remote end closed connection')")
except ConnectionError:
    logging.getLogger("azure.core.pipeline.policies._retry").exception("Retrying after error")
warnings.warn("a deprecated knob", DeprecationWarning, stacklevel=1)
warnings.simplefilter("always")
warnings.warn("a deprecated knob", UserWarning)
t = threading.Thread(target=lambda: 1 / 0, name="poller")
t.start(); t.join()
raise RuntimeError("escaped main")
"""


def test_library_logs_thread_deaths_and_uncaught_errors_are_json_lines():
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    records = _records(r.stderr)
    by_event = {rec["event"]: rec for rec in records}
    assert by_event["own_event"]["lease_id"] == "l-1" and by_event["own_event"]["level"] == "info"
    assert "hidden at info" not in r.stderr and "third-party info is quiet" not in r.stderr
    azure = by_event["Retrying after error"]
    assert azure["logger"] == "azure.core.pipeline.policies._retry" and "RemoteDisconnected" in azure["exception"]
    assert any("a deprecated knob" in rec["event"] and rec["logger"] == "py.warnings" for rec in records)
    died = by_event["thread_died"]
    assert died["thread_name"] == "poller" and "ZeroDivisionError" in died["exception"]
    assert "escaped main" in by_event["uncaught_exception"]["exception"]
