"""Real databases for store tests: a SQLite file, and a fresh PostgreSQL database on 127.0.0.1."""
from __future__ import annotations

import os
import uuid

import pytest

PG_ADMIN = os.environ.get("BROKER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def pg_url_or_skip():
    """Create a throwaway database; yield its URL; drop it afterwards."""
    try:
        import psycopg
    except ImportError:
        pytest.skip("psycopg not installed")
    dsn = PG_ADMIN.replace("postgresql+psycopg://", "postgresql://")
    name = f"broker_test_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as c:
            c.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN.split('@')[-1]}: {str(e).splitlines()[0]}")
    base = PG_ADMIN.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'broker.db'}"
    else:
        yield from pg_url_or_skip()
