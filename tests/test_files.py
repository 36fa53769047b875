"""providers.files: a file a person names is read within a bound, and within it exactly."""
from __future__ import annotations

import errno
import io

import pytest
from hypothesis import given, settings, strategies as st

from providers.files import lines, read_bytes, read_text


def test_a_document_of_the_bound_is_read_and_one_byte_more_is_refused(tmp_path):
    p = tmp_path / "doc.json"
    p.write_bytes(b"x" * 100)
    assert read_bytes(p, 100) == b"x" * 100
    p.write_bytes(b"x" * 101)
    with pytest.raises(OSError) as e:
        read_bytes(p, 100)
    assert e.value.errno == errno.EFBIG and e.value.strerror.startswith("it is larger than ")
    p.write_bytes("é".encode("latin-1"))
    with pytest.raises(UnicodeDecodeError):
        read_text(p)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(st.characters(exclude_characters="\r\n"), max_size=12), max_size=8),
       st.sampled_from(["\n", "\r\n", "\r"]), st.booleans())
def test_lines_within_the_bound_are_the_files_own_lines(rows, end, last_ended):
    text = end.join(rows) + (end if last_ended and rows else "")
    assert list(lines(io.StringIO(text, newline=""), 12)) == list(io.StringIO(text, newline=""))


@pytest.mark.parametrize("text, bad", [("a" * 13, 1), ("ok\n" + "b" * 20 + "\nok\n", 2), ("ab\r" + "c" * 13, 2)])
def test_a_line_past_the_bound_is_refused_by_its_number(text, bad):
    with pytest.raises(OSError) as e:
        list(lines(io.StringIO(text, newline=""), 12))
    assert e.value.errno == errno.EFBIG and e.value.strerror.startswith(f"line {bad} is longer than 12 characters")
