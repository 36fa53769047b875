"""Property-based fuzzing of every RPC of a real `broker serve` (on the three mocked clouds), with
requests built from the proto descriptors: zeros, extremes, NaN/inf, huge and NUL-bearing
strings, unknown enum values, invalid Timestamps, oversized lists and raw bytes.

The property: the broker never answers UNKNOWN or INTERNAL (its own code always names a status a
client can act on), never hangs a unary call, and afterwards is alive, serving and no bigger than
a bounded amount. Hypothesis runs derandomized (the same examples every run) and without
shrinking, so the whole file takes about a minute and reports every failing request it found.
"""
from __future__ import annotations

import json
import math
import os

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.clouds.three import ServeProcess, clouds, clouds_server, write_config  # noqa: F401

pytestmark = pytest.mark.timeout(600)

SERVICE = pb.DESCRIPTOR.services_by_name["Broker"]
METHODS = [m.name for m in SERVICE.methods]
EXAMPLES = int(os.environ.get("BROKER_FUZZ_EXAMPLES", "50"))
OPERATOR, TENANT = "fuzz-operator-token", "fuzz-tenant-token"
RSS_GROWTH_LIMIT_MB = 300

INT32 = (0, 1, -1, 8, 1024, 2**31 - 1, -(2**31))
INT64 = (0, 1, -1, 3600, 2**31, 2**63 - 1, -(2**63))
DOUBLES = (0.0, -0.0, 1.0, 24.0, 0.5, 1e308, -1e308, 5e-324, math.nan, math.inf, -math.inf)
HUGE = "x" * 200_000
STRINGS = ("", " ", "\x00", "a\x00b", "ü" * 5000, HUGE, "../../etc/passwd", "'; DROP TABLE leases; --", "%s%n")
# Values that get past the first checks, so the fuzzer reaches the code behind them.
PLAUSIBLE = {
    "gpu_model": ("H100", "A100", "L4", "A10G", "h100", "any"),
    "provider": ("aws", "gcp", "azure", "oracle"), "providers": ("aws", "gcp", "azure", "AWS", "mars"),
    "region": ("us-east-1", "us-central1", "eastus", "eu-west-1", "nowhere-1"),
    "regions": ("us-east-1", "us-central1", "eastus", "europe-west4"),
    "residency": ("eu", "us", "asia", "mars", "us-east-1"),
    "zone": ("", "us-east-1a", "us-central1-a", "1", "mars-1a"),
    "instance_type": ("p5.48xlarge", "a3-highgpu-8g", "g6.xlarge", "Standard_NC24ads_A100_v4", "t2.micro"),
    "data_location": ("onprem", "aws:us-east-1", "gcp:us-central1", "aws:nowhere-1", "x:"),
    "tenant": ("", "default", "team-a", "*"), "queue": ("", "default", "team-a", "team-b"),
    "bootstrap": ("", "slurm", "container", "kubernetes", "/etc/passwd"),
    "state": ("idle", "alloc", "mix", "drain", "down", "cloud", "unknown"),
    "kind": ("", "training", "tuning", "eval", "inference", "other"),
    "source": ("", "slurm:a", "kueue:prod"), "idempotency_key": ("k-1", "k-2", ""),
    "node": ("n1", "n2"), "name": ("n1", "n2", "burst-1"), "nodes": ("n1", "n2"),
    "node_names": ("burst-1", "burst-2", "burst-1"), "partitions": ("gpu", "burst"),
    "job_id": ("1", "j-1", ""), "reason": ("", "done"),
}


def _scalar(fd) -> st.SearchStrategy:
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        plausible = PLAUSIBLE.get(fd.name, ())
        return st.one_of(st.sampled_from(plausible + STRINGS) if plausible else st.sampled_from(STRINGS),
                         st.text(max_size=40))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.sampled_from(DOUBLES), st.floats(allow_nan=True, allow_infinity=True))
    if t == FieldDescriptor.TYPE_ENUM:
        defined = tuple(v.number for v in fd.enum_type.values)
        return st.sampled_from(defined + (len(defined), 99, -1, 2**31 - 1))
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return st.one_of(st.sampled_from(INT64), st.integers(-(2**63), 2**63 - 1))
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return st.one_of(st.sampled_from(INT32), st.integers(-(2**31), 2**31 - 1))
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    raise AssertionError(f"no strategy for {fd.full_name} (type {t})")


def _timestamp() -> st.SearchStrategy:
    from google.protobuf.timestamp_pb2 import Timestamp

    seconds = st.one_of(st.sampled_from((0, 1, 1_800_000_000, -62135596801, 253402300800, 2**62, -(2**62))),
                        st.integers(-(2**63), 2**63 - 1))
    nanos = st.sampled_from((0, 1, 999_999_999, 1_000_000_000, -1, 2**31 - 1))
    return st.builds(lambda s, n: Timestamp(seconds=s, nanos=n), seconds, nanos)


def message(desc, depth: int = 0) -> st.SearchStrategy:
    """Messages of ``desc``: any subset of its fields set, each to a hostile or plausible value."""
    if desc.full_name == "google.protobuf.Timestamp":
        return _timestamp()
    cls = _class(desc)
    optional = {}
    for fd in desc.fields:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            key, value = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            optional[fd.name] = st.dictionaries(_scalar(key), _scalar(value), max_size=4)
            continue
        if fd.message_type is not None:
            if depth >= 3:
                continue
            elem = message(fd.message_type, depth + 1)
        else:
            elem = _scalar(fd)
        if fd.is_repeated:
            many = elem.map(lambda v: [v] * 5000)  # one value, many times: the list-size bound
            optional[fd.name] = st.one_of(st.lists(elem, max_size=4), many) if depth < 2 else st.lists(elem, max_size=3)
        else:
            optional[fd.name] = elem
    return st.fixed_dictionaries({}, optional=optional).map(lambda fields: _build(cls, fields))


def _class(desc):
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(desc)


def _build(cls, fields: dict):
    m = cls()
    for name, value in fields.items():
        fd = m.DESCRIPTOR.fields_by_name[name]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            getattr(m, name).update(value)
        elif fd.is_repeated:
            target = getattr(m, name)
            if fd.message_type is not None:
                for v in value:
                    target.add().CopyFrom(v)
            else:
                target.extend(value)
        elif fd.message_type is not None:
            getattr(m, name).CopyFrom(value)
        else:
            setattr(m, name, value)
    return m


# ---------------------------------------------------------------------------------------------


class Findings:
    def __init__(self) -> None:
        self.rss_start = 0.0
        self.bad: list[str] = []
        self.codes: dict[str, int] = {}

    def record(self, method: str, code: grpc.StatusCode, details: str, request_repr: str, raw: bool) -> None:
        self.codes[code.name] = self.codes.get(code.name, 0) + 1
        bad = code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
        if raw and code == grpc.StatusCode.INTERNAL and details == "Exception deserializing request!":
            bad = False  # grpcio's answer to bytes that are not the message: no broker code ran
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and method != "WatchLeases":
            bad = True  # a unary call that hangs
        if bad:
            self.bad.append(f"{method} -> {code.name} {details[:200]!r} for {request_repr[:300]}")


@pytest.fixture(scope="module")
def served(clouds_server, tmp_path_factory):  # noqa: F811
    from tests.clouds.aws import AwsCloud

    tmp = tmp_path_factory.mktemp("fuzz")
    old = {k: os.environ.get(k) for k in AwsCloud.client_env()}
    os.environ.update(AwsCloud.client_env())
    clouds_server.reset()
    cfg = write_config(tmp / "broker.toml", clouds_server, f"sqlite:///{tmp / 'broker.db'}",
                       reconciler={"interval_s": 3600},
                       auth={"tokens": {OPERATOR: "*", TENANT: "team-a"}},
                       bootstrap={"container": {"image": "registry.example/train:1", "command": "true"}})
    serve = ServeProcess(cfg, tmp).start()
    channel = grpc.insecure_channel(serve.address)
    findings = Findings()
    stub = pb_grpc.BrokerStub(channel)
    stub.Quote(pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=1)),  # warm: catalog, caches
               metadata=(("authorization", f"Bearer {OPERATOR}"),), timeout=30)
    findings.rss_start = _rss_mb(serve.proc.pid)
    try:
        yield serve, channel, findings
    finally:
        channel.close()
        code = serve.stop()
        clouds_server.reset()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        assert code == 0, serve.log.read_text()[-3000:]


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _call(channel, method: str, request, token: str, raw: bool = False):
    path = f"/{SERVICE.full_name}/{method}"
    md = (("authorization", f"Bearer {token}"),)
    stream = method == "WatchLeases"
    if raw:
        fn = (channel.unary_stream if stream else channel.unary_unary)(path)
    else:
        m = SERVICE.methods_by_name[method]
        req_cls, resp_cls = _class(m.input_type), _class(m.output_type)
        fn = (channel.unary_stream if stream else channel.unary_unary)(
            path, request_serializer=req_cls.SerializeToString, response_deserializer=resp_cls.FromString)
    try:
        if stream:
            for _ in fn(request, metadata=md, timeout=0.5):
                pass
        else:
            fn(request, metadata=md, timeout=30)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                phases=(Phase.explicit, Phase.generate), print_blob=False,
                suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("method", METHODS)
def test_fuzz_every_rpc_from_its_descriptor(served, method):
    serve, channel, findings = served
    request_type = SERVICE.methods_by_name[method].input_type

    @FUZZ
    @given(request=message(request_type), as_tenant=st.integers(0, 9))
    def run(request, as_tenant):
        token = TENANT if as_tenant == 0 else OPERATOR
        code, details = _call(channel, method, request, token)
        findings.record(method, code, details, repr(request), raw=False)

    run()
    assert not [b for b in findings.bad if b.startswith(method + " ")], "\n".join(findings.bad)


def test_fuzz_raw_bytes_to_every_rpc(served):
    serve, channel, findings = served

    @FUZZ
    @given(method=st.sampled_from(METHODS), body=st.one_of(st.binary(max_size=512),
                                                           st.sampled_from((b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f"))))
    def run(method, body):
        code, details = _call(channel, method, body, OPERATOR, raw=True)
        findings.record(method, code, details, repr(body), raw=True)

    run()
    assert not findings.bad, "\n".join(findings.bad)


def test_the_server_is_alive_serving_and_bounded_afterwards(served):
    serve, channel, findings = served
    assert sum(findings.codes.values()) >= len(METHODS) * min(EXAMPLES, 10), findings.codes
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    stub = pb_grpc.BrokerStub(channel)
    q = stub.Quote(pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=1)),
                   metadata=(("authorization", f"Bearer {OPERATOR}"),), timeout=30)
    assert q.quote.offers
    assert serve.proc.poll() is None
    rss = _rss_mb(serve.proc.pid)
    assert rss - findings.rss_start < RSS_GROWTH_LIMIT_MB, \
        f"server RSS grew from {findings.rss_start:.0f} to {rss:.0f} MB while fuzzing"
    records = [json.loads(l) for l in serve.log.read_text().splitlines() if l.startswith("{")]
    internal = [r for r in records if r.get("event") == "rpc_internal_error"]
    assert not internal, internal[:3]
    print(f"\nfuzz: {sum(findings.codes.values())} requests, statuses {findings.codes}, "
          f"server RSS {findings.rss_start:.0f} -> {rss:.0f} MB")
