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
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = ["app", "exit_usage", "main"]
