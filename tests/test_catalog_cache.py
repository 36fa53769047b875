"""The compiled catalog (providers.catalog_cache): the same catalog as a parse, and any copy that is
stale, corrupt, someone else's or cannot be written is ignored (the catalog is parsed)."""
from __future__ import annotations

import errno
import marshal
import os
import shutil
from pathlib import Path

import pytest

from providers import catalog, catalog_cache
from providers.catalog import DATA_DIR


@pytest.fixture
def data(tmp_path, monkeypatch) -> Path:
    """A copy of the bundled catalog, and a cache directory of its own."""
    d = tmp_path / "data"
    d.mkdir()
    for name in catalog_cache.FILES:
        shutil.copy2(DATA_DIR / name, d / name)
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    return d


class Parses:
    """catalog.load, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, d: Path):
        self.calls += 1
        return catalog.load(d)


def cached(d: Path, parse: Parses):
    return catalog_cache.cached(d, parse, (catalog.Catalog, catalog.Region, catalog.Terms), (catalog.__file__,))


def test_the_copy_gives_the_catalog_a_parse_gives_without_parsing(data):
    parse = Parses()
    first = cached(data, parse)
    assert parse.calls == 1 and catalog_cache.path_for(data).is_file()
    again = cached(data, parse)
    assert parse.calls == 1  # read from the copy
    assert again == first == catalog.load(data)
    assert again.by_gpu.keys() == first.by_gpu.keys() and again.offerings[0].market is first.offerings[0].market
    assert os.stat(catalog_cache.path_for(data)).st_mode & 0o777 == 0o600


def test_a_changed_catalog_file_is_parsed_again_and_the_copy_replaced(data):
    parse = Parses()
    before = cached(data, parse)
    prices = data / "prices.csv"
    lines = prices.read_text().splitlines()
    head, first = lines[0].split(","), lines[1].split(",")
    first[head.index("on_demand_usd")] = "12345.67"
    prices.write_text("\n".join([lines[0], ",".join(first), *lines[2:]]) + "\n")
    after = cached(data, parse)
    assert parse.calls == 2 and after != before
    assert any(o.hourly_micros == 12345_670000 for o in after.offerings)
    assert cached(data, parse) == after and parse.calls == 2  # the new copy stands


def test_a_copy_made_by_other_code_is_not_read(data, monkeypatch):
    parse = Parses()
    cached(data, parse)
    monkeypatch.setattr(catalog_cache, "FORMAT", catalog_cache.FORMAT + 1)
    cached(data, parse)
    assert parse.calls == 2


@pytest.mark.parametrize("content", [
    b"", b"not marshal at all \x00\xff", b"\xe9\x01\x00",  # empty, garbage, truncated
    marshal.dumps(("a", "tuple", "of", "the", "wrong", "shape")),
    marshal.dumps([1, 2, 3]),
], ids=["empty", "garbage", "truncated", "wrong-shape", "wrong-type"])
def test_a_corrupt_copy_is_ignored_and_replaced(data, content):
    parse = Parses()
    cached(data, parse)
    path = catalog_cache.path_for(data)
    path.write_bytes(content)
    assert cached(data, parse) == catalog.load(data) and parse.calls == 2
    assert cached(data, parse) == catalog.load(data) and parse.calls == 2  # replaced by a good copy


def test_a_copy_with_the_right_key_but_broken_rows_is_ignored(data):
    parse = Parses()
    cached(data, parse)
    path = catalog_cache.path_for(data)
    k, inst, *rest = marshal.loads(path.read_bytes())
    path.write_bytes(marshal.dumps((k, [r[:3] for r in inst], *rest)))  # instance rows cut short
    assert cached(data, parse) == catalog.load(data) and parse.calls == 2


@pytest.mark.parametrize("what", ["file group-writable", "file world-writable", "directory world-writable",
                                  "file someone else's"])
def test_a_copy_someone_else_could_have_written_is_not_read(data, what):
    parse = Parses()
    cached(data, parse)
    path = catalog_cache.path_for(data)
    if what == "file group-writable":
        os.chmod(path, 0o620)
    elif what == "file world-writable":
        os.chmod(path, 0o602)
    elif what == "directory world-writable":
        os.chmod(path.parent, 0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("only root can give a file away")
        os.chown(path, 4242, -1)
    assert catalog_cache.read(path) is None
    assert cached(data, parse) == catalog.load(data) and parse.calls == 2


def test_a_link_in_place_of_the_copy_is_not_followed(data, tmp_path):
    parse = Parses()
    cached(data, parse)
    path = catalog_cache.path_for(data)
    real = tmp_path / "elsewhere.marshal"
    os.replace(path, real)
    path.symlink_to(real)
    assert catalog_cache.read(path) is None


def test_a_cache_directory_that_cannot_be_made_leaves_the_parse(data, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("BROKER_HOME", str(blocker))  # the cache directory would be inside a file
    parse = Parses()
    assert cached(data, parse) == catalog.load(data)
    assert cached(data, parse) == catalog.load(data) and parse.calls == 2


def test_a_read_only_cache_leaves_the_parse_and_no_temporary_file(data, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(catalog_cache.os, "replace", read_only)
    parse = Parses()
    assert cached(data, parse) == catalog.load(data)
    path = catalog_cache.path_for(data)
    assert not path.exists() and list(path.parent.iterdir()) == []
    assert catalog_cache.write(path, ("x",)) is False


def test_a_missing_catalog_file_is_the_parse_s_error(data):
    (data / "regions.csv").unlink()
    with pytest.raises(catalog.CatalogError, match="regions.csv"):
        cached(data, Parses())


def test_the_bundled_catalog_goes_through_the_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("BROKER_HOME", str(tmp_path / "home"))
    catalog.bundled.cache_clear()
    try:
        got = catalog.bundled()
        assert catalog_cache.path_for(DATA_DIR).is_file()
        assert got == catalog.load()
    finally:
        catalog.bundled.cache_clear()
