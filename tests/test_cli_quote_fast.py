"""A cold `broker quote` is answered without typer (broker.quote_command.fast): the same options,
the same output and the same errors as the typer command, and none of the heavy modules."""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys

import pytest
import typer.main

from broker.cli import app
from broker.quote_command import ENVVARS, OPTIONS, REQUIRED, parse, run
from tests.conftest import ROOT

KINDS = {"StringParamType": str, "FloatParamType": float, "IntParamType": int, "BoolParamType": bool}


def test_the_fast_path_reads_exactly_the_options_the_typer_command_declares():
    cmd = typer.main.get_command(app).commands["quote"]
    declared = {}
    defaults = inspect.signature(run).parameters
    for p in cmd.params:
        assert not p.secondary_opts, p.name  # a --no-x form would be a flag the fast path does not know
        assert p.is_flag == (KINDS[type(p.type).__name__] is bool), p.name
        for opt in p.opts:
            declared[opt] = (p.name, KINDS[type(p.type).__name__])
        assert p.required == (p.name in REQUIRED), p.name
        assert p.envvar == ENVVARS.get(p.name), p.name
        if not p.required:
            assert defaults[p.name].default == p.default, p.name
    assert declared == OPTIONS


@pytest.mark.parametrize("args, want", [
    (["--gpu", "H100:8", "--hours", "24"], {"gpu": "H100:8", "hours": 24.0}),
    (["--gpu=H100:8", "--hours=1e3", "-ojson", "--top", "0"], {"gpu": "H100:8", "hours": 1000.0, "fmt": "json", "top": 0}),
    (["--hours", "2", "--gpu", "A100:8", "--gpu", "H100:8", "-o", "table"], {"gpu": "H100:8", "hours": 2.0, "fmt": "table"}),
    (["--gpu", "H100:8", "--hours", "nan", "--interruptible", "--gpu-memory", " 40 "],
     {"gpu": "H100:8", "hours": float("nan"), "interruptible": True, "gpu_memory": 40}),
    (["--gpu", "H100:8", "--hours", "1", "--gpu", ""], {"gpu": "", "hours": 1.0}),
])
def test_a_well_formed_command_line_is_read_as_typer_reads_it(args, want):
    got = parse(args, environ={})
    assert got is not None and set(got) == set(want)
    assert all(got[k] == v or (v != v and got[k] != got[k]) for k, v in want.items())  # nan is nan


def test_the_config_comes_from_the_environment_unless_given():
    assert parse(["--gpu", "H100:8", "--hours", "1"], environ={"BROKER_CONFIG": "a.toml"})["config"] == "a.toml"
    assert parse(["--gpu", "H100:8", "--hours", "1", "--config", "b.toml"],
                 environ={"BROKER_CONFIG": "a.toml"})["config"] == "b.toml"
    assert "config" not in parse(["--gpu", "H100:8", "--hours", "1"], environ={"BROKER_CONFIG": ""})


@pytest.mark.parametrize("args", [
    ["--help"], ["--gpu", "H100:8", "--hours", "1", "--help"], ["-h"],
    ["--gpu", "H100:8"],  # --hours missing
    ["--gpu", "H100:8", "--hours"],  # no value
    ["--gpu", "H100:8", "--hours", "many"],
    ["--gpu", "H100:8", "--hours", "1", "--top", "1.5"],
    ["--gpu", "H100:8", "--hours", "-1"],  # a value that looks like an option
    ["--gpu", "H100:8", "--hours", "1", "--interruptible=yes"],
    ["--gpu", "H100:8", "--hours", "1", "extra"],
    ["--gpu", "H100:8", "--hours", "1", "--"],
    ["--gpu", "H100:8", "--hours", "1", "--hour", "2"],  # no prefix matching
    ["--gpu", "H100:8", "--hours", "1", "--no-interruptible"],
])
def test_anything_else_is_left_to_typer(args):
    assert parse(args, environ={}) is None


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BROKER_CONFIG", "COLUMNS", "BROKER_TLS_CA")}
    return {**env, **extra}


# Both as the `broker` console script runs: its entry point, and the typer application's own.
FAST = "import sys; sys.argv[0] = 'broker'; from broker.command import main; main()"
TYPER = "import sys; sys.argv[0] = 'broker'; from broker.cli import main; main()"


def _same(r: subprocess.CompletedProcess) -> tuple[int, str, str]:
    """The output without what differs from one quote to the next (its id and creation time)."""
    scrub = lambda s: re.sub(r"q-[0-9a-z]+-[0-9a-f]+", "Q", re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "T", s))
    return r.returncode, scrub(r.stdout), scrub(r.stderr)


@pytest.mark.parametrize("args, env", [
    (["--gpu", "H100:8", "--hours", "24"], {}),
    (["--gpu", "H100:8", "--hours", "24", "-o", "json"], {}),
    (["--gpu", "any:8", "--gpu-memory", "1", "--hours", "2400", "--interruptible", "--top", "0"], {"COLUMNS": "80"}),
    (["--gpu", "H100:8", "--hours", "0"], {}),  # the command's own check: exit 2, one sentence
    (["--gpu", "H100", "--hours", "1"], {}),
    (["--gpu", "H100:8", "--hours", "1", "--top", "-1"], {}),  # declined: typer reads -1
    (["--gpu", "H100:8"], {}),  # typer's usage error
    (["--gpu", "H100:8", "--hours", "1", "--config", "/nonexistent.toml"], {}),
    (["--gpu", "H100:8", "--hours", "1"], {"BROKER_TLS_CA": "/nonexistent.pem"}),  # checked before any command
])
def test_the_fast_path_answers_as_the_typer_command_does(args, env, tmp_path):
    env = {**env, "BROKER_HOME": str(tmp_path)}  # a cache of its own: the first run writes it
    fast, again = (subprocess.run([sys.executable, "-c", FAST, "quote", *args], capture_output=True, text=True,
                                  cwd=ROOT, env=_env(**env), timeout=120) for _ in range(2))
    slow = subprocess.run([sys.executable, "-c", TYPER, "quote", *args], capture_output=True, text=True, cwd=ROOT,
                          env=_env(**env), timeout=120)
    assert _same(fast) == _same(slow) == _same(again)  # again: from the compiled catalog and settings


HEAVY = {"typer", "click", "rich", "grpc", "google", "sqlalchemy", "sqlmodel", "alembic", "boto3", "botocore",
         "azure", "msal", "numpy", "structlog", "pydantic", "kubernetes", "httpx"}


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_cold_quote_loads_no_cli_framework_sdk_database_or_array_library(fmt, tmp_path):
    """What a `broker quote` imports is what it costs to start. Piped (no terminal), its table is
    plain text: rich is imported only to draw on a terminal or to fold a table too wide."""
    snippet = ("import json, runpy, sys\n"
               "sys.argv = ['broker', *sys.argv[1:]]\n"
               "try:\n    runpy.run_module('broker', run_name='__main__')\n"
               "except SystemExit as e:\n    assert not e.code, e.code\n"
               "sys.stderr.write(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n")
    r = subprocess.run([sys.executable, "-c", snippet, "quote", "--gpu", "H100:8", "--hours", "24", "-o", fmt],
                       capture_output=True, text=True, cwd=ROOT, env=_env(BROKER_HOME=str(tmp_path)), timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = set(json.loads(r.stderr[r.stderr.rindex("["):]))
    assert {"broker", "policies", "providers"} <= loaded
    assert not loaded & HEAVY, sorted(loaded & HEAVY)
    if fmt == "json":
        assert json.loads(r.stdout)["offers"]
    else:
        assert r.stdout.splitlines()[1].split()[:2] == ["#", "provider"]


def test_a_quote_after_the_first_reads_the_compiled_catalog_and_settings(tmp_path):
    """The first quote parses the catalog and loads the whole configuration, and keeps both
    compiled; the next loads neither the schema nor a parser, and says the same."""
    snippet = ("import json, runpy, sys\n"
               "sys.argv = ['broker', *sys.argv[1:]]\n"
               "runpy.run_module('broker', run_name='__main__')\n"
               "sys.stderr.write(json.dumps(sorted(m for m in ('broker.config', 'csv', 'tomllib')"
               " if m in sys.modules)))\n")
    config = tmp_path / "broker.toml"
    config.write_text('[providers.aws]\nenabled = true\nregions = ["us-east-1"]\nimage_id = "ami-0abc12345def67890"\n')
    runs = [subprocess.run([sys.executable, "-c", snippet, "quote", "--gpu", "H100:8", "--hours", "24", "-o", "json",
                            "--config", str(config)], capture_output=True, text=True, cwd=ROOT,
                           env=_env(BROKER_HOME=str(tmp_path / "home")), timeout=120) for _ in range(2)]
    loaded = [json.loads(r.stderr[r.stderr.rindex("["):]) for r in runs]
    assert loaded == [["broker.config", "csv", "tomllib"], []]
    assert _same(runs[0])[1] == _same(runs[1])[1]
    assert {o["provider"] for o in json.loads(runs[1].stdout)["offers"]} == {"aws"}
