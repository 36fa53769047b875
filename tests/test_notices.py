"""Interruption notices acted on before the loss (issue 17 item 3).

AWS as Karpenter reads them: EventBridge events routed by the rules of
``deploy/aws/interruption-queue.yaml`` (created as they are written, on moto's EventBridge) into
the SQS queue the broker's leader long-polls. A spot interruption warning for a running lease's
instance yields an ``interruption_notice`` event and a running replacement while the old
instance still runs; the later loss adds no second replacement.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from broker.convert import demand_to_pb
from broker.v1 import broker_pb2 as pb
from policies.demand import Demand
from providers.base import offering_key
from providers.notices import MalformedNotice, NoticeKind, from_eventbridge
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from broker.notices import notice_sources
from broker.records import Job
from tests.lease_kit import Watch, instances_of, offering, service, serving, wait_until

pytestmark = pytest.mark.timeout(420)  # the deadlines inside are generous for a loaded machine

TEMPLATE = Path(__file__).resolve().parents[1] / "deploy" / "aws" / "interruption-queue.yaml"
ACCOUNT = "123456789012"


def event(detail_type: str, detail: dict, source: str = "aws.ec2", **extra) -> dict:
    """An EventBridge event as AWS delivers it to an SQS target."""
    return {"version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602", "detail-type": detail_type,
            "source": source, "account": ACCOUNT, "time": "2026-12-03T13:00:00Z", "region": "us-east-1",
            "resources": [], "detail": detail, **extra}


SPOT = event("EC2 Spot Instance Interruption Warning", {"instance-id": "i-0abc123", "instance-action": "terminate"})
REBALANCE = event("EC2 Instance Rebalance Recommendation", {"instance-id": "i-0abc123"})
HEALTH = event("AWS Health Event", {
    "eventArn": "arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/x",
    "service": "EC2", "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", "eventTypeCategory": "scheduledChange",
    "startTime": "Sat, 05 Dec 2026 15:10:09 GMT", "endTime": "Sat, 05 Dec 2026 17:10:09 GMT",
    "eventDescription": [{"language": "en_US", "latestDescription": "retirement"}],
    "affectedEntities": [{"entityValue": "i-0abc123"}, {"entityValue": "i-0def456"}]}, source="aws.health")


def state(s: str) -> dict:
    return event("EC2 Instance State-change Notification", {"instance-id": "i-0abc123", "state": s})


# -- reading the events ------------------------------------------------------------------------

def test_each_eventbridge_event_reads_as_its_notice():
    n = from_eventbridge(json.dumps(SPOT))
    assert (n.provider, n.kind, n.instance_ids) == ("aws", NoticeKind.PREEMPTION, ("i-0abc123",))
    assert n.not_before == datetime(2026, 12, 3, 13, 2, tzinfo=timezone.utc).timestamp()  # two minutes on
    assert n.source == "aws.ec2: EC2 Spot Instance Interruption Warning" and n.kind.acts
    r = from_eventbridge(json.dumps(REBALANCE))
    assert r.kind is NoticeKind.REBALANCE and not r.kind.acts
    h = from_eventbridge(json.dumps(HEALTH))
    assert h.kind is NoticeKind.MAINTENANCE and h.instance_ids == ("i-0abc123", "i-0def456")
    assert h.not_before == datetime(2026, 12, 5, 15, 10, 9, tzinfo=timezone.utc).timestamp()
    assert "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED" in h.detail
    for s in ("stopping", "stopped", "shutting-down", "terminated"):
        assert from_eventbridge(json.dumps(state(s))).kind is NoticeKind.STOPPING
    # Known shapes that ask nothing.
    assert from_eventbridge(json.dumps(state("running"))) is None
    other = json.loads(json.dumps(HEALTH))
    other["detail"]["eventTypeCategory"] = "issue"
    assert from_eventbridge(json.dumps(other)) is None
    volumes = json.loads(json.dumps(HEALTH))
    volumes["detail"]["affectedEntities"] = [{"entityValue": "vol-0abc"}]
    assert from_eventbridge(json.dumps(volumes)) is None  # a scheduled change of no instance


@pytest.mark.parametrize("body", [
    "", "not json", "[]", "null", '"text"', json.dumps({"source": "aws.ec2"}),
    json.dumps(event("EC2 Spot Instance Interruption Warning", {})),
    json.dumps(event("EC2 Spot Instance Interruption Warning", {"instance-id": "../../etc/passwd"})),
    json.dumps(event("EC2 Spot Instance Interruption Warning", {"instance-id": "i-\x00abc"})),
    json.dumps(event("EC2 Spot Instance Interruption Warning", {"instance-id": "i-\uff41\uff42"})),
    json.dumps(event("Something Else", {"instance-id": "i-0abc"})),
    json.dumps(event("AWS Health Event", {"service": "EC2", "eventTypeCategory": "scheduledChange"},
                     source="aws.health")),
    "x" * 300_000,
])
def test_malformed_messages_are_named_never_raised_otherwise(body):
    with pytest.raises(MalformedNotice):
        from_eventbridge(body)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("latin-1")),
                 st.recursive(st.none() | st.booleans() | st.floats() | st.text(max_size=20),
                              lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
                              max_leaves=20).map(json.dumps)))
def test_any_body_is_a_notice_none_or_malformed(body):
    try:
        n = from_eventbridge(body)
    except MalformedNotice:
        return
    assert n is None or (n.instance_ids and all(i.startswith("i-") for i in n.instance_ids))


# -- the CloudFormation template ---------------------------------------------------------------

def template() -> dict:
    return yaml.safe_load(TEMPLATE.read_text())


def test_the_template_routes_the_four_kinds_into_one_queue_that_eventbridge_may_write():
    t = template()
    res = t["Resources"]
    queues = [k for k, r in res.items() if r["Type"] == "AWS::SQS::Queue"]
    assert queues == ["InterruptionQueue"]
    rules = {k: r for k, r in res.items() if r["Type"] == "AWS::Events::Rule"}
    kinds = {dt for r in rules.values() for dt in r["Properties"]["EventPattern"]["detail-type"]}
    assert kinds == {"EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation",
                     "EC2 Instance State-change Notification", "AWS Health Event"}
    for r in rules.values():
        assert [tg["Arn"] for tg in r["Properties"]["Targets"]] == [{"Fn::GetAtt": ["InterruptionQueue", "Arn"]}]
    (policy,) = [r for r in res.values() if r["Type"] == "AWS::SQS::QueuePolicy"]
    assert policy["Properties"]["Queues"] == [{"Ref": "InterruptionQueue"}]
    allow = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    assert any("events.amazonaws.com" in s["Principal"]["Service"] and s["Action"] == "sqs:SendMessage"
               and s["Resource"] == {"Fn::GetAtt": ["InterruptionQueue", "Arn"]} for s in allow)
    assert t["Outputs"]["QueueURL"]["Value"] == {"Ref": "InterruptionQueue"}
    # Every event shape the broker reads matches exactly one rule's pattern.
    for ev in (SPOT, REBALANCE, HEALTH, state("terminated")):
        assert sum(_matches(r["Properties"]["EventPattern"], ev) for r in rules.values()) == 1, ev["detail-type"]
    assert not any(_matches(r["Properties"]["EventPattern"], state("running")) for r in rules.values())


def _matches(pattern: dict, ev: dict) -> bool:
    """EventBridge's matching for the patterns the template uses (values listed per field)."""
    for k, want in pattern.items():
        got = ev.get(k)
        if isinstance(want, dict):
            if not isinstance(got, dict) or not _matches(want, got):
                return False
        elif got not in want:
            return False
    return True


# -- on the mocked cloud -----------------------------------------------------------------------

def interruption_queue(clouds, region: str) -> tuple[str, object, object]:  # noqa: F811
    """The template's queue and rules, made on moto's SQS and EventBridge; (url, sqs, events)."""
    kw = dict(region_name=region, endpoint_url=clouds.aws.url, aws_access_key_id="testing",
              aws_secret_access_key="testing")
    sqs, events = boto3.client("sqs", **kw), boto3.client("events", **kw)
    url = sqs.create_queue(QueueName="broker-interruptions")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for name, r in template()["Resources"].items():
        if r["Type"] == "AWS::Events::Rule":
            events.put_rule(Name=name, EventPattern=json.dumps(r["Properties"]["EventPattern"]))
            events.put_targets(Rule=name, Targets=[{"Id": "q", "Arn": arn}])
    return url, sqs, events


def put(events, ev: dict) -> None:
    out = events.put_events(Entries=[{"Source": ev["source"], "DetailType": ev["detail-type"],
                                      "Detail": json.dumps(ev["detail"]), "Resources": ev.get("resources", [])}])
    assert out["FailedEntryCount"] == 0


def aws_tables(clouds, url: str) -> dict:  # noqa: F811
    tables = clouds.provider_tables()
    tables["aws"].update(interruption_queue_url=url, interruption_wait_s=1)
    return tables


def queued(sqs, url: str) -> int:
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                                                "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(a["ApproximateNumberOfMessages"]) + int(a["ApproximateNumberOfMessagesNotVisible"])


def test_a_spot_interruption_warning_launches_the_replacement_before_the_node_dies(clouds, tmp_path):  # noqa: F811
    region = clouds.provider_tables()["aws"]["regions"][0]
    url, sqs, events = interruption_queue(clouds, region)
    with service(tmp_path, clouds, providers=aws_tables(clouds, url)) as svc, serving(svc) as stub:
        demand = Demand(gpus=1, hours=4, gpu_model="A10G", interruptible=True, checkpoint_minutes=20,
                        regions=("us-east-1", "us-west-2", "us-central1", "europe-west4", "eastus", "westeurope"))
        quote = stub.Quote(pb.QuoteRequest(demand=demand_to_pb(demand)), timeout=30).quote
        rank = next(o.rank for o in quote.offers if o.provider == "aws" and o.market == pb.MARKET_SPOT)
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="itn", quote_offer=pb.QuoteOffer(
            quote_id=quote.quote_id, rank=rank)), timeout=60).lease
        stub.Handoff(pb.HandoffRequest(lease_id=lease.lease_id, job=pb.Job(
            job_id="train-7", checkpoint_uri="s3://ckpt/train-7/step-100")), timeout=30)
        old = svc.store.get_lease(lease.lease_id)
        iid = instances_of(old)[0].instance_id
        watch = Watch(stub).opened(svc.store)
        svc.start_background()  # the leader's loops: the queue is long-polled from here on
        try:
            put(events, {**SPOT, "detail": {"instance-id": iid, "instance-action": "terminate"}})
            ev = watch.wait_for(lambda e: e.kind == pb.LEASE_EVENT_KIND_INTERRUPTION_NOTICE, timeout=120)
        finally:
            watch.close()
        assert ev.lease.lease_id == old.lease_id and "preemption notice" in ev.message
        assert "EC2 Spot Instance Interruption Warning" in ev.message and "checkpoint" in ev.message
        (new,) = wait_until(lambda: [l for l in svc.store.list_leases() if l.replaces == old.lease_id
                                     and l.state == "running"], timeout=120, what="a running replacement")
        # ... while the old node still runs: the cloud has not taken it yet.
        assert svc.store.get_lease(old.lease_id).state == "running"
        assert [i["state"] for i in clouds.aws.instances() if i["id"] == iid] == ["running"]
        key = offering_key(old.provider, old.region, old.instance_type, old.market)
        assert key in svc.store.active_blocks(time.time())
        (rq,) = [e for e in svc.store.events_of(old.lease_id) if e.kind == "requeue"]
        assert new.lease_id in rq.message and "s3://ckpt/train-7/step-100" in rq.message
        assert offering_key(new.provider, new.region, new.instance_type, new.market) != key
        assert new.job.job_id == "train-7" and new.job.checkpoint_uri == "s3://ckpt/train-7/step-100"
        wait_until(lambda: queued(sqs, url) == 0, timeout=120, what="the message deleted")
        assert svc.metrics.notices.labels("aws", "preemption", "acted")._value.get() == 1

        # The cloud takes the node: the loss is the same interruption, with no second replacement.
        clouds.aws.interrupt(iid)
        report = svc.reconciler.run_pass()
        assert report.interrupted == 1
        assert svc.store.get_lease(old.lease_id).state == "released"
        assert [l.lease_id for l in svc.store.list_leases() if l.replaces == old.lease_id] == [new.lease_id]
        kinds = [e.kind for e in svc.store.events_of(old.lease_id)]
        assert kinds.count("interruption_notice") == 1 and kinds.count("requeue") == 1
        stub.Release(pb.ReleaseRequest(lease_id=new.lease_id), timeout=60)


def test_bad_and_repeated_messages_are_deleted_and_never_stop_the_poller(clouds, tmp_path):  # noqa: F811
    region = clouds.provider_tables()["aws"]["regions"][0]
    url, sqs, events = interruption_queue(clouds, region)
    with service(tmp_path, clouds, providers=aws_tables(clouds, url)) as svc, serving(svc) as stub:
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="x", offering=offering(
            "aws", region, "g5.xlarge", market="spot")), timeout=60).lease
        iid = lease.instances[0].instance_id
        for body in ("not json", json.dumps({"source": "aws.ec2", "detail-type": "x"}), "\x00" * 50):
            sqs.send_message(QueueUrl=url, MessageBody=body)
        put(events, {**REBALANCE, "detail": {"instance-id": iid}})
        put(events, {**SPOT, "detail": {"instance-id": "i-0000000000000dead"}})  # no lease of ours
        (src,) = [s for s in notice_sources(svc.providers) if s.provider == "aws"]
        totals = {"malformed": 0, "acted": 0, "ignored": 0}
        deadline = time.monotonic() + 120  # a loaded machine: polls are slow, never fewer
        while queued(sqs, url) and time.monotonic() < deadline:
            r = svc.notices.poll(src)
            for k in totals:
                totals[k] += getattr(r, k)
        assert queued(sqs, url) == 0
        assert totals["malformed"] == 3 and totals["ignored"] == 1
        assert svc.metrics.notices.labels("aws", "unknown", "malformed")._value.get() == 3
        kinds = [(e.kind, json.loads(e.data)["kind"]) for e in svc.store.events_of(lease.lease_id)
                 if e.kind == "interruption_notice"]
        assert kinds == [("interruption_notice", "rebalance")]  # advice: recorded, nothing else
        assert not [l for l in svc.store.list_leases() if l.replaces == lease.lease_id]
        # The same warning twice (SQS delivers at least once): one replacement attempt, one event.
        for _ in range(2):
            put(events, {**SPOT, "detail": {"instance-id": iid, "instance-action": "terminate"}})
        while queued(sqs, url) and time.monotonic() < deadline + 120:
            svc.notices.poll(src)
        notices = [json.loads(e.data) for e in svc.store.events_of(lease.lease_id) if e.kind == "interruption_notice"]
        assert [n["kind"] for n in notices] == ["rebalance", "preemption"]
        assert svc.store.get_lease(lease.lease_id).state == "running"  # the cloud has not taken it
        stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id), timeout=60)


def test_a_gcp_preemption_operation_launches_the_replacement_while_the_vm_stops(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        demand = Demand(gpus=1, hours=4, gpu_model="A100", interruptible=True, checkpoint_minutes=20,
                        providers=("gcp",), regions=("us-central1", "europe-west4"))
        quote = stub.Quote(pb.QuoteRequest(demand=demand_to_pb(demand)), timeout=30).quote
        rank = next(o.rank for o in quote.offers if o.market == pb.MARKET_SPOT)
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="gcp-pre", quote_offer=pb.QuoteOffer(
            quote_id=quote.quote_id, rank=rank)), timeout=60).lease
        stub.Handoff(pb.HandoffRequest(lease_id=lease.lease_id, job=pb.Job(job_id="train-9")), timeout=30)
        old = svc.store.get_lease(lease.lease_id)
        name = instances_of(old)[0].node_name
        (src,) = [s for s in notice_sources(svc.providers) if s.provider == "gcp"]
        assert src.poll_s == 10.0
        assert svc.notices.poll(src).acted == 0  # nothing preempted yet

        clouds.gcp.interrupt(name, stopping=True)  # the preemption starts: ~30 s of soft-off
        report = svc.notices.poll(src)
        assert (report.received, report.acted) == (1, 1), report
        svc.notices.wait_launches(120)
        (new,) = [l for l in svc.store.list_leases() if l.replaces == old.lease_id]
        assert new.state == "running" and new.job.job_id == "train-9", new.state_reason
        assert clouds.gcp.instance(name)["status"] == "STOPPING"  # the old VM is still there
        assert svc.store.get_lease(old.lease_id).state == "running"
        (ev,) = [e for e in svc.store.events_of(old.lease_id) if e.kind == "interruption_notice"]
        assert "compute.instances.preempted" in ev.message
        (rq,) = [e for e in svc.store.events_of(old.lease_id) if e.kind == "requeue"]
        assert new.lease_id in rq.message
        assert svc.notices.poll(src).received == 0  # an operation is news once

        clouds.gcp.finish_preemption(name)
        svc.reconciler.run_pass()
        assert svc.store.get_lease(old.lease_id).state == "released"
        assert [l.lease_id for l in svc.store.list_leases() if l.replaces == old.lease_id] == [new.lease_id]
        stub.Release(pb.ReleaseRequest(lease_id=new.lease_id), timeout=60)


# -- the node's own notices, through the callback ----------------------------------------------

class _Metadata:
    """A stand-in for the node's metadata server on loopback: GCP's ``instance/preempted``
    (FALSE, then TRUE once preempted; the Metadata-Flavor header required) and Azure's
    Scheduled Events document (an empty list, then a Preempt naming the VM; ``Metadata: true``)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        import threading

        self.preempted_node = ""
        self.asked: list[str] = []
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                meta.asked.append(self.path)
                if self.path.startswith("/computeMetadata/v1/instance/preempted"):
                    ok, body = self.headers.get("Metadata-Flavor") == "Google", \
                        "TRUE" if meta.preempted_node else "FALSE"
                elif self.path.startswith("/metadata/scheduledevents?api-version="):
                    events = [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Preempt",
                               "ResourceType": "VirtualMachine", "Resources": [meta.preempted_node],
                               "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
                               "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}] \
                        if meta.preempted_node else []
                    ok, body = self.headers.get("Metadata") == "true", json.dumps(
                        {"DocumentIncarnation": 1 + len(events), "Events": events})
                else:
                    ok, body = False, ""
                data = body.encode()
                self.send_response(200 if ok else 400)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("provider,gpu,regions", [("gcp", "A100", ("us-central1", "europe-west4")),
                                                  ("azure", "A100", ("eastus", "westeurope"))])
def test_the_node_reports_its_own_preemption_through_the_callback(clouds, tmp_path, provider, gpu, regions):  # noqa: F811
    """The rendered container script, run by a real bash with the real curl, watches the node's
    metadata server; when it says the VM is being preempted, the script tells the broker's real
    callback endpoint, which starts the replacement while the node (and its job) still runs."""
    import stat
    import subprocess

    from broker.lifecycle import node_names
    from broker.records import LaunchOrder
    from broker.serving import start_callback

    md = _Metadata()
    boot = {"container": {"image": "busybox:1.36", "command": ["sh", "-c", "exit 0"],
                          "marker_path": str(tmp_path / "done"), "notice_metadata_url": md.url}}
    with service(tmp_path, clouds, bootstrap=boot, server={"callback_listen": "127.0.0.1:0"}) as svc:
        callback = start_callback(svc.config, svc)
        proc = None
        try:
            q = svc.quote(Demand(gpus=1, hours=4, gpu_model=gpu, interruptible=True, checkpoint_minutes=20,
                                 providers=(provider,), regions=regions))
            rank = next(r.rank for r in q.offers if r.offering.market.value == "spot")
            lease = svc.launch(LaunchOrder(f"node-{provider}", quote_id=q.quote_id, rank=rank,
                                           job=Job(job_id="train-3"), bootstrap="container"))
            assert lease.state.value == "running" and lease.provider == provider
            script = svc._boot_script(lease, node_names(lease))
            bindir = tmp_path / "bin"
            bindir.mkdir()
            docker = bindir / "docker"  # the job: runs until the test lets it end
            docker.write_text(f"#!/bin/bash\nfor _ in $(seq 600); do [ -e {tmp_path}/stop ] && exit 0; sleep 0.1; done\n")
            docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
            (tmp_path / "boot.sh").write_text(script)
            proc = subprocess.Popen(["bash", str(tmp_path / "boot.sh")], cwd=tmp_path, text=True,
                                    env={"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            wait_until(lambda: md.asked, timeout=120, what="the script to ask the metadata server")
            assert not [e for e in svc.store.events_of(lease.lease_id) if e.kind == "interruption_notice"]

            md.preempted_node = lease.instances[0].node_name  # the cloud starts taking the VM
            (ev,) = wait_until(lambda: [e for e in svc.store.events_of(lease.lease_id)
                                        if e.kind == "interruption_notice"], timeout=120,
                              what="the node's notice")
            assert "preemption notice" in ev.message and json.loads(ev.data)["source"].startswith(f"{provider}: ")
            (new,) = wait_until(lambda: [l for l in svc.store.list_leases() if l.replaces == lease.lease_id
                                         and l.state == "running"], timeout=120, what="a running replacement")
            assert new.job.job_id == "train-3"
            assert svc.store.get_lease(lease.lease_id).state == "running" and proc.poll() is None  # node and job live

            (tmp_path / "stop").touch()  # the job checkpoints and ends
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            assert "preemption notice" in err and "reported: checkpoint now" in err
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
            md.close()
            if callback is not None:
                callback.stop()


def test_the_sqs_client_goes_to_aws_endpoint_url_sqs_before_the_providers_endpoint(clouds, monkeypatch):  # noqa: F811
    from providers.base import ProviderError
    from providers.registry import build

    region = "us-east-1"
    url, sqs, _ = interruption_queue(clouds, region)
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(SPOT))
    table = {**clouds.provider_tables()["aws"], "endpoint_url": "http://127.0.0.1:9",  # nothing listens
             "interruption_queue_url": url, "interruption_wait_s": 0, "connect_timeout_s": 1}
    monkeypatch.delenv("AWS_ENDPOINT_URL_SQS", raising=False)
    with pytest.raises(ProviderError):
        build("aws", table, "broker-test").notice_source().receive()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", clouds.aws.url)
    (got,) = build("aws", table, "broker-test").notice_source().receive()
    assert got.notice.kind is NoticeKind.PREEMPTION and got.notice.instance_ids == ("i-0abc123",)


@pytest.mark.parametrize("url", ["sqs", "https://sqs.us-east-1.amazonaws.com/broker", "file:///etc/passwd",
                                 "https://sqs.us-east-1.amazonaws.com/123456789012/a b"])
def test_a_bad_queue_url_is_a_config_error_naming_the_key(url):
    from broker import config as cfgmod
    from broker.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        cfgmod.load(None, environ={}, overrides={"providers": {"aws": {"interruption_queue_url": url}}})
    assert "providers.aws.interruption_queue_url" in str(e.value)
