"""The service is the façade: the gRPC layer only translates, and every error it sends comes from
broker.errors' one table."""
from __future__ import annotations

import ast
import inspect

import grpc
import pytest

from broker import errors, queue_api, server
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.grpc_server import running_server

ERRORS = [cls for cls in errors.OUTCOMES]


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_error_of_the_family_reaches_the_client_with_its_status_from_the_table(tmp_path, cls):
    with running_server(tmp_path) as (addr, svc):
        def failing(lease_id):
            raise cls(f"{cls.__name__} for {lease_id}.")

        svc.lease = failing
        with grpc.insecure_channel(addr) as ch, pytest.raises(grpc.RpcError) as e:
            pb_grpc.BrokerStub(ch).GetLease(pb.GetLeaseRequest(lease_id="l-x"), timeout=10)
    assert e.value.code() == errors.OUTCOMES[cls].status
    assert e.value.details() == f"{cls.__name__} for l-x."


def test_a_stream_translates_an_error_raised_before_its_first_message(tmp_path):
    with running_server(tmp_path) as (addr, _):
        with grpc.insecure_channel(addr) as ch, pytest.raises(grpc.RpcError) as e:
            next(pb_grpc.BrokerStub(ch).WatchLeases(pb.WatchLeasesRequest(after_event_id=-1), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "after_event_id" in e.value.details()


def test_diagnose_without_any_snapshot_is_a_failed_precondition(tmp_path):
    with running_server(tmp_path) as (addr, _):
        with grpc.insecure_channel(addr) as ch, pytest.raises(grpc.RpcError) as e:
            pb_grpc.BrokerStub(ch).Diagnose(pb.DiagnoseRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_the_service_builds_its_autoscaler_from_the_config(tmp_path):
    with running_server(tmp_path, config={"autoscaler.enabled": True}) as (_, svc):
        assert svc.autoscaler is not None
    with running_server(tmp_path) as (_, svc):
        assert svc.autoscaler is None


def _attribute_chains(module) -> set[str]:
    """Every dotted name read in ``module`` ("self.svc.store.get_lease" -> also "self.svc.store")."""
    out = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Attribute):
            parts, cur = [], node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                parts.append(cur.id)
                out.add(".".join(reversed(parts)))
    return out


@pytest.mark.parametrize("module", [server, queue_api], ids=lambda m: m.__name__)
def test_the_grpc_layer_calls_only_the_service(module):
    reached = {c for c in _attribute_chains(module)
               if any(f"svc.{part}" in c for part in ("store", "lifecycle", "autoscaler", "reconciler", "budgets"))}
    assert not reached, f"{module.__name__} reaches past the service: {sorted(reached)}"


def test_the_server_has_no_status_table_of_its_own():
    chains = _attribute_chains(server)
    statuses = {c for c in chains if c.startswith("grpc.StatusCode.")}
    assert not statuses, f"statuses chosen outside broker.errors: {sorted(statuses)}"


def test_the_client_tells_a_cloud_connection_error_from_a_dead_broker(tmp_path):
    """A launch that failed in the cloud with a connection error is the broker's answer; only a
    call nothing answered is "no broker answering". Both are UNAVAILABLE (exit 7)."""
    import socket

    from broker.client import BrokerClient, ClientError

    with running_server(tmp_path) as (addr, svc):
        def launch(order):
            raise errors.Unavailable("lease l-1 could not be launched: aws/us-east-1: connection refused "
                                     "(could not connect to ec2.us-east-1.amazonaws.com).")

        svc.launch = launch
        req = pb.LaunchRequest(idempotency_key="k")
        req.offering.provider, req.offering.region, req.offering.instance_type = "aws", "us-east-1", "p5.48xlarge"
        with BrokerClient(addr) as c, pytest.raises(ClientError) as e:
            c.launch(req)
    assert e.value.answered and "could not connect to ec2" in str(e.value)
    assert "no broker answering" not in str(e.value) and e.value.exit_code == 7

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with BrokerClient(dead, timeout=5) as c, pytest.raises(ClientError) as e:
        c.get_lease("l-1")
    assert not e.value.answered and "no broker answering at " + dead in str(e.value)
    assert e.value.exit_code == 7
