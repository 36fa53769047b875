"""The typer application and the helpers every command shares."""
from __future__ import annotations

import os
import sys
from typing import NoReturn

import typer

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
    ca = environ.get("BROKER_TLS_CA", "")
    if ca:
        try:
            with open(ca, "rb") as f:
                pem = f.read()
        except OSError as e:
            exit_usage(f"BROKER_TLS_CA names {ca}, which cannot be read ({e.strerror}).")
        if b"-----BEGIN CERTIFICATE-----" not in pem:
            exit_usage(f"BROKER_TLS_CA names {ca}, which is not a PEM certificate file.")


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


def console():
    """A rich console: the terminal's width (or $COLUMNS); wide when the output is piped, so piped
    tables stay readable."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)


FORMATS = ("table", "json")


def check_format(fmt: str) -> str:
    """``--format`` is table or json; anything else is bad input."""
    if fmt not in FORMATS:
        exit_usage(f"--format must be table or json, got {fmt!r}.")
    return fmt


def print_json(obj) -> None:
    """A command's --format json output: indented JSON and a newline on stdout."""
    import json

    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def fitted_table(console, columns: list[tuple[str, str]], rows: list[tuple[str, ...]],
                 drop_first: tuple[str, ...] = (), fold: tuple[str, ...] = (), **table_kw):
    """A table that fits ``console`` without cutting a cell: ``columns`` are (name, "left" or
    "right"); while the table is too wide, the columns in ``drop_first`` are left out, in that
    order. Ids and totals belong in no ``drop_first``: they are never cut or wrapped. Should the
    rest still not fit, the gaps close to one space and the columns in ``fold`` wrap onto a
    second line inside their cell (every character still shown)."""
    from rich import box
    from rich.measure import Measurement
    from rich.table import Table

    def build(keep: list[str], last_resort: bool) -> Table:
        kw = {"padding": 0, **table_kw} if last_resort else table_kw
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, show_edge=False, **kw)
        idx = [i for i, (name, _) in enumerate(columns) if name in keep]
        for i in idx:
            name = columns[i][0]
            folds = last_resort and name in fold
            t.add_column(name, justify=columns[i][1], no_wrap=not folds, overflow="fold" if folds else "ellipsis")
        for r in rows:
            t.add_row(*(r[i] for i in idx))
        return t

    keep = [name for name, _ in columns]
    for drop in (None, *drop_first):
        if drop is not None:
            keep.remove(drop)
        t = build(keep, False)
        if Measurement.get(console, console.options.update_width(1 << 16), t).maximum <= console.width:
            return t  # its natural width (measured unbounded) fits
    return build(keep, True)
