"""What a command imports as it starts: a well-formed `broker quote` no command module at all
(broker.command answers it), any other command its own module, not the other fifteen;
`import broker.cli` anywhere else still gets every command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.main import get_command_name

import broker.cli
from broker.cli import COMMANDS, app, command_modules

ROOT = Path(__file__).resolve().parents[1]


def test_the_command_table_names_the_module_of_every_registered_command():
    """Imported under pytest, every module is loaded; the table must say where each command is."""
    registered = {(c.name or get_command_name(c.callback.__name__)): c.callback.__module__
                  for c in app.registered_commands}
    registered.update({(g.name or g.typer_instance.info.name): g.typer_instance.registered_commands[0].callback.__module__
                       for g in app.registered_groups})
    assert {k: f"broker.cli.{v}" for k, v in COMMANDS.items()} == registered


def test_only_the_broker_command_with_a_known_name_first_imports_one_module():
    every = command_modules(["pytest"])
    assert {"quote", "leases", "serve", "simulate_report"} <= set(every)
    assert command_modules(["/venv/bin/broker", "quote", "--gpu", "H100:8"]) == ["quote"]
    assert command_modules(["-m", "launch"]) == ["leases"]
    assert command_modules(["/x/broker/__main__.py", "slurm", "resume"]) == ["slurm"]
    assert command_modules(["/venv/bin/broker", "quot"]) == every  # a typo: suggestions need them all
    assert command_modules(["/venv/bin/broker", "--help"]) == every
    assert command_modules(["/venv/bin/broker"]) == every
    assert command_modules(["/venv/bin/pytest", "quote"]) == every  # not the broker command


def _run(*args: str) -> subprocess.CompletedProcess:
    snippet = ("import json, runpy, sys\n"
               "sys.argv = ['broker', *sys.argv[1:]]\n"
               "try:\n    runpy.run_module('broker', run_name='__main__')\n"
               "except SystemExit as e:\n    assert not e.code, e.code\n"
               "sys.stderr.write(json.dumps(sorted(m for m in sys.modules if m.startswith('broker.cli.'))))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", snippet, *args], check=False, capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


def test_a_quote_imports_no_command_module_and_help_still_lists_every_command():
    r = _run("quote", "--gpu", "H100:8", "--hours", "1", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stderr[r.stderr.rindex("["):]) == []  # broker.quote_command answers it, without typer
    assert json.loads(r.stdout)["offers"]
    r = _run("quote", "--help")  # typer's to answer: the command's module alone
    assert r.returncode == 0 and "--gpu" in r.stdout, r.stderr
    assert json.loads(r.stderr[r.stderr.rindex("["):]) == ["broker.cli.app", "broker.cli.quote"]
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    assert all(f" {name} " in r.stdout for name in COMMANDS), r.stdout
    assert "broker.cli.leases" in r.stderr and "broker.cli.tokens" in r.stderr


def test_the_package_still_exports_the_whole_app():
    assert broker.cli.app is app and len(app.registered_commands) + len(app.registered_groups) == len(COMMANDS)
