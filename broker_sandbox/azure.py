"""A fake Azure Resource Manager endpoint for Microsoft.Compute, on loopback HTTP.

It speaks the real ARM paths and JSON, so ``azure-mgmt-compute``'s ``ComputeManagementClient``
talks to it unchanged (``base_url="http://127.0.0.1:PORT"``):

* ``virtualMachines``: ``PUT`` answers ``201`` (``200`` on update) with an ``Azure-AsyncOperation``
  header; the operation reads ``InProgress`` for ``lro_polls`` polls, then ``Succeeded`` or
  ``Failed`` with ``{"error": {"code", "message"}}`` (``AllocationFailed`` & co. end like this, and,
  like the real cloud, leave the VM behind in provisioning state ``Failed``). ``GET`` (``$expand=
  instanceView|userData``), list with ``nextLink`` paging, ``DELETE`` (``202`` with
  ``Azure-AsyncOperation`` and ``Location``; ``204`` when absent), ``instanceView``,
  ``POST simulateEviction``.
* ``proximityPlacementGroups`` and ``capacityReservationGroups``: ``PUT``/``GET``/``DELETE``/list.
* ``Microsoft.Network/networkInterfaces/{name}``: ``GET`` of the NICs that VM-level
  ``networkInterfaceConfigurations`` create (removed with the VM when ``deleteOption`` is Delete).
* ``/subscriptions/S/providers/Microsoft.Compute/locations/L/operations/ID``: operation status.

Bodies are validated like the real API: ``api-version`` is required, ``location`` too
(``LocationRequired``), ``hardwareProfile.vmSize`` must be a known size (``InvalidParameter``) sold
in the location (``SkuNotAvailable``), eviction policy and billing profile only on Spot, and (stricter
than Azure, which would silently default to Deallocate) a Spot VM must say its eviction policy.

Faults: :meth:`FakeArm.inject` (``capacity``, ``quota``, ``throttle``, ``5xx``, ``slow``, ``auth``),
:meth:`FakeArm.fail_rate`; evictions: :meth:`FakeArm.interrupt`. Every request is in
:attr:`FakeArm.calls`.

Run it alone (for a ``broker serve`` subprocess): ``python -m broker_sandbox.azure [--port N]``
prints its URL and serves until interrupted. Binds 127.0.0.1 only.
"""
from __future__ import annotations

import base64
import binascii
import csv
import datetime as dt
import json
import random
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import parse_qs, urlsplit

import providers

from broker_sandbox.loopback import LoopbackServer
from broker_sandbox.azure_market import MARKET_ROUTES, ArmMarketMixin

_DATA = Path(providers.__file__).resolve().parent / "data"

BUILTIN_SIZES = (
    "Standard_ND96isr_H100_v5", "Standard_ND96amsr_A100_v4", "Standard_ND96asr_v4",
    "Standard_NC24ads_A100_v4", "Standard_NC48ads_A100_v4", "Standard_NC96ads_A100_v4",
    "Standard_NC4as_T4_v3", "Standard_NC64as_T4_v3", "Standard_NV36ads_A10_v5",
    "Standard_NV72ads_A10_v5",
)
BUILTIN_REGIONS = (
    "eastus", "eastus2", "westus", "westus2", "westus3", "centralus", "southcentralus",
    "northcentralus", "westcentralus", "canadacentral", "brazilsouth", "northeurope", "westeurope",
    "uksouth", "francecentral", "germanywestcentral", "swedencentral", "switzerlandnorth",
    "norwayeast", "polandcentral", "italynorth", "japaneast", "japanwest", "koreacentral",
    "southeastasia", "eastasia", "australiaeast", "centralindia", "southindia", "uaenorth",
    "southafricanorth", "qatarcentral",
)
FAULT_KINDS = ("capacity", "quota", "throttle", "5xx", "slow", "auth", "not_found", "html", "garbage",
               "truncated", "shape")
# A 2xx whose body is no ARM answer: "garbage" is not JSON and "shape" is JSON of another shape
# (nothing is done), "truncated" is the real answer cut short (the request took effect).
GARBAGE = b"\x00\x01<<not an answer>> \xff\xfe garbage"
WRONG_SHAPE = b'[{"value": 7, "nextLink": {"not": "a link"}, "tags": ["x"], "location": 5}]'
# "html": what a gateway in front of ARM answers instead of its JSON (a 502 page).
HTML_PAGE = (b"<!DOCTYPE html>\r\n<html><head><title>502 - Web server received an invalid response while acting "
             b"as a gateway or proxy server.</title></head><body><h2>502 - Web server received an invalid "
             b"response while acting as a gateway or proxy server.</h2></body></html>\r\n")
_CREATE_ONLY = ("capacity", "quota")  # faults that only a VM create can meet
_CAPACITY_LRO = ("AllocationFailed", "OverconstrainedAllocationRequest", "ZonalAllocationFailed")
_API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}(-preview)?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_BAD_TAG_CHARS = set("<>%&\\?/")
_SUB = r"^/subscriptions/(?P<sub>[^/]+)"
_RG = _SUB + r"/resourceGroups/(?P<rg>[^/]+)"
_CMP = _RG + r"/providers/Microsoft\.Compute"
_ROUTES = [
    ("vms", re.compile(_CMP + r"/virtualMachines/?$", re.I)),
    ("vm", re.compile(_CMP + r"/virtualMachines/(?P<name>[^/]+)$", re.I)),
    ("vm_view", re.compile(_CMP + r"/virtualMachines/(?P<name>[^/]+)/instanceView$", re.I)),
    ("vm_evict", re.compile(_CMP + r"/virtualMachines/(?P<name>[^/]+)/simulateEviction$", re.I)),
    ("ppgs", re.compile(_CMP + r"/proximityPlacementGroups/?$", re.I)),
    ("ppg", re.compile(_CMP + r"/proximityPlacementGroups/(?P<name>[^/]+)$", re.I)),
    ("crg", re.compile(_CMP + r"/capacityReservationGroups/(?P<name>[^/]+)$", re.I)),
    ("nic", re.compile(_RG + r"/providers/Microsoft\.Network/networkInterfaces/(?P<name>[^/]+)$", re.I)),
    ("op", re.compile(_SUB + r"/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)"
                      r"/operations/(?P<op>[^/]+)$", re.I)),
    *MARKET_ROUTES,
]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _norm_location(loc: str) -> str:
    return loc.replace(" ", "").lower()


def _load_sizes() -> tuple[str, ...]:
    path = _DATA / "instances.csv"
    try:
        with path.open(newline="") as f:
            sizes = tuple(r["instance_type"] for r in csv.DictReader(f)
                          if r.get("provider") == "azure" and r.get("instance_type"))
    except (OSError, KeyError):
        sizes = ()
    return tuple(dict.fromkeys(sizes + BUILTIN_SIZES))


_NO_ZONES = ("westus", "northcentralus", "westcentralus")


def _load_regions() -> dict[str, frozenset[str]]:
    """Location → its availability zones (the catalog's regions.csv first, then a built-in list)."""
    out = {r: frozenset() if r in _NO_ZONES else frozenset("123") for r in BUILTIN_REGIONS}
    path = _DATA / "regions.csv"
    try:
        with path.open(newline="") as f:
            for r in csv.DictReader(f):
                if r.get("provider") == "azure" and r.get("region"):
                    out[_norm_location(r["region"])] = frozenset((r.get("zones") or "").split())
    except (OSError, KeyError):
        pass
    return out


class ArmError(Exception):
    """An ARM error answer: ``status`` with ``{"error": {"code", "message", "target"}}``."""

    def __init__(self, status: int, code: str, message: str, target: str = "",
                 headers: dict[str, str] | None = None, page: bytes | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.target = status, code, message, target
        self.headers = headers or {}
        self.page = page  # an HTML page answered instead of ARM's JSON error

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.target:
            err["target"] = self.target
        return {"error": err}


@dataclass
class Call:
    """One request the fake answered."""

    method: str
    path: str
    query: dict[str, str]
    status: int = 0
    body: Any = None  # parsed JSON request body (None when empty)
    authorization: bool = False  # an Authorization header was sent
    fault: str = ""  # the injected fault it met, if any

    @property
    def api_version(self) -> str:
        return self.query.get("api-version", "")


@dataclass
class _Fault:
    kind: str
    times: int  # -1 = every time
    match: str
    code: str = ""


@dataclass
class _Op:
    """An async operation: InProgress for ``polls_left`` polls (or until ``deadline``), then done."""

    id: str
    location: str
    sub: str
    start: str
    polls_left: int
    deadline: float
    error: tuple[str, str] | None = None  # (code, message) when it is to fail
    on_done: Any = None  # callable run once when the operation completes
    status: str = "InProgress"
    end: str = ""


@dataclass
class _Vm:
    sub: str
    rg: str
    name: str
    location: str
    body: dict[str, Any]  # the stored ARM resource (with userData)
    vm_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: str = field(default_factory=_now)
    provisioning: str = "Creating"
    power: str = "starting"
    failure: tuple[str, str] | None = None
    nics: list[str] = field(default_factory=list)  # NIC resource ids
    disk: str = ""

    @property
    def id(self) -> str:
        return (f"/subscriptions/{self.sub}/resourceGroups/{self.rg}/providers/Microsoft.Compute"
                f"/virtualMachines/{self.name}")

    @property
    def props(self) -> dict[str, Any]:
        return self.body.setdefault("properties", {})

    @property
    def spot(self) -> bool:
        return self.props.get("priority") in ("Spot", "Low")


class FakeArm(ArmMarketMixin, LoopbackServer):
    """The fake ARM server. ``start()`` / ``stop()``, ``.url``; also a context manager.

    Tunables (plain attributes, safe to change between calls): ``lro_polls`` (InProgress answers
    before an operation finishes), ``settle_s`` (an operation nobody polls finishes after this long),
    ``page_size`` (VMs per list page), ``retry_after`` (seconds in a throttle's ``Retry-After``),
    ``slow_s`` (how long a ``slow`` fault sleeps), ``require_auth`` (refuse requests without a
    bearer token, like ARM's ``AuthenticationFailed``), ``resource_groups`` (None = any exists).
    """

    thread_name = "fake-arm"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, sizes: Iterable[str] | None = None,
                 regions: Iterable[str] | None = None) -> None:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("the fake ARM binds loopback only")
        self._host, self._port = host, port
        self.sizes = {s.lower(): s for s in (sizes or _load_sizes())}
        self.regions: dict[str, frozenset[str]] = (
            {_norm_location(r): frozenset("123") for r in regions} if regions else _load_regions())
        self.lro_polls = 1
        self.settle_s = 0.25
        self.page_size = 50
        self.retry_after = 1
        self.slow_s = 5.0
        self.require_auth = False
        self.resource_groups: set[str] | None = None
        self.calls: list[Call] = []
        self._lock = threading.RLock()
        self._reset_state()

    # ----------------------------------------------------------------------------- lifecycle
    def _reset_state(self) -> None:
        self._vms: dict[tuple[str, str, str], _Vm] = {}
        self._ppgs: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._crgs: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._nics: dict[str, dict[str, Any]] = {}  # lower(id) -> resource
        self._disks: set[str] = set()
        self._ops: dict[str, _Op] = {}
        self._open: dict[str, _Op] = {}  # the operations still in progress: each request settles these
        self._faults: list[_Fault] = []
        self._unavailable: set[tuple[str, str]] = set()
        self._rate = 0.0
        self._rate_kinds: tuple[str, ...] = ()
        self._rng = random.Random(0)
        self._ip = 4
        self._generation = getattr(self, "_generation", 0) + 1
        self._reset_market()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"fake": self})

    def reset(self) -> None:
        """Forget every resource, fault and call; tunables back to their defaults."""
        with self._lock:
            self._reset_state()
            self.calls.clear()
            self.lro_polls, self.settle_s, self.page_size = 1, 0.25, 50
            self.retry_after, self.slow_s, self.require_auth = 1, 5.0, False
            self.resource_groups = None

    # ----------------------------------------------------------------------------- faults
    def inject(self, kind: str, times: int = 1, match: str = "", *, code: str = "") -> None:
        """Make the next ``times`` requests (``-1``: all) whose ``"METHOD /path"`` contains
        ``match`` meet a fault. ``capacity`` and ``quota`` only meet VM creations.

        * ``capacity``: the create's operation ends ``Failed`` with ``AllocationFailed``
          (``ZonalAllocationFailed`` for a zonal VM), or ``code`` (``OverconstrainedAllocationRequest``);
          ``code="SkuNotAvailable"`` answers ``409`` at once, like the real API.
        * ``quota``: ``409 OperationNotAllowed`` with the real quota message (or ``code``).
        * ``throttle``: ``429 TooManyRequests`` with ``Retry-After: retry_after``.
        * ``5xx``: ``500 InternalServerError`` (``code="ServiceUnavailable"`` gives 503).
        * ``slow``: sleeps ``slow_s`` before answering normally (the work is still done).
        * ``auth``: ``401 InvalidAuthenticationToken`` (``code="AuthorizationFailed"`` gives 403).
        * ``html``: a gateway's 502 HTML page; ``garbage`` / ``shape``: a 200 whose body is not
          JSON / JSON of another shape (nothing done); ``truncated``: the real answer, its body cut
          short (the request took effect).
        * ``not_found``: a ``404`` that is not "this resource does not exist": ARM's
          ``ResourceGroupNotFound`` (the default), ``ParentResourceNotFound``, the generic
          ``NotFound`` of a regional front end, or ``code="ResourceNotFound"`` naming ANOTHER
          resource (the VM's network interface), each with the real message.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
        with self._lock:
            self._faults.append(_Fault(kind, times, match, code))

    def fail_rate(self, p: float, kinds: Iterable[str] = ("5xx",), seed: int = 0) -> None:
        """Each request meets one of ``kinds`` (chosen at random) with probability ``p``."""
        kinds = tuple(kinds)
        for k in kinds:
            if k not in FAULT_KINDS:
                raise ValueError(f"unknown fault {k!r}")
        with self._lock:
            self._rate, self._rate_kinds, self._rng = p, kinds, random.Random(seed)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._rate = 0.0

    def set_unavailable(self, region: str, size: str) -> None:
        """``size`` is not sold in ``region`` (creates answer ``409 SkuNotAvailable``)."""
        with self._lock:
            self._unavailable.add((_norm_location(region), size.lower()))

    def _take_fault(self, method: str, path: str, vm_create: bool) -> _Fault | None:
        where = f"{method} {path}"
        with self._lock:
            for f in self._faults:
                if f.match in where and (vm_create or f.kind not in _CREATE_ONLY):
                    if f.times > 0:
                        f.times -= 1
                        if f.times == 0:
                            self._faults.remove(f)
                    return f
            if self._rate > 0 and self._rng.random() < self._rate:
                kinds = [k for k in self._rate_kinds if vm_create or k not in _CREATE_ONLY]
                if kinds:
                    return _Fault(self._rng.choice(kinds), 1, "")
        return None

    # ----------------------------------------------------------------------------- cloud events
    def interrupt(self, vm_name: str, resource_group: str | None = None) -> None:
        """Evict a Spot VM like the platform does: with eviction policy Delete it (and its NIC and
        disk with deleteOption Delete) is gone; with Deallocate it is deallocated."""
        with self._lock:
            vm = self._find(vm_name, resource_group)
            if vm is None:
                raise KeyError(f"no VM named {vm_name!r}")
            if not vm.spot:
                raise ValueError(f"{vm_name} is not a Spot VM")
            self._evict(vm)

    def _evict(self, vm: _Vm) -> None:
        if vm.props.get("evictionPolicy") == "Delete":
            self._remove_vm(vm)
        else:
            vm.power = "deallocated"

    def _find(self, name: str, rg: str | None) -> _Vm | None:
        for (_, vrg, vname), vm in self._vms.items():
            if vname == name.lower() and (rg is None or vrg == rg.lower()):
                return vm
        return None

    # ----------------------------------------------------------------------------- inspection
    def instances(self) -> list[dict[str, Any]]:
        """Every VM as the stored ARM resource (with ``userData``, ``provisioningState``)."""
        with self._lock:
            self._settle()
            return [self._vm_json(vm, expand={"userData"}) for vm in self._vms.values()]

    def vm(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            self._settle()
            vm = self._find(name, None)
            return None if vm is None else self._vm_json(vm, expand={"userData", "instanceView"})

    def proximity_placement_groups(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._ppg_json(k, p) for k, p in self._ppgs.items()]

    def network_interfaces(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(n) for n in self._nics.values()]

    def disks(self) -> list[str]:
        with self._lock:
            return sorted(self._disks)

    def add_capacity_reservation_group(self, subscription: str, resource_group: str, name: str,
                                       location: str, zones: Iterable[str] = ()) -> str:
        """Create a capacity reservation group; returns its ARM id."""
        with self._lock:
            key = (subscription.lower(), resource_group.lower(), name.lower())
            rid = (f"/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/"
                   f"Microsoft.Compute/capacityReservationGroups/{name}")
            self._crgs[key] = {"id": rid, "name": name, "location": _norm_location(location),
                               "type": "Microsoft.Compute/capacityReservationGroups",
                               "zones": list(zones), "properties": {}}
            return rid

    def calls_matching(self, method: str | None = None, contains: str = "") -> list[Call]:
        with self._lock:
            return [c for c in self.calls
                    if (method is None or c.method == method) and contains.lower() in c.path.lower()]

    # ----------------------------------------------------------------------------- operations
    def _new_op(self, sub: str, location: str, *, error: tuple[str, str] | None = None,
                on_done: Any = None) -> _Op:
        op = _Op(str(uuid.uuid4()), location, sub, _now(), self.lro_polls,
                 time.monotonic() + self.settle_s, error, on_done)
        self._ops[op.id] = self._open[op.id] = op
        if op.polls_left <= 0:
            self._finish(op)
        return op

    def _finish(self, op: _Op) -> None:
        if op.status != "InProgress":
            return
        op.status = "Failed" if op.error else "Succeeded"
        op.end = _now()
        if op.on_done is not None:
            op.on_done(op)

    def _settle(self) -> None:
        now = time.monotonic()
        for key, op in list(self._open.items()):
            if op.status == "InProgress" and now >= op.deadline:
                self._finish(op)
            if op.status != "InProgress":
                del self._open[key]

    def _op_url(self, op: _Op, api_version: str, monitor: bool = False) -> str:
        q = f"?monitor=true&api-version={api_version}" if monitor else f"?api-version={api_version}"
        return (f"{self.url}/subscriptions/{op.sub}/providers/Microsoft.Compute/locations/"
                f"{op.location}/operations/{op.id}{q}")

    def _op_json(self, op: _Op) -> dict[str, Any]:
        out: dict[str, Any] = {"name": op.id, "startTime": op.start, "status": op.status}
        if op.end:
            out["endTime"] = op.end
        if op.status == "Failed" and op.error:
            out["error"] = {"code": op.error[0], "message": op.error[1]}
        return out

    # ----------------------------------------------------------------------------- VMs
    def _vm_json(self, vm: _Vm, expand: set[str] = frozenset()) -> dict[str, Any]:
        body = json.loads(json.dumps(vm.body))
        props = body.setdefault("properties", {})
        if "userData" not in expand:
            props.pop("userData", None)
        (props.get("osProfile") or {}).pop("adminPassword", None)
        (props.get("osProfile") or {}).pop("customData", None)
        props["vmId"] = vm.vm_id
        props["timeCreated"] = vm.created
        props["provisioningState"] = vm.provisioning
        if "instanceView" in expand:
            props["instanceView"] = self._view_json(vm)
        body.update(id=vm.id, name=vm.name, type="Microsoft.Compute/virtualMachines",
                    location=vm.location)
        return body

    def _view_json(self, vm: _Vm) -> dict[str, Any]:
        if vm.provisioning == "Failed" and vm.failure:
            code, message = vm.failure
            prov = {"code": f"ProvisioningState/failed/{code}", "level": "Error",
                    "displayStatus": "Provisioning failed", "message": message, "time": _now()}
        else:
            prov = {"code": f"ProvisioningState/{vm.provisioning.lower()}", "level": "Info",
                    "displayStatus": f"Provisioning {vm.provisioning.lower()}", "time": _now()}
        statuses = [prov]
        if vm.provisioning != "Failed":
            statuses.append({"code": f"PowerState/{vm.power}", "level": "Info",
                             "displayStatus": f"VM {vm.power}"})
        return {"computerName": (vm.props.get("osProfile") or {}).get("computerName", vm.name),
                "osName": "ubuntu", "statuses": statuses}

    def _remove_vm(self, vm: _Vm) -> None:
        self._vms.pop((vm.sub.lower(), vm.rg.lower(), vm.name.lower()), None)
        for cfg_nic in vm.nics:
            self._nics.pop(cfg_nic.lower(), None)
        os_disk = (vm.props.get("storageProfile") or {}).get("osDisk") or {}
        if os_disk.get("deleteOption", "Detach") == "Delete":
            self._disks.discard(vm.disk)

    def _validate_vm(self, sub: str, rg: str, name: str, body: Any, api_version: str,
                     existing: _Vm | None) -> tuple[str, dict[str, Any]]:
        if not isinstance(body, dict):
            raise ArmError(400, "InvalidRequestContent", "The request content was invalid and "
                           "could not be deserialized.")
        if not _NAME.match(name):
            raise ArmError(400, "InvalidParameter", f"The resource name '{name}' is invalid.",
                           "vmName")
        location = body.get("location")
        if not location:
            raise ArmError(400, "LocationRequired",
                           "The location property is required for this definition.")
        location = _norm_location(location)
        if location not in self.regions:
            raise ArmError(400, "LocationNotAvailableForResourceType",
                           f"The provided location '{location}' is not available for resource type "
                           "'Microsoft.Compute/virtualMachines'.")
        tags = body.get("tags") or {}
        if len(tags) > 50:
            raise ArmError(400, "InvalidTemplate", "A resource can have at most 50 tags.")
        for k, v in tags.items():
            if not k or set(k) & _BAD_TAG_CHARS or len(k) > 512 or len(str(v)) > 256:
                raise ArmError(400, "InvalidTagNameCharacters",
                               f"The tag names '{k}' have reserved characters '<,>,%,&,\\,?,/' "
                               "or control characters.")
        props = body.get("properties")
        if not isinstance(props, dict):
            raise ArmError(400, "InvalidParameter", "Required parameter 'properties' is missing "
                           "(null).", "properties")
        size = (props.get("hardwareProfile") or {}).get("vmSize")
        if not size:
            raise ArmError(400, "InvalidParameter", "Required parameter 'hardwareProfile' is "
                           "missing (null).", "hardwareProfile")
        if size.lower() not in self.sizes:
            raise ArmError(400, "InvalidParameter",
                           f"The value {size} provided for the VM size is not valid. The valid "
                           f"sizes in the current region are: {', '.join(sorted(self.sizes.values()))}.",
                           "vmSize")
        if (location, size.lower()) in self._unavailable:
            raise ArmError(409, "SkuNotAvailable",
                           f"The requested VM size for resource 'Following SKUs have failed for "
                           f"Capacity Restrictions: {size}' is currently not available in location "
                           f"'{location}'. Please try another size or deploy to a different location "
                           "or different zone.")
        zones = body.get("zones")
        if zones is not None and (not isinstance(zones, list) or len(zones) != 1
                                  or zones[0] not in self.regions[location]):
            raise ArmError(400, "InvalidParameter", f"The zones '{zones}' are not available in "
                           f"location '{location}' (zones there: "
                           f"{', '.join(sorted(self.regions[location])) or 'none'}).", "zones")
        priority = props.get("priority", "Regular")
        if priority not in ("Regular", "Low", "Spot"):
            raise ArmError(400, "InvalidParameter", f"The value '{priority}' of parameter "
                           "'priority' is not allowed.", "priority")
        eviction = props.get("evictionPolicy")
        if priority == "Regular":
            if eviction is not None:
                raise ArmError(400, "InvalidParameter", "Eviction policy can be set only on Azure "
                               "Spot Virtual Machines.", "evictionPolicy")
            if props.get("billingProfile") is not None:
                raise ArmError(400, "InvalidParameter", "Billing profile can be set only on Azure "
                               "Spot Virtual Machines.", "billingProfile")
        else:
            if eviction not in ("Delete", "Deallocate"):
                raise ArmError(400, "InvalidParameter", "An eviction policy (Deallocate or Delete) "
                               "is required for Azure Spot Virtual Machines.", "evictionPolicy")
            price = (props.get("billingProfile") or {}).get("maxPrice", -1)
            if not isinstance(price, (int, float)) or (price != -1 and price <= 0):
                raise ArmError(400, "InvalidParameter", f"The maxPrice '{price}' is not valid: use "
                               "-1 or a price greater than 0.", "billingProfile.maxPrice")
        user_data = props.get("userData")
        if user_data is not None:
            if api_version < "2021-03-01":
                raise ArmError(400, "InvalidParameter", "userData requires api-version 2021-03-01 "
                               "or later.", "userData")
            try:
                base64.b64decode(user_data, validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise ArmError(400, "InvalidParameter", "The value of parameter userData is "
                               "invalid: it must be base64 encoded.", "userData") from None
            if len(user_data) > 64 * 1024:
                raise ArmError(400, "InvalidParameter", "userData is larger than 64 KB.", "userData")
        crg = ((props.get("capacityReservation") or {}).get("capacityReservationGroup") or {}).get("id")
        if crg is not None and self._lookup_id(self._crgs, crg, "capacityReservationGroups") is None:
            raise ArmError(400, "InvalidParameter", f"Capacity reservation group '{crg}' was not "
                           "found.", "capacityReservationGroup")
        ppg_id = (props.get("proximityPlacementGroup") or {}).get("id")
        if ppg_id is not None:
            ppg = self._lookup_id(self._ppgs, ppg_id, "proximityPlacementGroups")
            if ppg is None:
                raise ArmError(400, "InvalidParameter", f"Proximity placement group '{ppg_id}' "
                               "was not found.", "proximityPlacementGroup")
            if ppg["location"] != location:
                raise ArmError(400, "InvalidParameter", "The proximity placement group must be in "
                               "the same location as the virtual machine.", "proximityPlacementGroup")
        if existing is None:
            storage = props.get("storageProfile") or {}
            if not storage.get("imageReference"):
                raise ArmError(400, "InvalidParameter", "Required parameter 'imageReference' is "
                               "missing (null).", "imageReference")
            os_profile = props.get("osProfile") or {}
            if not os_profile.get("adminUsername"):
                raise ArmError(400, "InvalidParameter", "Required parameter "
                               "'osProfile.adminUsername' is missing (null).", "adminUsername")
            linux = os_profile.get("linuxConfiguration") or {}
            keys = ((linux.get("ssh") or {}).get("publicKeys") or [])
            if linux.get("disablePasswordAuthentication") and not keys \
                    and not os_profile.get("adminPassword"):
                raise ArmError(400, "InvalidParameter", "Authentication using either SSH or by "
                               "user name and password must be enabled in Linux profile.",
                               "linuxConfiguration")
            net = props.get("networkProfile") or {}
            cfgs = net.get("networkInterfaceConfigurations") or []
            if not cfgs and not net.get("networkInterfaces"):
                raise ArmError(400, "InvalidParameter", "Required parameter 'networkProfile' is "
                               "missing (null).", "networkProfile")
            if cfgs and not net.get("networkApiVersion"):
                raise ArmError(400, "InvalidParameter", "networkApiVersion must be specified when "
                               "networkInterfaceConfigurations are used.", "networkApiVersion")
            for cfg in cfgs:
                ipcs = (cfg.get("properties") or {}).get("ipConfigurations") or []
                if not cfg.get("name") or not ipcs:
                    raise ArmError(400, "InvalidParameter", "A network interface configuration "
                                   "needs a name and at least one IP configuration.",
                                   "networkInterfaceConfigurations")
                for ipc in ipcs:
                    subnet = ((ipc.get("properties") or {}).get("subnet") or {}).get("id", "")
                    if "/providers/Microsoft.Network/virtualNetworks/" not in subnet \
                            or "/subnets/" not in subnet:
                        raise ArmError(400, "InvalidParameter", f"Subnet id '{subnet}' is not a "
                                       "valid subnet reference.", "subnet")
        else:
            old = existing.props
            if existing.location != location:
                raise ArmError(409, "PropertyChangeNotAllowed", "Changing property 'location' is "
                               "not allowed.", "location")
            if old.get("priority", "Regular") != priority:
                raise ArmError(409, "PropertyChangeNotAllowed", "Changing property 'priority' is "
                               "not allowed.", "priority")
        return location, props

    def _put_vm(self, sub: str, rg: str, name: str, body: Any, api_version: str,
                fault: _Fault | None) -> tuple[int, dict[str, Any], dict[str, str]]:
        key = (sub.lower(), rg.lower(), name.lower())
        existing = self._vms.get(key)
        if existing is not None and existing.provisioning == "Deleting":
            raise ArmError(409, "Conflict", f"The virtual machine '{name}' is being deleted: "
                           "the operation is not allowed.")
        location, props = self._validate_vm(sub, rg, name, body, api_version, existing)
        error: tuple[str, str] | None = None
        if fault is not None and fault.kind == "quota":
            size = props["hardwareProfile"]["vmSize"]
            family = re.sub(r"[^a-z0-9]", "", size.lower().replace("standard_", "standard"))
            raise ArmError(409, fault.code or "OperationNotAllowed",
                           f"Operation could not be completed as it results in exceeding approved "
                           f"{family}Family Cores quota. Additional details - Deployment Model: "
                           f"Resource Manager, Location: {location}, Current Limit: 0, Current "
                           "Usage: 0, Additional Required: 96, (Minimum) New Limit Required: 96.")
        if fault is not None and fault.kind == "capacity":
            code = fault.code or ("ZonalAllocationFailed" if body.get("zones") else "AllocationFailed")
            if code not in _CAPACITY_LRO:
                raise ArmError(409, code, f"The requested VM size {props['hardwareProfile']['vmSize']}"
                               f" is currently not available in location '{location}'.")
            error = (code, "Allocation failed. We do not have sufficient capacity for the requested "
                     "VM size in this region. Read more about improving likelihood of allocation "
                     "success at http://aka.ms/allocation-guidance")
        stored = json.loads(json.dumps(body))
        stored["location"] = location
        if existing is None:
            vm = _Vm(sub, rg, name, location, stored)
            self._vms[key] = vm
            self._attach_resources(vm)
            status = 201
        else:
            vm = existing
            stored_props = stored["properties"]
            stored_props["networkProfile"] = vm.props.get("networkProfile")
            stored_props["storageProfile"] = vm.props.get("storageProfile")
            vm.body = stored
            status = 200
        vm.provisioning, vm.failure = ("Creating" if existing is None else "Updating"), None
        vm.power = "starting" if existing is None else vm.power

        def done(op: _Op, vm: _Vm = vm) -> None:
            if self._vms.get(key) is not vm:
                return
            if op.error:
                vm.provisioning, vm.failure, vm.power = "Failed", op.error, "stopped"
            else:
                vm.provisioning, vm.power = "Succeeded", "running"

        op = self._new_op(sub, location, error=error, on_done=done)
        headers = {"Azure-AsyncOperation": self._op_url(op, api_version)}
        return status, self._vm_json(vm), headers

    def _attach_resources(self, vm: _Vm) -> None:
        net = vm.props.setdefault("networkProfile", {})
        refs = []
        for i, cfg in enumerate(net.get("networkInterfaceConfigurations") or []):
            cprops = cfg.get("properties") or {}
            nic_name = f"{vm.name}-{cfg['name']}"
            nic_id = (f"/subscriptions/{vm.sub}/resourceGroups/{vm.rg}/providers/Microsoft.Network"
                      f"/networkInterfaces/{nic_name}")
            ipcs = []
            for ipc in cprops.get("ipConfigurations") or []:
                self._ip += 1
                ip = f"10.{(self._ip >> 16) & 255}.{(self._ip >> 8) & 255}.{self._ip & 255}"
                ipcs.append({"name": ipc["name"], "properties": {
                    "privateIPAddress": ip, "privateIPAllocationMethod": "Dynamic",
                    "privateIPAddressVersion": "IPv4", "primary": ipc.get("properties", {}).get(
                        "primary", True), "subnet": ipc["properties"]["subnet"],
                    "provisioningState": "Succeeded"}})
            self._nics[nic_id.lower()] = {
                "id": nic_id, "name": nic_name, "type": "Microsoft.Network/networkInterfaces",
                "location": vm.location, "properties": {
                    "provisioningState": "Succeeded", "ipConfigurations": ipcs,
                    "primary": cprops.get("primary", i == 0), "virtualMachine": {"id": vm.id}}}
            vm.nics.append(nic_id)
            refs.append({"id": nic_id, "properties": {
                "primary": cprops.get("primary", i == 0),
                "deleteOption": cprops.get("deleteOption", "Detach")}})
        if refs:
            net["networkInterfaces"] = refs
        storage = vm.props.setdefault("storageProfile", {})
        os_disk = storage.setdefault("osDisk", {"createOption": "FromImage"})
        disk_name = f"{vm.name}_OsDisk_1_{uuid.uuid4().hex}"
        vm.disk = (f"/subscriptions/{vm.sub}/resourceGroups/{vm.rg.upper()}/providers/"
                   f"Microsoft.Compute/disks/{disk_name}")
        os_disk["name"] = disk_name
        os_disk.setdefault("managedDisk", {})["id"] = vm.disk
        os_disk.setdefault("osType", "Linux")
        self._disks.add(vm.disk)

    def _delete_vm(self, sub: str, rg: str, name: str, api_version: str
                   ) -> tuple[int, Any, dict[str, str]]:
        vm = self._vms.get((sub.lower(), rg.lower(), name.lower()))
        if vm is None:
            return 204, None, {}
        vm.provisioning, vm.power = "Deleting", "stopping"
        op = self._new_op(sub, vm.location, on_done=lambda op, vm=vm: self._remove_vm(vm))
        return 202, None, {"Azure-AsyncOperation": self._op_url(op, api_version),
                           "Location": self._op_url(op, api_version, monitor=True)}

    # ----------------------------------------------------------------------------- PPG / CRG
    @staticmethod
    def _lookup_id(table: dict, rid: str, kind: str) -> dict[str, Any] | None:
        m = re.match(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/"
                     + kind + r"/([^/]+)$", rid, re.I)
        if not m:
            return None
        return table.get(tuple(g.lower() for g in m.groups()))

    def _ppg_json(self, key: tuple[str, str, str], ppg: dict[str, Any]) -> dict[str, Any]:
        out = json.loads(json.dumps(ppg))
        members = [{"id": vm.id} for vm in self._vms.values()
                   if ((vm.props.get("proximityPlacementGroup") or {}).get("id", "").lower()
                       == ppg["id"].lower())]
        out.setdefault("properties", {})["virtualMachines"] = members
        return out

    def _put_ppg(self, sub: str, rg: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not body.get("location"):
            raise ArmError(400, "LocationRequired",
                           "The location property is required for this definition.")
        key = (sub.lower(), rg.lower(), name.lower())
        location = _norm_location(body["location"])
        if location not in self.regions:
            raise ArmError(400, "LocationNotAvailableForResourceType",
                           f"The provided location '{location}' is not available for resource type "
                           "'Microsoft.Compute/proximityPlacementGroups'.")
        status = 200 if key in self._ppgs else 201
        props = dict(body.get("properties") or {})
        props.setdefault("proximityPlacementGroupType", "Standard")
        self._ppgs[key] = {
            "id": (f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/"
                   f"proximityPlacementGroups/{name}"),
            "name": name, "type": "Microsoft.Compute/proximityPlacementGroups",
            "location": location, "tags": body.get("tags") or {}, "properties": props,
            **({"zones": body["zones"]} if body.get("zones") else {})}
        return status, self._ppg_json(key, self._ppgs[key])

    def _delete_ppg(self, sub: str, rg: str, name: str) -> int:
        key = (sub.lower(), rg.lower(), name.lower())
        ppg = self._ppgs.get(key)
        if ppg is None:
            return 204
        if self._ppg_json(key, ppg)["properties"]["virtualMachines"]:
            raise ArmError(409, "OperationNotAllowed", f"Proximity placement group '{name}' cannot "
                           "be deleted because it still holds virtual machines.")
        del self._ppgs[key]
        return 200

    # ----------------------------------------------------------------------------- dispatch
    def handle(self, method: str, raw_path: str, headers: dict[str, str], raw_body: bytes,
               call: Call) -> tuple[int, Any, dict[str, str]]:
        split = urlsplit(raw_path)
        path = split.path
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        call.query = query
        body: Any = None
        if raw_body:
            try:
                body = json.loads(raw_body)
            except ValueError:
                raise ArmError(400, "InvalidRequestContent", "The request content was invalid "
                               "and could not be deserialized.") from None
        call.body = body
        route, m = next(((r, m) for r, rx in _ROUTES if (m := rx.match(path))), (None, None))
        vm_create = route == "vm" and method == "PUT"
        generation = self._generation
        fault = self._take_fault(method, path, vm_create)
        if fault is not None:
            call.fault = fault.kind
            if fault.kind == "slow":
                time.sleep(self.slow_s)
                if generation != self._generation:  # reset() while asleep: act on nothing
                    raise ArmError(503, "ServiceUnavailable", "The fake was reset.")
            if fault.kind != "truncated":  # cut short in _serve, once done
                self._raise_fault(fault, path)
        if self.require_auth and not headers.get("authorization", "").lower().startswith("bearer "):
            raise ArmError(401, "AuthenticationFailed", "Authentication failed. The "
                           "'Authorization' header is missing.")
        api_version = query.get("api-version", "")
        if not api_version:
            raise ArmError(400, "MissingApiVersionParameter", "The api-version query parameter "
                           "(?api-version=) is required for all requests.")
        if not _API_VERSION.match(api_version):
            raise ArmError(400, "InvalidApiVersionParameter", f"The api-version '{api_version}' is "
                           "invalid. The supported versions are '2015-06-15' and later.")
        if route is None or m is None:
            raise ArmError(404, "InvalidResourceType", f"The resource type could not be found for "
                           f"path '{path}'.")
        g = m.groupdict()
        with self._lock:
            self._settle()
            if route != "op" and "rg" in g and self.resource_groups is not None \
                    and g["rg"].lower() not in {r.lower() for r in self.resource_groups}:
                raise ArmError(404, "ResourceGroupNotFound",
                               f"Resource group '{g['rg']}' could not be found.")
            return self._route(route, method, g, query, body, api_version,
                               fault if fault is not None and fault.kind in _CREATE_ONLY else None)

    def _raise_fault(self, f: _Fault, path: str = "") -> None:
        if f.kind == "html":
            raise ArmError(502, "", "", page=HTML_PAGE)
        if f.kind in ("garbage", "shape"):
            raise ArmError(200, "", "", page=GARBAGE if f.kind == "garbage" else WRONG_SHAPE)
        if f.kind == "not_found":
            m = re.search(r"/resourceGroups/([^/]+)(?:/providers/[^/]+/[^/]+/([^/?]+))?", path, re.I)
            rg, name = (m.group(1), m.group(2) or "") if m else ("", "")
            code = f.code or "ResourceGroupNotFound"
            message = {
                "ResourceGroupNotFound": f"Resource group '{rg}' could not be found.",
                "ParentResourceNotFound": "Can not perform requested operation on nested resource. "
                                          f"Parent resource '{name}' not found.",
                "NotFound": "The entity was not found in this Azure location.",
                "ResourceNotFound": f"The Resource 'Microsoft.Network/networkInterfaces/{name}-nic' under "
                                    f"resource group '{rg}' was not found. For more details please go to "
                                    "https://aka.ms/ARMResourceNotFoundFix",
            }[code]
            raise ArmError(404, code, message)
        if f.kind == "throttle":
            raise ArmError(429, f.code or "TooManyRequests", "The request is being throttled as "
                           "the limit has been reached for operation type - Write_30Min.",
                           headers={"Retry-After": str(self.retry_after)})
        if f.kind == "5xx":
            status = 503 if f.code == "ServiceUnavailable" else 500
            raise ArmError(status, f.code or "InternalServerError", "An internal execution error "
                           "occurred. Please retry later.")
        if f.kind == "auth":
            code = f.code or "InvalidAuthenticationToken"
            status = 403 if code in ("AuthorizationFailed", "LinkedAuthorizationFailed") else 401
            hdrs = {} if status == 403 else {
                "WWW-Authenticate": 'Bearer authorization_uri="https://login.windows.net/", '
                                    'error="invalid_token", error_description="The access token '
                                    'is invalid."'}
            raise ArmError(status, code, "The client does not have authorization to perform "
                           "this action, or the access token is invalid.", headers=hdrs)

    def _route(self, route: str, method: str, g: dict[str, str], query: dict[str, str], body: Any,
               api_version: str, fault: _Fault | None) -> tuple[int, Any, dict[str, str]]:
        if route.startswith("mkt_") and method == "GET":
            return self._market_route(route, g, query)
        if route == "op" and method == "GET":
            op = self._ops.get(g["op"])
            if op is None:
                raise ArmError(404, "NotFound", f"The operation '{g['op']}' was not found.")
            if op.status == "InProgress":
                op.polls_left -= 1
                if op.polls_left < 0:
                    self._finish(op)
            if query.get("monitor") == "true":
                if op.status == "InProgress":
                    return 202, None, {"Location": self._op_url(op, api_version, monitor=True)}
                if op.status == "Failed" and op.error:
                    raise ArmError(200, *op.error)
                return 200, None, {}
            return 200, self._op_json(op), {}
        if route == "vms" and method == "GET":
            vms = sorted((vm for vm in self._vms.values()
                          if vm.sub.lower() == g["sub"].lower() and vm.rg.lower() == g["rg"].lower()),
                         key=lambda v: v.name.lower())
            skip = int(query.get("$skiptoken", "0") or 0)
            page = vms[skip:skip + self.page_size]
            out: dict[str, Any] = {"value": [self._vm_json(vm) for vm in page]}
            if skip + self.page_size < len(vms):
                out["nextLink"] = (f"{self.url}/subscriptions/{g['sub']}/resourceGroups/{g['rg']}"
                                   f"/providers/Microsoft.Compute/virtualMachines?api-version="
                                   f"{api_version}&$skiptoken={skip + self.page_size}")
            return 200, out, {}
        if route in ("vm", "vm_view", "vm_evict"):
            key = (g["sub"].lower(), g["rg"].lower(), g["name"].lower())
            if route == "vm" and method == "PUT":
                return self._put_vm(g["sub"], g["rg"], g["name"], body, api_version, fault)
            if route == "vm" and method == "DELETE":
                return self._delete_vm(g["sub"], g["rg"], g["name"], api_version)
            vm = self._vms.get(key)
            if vm is None:
                raise ArmError(404, "ResourceNotFound", f"The Resource 'Microsoft.Compute/"
                               f"virtualMachines/{g['name']}' under resource group '{g['rg']}' "
                               "was not found. For more details please go to "
                               "https://aka.ms/ARMResourceNotFoundFix")
            if route == "vm" and method == "GET":
                expand = {e.strip() for e in query.get("$expand", "").split(",") if e.strip()}
                return 200, self._vm_json(vm, expand), {}
            if route == "vm_view" and method == "GET":
                return 200, self._view_json(vm), {}
            if route == "vm_evict" and method == "POST":
                if not vm.spot:
                    raise ArmError(409, "OperationNotAllowed", "Simulate eviction is only "
                                   "supported for Azure Spot virtual machines.")
                self._evict(vm)
                return 204, None, {}
        if route == "ppgs" and method == "GET":
            items = [self._ppg_json(k, p) for k, p in self._ppgs.items()
                     if k[:2] == (g["sub"].lower(), g["rg"].lower())]
            return 200, {"value": items}, {}
        if route == "ppg":
            key = (g["sub"].lower(), g["rg"].lower(), g["name"].lower())
            if method == "PUT":
                status, out = self._put_ppg(g["sub"], g["rg"], g["name"], body)
                return status, out, {}
            if method == "DELETE":
                return self._delete_ppg(g["sub"], g["rg"], g["name"]), None, {}
            if method == "GET":
                if key not in self._ppgs:
                    raise ArmError(404, "ResourceNotFound", f"The Resource 'Microsoft.Compute/"
                                   f"proximityPlacementGroups/{g['name']}' was not found.")
                return 200, self._ppg_json(key, self._ppgs[key]), {}
        if route == "crg":
            key = (g["sub"].lower(), g["rg"].lower(), g["name"].lower())
            if method == "PUT":
                if not isinstance(body, dict) or not body.get("location"):
                    raise ArmError(400, "LocationRequired",
                                   "The location property is required for this definition.")
                status = 200 if key in self._crgs else 201
                self.add_capacity_reservation_group(g["sub"], g["rg"], g["name"], body["location"],
                                                    body.get("zones") or ())
                return status, self._crgs[key], {}
            if method == "GET":
                if key not in self._crgs:
                    raise ArmError(404, "ResourceNotFound", "The capacity reservation group was "
                                   "not found.")
                return 200, self._crgs[key], {}
            if method == "DELETE":
                return (200 if self._crgs.pop(key, None) else 204), None, {}
        if route == "nic" and method == "GET":
            rid = (f"/subscriptions/{g['sub']}/resourceGroups/{g['rg']}/providers/Microsoft.Network"
                   f"/networkInterfaces/{g['name']}").lower()
            nic = self._nics.get(rid)
            if nic is None:
                raise ArmError(404, "ResourceNotFound", f"The Resource 'Microsoft.Network/"
                               f"networkInterfaces/{g['name']}' was not found.")
            return 200, nic, {}
        raise ArmError(405, "MethodNotAllowed", f"The requested method {method} is not allowed.")


class _Handler(BaseHTTPRequestHandler):
    fake: FakeArm
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without TCP_NODELAY, Nagle + delayed ACK
        # add ~40 ms to every answer
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        call = Call(self.command, urlsplit(self.path).path, {},
                    authorization=bool(headers.get("authorization")))
        with self.fake._lock:
            self.fake.calls.append(call)
        extra: dict[str, str] = {}
        page = None
        try:
            status, body, extra = self.fake.handle(self.command, self.path, headers, raw, call)
        except ArmError as e:
            status, body, extra, page = e.status, e.body(), e.headers, e.page
        except Exception as e:  # a bug in the fake must still answer like ARM would
            status, body = 500, {"error": {"code": "InternalServerError", "message": repr(e)}}
        call.status = status
        payload = page if page is not None else b"" if body is None else json.dumps(body).encode()
        if call.fault == "truncated" and 200 <= status < 300:
            payload = payload[:len(payload) // 2] or b"{"
        page = page if page is None or page.lstrip().startswith(b"<") else None  # garbage is sent as "JSON"
        try:
            self.send_response(status)
            self.send_header("x-ms-request-id", str(uuid.uuid4()))
            for k, v in extra.items():
                self.send_header(k, v)
            if payload:
                self.send_header("Content-Type", "text/html" if page is not None else "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if payload:
                self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            self.close_connection = True

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _serve


try:  # the pytest fixtures (the module also runs alone, where pytest may be absent)
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]
else:

    @pytest.fixture(scope="session")
    def fake_arm_server() -> Iterable[FakeArm]:
        """One fake ARM server for the whole session."""
        with FakeArm() as fake:
            yield fake

    @pytest.fixture
    def fake_arm(fake_arm_server: FakeArm) -> Iterable[FakeArm]:
        """The session's fake ARM, emptied (resources, faults, calls, tunables) for each test."""
        fake_arm_server.reset()
        yield fake_arm_server
        fake_arm_server.reset()


AZ_SUB = "3f2b1c9e-5d4a-4e8b-9c7d-0a1b2c3d4e5f"
AZ_SUBNET = (f"/subscriptions/{AZ_SUB}/resourceGroups/net-rg/providers/Microsoft.Network/"
             "virtualNetworks/gpu-vnet/subnets/nodes")
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBroKerTestKey broker@test"


def sandbox_cloud(market: bool = False) -> Any:
    """Azure's fakes for :class:`broker_sandbox.clouds.Clouds` (its registration's ``sandbox``):
    ARM and the Retail Prices API, two locations, no authentication."""
    from broker_sandbox import SandboxCloud
    from broker_sandbox.azure_market import FakeRetailPrices

    arm, retail = FakeArm().start(), FakeRetailPrices().start()
    return SandboxCloud(
        fakes={"azure": arm, "azure_retail": retail},
        table=lambda: {"enabled": True, "subscription_id": AZ_SUB, "resource_group": "broker-rg",
                       "regions": ["eastus", "westeurope"], "base_url": arm.url, "credentials": "anonymous",
                       "subnet_id": AZ_SUBNET, "ssh_public_key": SSH_KEY, "poll_interval_s": 0, "retries": 0,
                       "timeout_s": 5, "operation_timeout_s": 20, "retail_prices_url": retail.url},
        alive=arm.instances)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="fake Azure Resource Manager on loopback")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    fake = FakeArm(port=args.port).start()
    print(fake.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
