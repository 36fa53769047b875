"""Plain-text tables and lines (broker.terminal.PlainConsole) are byte for byte what rich prints to
a stream that is no terminal, and everything rich would print otherwise is left to rich."""
from __future__ import annotations

import io

import pytest
from hypothesis import given, settings, strategies as st
from rich.console import Console

from broker.terminal import PlainConsole, PlainTable, fitted_table, plain_console

NAMES = ("#", "provider", "region", "instance", "market", "nodes", "$/h", "total $")
CELL = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-./$* ", max_size=24).map(str.strip)


def _rich(width: int, draw) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, _environ={})
    draw(con)
    return buf.getvalue()


def _plain(width: int, draw) -> tuple[bool, str]:
    con = PlainConsole(width)
    draw(con)
    lines = con._lines
    return con.fits, "".join(f"{line}\n" for line in lines)


@st.composite
def tables(draw):
    n = draw(st.integers(1, len(NAMES)))
    names = list(NAMES[:n])
    columns = [(name, draw(st.sampled_from(["left", "right"]))) for name in names]
    rows = draw(st.lists(st.tuples(*[CELL] * n), max_size=6))
    drop = tuple(draw(st.permutations(names[1:]))[:draw(st.integers(0, n - 1))])
    lines = draw(st.lists(st.text(alphabet="abcdefgh xyz.,·×()0123456789", max_size=90), max_size=3))
    return columns, rows, drop, lines, draw(st.integers(10, 200))


@settings(max_examples=300, deadline=None)
@given(tables())
def test_what_the_plain_console_prints_is_what_rich_prints(case):
    columns, rows, drop, lines, width = case

    def draw(con):
        for line in lines:
            con.print(line, highlight=False, markup=False)
        t = fitted_table(con, columns, rows, drop_first=drop, fold=("provider", "region"))
        con.print(t)
        con.print(f"{len(rows)} rows", highlight=False)

    fits, text = _plain(width, draw)
    if fits:
        assert text == _rich(width, draw)
    else:  # declined only where rich wraps a line or closes the gaps and folds the table
        keep = [c for c in columns if c[0] not in drop]
        narrowest = PlainTable(keep, [tuple(r[columns.index(c)] for c in keep) for r in rows])
        assert any(len(line) > width for line in lines) or narrowest.width > width


def test_a_table_too_wide_even_without_its_detail_columns_is_rich_s_to_fold():
    rows = [("1", "x" * 40, "y" * 40, "12.00")]
    columns = [("#", "right"), ("provider", "left"), ("region", "left"), ("total $", "right")]
    con = PlainConsole(60)
    con.print(fitted_table(con, columns, rows, fold=("provider", "region")))
    assert not con.fits
    con = PlainConsole(100)
    con.print(fitted_table(con, columns, rows, fold=("provider", "region")))
    assert con.fits
    con = PlainConsole(100)  # rich trims a right-aligned cell's trailing space: its to lay out
    con.print(fitted_table(con, columns, [("1 ", "x", "y", "12.00")]))
    assert not con.fits


@pytest.mark.parametrize("text, markup, fits", [
    ("a plain sentence", True, True),
    ("older than [catalog] max_age_h", False, True),  # no markup asked for: printed as written
    ("older than [catalog] max_age_h", True, False),  # rich would read a style tag
    ("starts at 2026-12-03T18:00:00Z", False, False),  # a colon pair: rich looks for an emoji code
    ("spot judged by spot-model: ok", True, True),
    ("tab\there", False, False),
    ("ü is two bytes", False, False),
    ("x" * 81, False, False),  # rich would wrap it at 80
])
def test_a_line_is_plain_only_where_rich_prints_it_unchanged(text, markup, fits):
    con = PlainConsole(80)
    con.print(text, markup=markup)
    assert con.fits is fits
    if fits:
        assert _plain(80, lambda c: c.print(text, markup=markup))[1] == _rich(80, lambda c: c.print(text, markup=markup))


class _Stream(io.StringIO):
    def __init__(self, tty: bool, encoding: str = "utf-8") -> None:
        super().__init__()
        self._tty, self._encoding = tty, encoding

    def isatty(self) -> bool:
        return self._tty

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding


@pytest.mark.parametrize("environ, tty, encoding, width", [
    ({}, False, "utf-8", 200),
    ({"COLUMNS": ""}, False, "utf-8", 200),
    ({"COLUMNS": "80"}, False, "utf-8", 80),
    ({}, True, "utf-8", None),  # a terminal: colours and its own width, rich's
    ({"FORCE_COLOR": "1"}, False, "utf-8", None),
    ({"FORCE_COLOR": ""}, False, "utf-8", 200),  # empty: not forced (force-color.org)
    ({"TTY_COMPATIBLE": "1"}, False, "utf-8", None),
    ({"COLUMNS": "eighty"}, False, "utf-8", None),
    ({"COLUMNS": "0"}, False, "utf-8", None),
    ({}, False, "ascii", None),  # rich draws the rule in ASCII there
])
def test_the_plain_console_is_used_only_where_rich_would_print_plain_text(environ, tty, encoding, width):
    con = plain_console(environ, _Stream(tty, encoding))
    assert (con.width if con else None) == width
    if con is not None:  # and rich, in the same place, is that wide and colourless
        rich = Console(file=_Stream(tty, encoding), width=None if environ.get("COLUMNS") else 200, _environ=environ)
        assert rich.width == width and rich.color_system is None
