"""AzureProvider: the real azure-mgmt-compute client against the fake ARM on loopback."""
from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import structlog
from azure.core.credentials import AccessToken
from azure.mgmt.core.policies import ARMChallengeAuthenticationPolicy

from providers import registry
from providers.azure import AzureProvider, _LoopbackBearerPolicy, _NoAuthPolicy
from providers.base import (
    TAG_LEASE,
    TAG_OWNER,
    AuthError,
    CapacityError,
    InstanceState,
    InstanceType,
    InvalidRequestError,
    LaunchSpec,
    Market,
    Provider,
    ProviderError,
    QuotaError,
    Scope,
    StopReason,
    ThrottledError,
    TransientError,
)
from tests.clouds.azure import FakeArm, fake_arm, fake_arm_server  # noqa: F401  (fixtures)

SUB = "3f2b1c9e-5d4a-4e8b-9c7d-0a1b2c3d4e5f"
RG = "broker-rg"
SUBNET = (f"/subscriptions/{SUB}/resourceGroups/net-rg/providers/Microsoft.Network/"
          "virtualNetworks/gpu-vnet/subnets/nodes")
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBroKerTestKey broker@test"
H100 = InstanceType("azure", "Standard_ND96isr_H100_v5", "H100", 8, 80, 96, 1900, "infiniband", 3200)
T4 = InstanceType("azure", "Standard_NC4as_T4_v3", "T4", 1, 16, 4, 28, "ethernet", 8)
BOOT = "#!/bin/bash\nset -eu\necho 'join slurm' > /tmp/ünïcode\nexport TOKEN=s3cr3t-b00t-t0ken\n"
API = "2024-07-01"


def settings(fake: FakeArm, **over: Any) -> dict[str, Any]:
    s = {"enabled": True, "subscription_id": SUB, "resource_group": RG, "base_url": fake.url,
         "credentials": "anonymous", "subnet_id": SUBNET, "ssh_public_key": SSH_KEY,
         "poll_interval_s": 0, "retries": 0, "timeout_s": 5, "operation_timeout_s": 20}
    s.update(over)
    return {k: v for k, v in s.items() if v is not None}


@pytest.fixture
def make(fake_arm: FakeArm):
    made: list[AzureProvider] = []

    def _make(owner: str = "broker-test", credential: Any = None, **over: Any) -> AzureProvider:
        p = AzureProvider.from_config(settings(fake_arm, **over), owner=owner,
                                      **({"credential": credential} if credential else {}))
        made.append(p)
        return p

    yield _make
    for p in made:
        p.close()


@pytest.fixture
def az(make) -> AzureProvider:
    return make()


def spec(lease: str = "lease-a", count: int = 1, market: Market = Market.ON_DEMAND,
         region: str = "eastus", zone: str = "", it: InstanceType = H100, **kw: Any) -> LaunchSpec:
    names = kw.pop("node_names", tuple(f"{lease}-n{i}" for i in range(count)))
    return LaunchSpec(lease_id=lease, provider="azure", region=region, zone=zone, instance=it,
                      market=market, count=count, client_token=f"tok-{lease}", node_names=names,
                      boot_script=kw.pop("boot_script", BOOT), **kw)


def vm_body(fake: FakeArm, name: str) -> dict[str, Any]:
    """The body the fake received in the (last) PUT for VM ``name``."""
    puts = [c for c in fake.calls_matching("PUT", f"/virtualMachines/{name}") if c.body]
    assert puts, f"no PUT for {name}"
    return puts[-1].body


def leftovers(fake: FakeArm) -> dict[str, list]:
    return {"vms": [v["name"] for v in fake.instances()],
            "ppgs": [p["name"] for p in fake.proximity_placement_groups()],
            "nics": [n["name"] for n in fake.network_interfaces()], "disks": fake.disks()}


NOTHING = {"vms": [], "ppgs": [], "nics": [], "disks": []}


def raw(fake: FakeArm, method: str, path: str, body: Any = None, api: str | None = API
        ) -> tuple[int, Any]:
    """A plain HTTP call to the fake ARM (to check its own faithfulness, or plant resources)."""
    url = fake.url + path + (f"?api-version={api}" if api else "")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if text else None


def vm_path(name: str, rg: str = RG) -> str:
    return f"/subscriptions/{SUB}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}"


def plain_vm(location: str = "eastus", tags: dict | None = None, **props: Any) -> dict[str, Any]:
    p = {"hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"},
         "storageProfile": {"imageReference": {"publisher": "canonical", "offer": "ubuntu-24_04-lts",
                                               "sku": "server", "version": "latest"}},
         "osProfile": {"computerName": "x", "adminUsername": "azureuser",
                       "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {
                           "publicKeys": [{"path": "/home/azureuser/.ssh/authorized_keys",
                                           "keyData": SSH_KEY}]}}},
         "networkProfile": {"networkApiVersion": "2020-11-01", "networkInterfaceConfigurations": [
             {"name": "nic0", "properties": {"primary": True, "deleteOption": "Delete",
                                             "ipConfigurations": [{"name": "ip0", "properties": {
                                                 "subnet": {"id": SUBNET}}}]}}]}}
    p.update(props)
    body: dict[str, Any] = {"location": location, "properties": p}
    if tags is not None:
        body["tags"] = tags
    return body


def wait_for(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


# ------------------------------------------------------------------------------------ launches


def test_is_a_provider(az: AzureProvider) -> None:
    assert isinstance(az, Provider)
    assert az.name == "azure"


def test_on_demand_single_node(az: AzureProvider, fake_arm: FakeArm) -> None:
    s = spec(tags={"team": "vision", "job": "j-42"})
    [inst] = az.launch(s)

    body = vm_body(fake_arm, "lease-a-n0")
    props = body["properties"]
    assert body["location"] == "eastus" and "zones" not in body
    assert props["priority"] == "Regular"
    assert "evictionPolicy" not in props and "billingProfile" not in props
    assert "capacityReservation" not in props and "proximityPlacementGroup" not in props
    assert props["hardwareProfile"]["vmSize"] == "Standard_ND96isr_H100_v5"
    assert body["tags"] == {TAG_LEASE: "lease-a", TAG_OWNER: "broker-test", "Name": "lease-a-n0",
                            "team": "vision", "job": "j-42"}
    assert base64.b64decode(props["userData"]).decode() == BOOT
    net = props["networkProfile"]
    assert net["networkApiVersion"] == "2020-11-01"
    [nic] = net["networkInterfaceConfigurations"]
    assert nic["properties"]["deleteOption"] == "Delete"
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"] == SUBNET
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert props["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == SSH_KEY
    assert fake_arm.proximity_placement_groups() == []

    stored = fake_arm.vm("lease-a-n0")
    assert stored["properties"]["provisioningState"] == "Succeeded"
    assert inst.provider == "azure" and inst.instance_id == stored["id"]
    assert inst.node_name == "lease-a-n0" and inst.lease_id == "lease-a"
    assert inst.market is Market.ON_DEMAND and inst.state is InstanceState.RUNNING
    assert inst.region == "eastus" and inst.zone == ""
    assert inst.instance_type == "Standard_ND96isr_H100_v5"
    [fake_nic] = fake_arm.network_interfaces()
    assert inst.private_ip == fake_nic["properties"]["ipConfigurations"][0]["properties"][
        "privateIPAddress"]
    assert inst.launched_at > 0
    # every call named an api-version, and the VM list/GETs never echoed userData back
    assert all(c.api_version for c in fake_arm.calls)


def test_spot_multi_node_zonal_with_placement_group(az: AzureProvider, fake_arm: FakeArm) -> None:
    s = spec("lease-s", count=3, market=Market.SPOT, zone="eastus-2", max_price_micros=12_345_000)
    out = az.launch(s)

    assert [i.node_name for i in out] == ["lease-s-n0", "lease-s-n1", "lease-s-n2"]
    [ppg] = fake_arm.proximity_placement_groups()
    assert ppg["name"] == "broker-lease-s" and ppg["zones"] == ["2"]
    assert ppg["tags"] == {TAG_LEASE: "lease-s", TAG_OWNER: "broker-test"}
    assert {m["id"] for m in ppg["properties"]["virtualMachines"]} == {i.instance_id for i in out}
    for i in out:
        body = vm_body(fake_arm, i.node_name)
        props = body["properties"]
        assert body["zones"] == ["2"]
        assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
        assert props["billingProfile"]["maxPrice"] == pytest.approx(12.345)
        assert props["proximityPlacementGroup"]["id"] == ppg["id"]
        assert base64.b64decode(props["userData"]).decode() == BOOT
        assert i.market is Market.SPOT and i.zone == "2" and i.state is InstanceState.RUNNING
    assert len({i.private_ip for i in out}) == 3


def test_spot_without_cap_bids_up_to_on_demand(az: AzureProvider, fake_arm: FakeArm) -> None:
    az.launch(spec("lease-cap", market=Market.SPOT, zone="1"))
    assert vm_body(fake_arm, "lease-cap-n0")["properties"]["billingProfile"] == {"maxPrice": -1}


def test_reserved_launch_names_the_capacity_reservation_group(az: AzureProvider,
                                                              fake_arm: FakeArm) -> None:
    crg = fake_arm.add_capacity_reservation_group(SUB, RG, "h100-crg", "eastus", zones=["1"])
    out = az.launch(spec("lease-r", count=2, market=Market.RESERVED, zone="1",
                         reservation="h100-crg"))
    for i in out:
        props = vm_body(fake_arm, i.node_name)["properties"]
        assert props["capacityReservation"]["capacityReservationGroup"]["id"] == crg
        assert props["priority"] == "Regular" and "evictionPolicy" not in props
        assert i.market is Market.RESERVED
    # a full ARM id is passed through as it is
    az.launch(spec("lease-r2", market=Market.RESERVED, reservation=crg))
    assert vm_body(fake_arm, "lease-r2-n0")["properties"]["capacityReservation"][
        "capacityReservationGroup"]["id"] == crg


def test_reserved_into_unknown_reservation_is_invalid_and_leaves_nothing(
        az: AzureProvider, fake_arm: FakeArm) -> None:
    with pytest.raises(InvalidRequestError) as ei:
        az.launch(spec("lease-r", count=2, market=Market.RESERVED, reservation="nope"))
    assert ei.value.code == "InvalidParameter"
    assert leftovers(fake_arm) == NOTHING


def test_retry_of_a_finished_launch_creates_nothing(az: AzureProvider, fake_arm: FakeArm) -> None:
    s = spec("lease-i", count=2, market=Market.SPOT)
    first = az.launch(s)
    puts = len(fake_arm.calls_matching("PUT", "/virtualMachines/"))
    again = az.launch(s)
    assert [i.instance_id for i in again] == [i.instance_id for i in first]
    assert [i.private_ip for i in again] == [i.private_ip for i in first]
    assert len(fake_arm.calls_matching("PUT", "/virtualMachines/")) == puts == 2
    assert len(fake_arm.instances()) == 2


def test_retry_after_a_timed_out_create_adopts_the_vm(make, fake_arm: FakeArm) -> None:
    """The first PUT reaches ARM but its answer comes too late: the retry must not duplicate."""
    az = make(timeout_s=0.5)
    fake_arm.slow_s = 1.0
    fake_arm.inject("slow", match="/virtualMachines/lease-t-n0")
    s = spec("lease-t")
    with pytest.raises(TransientError) as ei:
        az.launch(s)
    assert ei.value.code == "ServiceResponseError" and ei.value.retryable
    [slow] = [c for c in fake_arm.calls if c.fault == "slow"]
    wait_for(lambda: slow.status != 0)  # ARM did the work after all, after the client gave up
    [inst] = az.launch(s)
    assert inst.node_name == "lease-t-n0" and inst.state is InstanceState.RUNNING
    assert [v["name"] for v in fake_arm.instances()] == ["lease-t-n0"]


def test_retry_waits_out_a_vm_being_deleted(az: AzureProvider, fake_arm: FakeArm) -> None:
    [first] = az.launch(spec("lease-dd"))
    fake_arm.lro_polls = 10**9  # operations now finish only after settle_s
    fake_arm.settle_s = 0.2
    assert raw(fake_arm, "DELETE", vm_path("lease-dd-n0"))[0] == 202
    assert fake_arm.vm("lease-dd-n0")["properties"]["provisioningState"] == "Deleting"
    [again] = az.launch(spec("lease-dd"))
    assert again.state is InstanceState.RUNNING and again.instance_id == first.instance_id
    assert len(fake_arm.calls_matching("PUT", "/virtualMachines/lease-dd-n0")) == 2
    assert len(fake_arm.instances()) == 1


def test_retry_recreates_a_vm_left_failed(az: AzureProvider, fake_arm: FakeArm) -> None:
    # a VM of the lease left behind in provisioning state Failed (crash before the clean-up)
    fake_arm.inject("capacity")
    status, _ = raw(fake_arm, "PUT", vm_path("lease-f-n0"),
                    plain_vm(tags={TAG_LEASE: "lease-f", TAG_OWNER: "broker-test"}))
    assert status == 201
    wait_for(lambda: fake_arm.vm("lease-f-n0")["properties"]["provisioningState"] == "Failed")
    [inst] = az.launch(spec("lease-f", it=T4))
    assert inst.state is InstanceState.RUNNING
    assert fake_arm.vm("lease-f-n0")["properties"]["provisioningState"] == "Succeeded"


def test_a_name_taken_by_someone_else_is_not_adopted(az: AzureProvider, fake_arm: FakeArm) -> None:
    assert raw(fake_arm, "PUT", vm_path("lease-x-n0"), plain_vm())[0] == 201
    with pytest.raises(InvalidRequestError) as ei:
        az.launch(spec("lease-x"))
    assert ei.value.code == "VmNameInUse"
    assert [v["name"] for v in fake_arm.instances()] == ["lease-x-n0"]  # left alone


# ------------------------------------------------------------------------------------ errors

ERRORS = [
    # (fault, code, zone, expected type, expected code, expected scope)
    ("capacity", "", "", CapacityError, "AllocationFailed", Scope.REGION),
    ("capacity", "", "3", CapacityError, "ZonalAllocationFailed", Scope.ZONE),
    ("capacity", "OverconstrainedAllocationRequest", "1", CapacityError,
     "OverconstrainedAllocationRequest", Scope.REGION),
    ("capacity", "SkuNotAvailable", "", CapacityError, "SkuNotAvailable", Scope.REGION),
    ("quota", "", "", QuotaError, "OperationNotAllowed", Scope.REGION),
    ("quota", "QuotaExceeded", "", QuotaError, "QuotaExceeded", Scope.REGION),
    ("throttle", "", "", ThrottledError, "TooManyRequests", Scope.REGION),
    ("5xx", "", "", TransientError, "InternalServerError", Scope.REGION),
    ("5xx", "ServiceUnavailable", "", TransientError, "ServiceUnavailable", Scope.REGION),
    ("auth", "", "", AuthError, "InvalidAuthenticationToken", Scope.CLOUD),
    ("auth", "AuthorizationFailed", "", AuthError, "AuthorizationFailed", Scope.CLOUD),
]


@pytest.mark.parametrize("fault,code,zone,etype,ecode,escope", ERRORS,
                         ids=[f"{e[0]}-{e[1] or 'default'}-z{e[2] or 'none'}" for e in ERRORS])
def test_error_mapping(az: AzureProvider, fake_arm: FakeArm, fault, code, zone, etype, ecode,
                       escope) -> None:
    fake_arm.inject(fault, match="/virtualMachines/lease-e-n1", code=code)
    with pytest.raises(ProviderError) as ei:
        az.launch(spec("lease-e", count=2, zone=zone))
    err = ei.value
    assert type(err) is etype
    assert (err.provider, err.code, err.scope) == ("azure", ecode, escope)
    assert err.region == "eastus" and err.zone == zone and err.message
    assert err.retryable == (etype in (ThrottledError, TransientError))
    assert leftovers(fake_arm) == NOTHING  # node 0 and the placement group were cleaned up


def test_size_not_sold_in_region_is_capacity(az: AzureProvider, fake_arm: FakeArm) -> None:
    fake_arm.set_unavailable("westus2", "Standard_ND96isr_H100_v5")
    with pytest.raises(CapacityError) as ei:
        az.launch(spec(region="westus2"))
    assert (ei.value.code, ei.value.scope, ei.value.region) == ("SkuNotAvailable", Scope.REGION,
                                                                "westus2")


def test_unknown_size_is_an_invalid_request(az: AzureProvider, fake_arm: FakeArm) -> None:
    bogus = InstanceType("azure", "Standard_ND1000_Z9000", "Z", 8, 80, 96, 1900, "infiniband", 0)
    with pytest.raises(InvalidRequestError) as ei:
        az.launch(spec(it=bogus))
    assert ei.value.code == "InvalidParameter" and not ei.value.retryable
    assert leftovers(fake_arm) == NOTHING


def test_unknown_location_blocks_the_region(az: AzureProvider) -> None:
    with pytest.raises(InvalidRequestError) as ei:
        az.launch(spec(region="atlantis"))
    assert (ei.value.code, ei.value.scope) == ("LocationNotAvailableForResourceType", Scope.REGION)


def test_missing_resource_group_blocks_the_cloud(az: AzureProvider, fake_arm: FakeArm) -> None:
    fake_arm.resource_groups = {"some-other-rg"}
    with pytest.raises(InvalidRequestError) as ei:
        az.launch(spec())
    assert (ei.value.code, ei.value.scope) == ("ResourceGroupNotFound", Scope.CLOUD)


def test_timeout_is_transient(make, fake_arm: FakeArm) -> None:
    az = make(timeout_s=0.3)
    fake_arm.slow_s = 1.0
    fake_arm.inject("slow", times=-1, match="GET /subscriptions")
    with pytest.raises(TransientError) as ei:
        az.list_managed()
    assert ei.value.code == "ServiceResponseError"


def test_unreachable_endpoint_is_transient(fake_arm: FakeArm) -> None:
    gone = FakeArm().start()
    url = gone.url
    gone.stop()
    p = AzureProvider.from_config(settings(fake_arm, base_url=url), owner="o")
    with pytest.raises(TransientError) as ei:
        p.describe("lease", "eastus")
    assert ei.value.code == "ServiceRequestError"


def test_operation_that_never_finishes_times_out(make, fake_arm: FakeArm) -> None:
    az = make(operation_timeout_s=0.3, poll_interval_s=0.05)
    fake_arm.lro_polls, fake_arm.settle_s = 10**9, 3600
    with pytest.raises(TransientError) as ei:
        az.launch(spec("lease-slow"))
    assert ei.value.code == "OperationTimeout"
    fake_arm.lro_polls, fake_arm.settle_s = 0, 0  # let ARM finish, then nothing may remain
    az.terminate(az.list_managed())
    assert leftovers(fake_arm) == NOTHING


def test_sdk_retries_absorb_a_single_throttle(make, fake_arm: FakeArm) -> None:
    az = make(retries=2)
    fake_arm.retry_after = 0
    fake_arm.inject("throttle", match="PUT /subscriptions")
    [inst] = az.launch(spec())
    assert inst.state is InstanceState.RUNNING
    assert [c.status for c in fake_arm.calls_matching("PUT", "/virtualMachines/")] == [429, 201]


def test_partial_launch_is_cleaned_up(az: AzureProvider, fake_arm: FakeArm) -> None:
    fake_arm.inject("capacity", match="/virtualMachines/lease-p-n2")
    with pytest.raises(CapacityError):
        az.launch(spec("lease-p", count=4, market=Market.SPOT, zone="1"))
    # the nodes that were created were deleted, with their NICs, disks and the placement group
    deleted = {c.path.rsplit("/", 1)[1] for c in fake_arm.calls_matching("DELETE", "/virtualMachines/")}
    assert {"lease-p-n0", "lease-p-n1", "lease-p-n2", "lease-p-n3"} <= deleted
    assert fake_arm.calls_matching("DELETE", "/proximityPlacementGroups/broker-lease-p")
    assert leftovers(fake_arm) == NOTHING


def test_a_placement_group_whose_cleanup_failed_is_listed_and_removed(make, fake_arm: FakeArm) -> None:
    """The launch's cleanup cannot delete the group (ARM answers 500 to every try): the group
    stays, empty. It is listed as a terminated leftover of its lease, so terminating what
    ``list_managed`` returns (what the reconciler does with orphans) removes it."""
    az = make(retries=1)
    fake_arm.retry_after = 0
    fake_arm.inject("capacity", match="/virtualMachines/lease-q-n1")
    group = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/proximityPlacementGroups/broker-lease-q"
    fake_arm.inject("5xx", match=f"DELETE {group}", times=-1)  # ARM keeps failing the group's deletes
    with pytest.raises(CapacityError):
        az.launch(spec("lease-q", count=2, market=Market.SPOT))
    fake_arm.clear_faults()
    assert leftovers(fake_arm)["ppgs"] == ["broker-lease-q"]
    [left] = az.list_managed()
    assert (left.lease_id, left.state, left.instance_type) == ("lease-q", InstanceState.TERMINATED, "")
    assert left.instance_id.endswith("/proximityPlacementGroups/broker-lease-q")
    assert az.list_managed(["westus2"]) == []
    az.terminate([left])
    assert leftovers(fake_arm) == NOTHING
    assert not fake_arm.calls_matching("DELETE", "/virtualMachines/broker-lease-q")  # not taken for a VM


@pytest.mark.parametrize("seed", range(4))
def test_random_faults_never_leave_a_half_lease(make, fake_arm: FakeArm, seed: int) -> None:
    az = make(retries=1)
    fake_arm.retry_after = 0
    fake_arm.fail_rate(0.25, ["5xx", "throttle", "capacity"], seed=seed)
    try:
        out = az.launch(spec(f"lease-r{seed}", count=3, market=Market.SPOT))
    except ProviderError as e:
        assert isinstance(e, (TransientError, ThrottledError, CapacityError))
        out = None
    fake_arm.clear_faults()
    mine = [v for v in fake_arm.instances() if v["tags"].get(TAG_LEASE) == f"lease-r{seed}"]
    if out is not None:
        assert len(mine) == 3 and len(out) == 3
    az.terminate(az.list_managed())  # whatever the outcome, the broker can remove all of it
    assert leftovers(fake_arm) == NOTHING


def test_bad_specs_are_refused_before_any_call(make, fake_arm: FakeArm) -> None:
    az = make(regions=["eastus"], subnet_id={"eastus": SUBNET})
    with pytest.raises(InvalidRequestError, match="node names"):
        az.launch(spec(count=2, node_names=("only-one",)))
    with pytest.raises(InvalidRequestError, match="reservation"):
        az.launch(spec(market=Market.RESERVED))
    with pytest.raises(InvalidRequestError) as ei:
        az.launch(spec(region="westus2"))
    assert ei.value.scope is Scope.REGION
    assert fake_arm.calls == []


def test_subnet_table_picks_the_region(make, fake_arm: FakeArm) -> None:
    west = SUBNET.replace("gpu-vnet", "west-vnet")
    az = make(subnet_id={"eastus": SUBNET, "West US 2": west})
    az.launch(spec("lease-w", region="westus2"))
    props = vm_body(fake_arm, "lease-w-n0")["properties"]
    ipc = props["networkProfile"]["networkInterfaceConfigurations"][0]["properties"][
        "ipConfigurations"][0]
    assert ipc["properties"]["subnet"]["id"] == west
    with pytest.raises(InvalidRequestError) as ei:
        az.launch(spec("lease-j", region="japaneast"))
    assert (ei.value.code, ei.value.scope) == ("NoSubnet", Scope.REGION)


# ------------------------------------------------------------------------------------ terminate


def test_terminate_removes_everything_of_the_lease(az: AzureProvider, fake_arm: FakeArm) -> None:
    out = az.launch(spec("lease-d", count=3, market=Market.SPOT, zone="1"))
    keep = az.launch(spec("lease-k", count=1))
    az.terminate(out)
    assert leftovers(fake_arm)["vms"] == ["lease-k-n0"]
    assert leftovers(fake_arm)["ppgs"] == []
    assert len(fake_arm.network_interfaces()) == 1 and len(fake_arm.disks()) == 1
    az.terminate(out)  # idempotent: already gone is fine
    az.terminate([])
    az.terminate(keep)
    assert leftovers(fake_arm) == NOTHING


def test_placement_group_outlives_a_partial_terminate(az: AzureProvider, fake_arm: FakeArm) -> None:
    out = az.launch(spec("lease-pp", count=2))
    az.terminate(out[:1])
    assert [p["name"] for p in fake_arm.proximity_placement_groups()] == ["broker-lease-pp"]
    az.terminate(out[1:])
    assert leftovers(fake_arm) == NOTHING


def test_terminate_errors_are_mapped(az: AzureProvider, fake_arm: FakeArm) -> None:
    out = az.launch(spec("lease-te"))
    fake_arm.inject("auth", code="AuthorizationFailed", match="DELETE")
    with pytest.raises(AuthError):
        az.terminate(out)
    assert [v["name"] for v in fake_arm.instances()] == ["lease-te-n0"]
    az.terminate(out)
    assert leftovers(fake_arm) == NOTHING


@pytest.mark.parametrize("code", ["ResourceGroupNotFound", "ParentResourceNotFound", "NotFound", "ResourceNotFound"])
@pytest.mark.parametrize("where", ["instanceView", "DELETE"])
def test_only_resource_not_found_for_that_vm_means_gone(az: AzureProvider, fake_arm: FakeArm, code: str,
                                                        where: str) -> None:
    """A teardown reads the VM (describe) and deletes it. A 404 that is not ARM's ResourceNotFound
    naming that VM — the resource group, a parent, a regional front end, the VM's NIC — says
    nothing about the VM: it is an error, the VM is not taken for gone, and the next teardown
    deletes it."""
    out = az.launch(spec("lease-404"))
    fake_arm.inject("not_found", code=code, match=where)
    with pytest.raises(ProviderError):
        az.terminate(az.describe("lease-404", "eastus"))
    assert [v["name"] for v in fake_arm.instances()] == ["lease-404-n0"], "taken for gone, never deleted"
    got = az.describe("lease-404", "eastus")
    assert [i.node_name for i in got] == ["lease-404-n0"]
    az.terminate(got)
    assert leftovers(fake_arm) == NOTHING
    # ARM's own ResourceNotFound for the VM does mean gone: nothing to describe, nothing to delete
    assert az.describe("lease-404", "eastus") == []
    az.terminate(out)


# ------------------------------------------------------------------------------------ listing


def test_list_managed_ignores_other_owners_and_untagged(make, fake_arm: FakeArm) -> None:
    mine, theirs = make(owner="broker-a"), make(owner="broker-b")
    a = mine.launch(spec("lease-1", count=2))
    mine.launch(spec("lease-2", region="westus2", it=T4))
    theirs.launch(spec("lease-3"))
    assert raw(fake_arm, "PUT", vm_path("hand-made"), plain_vm())[0] == 201
    assert raw(fake_arm, "PUT", vm_path("tagged-other"),
               plain_vm(tags={TAG_LEASE: "lease-9", TAG_OWNER: "someone"}))[0] == 201
    fake_arm.page_size = 2  # six VMs: three pages through nextLink

    listed = mine.list_managed()
    assert [(i.lease_id, i.node_name) for i in listed] == [
        ("lease-1", "lease-1-n0"), ("lease-1", "lease-1-n1"), ("lease-2", "lease-2-n0")]
    assert len([c for c in fake_arm.calls_matching("GET", "/virtualMachines")
                if "$skiptoken" in c.query]) >= 2
    assert [i.node_name for i in mine.list_managed(["eastus"])] == ["lease-1-n0", "lease-1-n1"]
    assert [i.node_name for i in mine.list_managed(["West US 2"])] == ["lease-2-n0"]
    assert mine.list_managed([]) == []
    assert [i.instance_id for i in mine.describe("lease-1", "eastus")] == [i.instance_id for i in a]
    assert mine.describe("lease-1", "westus2") == []
    assert [i.node_name for i in theirs.list_managed()] == ["lease-3-n0"]


def test_describe_reports_state_and_ip(az: AzureProvider, fake_arm: FakeArm) -> None:
    out = az.launch(spec("lease-v", count=2, market=Market.SPOT, zone="2"))
    got = az.describe("lease-v", "eastus")
    assert [(i.node_name, i.state, i.private_ip, i.market, i.zone) for i in got] == [
        (i.node_name, InstanceState.RUNNING, i.private_ip, Market.SPOT, "2") for i in out]
    assert all(i.private_ip for i in got)


def test_failed_vm_is_reported_with_the_clouds_reason(az: AzureProvider, fake_arm: FakeArm) -> None:
    fake_arm.inject("capacity")
    raw(fake_arm, "PUT", vm_path("lease-q-n0"),
        plain_vm(tags={TAG_LEASE: "lease-q", TAG_OWNER: "broker-test"}))
    wait_for(lambda: fake_arm.vm("lease-q-n0")["properties"]["provisioningState"] == "Failed")
    [inst] = az.describe("lease-q", "eastus")
    assert inst.state is InstanceState.TERMINATED and inst.stop_reason is StopReason.CAPACITY
    assert inst.stop_detail.startswith("AllocationFailed")
    [listed] = az.list_managed()
    assert listed.state is InstanceState.TERMINATED


# ------------------------------------------------------------------------------------ eviction


def test_spot_eviction_with_delete_policy_makes_the_node_vanish(az: AzureProvider,
                                                                fake_arm: FakeArm) -> None:
    out = az.launch(spec("lease-ev", count=2, market=Market.SPOT))
    fake_arm.interrupt("lease-ev-n1")
    assert [i.node_name for i in az.describe("lease-ev", "eastus")] == ["lease-ev-n0"]
    assert [i.node_name for i in az.list_managed()] == ["lease-ev-n0"]
    # the platform's own eviction path: POST simulateEviction, through the SDK
    az._client.virtual_machines.simulate_eviction(RG, "lease-ev-n0")
    assert az.describe("lease-ev", "eastus") == []
    az.terminate(out)  # the lifecycle's teardown of an evicted lease still succeeds
    assert leftovers(fake_arm) == NOTHING


def test_only_spot_vms_can_be_evicted(az: AzureProvider, fake_arm: FakeArm) -> None:
    az.launch(spec("lease-od"))
    with pytest.raises(ValueError):
        fake_arm.interrupt("lease-od-n0")
    status, body = raw(fake_arm, "POST", vm_path("lease-od-n0") + "/simulateEviction")
    assert status == 409 and body["error"]["code"] == "OperationNotAllowed"


def test_deallocated_spot_vm_is_reported_interrupted(az: AzureProvider, fake_arm: FakeArm) -> None:
    """A Spot VM with policy Deallocate (not the broker's own, e.g. adopted) stays, deallocated."""
    raw(fake_arm, "PUT", vm_path("lease-dl-n0"), plain_vm(
        tags={TAG_LEASE: "lease-dl", TAG_OWNER: "broker-test"}, priority="Spot",
        evictionPolicy="Deallocate", billingProfile={"maxPrice": -1}))
    wait_for(lambda: fake_arm.vm("lease-dl-n0")["properties"]["provisioningState"] == "Succeeded")
    fake_arm.interrupt("lease-dl-n0")
    [inst] = az.describe("lease-dl", "eastus")
    assert inst.state is InstanceState.TERMINATED
    assert inst.stop_reason is StopReason.INTERRUPTED and inst.market is Market.SPOT


# ------------------------------------------------------------------------------------ auth & logs


class StaticToken:
    """A TokenCredential handing out a fixed token (stands in for DefaultAzureCredential)."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kw: Any) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken("eyJ0ZXN0In0.token", int(time.time()) + 3600)


def test_bearer_credential_over_loopback(make, fake_arm: FakeArm) -> None:
    fake_arm.require_auth = True
    cred = StaticToken()
    az = make(credential=cred, credentials=None)
    az.launch(spec("lease-b"))
    assert cred.scopes and cred.scopes[0] == ("https://management.azure.com/.default",)
    assert all(c.authorization for c in fake_arm.calls)
    assert isinstance(az._client._config.authentication_policy, _LoopbackBearerPolicy)


def test_anonymous_sends_no_credentials(az: AzureProvider, fake_arm: FakeArm) -> None:
    assert isinstance(az._client._config.authentication_policy, _NoAuthPolicy)
    fake_arm.require_auth = True
    with pytest.raises(AuthError) as ei:
        az.list_managed()
    assert (ei.value.code, ei.value.scope) == ("AuthenticationFailed", Scope.CLOUD)
    assert not any(c.authorization for c in fake_arm.calls)


def test_production_endpoint_keeps_the_sdks_tls_bearer_policy() -> None:
    p = AzureProvider.from_config(
        {"subscription_id": SUB, "resource_group": RG, "subnet_id": SUBNET,
         "ssh_public_key": SSH_KEY}, owner="o", credential=StaticToken())
    policy = p._client._config.authentication_policy
    assert type(policy) is ARMChallengeAuthenticationPolicy
    assert p._client._config.base_url == "https://management.azure.com"
    p.close()


def test_default_credential_is_built_lazily_without_network() -> None:
    p = AzureProvider.from_config(
        {"subscription_id": SUB, "resource_group": RG, "subnet_id": SUBNET,
         "ssh_public_key": SSH_KEY}, owner="o")
    assert type(p._client._config.credential).__name__ == "DefaultAzureCredential"
    p.close()


def test_boot_script_and_credentials_never_reach_the_logs(make, fake_arm: FakeArm) -> None:
    az = make(credential=StaticToken(), credentials=None)
    fake_arm.inject("capacity", match="lease-l-n1")
    encoded = base64.b64encode(BOOT.encode()).decode()
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(CapacityError):
            az.launch(spec("lease-l", count=2))
        az.launch(spec("lease-l2"))
    assert logs and all(e.get("lease") in ("lease-l", "lease-l2") for e in logs)
    assert all(e.get("provider") == "azure" for e in logs)
    text = repr(logs)
    for secret in ("s3cr3t-b00t-t0ken", encoded, "eyJ0ZXN0In0"):
        assert secret not in text


# ------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("drop,key", [("subscription_id", "providers.azure.subscription_id"),
                                      ("resource_group", "providers.azure.resource_group"),
                                      ("subnet_id", "providers.azure.subnet_id"),
                                      ("ssh_public_key", "providers.azure.ssh_public_key")])
def test_missing_required_keys(fake_arm: FakeArm, drop: str, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        AzureProvider.from_config(settings(fake_arm, **{drop: None}), owner="o")


@pytest.mark.parametrize("over,key", [
    ({"subscription_id": "my-sub"}, "subscription_id"),
    ({"subnet_id": "subnet-123"}, "subnet_id"),
    ({"subnet_id": {"eastus": "/bad"}}, "subnet_id.eastus"),
    ({"image": {"publisher": "canonical"}}, "image"),
    ({"image": "ubuntu"}, "image"),
    ({"admin_username": "root"}, "admin_username"),
    ({"credentials": "password"}, "credentials"),
    ({"os_disk_gb": 10}, "os_disk_gb"),
    ({"timeout_s": "soon"}, "timeout_s"),
    ({"regions": "eastus"}, "regions"),
    ({"base_url": "http://10.1.2.3:8080"}, "base_url"),
])
def test_invalid_values_name_the_key(fake_arm: FakeArm, over: dict, key: str) -> None:
    with pytest.raises(ValueError, match=r"providers\.azure\." + key.replace(".", r"\.")):
        AzureProvider.from_config(settings(fake_arm, **over), owner="o")


@pytest.mark.parametrize("url", ["https://management.azure.com", "https://arm.example.org",
                                 None])
def test_anonymous_refused_off_loopback(fake_arm: FakeArm, url: str | None) -> None:
    s = settings(fake_arm, base_url=url)
    if url is None:
        s.pop("base_url", None)
    with pytest.raises(ValueError, match="anonymous"):
        AzureProvider.from_config(s, owner="o")


def test_image_forms(make, fake_arm: FakeArm) -> None:
    gallery = (f"/subscriptions/{SUB}/resourceGroups/img/providers/Microsoft.Compute/galleries/g/"
               "images/gpu/versions/1.2.3")
    for image, expect in [
        ("canonical:ubuntu-24_04-lts:server:latest",
         {"publisher": "canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"}),
        ({"publisher": "p", "offer": "o", "sku": "s"},
         {"publisher": "p", "offer": "o", "sku": "s", "version": "latest"}),
        (gallery, {"id": gallery}),
    ]:
        fake_arm.reset()
        make(image=image).launch(spec("lease-img"))
        assert vm_body(fake_arm, "lease-img-n0")["properties"]["storageProfile"][
            "imageReference"] == expect


def test_registry_builds_the_provider(fake_arm: FakeArm) -> None:
    p = registry.build("azure", settings(fake_arm), owner="o")
    assert isinstance(p, AzureProvider) and p.name == "azure"
    assert registry.build_enabled({"azure": settings(fake_arm, enabled=False)}, owner="o") == {}
    p.close()


# ------------------------------------------------------------------------------------ the fake


def test_fake_validates_like_arm(fake_arm: FakeArm) -> None:
    def err(status_body: tuple[int, Any]) -> tuple[int, str]:
        status, body = status_body
        return status, body["error"]["code"]

    good = plain_vm()
    assert err(raw(fake_arm, "PUT", vm_path("v"), {"properties": good["properties"]})) == (
        400, "LocationRequired")
    assert err(raw(fake_arm, "PUT", vm_path("v"),
                   plain_vm(hardwareProfile=None))) == (400, "InvalidParameter")
    assert err(raw(fake_arm, "PUT", vm_path("v"), plain_vm(priority="Spot"))) == (
        400, "InvalidParameter")
    assert err(raw(fake_arm, "PUT", vm_path("v"), plain_vm(evictionPolicy="Delete"))) == (
        400, "InvalidParameter")
    assert err(raw(fake_arm, "PUT", vm_path("v"), plain_vm(
        hardwareProfile={"vmSize": "Standard_Nope"}))) == (400, "InvalidParameter")
    assert err(raw(fake_arm, "PUT", vm_path("v"), plain_vm(userData="not base64!"))) == (
        400, "InvalidParameter")
    net = dict(good["properties"]["networkProfile"])
    net.pop("networkApiVersion")
    assert err(raw(fake_arm, "PUT", vm_path("v"), plain_vm(networkProfile=net))) == (
        400, "InvalidParameter")
    assert err(raw(fake_arm, "PUT", vm_path("v"), plain_vm(tags={"a/b": "x"}))) == (
        400, "InvalidTagNameCharacters")
    assert err(raw(fake_arm, "PUT", vm_path("v"), {**plain_vm("westus"), "zones": ["1"]})) == (
        400, "InvalidParameter")  # westus has no availability zones
    assert err(raw(fake_arm, "GET", vm_path("v"), api=None)) == (400, "MissingApiVersionParameter")
    assert err(raw(fake_arm, "GET", vm_path("v"))) == (404, "ResourceNotFound")
    assert fake_arm.instances() == []
    # a create answers 201 with an Azure-AsyncOperation the client polls; userData stays private
    status, body = raw(fake_arm, "PUT", vm_path("v"), plain_vm(userData="aGk="))
    assert status == 201 and body["properties"]["provisioningState"] == "Creating"
    assert "userData" not in body["properties"]
    assert raw(fake_arm, "DELETE", vm_path("never-was"))[0] == 204


def test_fake_serves_another_process(tmp_path) -> None:
    """``python -m broker_sandbox.azure`` serves the same fake to a separate process."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "broker_sandbox.azure"], cwd=root,
                            stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        s = {"subscription_id": SUB, "resource_group": RG, "base_url": url,
             "credentials": "anonymous", "subnet_id": SUBNET, "ssh_public_key": SSH_KEY,
             "poll_interval_s": 0, "retries": 0}
        p = AzureProvider.from_config(s, owner="o")
        [inst] = p.launch(spec("lease-proc", market=Market.SPOT))
        assert [i.node_name for i in p.list_managed()] == [inst.node_name]
        p.terminate([inst])
        assert p.list_managed() == []
        p.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_gateways_html_page_is_a_transient_error_naming_the_status(az: AzureProvider, fake_arm: FakeArm) -> None:
    """A gateway's 502 HTML page instead of ARM's JSON: a retryable error of one sentence naming
    Azure and the status, not the page itself."""
    fake_arm.inject("html", times=-1, match="GET")
    with pytest.raises(TransientError) as e:
        az.list_managed()
    err = e.value
    assert err.retryable and err.provider == "azure" and err.code == "HTTP502"
    assert "HTTP 502" in str(err) and "<" not in str(err) and len(str(err)) < 300
