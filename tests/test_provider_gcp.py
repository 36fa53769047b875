"""The GCP provider, driven through google-cloud-compute against the fake Compute API on loopback."""
from __future__ import annotations

import json
import time
import uuid

import pytest
import requests
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from providers import registry
from providers.base import (
    LABEL_LEASE,
    LABEL_OWNER,
    AuthError,
    CapacityError,
    InstanceState,
    InstanceType,
    InvalidRequestError,
    LaunchSpec,
    Market,
    Provider,
    QuotaError,
    Scope,
    StopReason,
    ThrottledError,
    TransientError,
)
from providers.gcp import GcpProvider, classify, label_key, label_value, request_id
from tests.clouds.gcp import FakeGcpCompute, fake_gcp  # noqa: F401  (fixture)

PROJECT = "test-project"
REGION = "us-central1"
ZONE = "us-central1-b"
OWNER = "broker-test"

A3 = InstanceType("gcp", "a3-highgpu-8g", "H100", 8, 80, 208, 1872, "tcpx", 800)
L4 = InstanceType("gcp", "g2-standard-8", "L4", 1, 24, 8, 32, "ethernet", 16)
T4 = InstanceType("gcp", "n1-standard-8+t4", "T4", 1, 16, 8, 30, "ethernet", 16,
                  accelerator_type="nvidia-tesla-t4", machine_type="n1-standard-8")
BOOT = "#!/bin/bash\nset -euo pipefail\necho 'join token: s3cr3t' > /etc/broker-token\n# ünïcode \"quotes\"\n"


def settings(url: str, **extra) -> dict:
    return {"enabled": True, "project": PROJECT, "regions": [REGION, "europe-west4"],
            "zones": {REGION: [ZONE, "us-central1-c"]}, "api_endpoint": url, "credentials": "anonymous",
            "timeout_s": 10, **extra}


@pytest.fixture
def gcp(fake_gcp: FakeGcpCompute) -> GcpProvider:
    return GcpProvider.from_config(settings(fake_gcp.url), owner=OWNER)


def spec(lease: str = "lease-1", *, it: InstanceType = A3, market: Market = Market.ON_DEMAND, count: int = 1,
         zone: str = "", token: str | None = None, reservation: str = "", tags=None) -> LaunchSpec:
    base = label_value(lease).replace("_", "-")
    return LaunchSpec(
        lease_id=lease, provider="gcp", region=REGION, zone=zone, instance=it, market=market, count=count,
        client_token=token or f"tok-{lease}", node_names=tuple(f"{base}-n{i}" for i in range(count)),
        boot_script=BOOT, tags=tags or {"job": "train-42"}, reservation=reservation)


def fake_instance(fake: FakeGcpCompute, name: str) -> dict:
    inst = fake.instance(name)
    assert inst is not None, f"{name} not in the fake cloud"
    return inst


def metadata(inst: dict) -> dict[str, str]:
    return {i["key"]: i["value"] for i in inst["metadata"]["items"]}


# ---------------------------------------------------------------------------------------------
# launch


def test_provider_satisfies_protocol_and_registry_builds_it(fake_gcp):
    p = registry.build("gcp", settings(fake_gcp.url), owner=OWNER)
    assert isinstance(p, GcpProvider) and isinstance(p, Provider) and p.name == "gcp"


def test_on_demand_single_node(gcp, fake_gcp):
    [inst] = gcp.launch(spec())
    assert (inst.provider, inst.zone, inst.region, inst.market) == ("gcp", ZONE, REGION, Market.ON_DEMAND)
    assert inst.state is InstanceState.RUNNING and inst.stop_reason is StopReason.NONE
    assert inst.lease_id == "lease-1" and inst.node_name == "lease-1-n0" and inst.instance_type == "a3-highgpu-8g"
    assert inst.private_ip.startswith("10.") and inst.launched_at > 0

    raw = fake_instance(fake_gcp, "lease-1-n0")
    assert raw["machineType"].endswith(f"/zones/{ZONE}/machineTypes/a3-highgpu-8g")
    assert raw["scheduling"]["provisioningModel"] == "STANDARD"
    assert raw["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert "instanceTerminationAction" not in raw["scheduling"]
    assert raw["reservationAffinity"]["consumeReservationType"] == "NO_RESERVATION"
    assert not raw.get("guestAccelerators")
    assert raw["labels"][LABEL_LEASE] == "lease-1" and raw["labels"][LABEL_OWNER] == OWNER
    assert raw["labels"]["job"] == "train-42"
    assert metadata(raw)["startup-script"] == BOOT
    [insert] = fake_gcp.calls_to("POST", "/instances")
    assert uuid.UUID(insert.query["requestId"]).int != 0
    assert insert.query["requestId"] == request_id("tok-lease-1", ZONE, 0)


def test_spot_multi_node_n1_attachment(gcp, fake_gcp):
    out = gcp.launch(spec("lease-spot", it=T4, market=Market.SPOT, count=3, zone="us-central1-c"))
    assert [i.node_name for i in out] == ["lease-spot-n0", "lease-spot-n1", "lease-spot-n2"]
    assert {i.zone for i in out} == {"us-central1-c"} and {i.market for i in out} == {Market.SPOT}
    assert {i.instance_type for i in out} == {"n1-standard-8+t4"}
    for i in out:
        raw = fake_instance(fake_gcp, i.node_name)
        assert raw["scheduling"] == {**raw["scheduling"], "provisioningModel": "SPOT",
                                     "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE",
                                     "automaticRestart": False}
        assert raw["machineType"].endswith("/machineTypes/n1-standard-8")
        [acc] = raw["guestAccelerators"]
        assert acc["acceleratorType"].endswith("/acceleratorTypes/nvidia-tesla-t4") and acc["acceleratorCount"] == 1
        assert metadata(raw)["startup-script"] == BOOT
    ids = [c.query["requestId"] for c in fake_gcp.calls_to("POST", "/instances")]
    assert len(set(ids)) == 3


def test_reserved_multi_node(gcp, fake_gcp):
    fake_gcp.add_reservation(ZONE, "team-a3-res", "a3-highgpu-8g", 2)
    out = gcp.launch(spec("lease-res", market=Market.RESERVED, count=2, zone=ZONE, reservation="team-a3-res"))
    assert {i.market for i in out} == {Market.RESERVED}
    for i in out:
        aff = fake_instance(fake_gcp, i.node_name)["reservationAffinity"]
        assert aff == {"consumeReservationType": "SPECIFIC_RESERVATION",
                       "key": "compute.googleapis.com/reservation-name", "values": ["team-a3-res"]}
        assert fake_instance(fake_gcp, i.node_name)["scheduling"]["provisioningModel"] == "STANDARD"


def test_reserved_with_unknown_reservation_is_invalid(gcp, fake_gcp):
    with pytest.raises(InvalidRequestError) as e:
        gcp.launch(spec("lease-nores", market=Market.RESERVED, zone=ZONE, reservation="nope"))
    assert e.value.code == "notFound" and e.value.scope is Scope.OFFER
    assert fake_gcp.instances() == []


def test_reserved_without_reservation_name_is_refused_before_any_call(gcp, fake_gcp):
    with pytest.raises(InvalidRequestError) as e:
        gcp.launch(spec(market=Market.RESERVED))
    assert e.value.code == "RESERVATION_REQUIRED"
    assert fake_gcp.calls == []


@pytest.mark.parametrize("bad", [
    dict(node_names=("Upper-Case",)), dict(node_names=("a", "a"), count=2), dict(count=2),
    dict(zone="europe-west4-a"), dict(provider="aws"), dict(client_token=""),
])
def test_bad_specs_are_refused_before_any_call(gcp, fake_gcp, bad):
    s = spec()
    fields = {f: getattr(s, f) for f in s.__slots__}
    with pytest.raises(InvalidRequestError):
        gcp.launch(LaunchSpec(**{**fields, **bad}))
    assert fake_gcp.calls == []


def test_labels_are_sanitised_and_exact_ids_kept(gcp, fake_gcp):
    lease = "Lease_ABC.01"
    s = spec(lease, tags={"Team": "ML Infra/Research", "9lives": "Yes", "broker:lease": "spoof"})
    [inst] = gcp.launch(s)
    raw = fake_instance(fake_gcp, s.node_names[0])
    assert raw["labels"] == {"team": "ml-infra-research", "k-9lives": "yes",
                             LABEL_LEASE: "lease_abc-01", LABEL_OWNER: OWNER}
    assert inst.lease_id == lease
    assert [i.lease_id for i in gcp.describe(lease, REGION)] == [lease]
    assert gcp.describe("lease_abc-01", REGION) == []  # same label, other lease id: not ours


def test_label_helpers():
    assert label_value("A" * 80) == "a" * 63
    assert label_key("_x") == "k-_x" and label_key("Ok") == "ok"


# ---------------------------------------------------------------------------------------------
# idempotency


def test_retry_launches_nothing_new(gcp, fake_gcp):
    s = spec("lease-idem", it=L4, count=2)
    first = gcp.launch(s)
    assert fake_gcp.insert_count == 2
    again = gcp.launch(s)
    assert fake_gcp.insert_count == 2
    assert [i.node_name for i in again] == [i.node_name for i in first]
    assert len(fake_gcp.instances()) == 2


def test_fake_deduplicates_request_ids_like_compute(fake_gcp):
    client = compute_v1.InstancesClient(credentials=AnonymousCredentials(), transport="rest",
                                        client_options=ClientOptions(api_endpoint=fake_gcp.url))
    body = compute_v1.Instance(
        name="dup", machine_type=f"zones/{ZONE}/machineTypes/n1-standard-4",
        disks=[compute_v1.AttachedDisk(boot=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image="projects/debian-cloud/global/images/family/debian-12"))],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default")])
    rid = str(uuid.uuid4())
    ops = [client.insert(request=compute_v1.InsertInstanceRequest(
        project=PROJECT, zone=ZONE, instance_resource=body, request_id=rid)) for _ in range(2)]
    assert ops[0].name == ops[1].name
    assert len(fake_gcp.instances()) == 1


def test_timed_out_insert_is_adopted_by_the_retry(fake_gcp):
    gcp = GcpProvider.from_config(settings(fake_gcp.url, timeout_s=0.5), owner=OWNER)
    s = spec("lease-slow")
    fake_gcp.inject("slow", match="POST /compute", seconds=1.0)
    with pytest.raises(TransientError) as e:
        gcp.launch(s)
    assert e.value.code == "TIMEOUT" and e.value.retryable
    for _ in range(100):  # the insert still lands once the fake wakes up, as a real one would
        if fake_gcp.instance("lease-slow-n0"):
            break
        time.sleep(0.05)
    [inst] = gcp.launch(s)
    assert inst.node_name == "lease-slow-n0"
    assert len(fake_gcp.instances()) == 1


def test_retry_after_a_cleaned_up_failure_creates_a_fresh_set(gcp, fake_gcp):
    s = spec("lease-again", count=2)
    fake_gcp.inject("capacity", match="lease-again-n1")
    with pytest.raises(CapacityError):
        gcp.launch(s)
    assert fake_gcp.instances() == []
    # Compute replays both cached operations (one succeeded, its VM since deleted; one failed);
    # the provider must move on to new requestIds rather than trust the replays.
    out = gcp.launch(s)
    assert [i.node_name for i in out] == list(s.node_names)
    assert len(fake_gcp.instances()) == 2


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("kind, error, code, scope", [
    ("capacity", CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED", Scope.ZONE),
    ("quota", QuotaError, "QUOTA_EXCEEDED", Scope.REGION),
    ("throttle", ThrottledError, "rateLimitExceeded", Scope.REGION),
    ("ratelimit", ThrottledError, "rateLimitExceeded", Scope.REGION),
    ("5xx", TransientError, "backendError", Scope.REGION),
    # 401: google-auth tries to refresh the token first; anonymous credentials cannot, and say so.
    ("auth", AuthError, "InvalidOperation", Scope.CLOUD),
    ("forbidden", AuthError, "forbidden", Scope.CLOUD),
])
def test_insert_errors_are_mapped(gcp, fake_gcp, kind, error, code, scope):
    fake_gcp.inject(kind, match="POST /compute")
    with pytest.raises(error) as e:
        gcp.launch(spec("lease-err", zone=ZONE))
    err = e.value
    assert type(err) is error
    assert (err.provider, err.code, err.scope, err.region, err.zone) == ("gcp", code, scope, REGION, ZONE)
    assert err.message
    assert fake_gcp.instances() == []


def test_unknown_machine_type_is_invalid(gcp, fake_gcp):
    bogus = InstanceType("gcp", "z9-imaginary-8g", "H100", 8, 80, 8, 8, "ethernet", 0)
    with pytest.raises(InvalidRequestError) as e:
        gcp.launch(spec(it=bogus))
    assert e.value.code == "invalid" and e.value.scope is Scope.OFFER
    assert "z9-imaginary-8g" in e.value.message


def test_listing_errors_are_mapped(gcp, fake_gcp):
    fake_gcp.inject("5xx", match="GET /compute/v1/projects/test-project/aggregated")
    with pytest.raises(TransientError):
        gcp.list_managed()
    fake_gcp.inject("auth", match="aggregated")
    with pytest.raises(AuthError):
        gcp.describe("lease-1", REGION)


def test_unreachable_endpoint_is_transient():
    with FakeGcpCompute() as fake:
        url = fake.url
    gcp = GcpProvider.from_config(settings(url), owner=OWNER)
    with pytest.raises(TransientError) as e:
        gcp.list_managed()
    assert e.value.code == "CONNECTION_ERROR"


def test_transient_errors_while_waiting_are_ridden_out(gcp, fake_gcp):
    fake_gcp.inject("5xx", times=2, match="/wait")
    out = gcp.launch(spec("lease-wait", count=2))
    assert len(out) == 2 and all(i.state is InstanceState.RUNNING for i in out)


@pytest.mark.parametrize("codes, status, message, error, scope", [
    (["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"], 503, "x", CapacityError, Scope.ZONE),
    ([], 503, "The zone does not have enough resources available", CapacityError, Scope.ZONE),
    (["quotaExceeded"], 403, "Quota 'GPUS_ALL_REGIONS' exceeded", QuotaError, Scope.REGION),
    (["rateLimitExceeded"], 403, "Quota exceeded for quota metric 'Queries'", ThrottledError, Scope.REGION),
    ([], 429, "Too many requests", ThrottledError, Scope.REGION),
    (["forbidden"], 403, "Required permission", AuthError, Scope.CLOUD),
    (["notFound"], 404, "machine type not found", InvalidRequestError, Scope.OFFER),
    (["alreadyExists"], 409, "exists", InvalidRequestError, Scope.OFFER),
    (["backendError"], 500, "Internal error", TransientError, Scope.REGION),
    (["resourceNotReady"], 400, "The resource is not ready", TransientError, Scope.REGION),
    ([], None, "connection reset", TransientError, Scope.REGION),
])
def test_classify(codes, status, message, error, scope):
    err = classify(codes, status, message, region=REGION, zone=ZONE)
    assert type(err) is error and err.scope is scope and err.provider == "gcp"


# ---------------------------------------------------------------------------------------------
# all-or-nothing


def test_capacity_on_the_second_node_cleans_up_the_first(gcp, fake_gcp):
    s = spec("lease-part", count=3, zone=ZONE)
    fake_gcp.inject("capacity", match="lease-part-n1")
    with pytest.raises(CapacityError) as e:
        gcp.launch(s)
    assert e.value.zone == ZONE
    assert fake_gcp.instances() == []
    deleted = {c.path.rsplit("/", 1)[-1] for c in fake_gcp.calls_to("DELETE") if "/instances/" in c.path}
    assert deleted == {"lease-part-n0", "lease-part-n2"}
    assert fake_gcp.policies() == []  # the gang's compact placement policy went with it


def test_synchronous_failure_mid_launch_cleans_up(gcp, fake_gcp):
    fake_gcp.inject("throttle", match="lease-mid-n1")
    with pytest.raises(ThrottledError):
        gcp.launch(spec("lease-mid", count=3))
    assert fake_gcp.instances() == []
    assert fake_gcp.insert_count == 2  # the third node was never asked for


def test_random_faults_never_leak_or_duplicate(fake_gcp):
    gcp = GcpProvider.from_config(settings(fake_gcp.url), owner=OWNER)
    fake_gcp.fail_rate(0.2, kinds=["5xx", "throttle", "capacity"], seed=7)
    s = spec("lease-chaos", count=3)
    out, failures = None, 0
    for _ in range(40):  # what the lifecycle does: retry the same token
        try:
            out = gcp.launch(s)
            break
        except (TransientError, ThrottledError, CapacityError):
            failures += 1
    fake_gcp.fail_rate(0)
    assert failures > 0
    assert out is not None
    assert sorted(i["name"] for i in fake_gcp.instances()) == sorted(s.node_names)
    assert sorted(i.node_name for i in gcp.describe("lease-chaos", REGION)) == sorted(s.node_names)


# ---------------------------------------------------------------------------------------------
# describe / list / terminate


def test_terminate_removes_the_lease(gcp, fake_gcp):
    out = gcp.launch(spec("lease-term", count=2))
    other = gcp.launch(spec("lease-keep"))
    gcp.terminate(out)
    assert [i["name"] for i in fake_gcp.instances()] == [other[0].node_name]
    assert gcp.describe("lease-term", REGION) == []
    gcp.terminate(out)  # already gone: fine
    assert len([c for c in fake_gcp.calls_to("DELETE") if "/instances/" in c.path]) == 4
    assert fake_gcp.policies() == []


def test_terminate_reports_errors(gcp, fake_gcp):
    out = gcp.launch(spec("lease-tfail"))
    fake_gcp.inject("forbidden", match="DELETE")
    with pytest.raises(AuthError):
        gcp.terminate(out)
    assert len(fake_gcp.instances()) == 1


def test_describe_filters_by_lease_and_region(gcp, fake_gcp):
    gcp.launch(spec("lease-a", count=2))
    gcp.launch(spec("lease-b"))
    assert sorted(i.node_name for i in gcp.describe("lease-a", REGION)) == ["lease-a-n0", "lease-a-n1"]
    assert gcp.describe("lease-a", "europe-west4") == []


def test_list_managed_ignores_other_owners_and_unlabeled_and_pages():
    with FakeGcpCompute(page_size=2) as fake:
        gcp = GcpProvider.from_config(settings(fake.url), owner=OWNER)
        gcp.launch(spec("lease-l1", count=2))
        gcp.launch(spec("lease-l2", zone="us-central1-c"))
        fake.seed_instance(ZONE, "someone-else", labels={LABEL_OWNER: "other-broker", LABEL_LEASE: "x"})
        fake.seed_instance(ZONE, "unlabeled")
        fake.seed_instance("europe-west4-a", "eu-node", labels={LABEL_OWNER: OWNER, LABEL_LEASE: "lease-eu"})
        fake.calls.clear()
        managed = gcp.list_managed()
        assert sorted(i.node_name for i in managed) == ["eu-node", "lease-l1-n0", "lease-l1-n1", "lease-l2-n0"]
        assert {i.lease_id for i in managed} == {"lease-l1", "lease-l2", "lease-eu"}
        pages = fake.calls_to("GET", "/aggregated/instances")
        assert len(pages) == 2 and "pageToken" in pages[1].query
        assert sorted(i.node_name for i in gcp.list_managed([REGION])) == ["lease-l1-n0", "lease-l1-n1",
                                                                           "lease-l2-n0"]


# ---------------------------------------------------------------------------------------------
# interruption


def test_preempted_and_deleted_spot_vm_is_reported_interrupted(gcp, fake_gcp):
    out = gcp.launch(spec("lease-pre", it=L4, market=Market.SPOT, count=2))
    op = fake_gcp.interrupt("lease-pre-n0")
    assert fake_gcp.instance("lease-pre-n0") is None  # DELETE action: the VM is gone
    got = {i.node_name: i for i in gcp.describe("lease-pre", REGION)}
    assert got["lease-pre-n1"].state is InstanceState.RUNNING
    lost = got["lease-pre-n0"]
    assert (lost.state, lost.stop_reason, lost.market) == (InstanceState.TERMINATED, StopReason.INTERRUPTED,
                                                           Market.SPOT)
    assert "compute.instances.preempted" in lost.stop_detail and op["name"] in lost.stop_detail
    assert any(i.node_name == "lease-pre-n0" and i.stop_reason is StopReason.INTERRUPTED
               for i in gcp.list_managed())
    listed = fake_gcp.calls_to("GET", f"/zones/{ZONE}/operations")
    assert 'operationType = "compute.instances.preempted"' in listed[-1].query["filter"]
    gcp.terminate(out)
    assert gcp.describe("lease-pre", REGION) == []


def test_preempted_vm_still_terminated_is_interrupted(gcp, fake_gcp):
    gcp.launch(spec("lease-pk", it=L4, market=Market.SPOT))
    op = fake_gcp.interrupt("lease-pk-n0", keep=True)
    [inst] = gcp.describe("lease-pk", REGION)
    assert inst.state is InstanceState.TERMINATED and inst.stop_reason is StopReason.INTERRUPTED
    assert op["name"] in inst.stop_detail


def test_preemption_of_a_relaunched_name_does_not_confuse_incarnations(gcp, fake_gcp):
    s = spec("lease-inc", it=L4, market=Market.SPOT)
    gcp.launch(s)
    fake_gcp.interrupt("lease-inc-n0")
    [old] = gcp.describe("lease-inc", REGION)
    assert old.stop_reason is StopReason.INTERRUPTED
    gcp.terminate([old])
    [new] = gcp.launch(spec("lease-inc", it=L4, market=Market.SPOT, token="tok-second"))
    [seen] = gcp.describe("lease-inc", REGION)
    assert seen.state is InstanceState.RUNNING and seen.stop_reason is StopReason.NONE


def test_a_vm_deleted_by_someone_else_is_simply_gone(gcp, fake_gcp):
    [inst] = gcp.launch(spec("lease-gone", it=L4, market=Market.SPOT))
    requests.delete(f"{fake_gcp.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{inst.node_name}")
    for _ in range(50):
        if fake_gcp.instance(inst.node_name) is None:
            break
        time.sleep(0.05)
    assert gcp.describe("lease-gone", REGION) == []


# ---------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize("change, key", [
    ({"project": ""}, "providers.gcp.project"),
    ({"project": None}, "providers.gcp.project"),
    ({"regions": []}, "providers.gcp.regions"),
    ({"zones": {REGION: ["europe-west4-a"]}}, "providers.gcp.zones"),
    ({"api_endpoint": "127.0.0.1:1"}, "providers.gcp.api_endpoint"),
    ({"timeout_s": 0}, "providers.gcp.timeout_s"),
    ({"boot_disk_gb": 5}, "providers.gcp.boot_disk_gb"),
    ({"subnetwork": "regions/us-central1/subnetworks/x"}, "providers.gcp.subnetwork"),
    ({"credentials": "/nonexistent/key.json"}, "providers.gcp.credentials"),
])
def test_config_errors_name_the_key(fake_gcp, change, key):
    raw = {k: v for k, v in {**settings(fake_gcp.url), **change}.items() if v is not None}
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        GcpProvider.from_config(raw, owner=OWNER)


def test_default_credentials_missing_is_a_config_error(fake_gcp, monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    with pytest.raises(ValueError, match=r"providers\.gcp\.credentials"):
        GcpProvider.from_config({**settings(fake_gcp.url), "credentials": ""}, owner=OWNER)


def test_missing_project_is_a_config_error():
    with pytest.raises(ValueError, match=r"providers\.gcp\.project"):
        GcpProvider.from_config({"regions": [REGION], "credentials": "anonymous",
                                 "api_endpoint": "http://127.0.0.1:9"}, owner=OWNER)


@pytest.mark.parametrize("endpoint", ["", "https://compute.googleapis.com", "http://10.0.0.5:8080"])
def test_anonymous_is_refused_off_loopback(endpoint):
    with pytest.raises(ValueError, match="anonymous"):
        GcpProvider.from_config({"project": PROJECT, "regions": [REGION], "credentials": "anonymous",
                                 "api_endpoint": endpoint}, owner=OWNER)


def test_service_account_key_file_is_used(tmp_path, fake_gcp):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    key = tmp_path / "sa.json"
    key.write_text(json.dumps({"type": "service_account", "project_id": PROJECT, "private_key_id": "1",
                               "private_key": pem, "client_email": "broker@test-project.iam.gserviceaccount.com",
                               "client_id": "1", "token_uri": "http://127.0.0.1:9/token"}))
    gcp = GcpProvider.from_config({**settings(fake_gcp.url), "credentials": str(key)}, owner=OWNER)
    assert gcp.project == PROJECT


@pytest.mark.timeout(30)  # a FIFO opened for reading would block for ever
def test_a_key_file_that_is_a_device_a_fifo_or_huge_is_refused_at_once(tmp_path, fake_gcp):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (16 * 1024 * 1024 + 1))
    for path, words in (("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
                        (str(huge), "larger than 16 MiB"), (str(tmp_path / "absent.json"), "No such file")):
        with pytest.raises(ValueError, match=f"providers.gcp.credentials: cannot read .*{words}"):
            GcpProvider.from_config({**settings(fake_gcp.url), "credentials": path}, owner=OWNER)


def test_zones_default_to_the_catalog_or_region_a(fake_gcp):
    gcp = GcpProvider.from_config({**settings(fake_gcp.url), "zones": {}}, owner=OWNER)
    zones = gcp.zones_for("europe-west4")
    assert zones and all(z.startswith("europe-west4-") for z in zones)
    assert gcp.zones_for(REGION)[0].startswith(f"{REGION}-")


def test_boot_script_is_never_logged(gcp, fake_gcp, capsys):
    import structlog.testing

    with structlog.testing.capture_logs() as logs:
        gcp.launch(spec("lease-log", count=2))
        fake_gcp.inject("capacity")
        with pytest.raises(CapacityError):
            gcp.launch(spec("lease-log2"))
    assert logs and all(e.get("provider") == "gcp" for e in logs)
    assert all(e.get("lease_id") for e in logs if e["event"].startswith("gcp.launch"))
    assert "s3cr3t" not in repr(logs) and "s3cr3t" not in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# the fake itself validates like Compute


def _post(fake: FakeGcpCompute, body: dict) -> requests.Response:
    return requests.post(f"{fake.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances", json=body,
                         timeout=5)


GOOD = {"name": "vm-1", "machineType": f"zones/{ZONE}/machineTypes/n1-standard-4",
        "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/x"}}],
        "networkInterfaces": [{"network": "global/networks/default"}]}


@pytest.mark.parametrize("change, status, text", [
    ({"name": None}, 400, "resource.name"),
    ({"disks": None}, 400, "resource.disks"),
    ({"networkInterfaces": None}, 400, "resource.networkInterfaces"),
    ({"machineType": f"zones/{ZONE}/machineTypes/nope-1"}, 400, "does not exist"),
    ({"guestAccelerators": [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]}, 400,
     "live migration"),
    ({"machineType": f"zones/{ZONE}/machineTypes/g2-standard-8"}, 400, "live migration"),
    ({"scheduling": {"instanceTerminationAction": "DELETE"}}, 400, "SPOT"),
    ({"scheduling": {"provisioningModel": "SPOT", "automaticRestart": True}}, 400, "automaticRestart"),
    ({"labels": {"Bad": "x"}}, 400, "labels"),
])
def test_fake_rejects_what_compute_rejects(fake_gcp, change, status, text):
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    r = _post(fake_gcp, body)
    assert r.status_code == status and text in r.json()["error"]["message"]
    assert r.json()["error"]["errors"][0]["reason"]
    assert _post(fake_gcp, GOOD).status_code == 200


def test_fake_operations_progress_across_polls(fake_gcp):
    op = _post(fake_gcp, GOOD).json()
    assert op["status"] == "PENDING"
    url = f"{fake_gcp.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/operations/{op['name']}"
    assert [requests.get(url, timeout=5).json()["status"] for _ in range(3)] == ["RUNNING", "DONE", "DONE"]
    assert fake_gcp.instance("vm-1")["status"] == "RUNNING"
    assert _post(fake_gcp, GOOD).status_code == 409


def test_fake_serves_machine_and_accelerator_types(fake_gcp):
    base = f"{fake_gcp.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}"
    mt = requests.get(f"{base}/machineTypes/a3-highgpu-8g", timeout=5).json()
    assert mt["guestCpus"] == 208 and mt["accelerators"][0]["guestAcceleratorCount"] == 8
    assert requests.get(f"{base}/machineTypes/nope", timeout=5).status_code == 404
    names = {a["name"] for a in requests.get(f"{base}/acceleratorTypes", timeout=5).json()["items"]}
    assert {"nvidia-tesla-t4", "nvidia-l4", "nvidia-h100-80gb"} <= names
    bad = requests.get(f"{base}/instances", params={"filter": "((("}, timeout=5)
    assert bad.status_code == 400


def test_relaunch_in_another_zone_removes_the_leftovers(gcp, fake_gcp):
    gcp.launch(spec("lease-move", count=2, zone="us-central1-c"))
    out = gcp.launch(spec("lease-move", count=2, zone=ZONE, token="tok-second-try"))
    assert {i.zone for i in out} == {ZONE}
    assert sorted((i["zone"].rsplit("/", 1)[-1], i["name"]) for i in fake_gcp.instances()) == [
        (ZONE, "lease-move-n0"), (ZONE, "lease-move-n1")]


def test_request_ids_are_stable_uuids():
    rid = request_id("tok", ZONE, 0)
    assert rid == request_id("tok", ZONE, 0) and uuid.UUID(rid).version == 5
    assert len({request_id("tok", ZONE, i, g) for i in range(3) for g in range(3)}
               | {request_id("tok", "us-central1-c", 0)}) == 10


# ---------------------------------------------------------------------------------------------
# compact placement


@pytest.fixture
def gcp_compact(fake_gcp: FakeGcpCompute) -> GcpProvider:
    return GcpProvider.from_config(settings(fake_gcp.url, compact_placement=True), owner=OWNER)


def test_compact_placement_for_a_multi_node_lease(gcp_compact, fake_gcp):
    out = gcp_compact.launch(spec("lease-cp", count=3))
    [policy] = fake_gcp.policies()
    assert policy["name"] == "broker-lease-cp" and policy["status"] == "READY"
    assert policy["groupPlacementPolicy"]["collocation"] == "COLLOCATED"
    for i in out:
        [used] = fake_instance(fake_gcp, i.node_name)["resourcePolicies"]
        assert used.endswith(f"/regions/{REGION}/resourcePolicies/broker-lease-cp")
    assert gcp_compact.launch(spec("lease-cp", count=3)) == out  # retry: the policy is reused
    gcp_compact.terminate(out)
    assert fake_gcp.policies() == [] and fake_gcp.instances() == []


def test_compact_placement_is_rolled_back_with_the_launch(gcp_compact, fake_gcp):
    fake_gcp.inject("capacity", match="lease-cpf-n1")
    with pytest.raises(CapacityError):
        gcp_compact.launch(spec("lease-cpf", count=2))
    assert fake_gcp.policies() == [] and fake_gcp.instances() == []
    out = gcp_compact.launch(spec("lease-cpf", count=2, token="tok-cpf-2"))
    assert len(out) == 2 and len(fake_gcp.policies()) == 1


def test_single_node_leases_get_no_placement_policy(gcp_compact, fake_gcp):
    [inst] = gcp_compact.launch(spec("lease-one"))
    assert fake_gcp.policies() == [] and not fake_instance(fake_gcp, inst.node_name).get("resourcePolicies")


def test_placement_policy_kept_while_other_nodes_use_it(gcp_compact, fake_gcp):
    out = gcp_compact.launch(spec("lease-half", count=2))
    gcp_compact.terminate(out[:1])
    assert len(fake_gcp.policies()) == 1
    gcp_compact.terminate(out[1:])
    assert fake_gcp.policies() == []


def test_placement_policy_errors_are_mapped(gcp_compact, fake_gcp):
    fake_gcp.inject("forbidden", match="resourcePolicies")
    with pytest.raises(AuthError):
        gcp_compact.launch(spec("lease-cpe", count=2))
    assert fake_gcp.insert_count == 0


def test_a_proxys_html_page_is_a_transient_error_naming_the_status(gcp, fake_gcp):
    """A load balancer's 502 HTML page instead of Compute's JSON: a retryable error of one
    sentence naming GCP and the status, not the page itself."""
    fake_gcp.inject("html", times=100, match="GET /compute/v1/projects/test-project/aggregated")
    with pytest.raises(TransientError) as e:
        gcp.list_managed()
    err = e.value
    assert err.retryable and err.provider == "gcp" and err.code == "HTTP502"
    assert "HTTP 502" in str(err) and "<" not in str(err) and len(str(err)) < 300
