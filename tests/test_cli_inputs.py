"""Careless input through the real command line: every case is exit 2 and one sentence on
stderr naming what was wrong, never a traceback and never a silent accept."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUOTE = ["quote", "--gpu", "H100:8"]


def broker(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    full.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, env=full,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, env, words", [
    (QUOTE + ["--hours", "nan"], {}, "--hours must be a positive number of at most 87840 (ten years)"),
    (QUOTE + ["--hours", "inf"], {}, "--hours must be a positive number of at most 87840 (ten years)"),
    (QUOTE + ["--hours", "1e308"], {}, "--hours must be a positive number of at most 87840 (ten years)"),
    (QUOTE + ["--hours", "100000"], {}, "--hours must be a positive number of at most 87840 (ten years)"),
    (QUOTE + ["--hours", "0"], {}, "--hours must be a positive number of at most 87840 (ten years), got 0.0."),
    (QUOTE + ["--hours", "-1"], {}, "--hours must be a positive number of at most 87840 (ten years), got -1.0."),
    (QUOTE + ["--hours", "1", "--data-in-gb", "1e300"], {}, "--data-in-gb must be a finite number"),
    (QUOTE + ["--hours", "1", "--data-out-gb", "-1"], {}, "--data-out-gb must be a finite number"),
    (QUOTE + ["--hours", "1", "--min-sla", "nan"], {}, "--min-sla must be a finite number"),
    (QUOTE + ["--hours", "1", "--residency", "mars"], {}, "residency 'mars' is neither a geography"),
    (QUOTE + ["--hours", "1", "--regions", "mars-1"], {}, "unknown region 'mars-1'"),
    (QUOTE + ["--hours", "1", "--data-location", "aws:nowhere-1"], {}, "'aws:nowhere-1' is not a region of aws"),
    (QUOTE + ["--hours", "1", "--data-location", "mars"], {}, "must be 'onprem' or PROVIDER:REGION"),
    (QUOTE + ["--hours", "1", "--deadline", "2020-01-01T00:00Z"], {}, "--deadline: deadline is in the past"),
    (QUOTE + ["--hours", "1", "--deadline", "tomorrow"], {}, "--deadline must be an ISO time"),
    (QUOTE + ["--hours", "1", "-o", "yaml"], {}, "--format must be table or json"),
    (["quote", "--gpu", "H100:zero", "--hours", "1"], {}, "--gpu count must be a whole number"),
    (["leases", "--server", "127.0.0.1:1"], {"BROKER_TLS_CA": "/nowhere/ca.pem"},
     "BROKER_TLS_CA names /nowhere/ca.pem, which cannot be read"),
    (["leases", "--server", "127.0.0.1:1"], {"BROKER_TLS_CA": str(ROOT / "README.md")},
     "is not a PEM certificate file"),
    (QUOTE + ["--hours", "1"], {"BROKER_QUOTE__TTL": "5"},
     "BROKER_QUOTE__TTL names quote.ttl, which is not a setting (did you mean BROKER_QUOTE__TTL_S?)"),
    (QUOTE + ["--hours", "1"], {"BROKER_SERVER__TLS_KEY_FILE": "/k.pem"},
     "server.tls_cert_file is required when server.tls_key_file is set"),
])
def test_careless_input_is_one_sentence_and_exit_2(args, env, words):
    r = broker(*args, env=env)
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr)
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("broker: "), r.stderr
    assert r.stdout == ""


def test_version_and_the_short_format_flag():
    r = broker("--version")
    assert r.returncode == 0 and r.stdout.startswith("broker ") and r.stdout.split()[1][0].isdigit()
    r = broker(*QUOTE, "--hours", "1", "--residency", "eu", "-o", "json")
    assert r.returncode == 0 and r.stdout.lstrip().startswith("{"), r.stderr
