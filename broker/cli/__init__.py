"""The `broker` command line: a thin typer layer over the flow.

Every module in this package registers its commands on :data:`app`; heavy imports (cloud SDKs,
gRPC, the database) happen inside the commands that need them, so `broker quote` starts fast.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys

from broker.cli.app import app, exit_usage

for _m in pkgutil.iter_modules(__path__):
    if _m.name not in ("app", "__main__"):
        importlib.import_module(f"{__name__}.{_m.name}")


def main() -> None:
    _only_the_command(sys.argv[1:])
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


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


__all__ = ["app", "exit_usage", "main"]
