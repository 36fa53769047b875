"""Bearer tokens map callers to tenants; TLS when configured; health stays open for probes."""
from __future__ import annotations

import datetime as dt

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.client import BrokerClient, ClientError, open_channel
from broker.lease import Lease
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from policies.demand import Demand
from tests.grpc_server import running_server

TOKENS = {"tok-a": "team-a", "tok-b": "team-b", "tok-op": "*"}


@pytest.fixture
def server(tmp_path, mini_catalog_dir):
    with running_server(tmp_path, config={"catalog.path": str(mini_catalog_dir), "auth.tokens": TOKENS}) as (addr, svc):
        for tenant, lid in (("team-a", "l-a"), ("team-b", "l-b")):
            svc.store.create_lease(Lease(
                lease_id=lid, tenant=tenant, idempotency_key=lid, state="running", provider="aws",
                region="us-east-1", instance_type="p5.48xlarge", market="on_demand", nodes=1,
                hourly_micros=1, client_token="t", created_at=1, updated_at=1, state_since=1))
        yield addr, svc


def test_no_token_is_unauthenticated(server):
    addr, _ = server
    with grpc.insecure_channel(addr) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.BrokerStub(ch).ListLeases(pb.ListLeasesRequest())
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert ok.status == health_pb2.HealthCheckResponse.SERVING
    with BrokerClient(addr, token="wrong") as c, pytest.raises(ClientError) as e:
        c.list_leases()
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_a_token_sees_and_acts_for_its_tenant_only(server):
    addr, _ = server
    with BrokerClient(addr, token="tok-a") as c:
        assert [l["lease_id"] for l in c.list_leases()] == ["l-a"]
        assert c.get_lease("l-a")["tenant"] == "team-a"
        with pytest.raises(ClientError) as e:  # another tenant's lease is as missing as a missing one
            c.get_lease("l-b")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(ClientError) as e:
            c.release("l-b")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(ClientError) as e:
            c.list_leases(tenant="team-b")
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        q = c.quote(Demand(gpus=8, hours=1, gpu_model="H100"))
        assert q["demand"]["tenant"] == "team-a"
    with BrokerClient(addr, token="tok-op") as c:
        assert sorted(l["lease_id"] for l in c.list_leases()) == ["l-a", "l-b"]


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return tmp_path / "cert.pem", tmp_path / "key.pem"


def test_tls_with_token(tmp_path, mini_catalog_dir):
    cert, key = _self_signed(tmp_path)
    cfg = {"catalog.path": str(mini_catalog_dir), "auth.tokens": TOKENS,
           "server.tls_cert_file": str(cert), "server.tls_key_file": str(key)}
    with running_server(tmp_path, config=cfg) as (addr, _):
        addr = addr.replace("127.0.0.1", "localhost")
        with BrokerClient(addr, token="tok-a", tls_ca=str(cert)) as c:
            assert c.list_leases() == []
        with grpc.insecure_channel(addr) as ch:  # plaintext to a TLS port fails
            with pytest.raises(grpc.RpcError):
                pb_grpc.BrokerStub(ch).ListLeases(pb.ListLeasesRequest(), timeout=3)
        with open_channel(addr, token="", tls_ca=str(cert)) as ch:
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.BrokerStub(ch).ListLeases(pb.ListLeasesRequest(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
