"""The typer application and the helpers every command shares."""
from __future__ import annotations

import os
import sys
from typing import NoReturn

import typer

from broker.terminal import FORMATS
from broker.terminal import console as console, fitted_table as fitted_table, print_json as print_json

app = typer.Typer(
    name="broker",
    help=(
        "Multi-cloud GPU burst broker. Schedule first, then scale: diagnose why a queue waits, "
        "and only when bursting is the right fix, quote GPU capacity across AWS, GCP and Azure "
        "at full cost, launch it, hand the job off and tear it down."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

DEFAULT_SERVER = "127.0.0.1:50051"


def _version(value: bool) -> None:
    if value:
        from broker import __version__

        sys.stdout.write(f"broker {__version__}\n")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", help="Print the version and exit.",
                                       callback=_version, is_eager=True)) -> None:
    """Multi-cloud GPU burst broker."""
    _check_client_environment(os.environ)


def _check_client_environment(environ) -> None:
    """A client setting that cannot work is bad input for every command: say so before anything."""
    token = environ.get("BROKER_TOKEN", "")
    if token and (token != token.strip() or any(not c.isprintable() or c.isspace() for c in token)):
        exit_usage("BROKER_TOKEN holds a space, a line break or another character no bearer token has "
                   "(a stray newline from a file? strip it).")
    ca = environ.get("BROKER_TLS_CA", "")
    if ca:
        from providers.files import SMALL_BYTES, read_bytes

        try:
            pem = read_bytes(ca, SMALL_BYTES)
        except OSError as e:
            exit_usage(f"BROKER_TLS_CA names {ca}, which cannot be read ({e.strerror}).")
        if b"-----BEGIN CERTIFICATE-----" not in pem:
            exit_usage(f"BROKER_TLS_CA names {ca}, which is not a PEM certificate file.")


def check_writable(path, option: str) -> None:
    """A file to write at the end of long work: its directory must take it now, not after the
    work (a replay of minutes lost to a typo in the path)."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        exit_usage(f"{option}: there is no directory {parent[:200]} to write {os.path.basename(path)[:100]} in.")
    if not os.access(parent, os.W_OK) or os.path.isdir(path):
        exit_usage(f"{option}: {str(path)[:200]} cannot be written here.")


def server_option_default() -> str:
    return os.environ.get("BROKER_SERVER", DEFAULT_SERVER)


def exit_usage(message: str) -> NoReturn:
    """Bad input: one sentence on stderr, exit code 2, no traceback."""
    sys.stderr.write(f"broker: {message.rstrip()}\n")
    raise typer.Exit(2)


def exit_error(message: str, code: int = 1) -> NoReturn:
    """The request was valid but could not be served (server down, cloud refused)."""
    sys.stderr.write(f"broker: {message.rstrip()}\n")
    raise typer.Exit(code)


def exit_refused(e) -> NoReturn:
    """A broker call that failed (a broker.client.ClientError): its sentence on stderr, and the
    exit code broker.errors' table gives its status (2 bad input, 3 over budget, 4 not found,
    5 not allowed, 6 conflict or wrong state, 7 unavailable: no broker answering, or a cloud)."""
    sys.stderr.write(f"broker: {str(e).rstrip()}\n")
    raise typer.Exit(e.exit_code)


def check_format(fmt: str) -> str:
    """``--format`` is table or json; anything else is bad input."""
    if fmt not in FORMATS:
        exit_usage(f"--format must be table or json, got {fmt!r}.")
    return fmt
