"""The generated gRPC code matches proto/, and the contract is buf-lint clean."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_generated_code_is_up_to_date(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", "proto", f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}", "proto/broker/v1/broker.proto"],
                   cwd=ROOT, check=True)
    for name in ("broker_pb2.py", "broker_pb2_grpc.py", "broker_pb2.pyi"):
        fresh = (tmp_path / "broker" / "v1" / name).read_text()
        assert fresh == (ROOT / "broker" / "v1" / name).read_text(), f"{name} is stale: run proto/gen.sh"


def test_buf_lint_is_clean():
    buf = shutil.which("buf") or str(ROOT / ".venv" / "bin" / "buf")
    if not shutil.which(buf):
        pytest.skip("buf not installed (pip install buf-bin)")
    r = subprocess.run([buf, "lint"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
