"""The `broker` command line: a thin typer layer over the flow.

Every module in this package registers its commands on :data:`app`; heavy imports (cloud SDKs,
gRPC, the database) happen inside the commands that need them, so `broker quote` starts fast.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys

from broker.cli.app import app, exit_usage

#: The module that registers each command (or group of commands). Run as the `broker` command
#: with a command's name first, only its module is imported: importing all sixteen costs ~12 ms
#: of CPU, a third of the interpreter's own start, on every command. tests/test_cli_inputs.py
#: keeps this table equal to what the modules register.
COMMANDS = {
    "advise": "advise", "decisions": "decisions", "diagnose": "diagnose", "launch": "leases",
    "release": "leases", "lease": "leases", "leases": "leases", "handoff": "leases", "watch": "leases",
    "report-job": "leases", "quote": "quote", "sandbox": "sandbox", "serve": "serve",
    "simulate": "simulate", "catalog": "catalog", "db": "db", "slurm": "slurm", "tokens": "tokens",
}
#: ``sys.argv[0]`` while the `broker` command starts: its console script, ``python -m broker``
#: (``__main__.py``) or ``python -m broker.cli`` (``-m`` while the package is imported).
ENTRY_POINTS = frozenset({"broker", "__main__.py", "-m"})


def command_modules(argv: list[str]) -> list[str]:
    """The modules to import for ``argv``: the named command's alone when this process is the
    `broker` command, else every one (``import broker.cli`` elsewhere gets the whole app)."""
    if len(argv) > 1 and os.path.basename(argv[0]) in ENTRY_POINTS and argv[1] in COMMANDS:
        return [COMMANDS[argv[1]]]
    return [m.name for m in pkgutil.iter_modules(__path__) if m.name not in ("app", "__main__")]


for _name in command_modules(sys.argv):
    importlib.import_module(f"{__name__}.{_name}")


def main() -> None:
    _only_the_command(sys.argv[1:])
    import typer

    try:
        rv = app(standalone_mode=False)
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.Abort:
        sys.exit(1)
    except Exception as e:  # click's own (typer vendors it; the classes are known by name)
        kinds = {c.__name__ for c in type(e).__mro__}
        if "ClickException" not in kinds:
            raise
        if "NoArgsIsHelpError" in kinds:  # `broker` or a group alone: its help, as before
            e.show()  # type: ignore[attr-defined]
            sys.exit(2)
        message = e.format_message().rstrip(".")  # type: ignore[attr-defined]
        if "UsageError" in kinds:  # an option's own parse: a number that is none, a missing option
            ctx = getattr(e, "ctx", None)
            message += f" (see `{ctx.command_path if ctx is not None else 'broker'} --help`)"
        sys.stderr.write(f"broker: {message}.\n")
        sys.exit(e.exit_code)  # type: ignore[attr-defined]
    sys.exit(rv if isinstance(rv, int) else 0)


def _only_the_command(args: list[str]) -> None:
    """Typer turns every command's signature into click options on each start (~30 ms for all
    of them, more than the whole of some commands): when the first argument names a command,
    only that one is built. Its options, help and errors are the same; anything else (no
    command, an option first, a name that is no command) builds them all, suggestions included."""
    from typer.main import get_command_name

    if not args or args[0].startswith("-"):
        return
    commands = [c for c in app.registered_commands
                if (c.name or get_command_name(c.callback.__name__)) == args[0]]
    groups = [g for g in app.registered_groups if (g.name or g.typer_instance.info.name) == args[0]]
    if commands or groups:
        app.registered_commands[:], app.registered_groups[:] = commands, groups


__all__ = ["COMMANDS", "app", "command_modules", "exit_usage", "main"]
