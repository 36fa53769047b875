"""Strings that reach a cloud are checked at the edge, and a cloud that answers garbage (a proxy's
HTML error page, bytes that are no answer) is a retryable provider error: the lease is failed or
retried, never left provisioning, and one provider's bad answer never stops a reconcile pass."""
from __future__ import annotations

import re

import grpc
import pytest
from hypothesis import given, settings, strategies as st

from broker.errors import InvalidArgument
from broker.lease import LeaseState
from broker.limits import Bounds, Limits
from broker.v1 import broker_pb2 as pb
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.lease_kit import service, serving

pytestmark = pytest.mark.timeout(300)

SAFE = st.characters(whitelist_categories=("L", "N", "P", "Zs"))
BAD_CHARS = ["\x01", "\x1b", "\x7f", "\x85", "\x9f", "\ufffe", "\uffff", "\ufdd0", "\U0001fffe", "\U0010ffff"]


@settings(max_examples=200, deadline=None)
@given(prefix=st.text(SAFE, max_size=20), bad=st.sampled_from(BAD_CHARS), suffix=st.text(max_size=20),
       field=st.sampled_from(["node_names", "job_id", "tenant", "idempotency_key", "owner"]))
def test_every_control_or_non_character_is_refused_naming_the_field(prefix, bad, suffix, field):
    value = prefix + bad + suffix
    req = pb.LaunchRequest(idempotency_key="k", offering=pb.Offering(provider="aws", count=1))
    where = {"node_names": "node_names[0]", "job_id": "job.job_id", "tenant": "tenant",
             "idempotency_key": "idempotency_key", "owner": "job.owner"}[field]
    if field == "node_names":
        req.node_names.append(value)
    elif field in ("job_id", "owner"):
        setattr(req.job, field, value)
    else:
        setattr(req, field, value)
    with pytest.raises(InvalidArgument) as e:
        Bounds(Limits()).check(req)
    assert e.value.field == where and str(e.value).startswith(where)
    assert f"U+{ord(bad):04X}" in str(e.value)


def test_free_text_keeps_its_tabs_and_newlines():
    Bounds(Limits()).check(pb.ReleaseRequest(lease_id="l-1", reason="done\n\tby hand"))
    Bounds(Limits()).check(pb.LaunchRequest(job=pb.Job(env={"SCRIPT": "a\nb\tc"})))
    with pytest.raises(InvalidArgument):
        Bounds(Limits()).check(pb.ReleaseRequest(lease_id="l-1\n"))


OFFERS = {"aws": pb.Offering(provider="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                             market=pb.MARKET_ON_DEMAND, count=1),
          "gcp": pb.Offering(provider="gcp", region="us-central1", zone="us-central1-a",
                             instance_type="g2-standard-8", market=pb.MARKET_ON_DEMAND, count=1),
          "azure": pb.Offering(provider="azure", region="eastus", zone="1", instance_type="Standard_NC24ads_A100_v4",
                               market=pb.MARKET_ON_DEMAND, count=1)}


@pytest.mark.parametrize("provider,name", [
    ("aws", "node\x01a"), ("aws", "node\uffff"), ("aws", "aws:reserved"), ("aws", "semi;colon"),
    ("gcp", "Node-1"), ("gcp", "node_1"), ("gcp", "n" * 64), ("azure", "node_1"), ("azure", "node-"),
])
def test_a_node_name_a_cloud_would_refuse_is_invalid_argument_before_any_lease(clouds, tmp_path, provider, name):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        with pytest.raises(grpc.RpcError) as e:
            stub.Launch(pb.LaunchRequest(idempotency_key=f"k-{provider}", offering=OFFERS[provider],
                                         node_names=[name]), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert e.value.details().startswith("node_names[0]")
        assert svc.store.list_leases() == []
    assert clouds.aws.count("RunInstances") == 0


@pytest.mark.parametrize("kind,status", [("html", 502), ("garbage", 200)])
def test_a_launch_answered_with_a_page_fails_the_lease_naming_the_status(clouds, tmp_path, kind, status):  # noqa: F811
    clouds.aws.inject(kind, times=0, match="RunInstances")
    with service(tmp_path, clouds, lifecycle={"retries": 2}) as svc, serving(svc) as stub:
        with pytest.raises(grpc.RpcError) as e:
            stub.Launch(pb.LaunchRequest(idempotency_key="k-page", offering=OFFERS["aws"]), timeout=60)
        assert e.value.code() != grpc.StatusCode.INTERNAL
        assert f"HTTP{status}" in e.value.details() and "<" not in e.value.details()
        (lease,) = svc.store.list_leases()
        assert lease.state is LeaseState.FAILED
        # retryable: each offer (every zone of the region) is asked twice before failing over
        assert clouds.aws.count("RunInstances") >= 2 * len({c.params.get("Placement.AvailabilityZone")
                                                            for c in clouds.aws.calls if c.action == "RunInstances"})


def test_a_page_instead_of_a_listing_skips_the_provider_for_one_pass_only(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        stub.Launch(pb.LaunchRequest(idempotency_key="k-ok", offering=OFFERS["gcp"]), timeout=60)
        clouds.aws.inject("html", times=0, match="DescribeInstances")
        report = svc.reconciler.run_pass()
        assert report.skipped_providers == ["aws"]
        clouds.aws.clear_faults()
        report = svc.reconciler.run_pass()
        assert report.skipped_providers == [] and report.errors == 0
        samples = svc.metrics.registry
        assert samples.get_sample_value("broker_provider_errors_total", {"provider": "aws", "code": "HTTP502"}) >= 1


def test_a_retryable_cloud_error_that_reaches_a_caller_is_unavailable_exit_7():
    from broker.errors import outcome
    from providers.base import InvalidRequestError, TransientError

    got = outcome(TransientError("AWS answered HTTP 502", provider="aws", code="HTTP502"))
    assert (got.status_name, got.exit_code) == ("UNAVAILABLE", 7)
    assert outcome(InvalidRequestError("x", provider="gcp")).status_name == "FAILED_PRECONDITION"


def _retag(clouds, instance_id: str, key: str, value: str, region: str = "us-east-1") -> None:  # noqa: F811
    """Write a tag on EC2 directly (someone else's tooling, not the broker)."""
    clouds.aws.client(region).create_tags(Resources=[instance_id], Tags=[{"Key": key, "Value": value}])


def _stray(clouds, image: str, lease_tag: str, name: str) -> str:  # noqa: F811
    """An instance carrying the broker's owner tag that the broker never launched."""
    ec2 = clouds.aws.client()
    made = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
                             TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                 {"Key": "broker:owner", "Value": "broker-test"}, {"Key": "Name", "Value": "stray"}]}])
    iid = made["Instances"][0]["InstanceId"]
    _retag(clouds, iid, "broker:lease", lease_tag)
    _retag(clouds, iid, "Name", name)
    return iid


@pytest.mark.parametrize("bad", ["node\x01a", "node\uffff", "node\x1b[0m"])
def test_an_instance_with_an_unreadable_tag_never_stops_the_aws_reconcile_pass(clouds, tmp_path, bad):  # noqa: F811
    from tests.lease_kit import events

    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        a = stub.Launch(pb.LaunchRequest(idempotency_key="k-a", offering=OFFERS["aws"]), timeout=60).lease
        b = stub.Launch(pb.LaunchRequest(idempotency_key="k-b", offering=OFFERS["aws"]), timeout=60).lease
        (a_node,) = [i.instance_id for i in a.instances]
        (b_node,) = [i.instance_id for i in b.instances]
        image = next(i["image_id"] for i in clouds.aws.instances() if i["id"] == a_node)
        _retag(clouds, a_node, "Name", bad)  # one of lease a's nodes: its Name tag garbled from outside
        stray = _stray(clouds, image, "l-" + bad, bad)  # ours by its owner tag, its lease tag unreadable
        # lease b's node is terminated from outside: the pass must still see and handle that
        clouds.aws.client().terminate_instances(InstanceIds=[b_node])

        report = svc.reconciler.run_pass()
        assert report.skipped_providers == []
        assert report.errors == 2  # the two unreadable instances, counted; nothing else failed
        assert svc.store.get_lease(a.lease_id).state is LeaseState.RUNNING  # its node is still its own
        assert svc.store.get_lease(b.lease_id).state is not LeaseState.RUNNING  # reconciled all the same
        assert report.orphans_terminated == 1  # the stray (orphan grace 0 here), never a's node
        state = {i["id"]: i["state"] for i in clouds.aws.instances()}
        assert state[stray] in ("shutting-down", "terminated") and state[a_node] == "running"
        told = [e for e in events(svc.store, a.lease_id) if e[0] == "instance_unreadable"]
        assert len(told) == 1 and a_node in told[0][3] and "Name" in told[0][3]
        errors = svc.metrics.registry.get_sample_value("broker_provider_errors_total",
                                                       {"provider": "aws", "code": "UnreadableTag"})
        assert errors >= 2

        again = svc.reconciler.run_pass()  # still reported each pass, told once
        assert again.skipped_providers == [] and again.errors == 1
        assert len([e for e in events(svc.store, a.lease_id) if e[0] == "instance_unreadable"]) == 1
        assert svc.store.get_lease(a.lease_id).state is LeaseState.RUNNING


GARBAGE_2XX = ["garbage", "truncated", "shape"]  # not JSON; the real answer cut short; JSON of another shape
CLOUD_NAME = {"gcp": "GCP", "azure": "Azure"}


@pytest.mark.parametrize("provider", ["gcp", "azure"])
@pytest.mark.parametrize("kind", ["garbage", "shape"])  # a create cut short took effect: see the list/terminate cases
def test_a_launch_answered_with_a_garbage_2xx_fails_the_lease_naming_the_cloud_and_status(
        clouds, tmp_path, provider, kind):  # noqa: F811
    getattr(clouds, provider).inject(kind, times=10_000, match="PUT" if provider == "azure" else "POST")
    with service(tmp_path, clouds, lifecycle={"retries": 2}) as svc, serving(svc) as stub:
        with pytest.raises(grpc.RpcError) as e:
            stub.Launch(pb.LaunchRequest(idempotency_key=f"k-{kind}", offering=OFFERS[provider]), timeout=120)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
        assert "HTTP200" in e.value.details() and f"{CLOUD_NAME[provider]} answered HTTP 200 OK" in e.value.details()
        assert "Traceback" not in e.value.details()
        (lease,) = svc.store.list_leases()
        assert lease.state is LeaseState.FAILED
        assert all(a["kind"] == "transient" for a in lease.attempts if a["provider"] == provider)


@pytest.mark.parametrize("provider", ["gcp", "azure"])
@pytest.mark.parametrize("kind", GARBAGE_2XX)
def test_a_listing_answered_with_a_garbage_2xx_is_a_retryable_error_and_skips_one_pass(
        clouds, tmp_path, provider, kind):  # noqa: F811
    from providers.base import TransientError

    with service(tmp_path, clouds) as svc:
        getattr(clouds, provider).inject(kind, times=10_000, match="GET")
        with pytest.raises(TransientError) as e:
            svc.lifecycle.providers[provider].list_managed()
        assert e.value.retryable and e.value.code == "HTTP200" and e.value.provider == provider
        assert str(e.value).count("\n") == 0 and f"{CLOUD_NAME[provider]} answered HTTP 200 OK" in str(e.value)
        assert svc.reconciler.run_pass().skipped_providers == [provider]
        getattr(clouds, provider).clear_faults()
        assert svc.reconciler.run_pass().skipped_providers == []


@pytest.mark.parametrize("provider", ["gcp", "azure"])
@pytest.mark.parametrize("kind", GARBAGE_2XX)
def test_a_terminate_answered_with_a_garbage_2xx_is_unavailable_and_finished_later(
        clouds, tmp_path, provider, kind):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="k", offering=OFFERS[provider]), timeout=120).lease
        getattr(clouds, provider).inject(kind, times=10_000, match="DELETE")
        with pytest.raises(grpc.RpcError) as e:
            stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id), timeout=120)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
        assert re.search(rf"{CLOUD_NAME[provider]} answered HTTP 20\d", e.value.details()), e.value.details()
        getattr(clouds, provider).clear_faults()
        svc.reconciler.run_pass()
        assert svc.store.get_lease(lease.lease_id).state is LeaseState.RELEASED


def test_a_gcp_instance_whose_metadata_no_answer_can_carry_never_stops_the_gcp_reconcile_pass(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        good = stub.Launch(pb.LaunchRequest(idempotency_key="k-g", offering=OFFERS["gcp"]), timeout=60).lease
        # written outside the broker: a lone surrogate, which Compute's JSON escapes and protobuf refuses
        clouds.gcp.seed_instance("us-central1-a", "stray-1", machine_type="g2-standard-8",
                                 labels={"broker-owner": "broker-test"},
                                 metadata={"items": [{"key": "broker-lease", "value": "l-\ud800x"}]})
        assert [i.instance_id for i in svc.lifecycle.providers["gcp"].list_managed()].count("stray-1") == 1
        report = svc.reconciler.run_pass()
        assert report.skipped_providers == [] and report.errors == 1
        assert report.orphans_terminated == 1  # its lease cannot be read: an orphan (grace 0 here)
        assert clouds.gcp.instance("stray-1") is None or clouds.gcp.instance("stray-1")["status"] != "RUNNING"
        assert svc.store.get_lease(good.lease_id).state is LeaseState.RUNNING
        assert svc.metrics.registry.get_sample_value("broker_provider_errors_total",
                                                     {"provider": "gcp", "code": "UnreadableLabel"}) >= 1


def test_an_azure_vm_whose_lease_tag_is_no_text_stays_its_running_lease_s(clouds, tmp_path):  # noqa: F811
    from tests.lease_kit import events

    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        a = stub.Launch(pb.LaunchRequest(idempotency_key="k-a", offering=OFFERS["azure"]), timeout=60).lease
        b = stub.Launch(pb.LaunchRequest(idempotency_key="k-b", offering=OFFERS["azure"]), timeout=60).lease
        (a_node,) = [i.node_name for i in a.instances]
        with clouds.azure._lock:  # a tag rewritten outside the broker: a lone surrogate, which ARM's JSON escapes
            next(vm for vm in clouds.azure._vms.values() if vm.name == a_node).body["tags"]["broker:lease"] = "l-\ud800"
        report = svc.reconciler.run_pass()
        assert report.skipped_providers == [] and report.errors == 1
        assert report.orphans_terminated == 0 and clouds.azure.vm(a_node) is not None  # a still lists it
        assert svc.store.get_lease(a.lease_id).state is LeaseState.RUNNING
        assert svc.store.get_lease(b.lease_id).state is LeaseState.RUNNING
        told = [e for e in events(svc.store, a.lease_id) if e[0] == "instance_unreadable"]
        assert len(told) == 1 and "broker:lease" in told[0][3]
        assert svc.metrics.registry.get_sample_value("broker_provider_errors_total",
                                                     {"provider": "azure", "code": "UnreadableTag"}) >= 1


@pytest.mark.parametrize("raw, read", [
    (b"<a>node\x01a</a>", "<a>node\ufffda</a>"),
    (b"<a>node&#1;a &#x1F; &#xFFFF; &#65534;</a>", "<a>node\ufffda \ufffd \ufffd \ufffd</a>"),
    ("<a>node\uffff \ufffe</a>".encode(), "<a>node\ufffd \ufffd</a>"),
    (b"<a>\xed\xa0\x80</a>", "<a>\ufffd\ufffd\ufffd</a>"),  # an encoded surrogate is no UTF-8
    (b"<a>tab\tok &#9; &#x85; &amp; \xc3\xa9</a>", "<a>tab\tok &#9; &#x85; &amp; \u00e9</a>"),
])
def test_what_xml_cannot_carry_reads_as_the_replacement_character(raw, read):
    from xml.etree import ElementTree

    from providers.aws.errors import readable

    assert readable(raw).decode() == read
    ElementTree.fromstring(readable(raw))  # parses
