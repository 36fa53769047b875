"""ListLeases is bounded: limit 0 is a page of 100, more than 1,000 is INVALID_ARGUMENT naming
``limit``, and a page token reads the rest of the history in pages, each lease once, in order
(even among leases created at the same instant), within the caller's tenants only. The CLI reads
every page with ``--limit 0``."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import grpc
import pytest

from broker.client import BrokerClient
from broker.lease import Lease
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.conftest import ROOT
from tests.grpc_server import running_server

TOKENS = {"tok-a": "team-a", "tok-op": "*"}
N = 250  # leases: 125 per tenant, created in groups of 10 at one instant each


def _lease(i: int) -> Lease:
    at = 1_000.0 + i // 10  # ten leases share each creation time
    return Lease(lease_id=f"l-{i:04d}", tenant="team-a" if i % 2 else "team-b", idempotency_key=f"k-{i}",
                 state="running" if i % 3 else "failed", provider="aws", region="us-east-1",
                 instance_type="g5.xlarge", market="on_demand", nodes=1, hourly_micros=1_006_000,
                 client_token=f"t-{i}", created_at=at, updated_at=at, state_since=at)


def _newest_first(leases) -> list[str]:
    return [l.lease_id for l in sorted(leases, key=lambda l: (l.created_at, l.lease_id), reverse=True)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, mini_catalog_dir):
    tmp = tmp_path_factory.mktemp("pages")
    with running_server(tmp, config={"catalog.path": str(mini_catalog_dir),
                                     "auth.tokens": TOKENS}) as (addr, svc):
        for i in range(N):
            svc.store.create_lease(_lease(i))
        yield addr, svc


def cli(*args: str, server: str, token: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "BROKER_SERVER": server, "BROKER_TOKEN": token}
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _call(addr: str, token: str, **request) -> pb.ListLeasesResponse:
    with grpc.insecure_channel(addr) as ch:
        return pb_grpc.BrokerStub(ch).ListLeases(pb.ListLeasesRequest(**request), timeout=30,
                                                  metadata=(("authorization", f"Bearer {token}"),))


def test_limit_zero_is_one_page_of_the_default_size_not_every_lease(server):
    addr, _ = server
    page = _call(addr, "tok-op")
    everyone = _newest_first(_lease(i) for i in range(N))
    assert [l.lease_id for l in page.leases] == everyone[:100]
    assert page.next_page_token


@pytest.mark.parametrize("limit", [1001, 100_000, 2**31 - 1])
def test_a_page_larger_than_the_most_is_invalid_argument_naming_limit(server, limit):
    addr, _ = server
    with pytest.raises(grpc.RpcError) as e:
        _call(addr, "tok-op", limit=limit)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("limit must be at most 1,000"), e.value.details()


@pytest.mark.parametrize("token", ["garbage", "W10", "WzEsIDJd", "x" * 2000])
def test_a_page_token_not_made_by_a_listing_is_invalid_argument_naming_it(server, token):
    addr, _ = server
    with pytest.raises(grpc.RpcError) as e:
        _call(addr, "tok-op", page_token=token)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("page_token "), e.value.details()


@pytest.mark.parametrize("token, size, states, expected", [
    ("tok-op", 7, [], [_lease(i) for i in range(N)]),
    ("tok-a", 10, [], [_lease(i) for i in range(N) if i % 2]),  # ten share a time: pages cut inside it
    ("tok-op", 33, [pb.LEASE_STATE_FAILED], [_lease(i) for i in range(N) if not i % 3]),
])
def test_page_tokens_read_every_lease_once_newest_first(server, token, size, states, expected):
    addr, _ = server
    seen, request = [], {"limit": size, "states": states}
    for _ in range(N):
        page = _call(addr, token, **request)
        assert len(page.leases) <= size
        seen += [l.lease_id for l in page.leases]
        if not page.next_page_token:
            break
        request["page_token"] = page.next_page_token
    assert seen == _newest_first(expected)


def test_a_tenant_pages_through_its_own_leases_only_whatever_the_token(server):
    addr, _ = server
    # the operator's token positioned among team-b's leases: team-a still sees only its own
    op_page = _call(addr, "tok-op", limit=3)
    page = _call(addr, "tok-a", limit=50, page_token=op_page.next_page_token)
    assert page.leases and {l.tenant for l in page.leases} == {"team-a"}
    with BrokerClient(addr, token="tok-a") as c:
        mine = c.list_leases()  # limit 0: the client reads every page
    assert [l["lease_id"] for l in mine] == _newest_first(_lease(i) for i in range(N) if i % 2)


def test_the_cli_lists_every_lease_with_limit_zero_and_refuses_a_negative_one(server):
    addr, _ = server
    out = cli("leases", "--limit", "0", "-o", "json", server=addr, token="tok-op")
    assert out.returncode == 0, out.stderr
    assert [l["lease_id"] for l in json.loads(out.stdout)] == _newest_first(_lease(i) for i in range(N))
    out = cli("leases", "--limit", "120", "-o", "json", server=addr, token="tok-op")
    assert len(json.loads(out.stdout)) == 120
    out = cli("leases", "--limit", "-1", server=addr)
    assert out.returncode == 2 and out.stderr.strip().endswith("--limit must be zero (every lease) or more, at most 10,000,000, got -1."), \
        out.stderr


def test_a_decisions_page_is_bounded_too(server):
    addr, _ = server
    with grpc.insecure_channel(addr) as ch, pytest.raises(grpc.RpcError) as e:
        pb_grpc.BrokerStub(ch).ListDecisions(pb.ListDecisionsRequest(limit=1001), timeout=30,
                                             metadata=(("authorization", "Bearer tok-op"),))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("limit must be at most 1,000"), e.value.details()
    out = cli("decisions", "--limit", "1001", server=addr, token="tok-op")
    assert out.returncode == 2 and out.stderr.strip() == "broker: --limit must be from 1 to 1,000, got 1001.", \
        out.stderr
