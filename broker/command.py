"""The `broker` command's entry point (``broker``, ``python -m broker``).

A well-formed `broker quote` is answered without the typer application (:func:`broker.quote_command.fast`):
importing typer and building the command costs more than the quote. Every other command line,
``--help`` and every error in how the command is called included, goes to :mod:`broker.cli`.
"""
from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["quote"]:
        from broker.quote_command import fast

        if fast(args[1:]):
            return
    from broker.cli import main as cli_main

    cli_main()
