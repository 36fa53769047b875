"""What a command writes: one-sentence errors with their exit codes, JSON, and tables that fit the
terminal without cutting an id or a total.

Nothing here imports typer, and rich only when a rich console is asked for: `broker quote` runs
from here without the CLI framework (:mod:`broker.command`). Where the output is no terminal and
carries no colour, a table and its lines are laid out as plain text by :class:`PlainConsole`,
byte for byte what rich prints there (``tests/test_terminal.py`` compares the two); anything it
does not lay out the same way (a line rich would wrap, markup, emoji codes, a table that must
fold its cells) is left to rich.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any, NoReturn, Sequence

FORMATS = ("table", "json")

#: Width of a console that writes to no terminal and is given no $COLUMNS: piped tables stay whole.
PIPED_WIDTH = 200


def exit_usage(message: str) -> NoReturn:
    """Bad input: one sentence on stderr, exit code 2, no traceback."""
    sys.stderr.write(f"broker: {message.rstrip()}\n")
    raise SystemExit(2)


def exit_error(message: str, code: int = 1) -> NoReturn:
    """The request was valid but could not be served (server down, cloud refused)."""
    sys.stderr.write(f"broker: {message.rstrip()}\n")
    raise SystemExit(code)


def exit_refused(e) -> NoReturn:
    """A broker call that failed (a broker.client.ClientError): its sentence on stderr and the exit
    code broker.errors' table gives its status."""
    sys.stderr.write(f"broker: {str(e).rstrip()}\n")
    raise SystemExit(e.exit_code)


def check_format(fmt: str) -> str:
    """``--format`` is table or json; anything else is bad input."""
    if fmt not in FORMATS:
        exit_usage(f"--format must be table or json, got {fmt!r}.")
    return fmt


def print_json(obj) -> None:
    """A command's --format json output: indented JSON and a newline on stdout."""
    import json

    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def console():
    """A rich console: the terminal's width (or $COLUMNS); wide when the output is piped, so piped
    tables stay readable."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPED_WIDTH)


def plain_console(environ=None, stdout=None) -> PlainConsole | None:
    """A :class:`PlainConsole` of the width :func:`console` would have, or None where rich would
    not print plain text: a terminal, colour forced (``FORCE_COLOR``, ``TTY_COMPATIBLE=1``), a
    $COLUMNS that is no positive number, or a stream that cannot take the table's rule."""
    environ = os.environ if environ is None else environ
    stdout = sys.stdout if stdout is None else stdout
    try:
        if stdout.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    if environ.get("TTY_COMPATIBLE", "") == "1" or environ.get("FORCE_COLOR", "") != "":
        return None
    if not (getattr(stdout, "encoding", None) or "utf-8").lower().startswith("utf"):
        return None  # rich draws the rule in ASCII there
    columns = environ.get("COLUMNS")
    if not columns:
        return PlainConsole(PIPED_WIDTH)
    if not columns.isdigit() or int(columns) < 1:
        return None
    return PlainConsole(int(columns))


#: Characters one cell wide in rich's measure, and no part of markup or an emoji code.
_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) | {"·", "×"}
_EMOJI = re.compile(r":\S*:")  # rich replaces :name: codes; any colon pair without a space is left to it


def _is_plain(text: str, markup: bool = True) -> bool:
    return _PLAIN.issuperset(text) and not (markup and "[" in text) and not (":" in text and _EMOJI.search(text))


class PlainColumn:
    def __init__(self, header: str, justify: str, width: int) -> None:
        self.header, self.justify, self.width = header, justify, width


class PlainTable:
    """A table as rich lays out ``fitted_table``'s (simple head rule, no edges, one space of
    padding closed up between columns) at its natural width."""

    def __init__(self, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> None:
        self.rows = rows
        self.columns = [PlainColumn(name, justify, max([len(name), *(len(r[i]) for r in rows)]))
                        for i, (name, justify) in enumerate(columns)]
        self.width = sum(c.width for c in self.columns) + 2 * (len(self.columns) - 1)
        # rich trims a right-aligned cell's trailing spaces: cells with spaces at an end are its to lay out
        self.plain = all(_is_plain(cell) and cell == cell.strip()
                         for r in (tuple(n for n, _ in columns), *rows) for cell in r)

    def _line(self, cells) -> str:
        return "  ".join(c.rjust(col.width) if col.justify == "right" else c.ljust(col.width)
                         for c, col in zip(cells, self.columns))

    def lines(self) -> list[str]:
        return [self._line([c.header for c in self.columns]), "─" * self.width, *map(self._line, self.rows)]


class PlainConsole:
    """The part of rich's Console the tables use, writing plain text: lines are kept until
    :meth:`flush`; :attr:`fits` turns False at the first thing rich would print otherwise."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.fits = True
        self._lines: list[str] = []

    def print(self, obj: Any = "", highlight: bool | None = None, markup: bool | None = None) -> None:
        if isinstance(obj, PlainTable):
            self.fits = self.fits and obj.plain and obj.width <= self.width
            self._lines.extend(obj.lines())
            return
        text = str(obj)
        self.fits = self.fits and len(text) <= self.width and _is_plain(text, markup is not False)
        self._lines.append(text)

    def flush(self) -> None:
        sys.stdout.write("".join(f"{line}\n" for line in self._lines))
        self._lines.clear()


def fitted_table(console, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]],
                 drop_first: tuple[str, ...] = (), fold: tuple[str, ...] = (), **table_kw):
    """A table that fits ``console`` without cutting a cell: ``columns`` are (name, "left" or
    "right"); while the table is too wide, the columns in ``drop_first`` are left out, in that
    order. Ids and totals belong in no ``drop_first``: they are never cut or wrapped. Should the
    rest still not fit, the gaps close to one space and the columns in ``fold`` wrap onto a
    second line inside their cell (every character still shown: rich's layout, never a
    :class:`PlainConsole`'s)."""
    if isinstance(console, PlainConsole):
        return _plain_fitted(console, columns, rows, drop_first, bool(table_kw))
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
            t.add_column(name, justify=columns[i][1],  # type: ignore[arg-type]
                          no_wrap=not folds, overflow="fold" if folds else "ellipsis")
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


def _plain_fitted(console: PlainConsole, columns, rows, drop_first, styled: bool) -> PlainTable:
    keep = [name for name, _ in columns]
    for drop in (None, *drop_first):
        if drop is not None:
            keep.remove(drop)
        idx = [i for i, (name, _) in enumerate(columns) if name in keep]
        t = PlainTable([columns[i] for i in idx], [tuple(r[i] for i in idx) for r in rows])
        if t.width <= console.width:
            break
    console.fits = console.fits and not styled and t.width <= console.width  # else rich closes the gaps and folds
    return t
