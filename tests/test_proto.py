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


def test_the_grpc_conversions_are_type_checked():
    """``broker/convert.py`` is checked by mypy (not on the ignore list), and passes: every name
    its annotations use resolves (``report_from_pb`` returns a ``broker.jobs.JobReport``)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ignored = {m for o in config["tool"]["mypy"]["overrides"] if o.get("ignore_errors") for m in o["module"]}
    assert "broker.convert" not in ignored
    r = subprocess.run([sys.executable, "-m", "mypy", "broker/convert.py"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_job_report_reads_the_optional_fields_only_when_set():
    from broker import convert
    from broker.jobs import JobReport
    from broker.v1 import broker_pb2 as pb

    r = convert.report_from_pb(pb.ReportJobRequest(lease_id="l-1", job_id="j", state=pb.JOB_STATE_FAILED,
                                                   exit_code=0, progress=0.0, checkpoint_uri="s3://b/c"))
    assert r == JobReport("l-1", "j", "failed", 0, "s3://b/c", 0.0)
    r = convert.report_from_pb(pb.ReportJobRequest(lease_id="l-1", job_id="j"))
    assert r == JobReport("l-1", "j", "unspecified", None, "", None)
