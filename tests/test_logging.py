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


def test_native_grpc_lines_from_a_tls_port_probed_in_plaintext_are_json_lines(tmp_path):
    """gRPC's C core writes straight to standard error (a failed TLS handshake: a plaintext client,
    a port scanner, an HTTP probe): those lines join the log as records, never raw."""
    import socket

    from tests.test_auth import _self_signed

    cert, key = _self_signed(tmp_path)
    cfg = tmp_path / "broker.toml"
    cfg.write_bytes(tomli_w.dumps({"owner": "broker-test", "store": {"url": f"sqlite:///{tmp_path / 'b.db'}"},
                                   "reconciler": {"interval_s": 3600}, "auth": {"tokens": {"t": "*"}},
                                   "server": {"tls_cert_file": str(cert), "tls_key_file": str(key)}}).encode())
    class TlsServe(ServeProcess):
        def _wait_ready(self, timeout: float) -> None:  # its own probe speaks plaintext
            deadline = time.monotonic() + timeout
            while '"serving"' not in self.log.read_text():
                assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()[-3000:]
                time.sleep(0.1)

    serve = TlsServe(cfg, tmp_path).start(timeout=60)
    try:
        with grpc.insecure_channel(serve.address) as ch:
            with pytest.raises(grpc.RpcError):
                ch.unary_unary("/broker.v1.Broker/ListLeases")(b"", timeout=5)
        host, port = serve.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(1024)  # the server closes it
    finally:
        assert serve.stop() == 0
    records = _records(serve.log.read_text())
    assert any(r.get("event") == "serving" for r in records)


BRIDGE = """
import os, sys, threading
from broker.telemetry import bridge_native_stderr, configure
bridge_native_stderr()
configure("info")
os.write(2, b"E1203 07:47:09.038604    3081 chttp2_transport.cc:1234] closing transport: boom\\n")
os.write(2, b"I1203 07:47:09.038700    3081 ssl_transport_security.cc:2563] Handshake failed\\n")
os.write(2, b"W1203 07:47:09.038800    3082 tcp_posix.cc:99] \\xff slow reader\\n")
os.write(2, b"a native line in no known format\\n")
os.close(2)  # the relay reads to the end of what was written, then stops
next(t for t in threading.enumerate() if t.name == "native-stderr").join(10)
print("one sentence for the user", file=sys.stderr)
"""


def test_native_stderr_lines_become_records_at_their_level():
    r = subprocess.run([sys.executable, "-c", BRIDGE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    *log, sentence = r.stderr.splitlines()
    assert sentence == "one sentence for the user"  # Python's own stderr is the stream itself
    records = _records("\n".join(log))
    assert [(x["logger"], x["level"], x["event"]) for x in records] == [
        ("grpc.core", "error", "closing transport: boom"),  # info is below the libraries' level
        ("grpc.core", "warning", "\\xff slow reader"),
        ("grpc.core", "warning", "a native line in no known format")]
    assert records[0]["source"] == "chttp2_transport.cc:1234"
