"""Bearer tokens kept in the store: issued, listed and revoked with `broker tokens` on the store
itself, honoured over gRPC next to the config file's (clear or ``sha256:``) tokens, and a
revocation honoured by a second replica of the same PostgreSQL store within its cache time."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from broker import config as cfgmod
from broker.auth import Role
from broker.errors import ConfigError, Unavailable
from broker.store import Store
from broker.tokens import (PREFIX, IssuedTokens, TokenStore, digest_hex, parse_duration)
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.grpc_server import running_server
from tests.stores import pg_url_or_skip

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[1]
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
OK = grpc.StatusCode.OK
CLEAR = "clear-config-token-of-team-b"
HASHED = "hashed-config-token-of-the-operator"
CONFIG_TOKENS = {CLEAR: "team-b", "sha256:" + hashlib.sha256(HASHED.encode()).hexdigest(): "*"}


@pytest.fixture
def pg():
    gen = pg_url_or_skip()
    yield next(gen)
    next(gen, None)


def broker(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    full.update({"PYTHONPATH": str(ROOT), "COLUMNS": "80", **(env or {})})
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, env=full,
                          timeout=120, stdin=subprocess.DEVNULL)


def create(db: str, *args: str) -> dict:
    r = broker("tokens", "create", "--db", db, "-o", "json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def call(stub, token: str, request=None) -> grpc.StatusCode:
    try:
        stub.ListLeases(request or pb.ListLeasesRequest(), metadata=(("authorization", f"Bearer {token}"),),
                        timeout=10)
        return OK
    except grpc.RpcError as e:
        return e.code()


def poll(what: str, check, deadline_s: float = 20.0) -> float:
    """Seconds until ``check()`` holds (fails past the deadline)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < deadline_s, f"{what} within {deadline_s:g} s"
        time.sleep(0.05)
    return time.monotonic() - start


def server_config(mini_catalog_dir, **auth) -> dict:
    return {"catalog.path": str(mini_catalog_dir), "auth.tokens": CONFIG_TOKENS,
            **{f"auth.{k}": v for k, v in auth.items()}}


# ---------------------------------------------------------------------------------------------
# over gRPC


def test_revoked_on_one_replica_is_refused_by_the_other(tmp_path, pg, mini_catalog_dir):
    """Two replicas on one PostgreSQL store: a token issued with the CLI works on both; revoked
    with the CLI, the replica that had it cached refuses it once its cache time has passed."""
    cfg = {**server_config(mini_catalog_dir), "store.url": pg}
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    with running_server(tmp_path / "a", config=cfg) as (addr_a, _), \
            running_server(tmp_path / "b", config=cfg) as (addr_b, svc_b), \
            grpc.insecure_channel(addr_a) as ch_a, grpc.insecure_channel(addr_b) as ch_b:
        a, b = pb_grpc.BrokerStub(ch_a), pb_grpc.BrokerStub(ch_b)
        made = create(pg, "--tenant", "team-a", "--note", "replica test")
        token = made["token"]
        assert token.startswith(PREFIX) and made["role"] == "tenant" and made["tenants"] == ["team-a"]
        assert call(a, token) == OK and call(b, token) == OK  # b now holds it in its cache
        # the token acts for its own tenant only, through the one authorization table
        assert call(a, token, pb.ListLeasesRequest(tenant="team-b")) == grpc.StatusCode.PERMISSION_DENIED
        r = broker("tokens", "revoke", made["id"], "--db", pg)
        assert r.returncode == 0 and made["id"] in r.stdout, r.stderr
        revoked = time.monotonic()
        poll("the second replica to refuse the revoked token", lambda: call(b, token) == UNAUTH)
        delay = time.monotonic() - revoked
        assert call(a, token) == UNAUTH and call(b, token) == UNAUTH
        # the config file's tokens, clear and hashed, still work next to the store's
        assert call(b, CLEAR) == OK and call(b, HASHED) == OK and call(a, HASHED) == OK
        assert delay <= svc_b.config.auth.store_cache_s + 15  # the poll's own deadline, not a timing


def test_config_tokens_clear_and_hashed_and_store_tokens_side_by_side(tmp_path, mini_catalog_dir):
    with running_server(tmp_path, config=server_config(mini_catalog_dir)) as (addr, svc), \
            grpc.insecure_channel(addr) as ch:
        stub = pb_grpc.BrokerStub(ch)
        tokens = TokenStore(svc.store.engine)
        _, sched = tokens.create("scheduler", ["team-a,team-c"], None, "kueue")
        _, op = tokens.create("operator", [], 3600)
        assert call(stub, CLEAR) == OK and call(stub, HASHED) == OK and call(stub, op) == OK
        assert call(stub, "sha256:" + hashlib.sha256(HASHED.encode()).hexdigest()) == UNAUTH  # a hash is no token
        assert call(stub, digest_hex(op)) == UNAUTH
        assert call(stub, sched) == grpc.StatusCode.PERMISSION_DENIED  # a scheduler may not list leases
        assert call(stub, "brk_never-issued") == UNAUTH and call(stub, "") == UNAUTH
        p = svc.auth.authenticate((("authorization", f"Bearer {sched}"),))
        assert p.role is Role.SCHEDULER and p.tenants == {"team-a", "team-c"}


def test_an_expired_token_is_refused_even_while_cached(tmp_path, mini_catalog_dir):
    with running_server(tmp_path, config=server_config(mini_catalog_dir, store_cache_s=300)) as (addr, svc), \
            grpc.insecure_channel(addr) as ch:
        stub = pb_grpc.BrokerStub(ch)
        _, old = TokenStore(svc.store.engine, clock=lambda: time.time() - 3600).create("tenant", ["team-a"], 60)
        assert call(stub, old) == UNAUTH  # expired 59 minutes ago
        _, short = TokenStore(svc.store.engine).create("tenant", ["team-a"], 5)
        assert call(stub, short) == OK  # cached now, for 300 s; its expiry travels with it
        poll("the token to expire", lambda: call(stub, short) == UNAUTH)
        assert svc.auth._issued.lookups == 2  # one store read per token: the expiry came from the cache


def test_store_tokens_false_ignores_the_store(tmp_path, mini_catalog_dir):
    with running_server(tmp_path, config=server_config(mini_catalog_dir, store_tokens=False)) as (addr, svc), \
            grpc.insecure_channel(addr) as ch:
        stub = pb_grpc.BrokerStub(ch)
        _, token = TokenStore(svc.store.engine).create("operator", [], None)
        assert call(stub, token) == UNAUTH and call(stub, CLEAR) == OK


def test_the_store_alone_is_enough_when_asked(tmp_path):
    cfg = cfgmod.load(None, environ={}, overrides={"auth.store_tokens": True})
    assert cfg.auth is not None and cfg.auth_tokens == {} and cfg.auth.honours_store
    with pytest.raises(ConfigError, match=r"auth.tokens\) is empty.*auth.store_tokens = true"):
        cfgmod.load(None, environ={"BROKER_AUTH__TOKENS": "{}"})
    with pytest.raises(ConfigError, match="auth.store_cache_s"):
        cfgmod.load(None, environ={}, overrides={"auth.store_tokens": True, "auth.store_cache_s": -1})


# ---------------------------------------------------------------------------------------------
# the store and its cache


@pytest.fixture
def tokens(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'b.db'}")
    yield TokenStore(store.engine)
    store.close()


def test_only_the_digest_is_stored(tokens, tmp_path):
    rec, token = tokens.create("tenant", ["team-a"], 86400, "ci")
    assert token.startswith(PREFIX) and len(token) == len(PREFIX) + 43
    assert rec.digest == hashlib.sha256(token.encode()).hexdigest()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("b.db*"))
    assert token.encode() not in raw and token[len(PREFIX):].encode() not in raw
    assert tokens.by_digest(bytes.fromhex(rec.digest)).id == rec.id
    assert tokens.by_digest(hashlib.sha256(b"other").digest()) is None
    other = tokens.create("tenant", ["team-a"], None)[1]
    assert other != token


def test_the_cache_answers_for_its_time_then_asks_the_store(tokens):
    now = [0.0]
    issued = IssuedTokens(tokens, ttl_s=2.0, monotonic=lambda: now[0])
    rec, token = tokens.create("tenant", ["team-a"], None)
    digest = hashlib.sha256(token.encode()).digest()
    assert issued(digest).tenant == "team-a"
    tokens.revoke(rec.id)
    now[0] = 1.9
    assert issued(digest) is not None  # still cached
    now[0] = 2.0
    assert issued(digest) is None and issued.lookups == 2
    unknown = hashlib.sha256(b"guess").digest()
    assert issued(unknown) is None and issued(unknown) is None and issued.lookups == 3
    uncached = IssuedTokens(tokens, ttl_s=0)
    assert uncached(digest) is None and uncached(digest) is None and uncached.lookups == 2


def test_revoke_is_once_and_unknown_ids_are_lookup_errors(tokens):
    rec, _ = tokens.create("operator", [], None)
    assert tokens.revoke(rec.id)[1] is True
    again, changed = tokens.revoke(rec.id)
    assert changed is False and again.revoked_at is not None
    with pytest.raises(LookupError):
        tokens.revoke("tok-missing")
    assert tokens.list() == [] and [r.id for r in tokens.list(include_inactive=True)] == [rec.id]


def test_a_store_that_does_not_answer_is_unavailable_never_a_pass():
    from sqlalchemy import create_engine

    issued = IssuedTokens(TokenStore(create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")))
    with pytest.raises(Unavailable, match="token store is unavailable"):
        issued(hashlib.sha256(b"x").digest())


def test_a_row_no_role_allows_gives_nothing(tokens):
    from sqlalchemy import update

    from broker.tokens import TokenRecord

    rec, token = tokens.create("tenant", ["team-a"], None)
    with tokens.engine.begin() as conn:
        conn.execute(update(TokenRecord).where(TokenRecord.id == rec.id).values(role="admin"))
    assert IssuedTokens(tokens)(hashlib.sha256(token.encode()).digest()) is None


@pytest.mark.parametrize("text, seconds", [("90d", 90 * 86400), ("12h", 43200), ("30m", 1800), ("45s", 45),
                                           ("2w", 14 * 86400), ("never", None), (" 7D ", 7 * 86400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["90x", "0d", "-1d", "1.5d", "d", "", "90", "99999w", "1e9s"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="--expires|duration|ten years"):
        parse_duration(text)


# ---------------------------------------------------------------------------------------------
# the command line


def test_list_never_shows_a_token_or_its_digest(tmp_path):
    db = f"sqlite:///{tmp_path / 'b.db'}"
    store = Store(db)
    try:  # made: the tenant's (to be revoked), the operator's, the scheduler's (through the CLI)
        made = [dict(zip(("record", "token"), TokenStore(store.engine).create(role, tenants, None, note)))
                for role, tenants, note in (("tenant", ["team-a"], "first"), ("operator", [], ""))]
    finally:
        store.close()
    made = [{"id": m["record"].id, "token": m["token"]} for m in made]
    made.append(create(db, "--role", "scheduler", "--tenant", "team-a", "--tenant", "team-c", "--expires", "12h"))
    assert broker("tokens", "revoke", made[0]["id"], "--db", db).returncode == 0
    outputs = [broker("tokens", "list", "--db", db, *args) for args in ((), ("--all",), ("--all", "-o", "json"))]
    for r in outputs:
        assert r.returncode == 0, r.stderr
        for m in made:
            assert m["token"] not in r.stdout and m["token"][len(PREFIX):] not in r.stdout
            assert digest_hex(m["token"]) not in r.stdout
    table, every = outputs[0].stdout, outputs[1].stdout
    assert all(len(line) <= 80 for line in every.splitlines()), every
    assert made[0]["id"] not in table and all(m["id"] in table for m in made[1:])
    assert all(m["id"] in every for m in made) and "revoked" in every
    listed = {t["id"]: t for t in json.loads(outputs[2].stdout)}
    assert listed[made[0]["id"]]["status"] == "revoked" and listed[made[2]["id"]]["tenants"] == ["team-a", "team-c"]
    assert listed[made[1]["id"]]["expires_at"] is None and listed[made[1]["id"]]["role"] == "operator"
    assert all(len(t["sha256_prefix"]) == 12 for t in listed.values())
    again = broker("tokens", "revoke", made[0]["id"], "--db", db)
    assert again.returncode == 0 and "already revoked" in again.stdout


def test_create_prints_the_token_once_and_says_when_no_server_would_ask_for_it(tmp_path):
    db = f"sqlite:///{tmp_path / 'b.db'}"
    r = broker("tokens", "create", "--tenant", "team-a", "--db", db)
    assert r.returncode == 0 and r.stdout.count(PREFIX) == 1 and "tok-" in r.stdout
    assert "no [auth] section" in r.stderr
    conf = tmp_path / "broker.toml"
    conf.write_text(f"[auth]\ntokens = {{ {CLEAR!r} = \"team-b\" }}\n".replace("'", '"'))
    r = broker("tokens", "create", "--tenant", "team-a", "--db", db, "--config", str(conf))
    assert r.returncode == 0 and r.stderr == ""


def test_revoking_a_token_that_does_not_exist_is_not_found(tmp_path):
    r = broker("tokens", "revoke", "tok-0000000000", "--db", f"sqlite:///{tmp_path / 'b.db'}")
    assert r.returncode == 4 and r.stderr == ("broker: there is no token 'tok-0000000000' "
                                              "(`broker tokens list --all` shows them).\n"), (r.returncode, r.stderr)


@pytest.mark.parametrize("args, words", [
    (["create", "--tenant", "team-a", "--expires", "90x"], "--expires must be a duration like 90d"),
    (["create", "--tenant", "team-a", "--role", "admin"], "--role must be tenant, scheduler or operator, got 'admin'"),
    (["create"], "--tenant: a tenant token needs one tenant"),
    (["create", "--tenant", "team-a,team-b"], "--tenant: a tenant token acts for exactly one tenant"),
    (["create", "--tenant", "team a"], "'team a' is not a tenant name"),
    (["create", "--role", "operator", "--tenant", "team-a"], "an operator token acts for every tenant"),
    (["create", "--role", "scheduler"], "--tenant: a scheduler token needs tenants"),
    (["create", "--tenant", "team-a", "--note", "x" * 201], "--note: a note is one line of at most 200"),
    (["create", "--tenant", "team-a", "-o", "yaml"], "--format must be table or json"),
    (["list", "--db", "mysql://root@127.0.0.1/x"], "store.url must be sqlite:///PATH or postgresql"),
])
def test_careless_input_is_one_sentence_and_exit_2(tmp_path, args, words):
    db = [] if "--db" in args else ["--db", f"sqlite:///{tmp_path / 'b.db'}"]
    r = broker("tokens", *args, *db)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("broker: "), r.stderr
    assert r.stdout == ""
