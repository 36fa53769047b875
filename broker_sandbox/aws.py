"""A mocked AWS EC2 on loopback: moto's server behind a thin WSGI front that adds what a broker
test needs and moto lacks.

:class:`AwsCloud` runs moto's ``ThreadedMotoServer`` on ``127.0.0.1`` (ephemeral port) in this
process; any process can talk to it at :attr:`AwsCloud.url` with real boto3 clients (see
:meth:`AwsCloud.client_env`). The front, in front of moto's own WSGI app:

- injects faults per call (:meth:`AwsCloud.inject`, :meth:`AwsCloud.fail_rate`), answering EC2's
  real error XML with EC2's HTTP status ("slow" answers correctly but only after ``slow_s``, longer
  than a client's read timeout; "reset" drops the connection without an answer; "html" is a
  load balancer's 502 HTML page, "garbage" a 200 whose body is no answer at all);
- logs every EC2 call with its form parameters (:attr:`AwsCloud.calls`, :meth:`AwsCloud.count`);
- honours ``ClientToken`` on RunInstances the way EC2 does (same token and parameters: the first
  answer again, no new instances; same token, other parameters: ``IdempotentParameterMismatch``);
- implements placement groups (Create/Describe/DeletePlacementGroup) and Capacity Reservations
  (DescribeCapacityReservations with ``tag:`` filters, targeting in RunInstances,
  ``ReservationCapacityExceeded``), which moto does not, and records them on the instances so
  DescribeInstances shows them;
- sells the Capacity Blocks :class:`broker_sandbox.aws_market.AwsMarket` offers
  (``PurchaseCapacityBlock``: ``CapacityBlockOfferingId`` and ``InstancePlatform`` required,
  ``TagSpecification`` of type ``capacity-reservation``; an id it never offered is
  ``InvalidCapacityBlockOfferingId.NotFound``). The block is a ``capacity-block`` reservation whose
  state follows :attr:`AwsCloud.clock`: ``scheduled`` (available count 0) until its start date,
  ``active`` until its end date, ``expired`` after.

Spot interruption (:meth:`AwsCloud.interrupt`) terminates the instance in moto's backend with the
state reason EC2 gives a reclaimed spot instance (``Server.SpotInstanceTermination``).

A terminated instance stays listed for a while and is then forgotten, as EC2 does ("about an hour
after termination"): moto would keep it for ever, and every DescribeInstances scans all it keeps.
The retention is ``terminated_retention_s`` (default :data:`TERMINATED_RETENTION_S`, or the
environment's ``SANDBOX_EC2_TERMINATED_RETENTION_S``); a soak shortens it. Once forgotten,
DescribeInstances no longer lists the instance and TerminateInstances answers
``InvalidInstanceID.NotFound`` for it.

``aws_cloud_server`` (session scope) starts one server; ``aws_cloud`` (function scope) sets fake
credentials in the environment for the test only and resets the cloud afterwards.
"""
from __future__ import annotations

import base64
import io
import json
import os
import random
import re
import socket
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.server import HTTPServer
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from broker_sandbox.loopback import LoopbackServer

try:  # the pytest fixtures (the sandbox runs these fakes where pytest may be absent)
    import pytest
except ImportError:  # pragma: no cover
    from broker_sandbox import _no_pytest as pytest  # type: ignore[no-redef]

ACCOUNT_ID = "123456789012"
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
FAULT_KINDS = ("capacity", "quota", "throttle", "5xx", "slow", "auth", "invalid", "reset", "html", "garbage")
# What a proxy or load balancer in front of an endpoint answers: an HTML page, not AWS's XML/JSON.
HTML_PAGE = (b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><center><h1>502 Bad "
             b"Gateway</h1></center><hr><center>awselb/2.0</center></body></html>\n")
GARBAGE = b"\x00\x01<<not an answer>> \xff\xfe garbage"

# kind -> (EC2 error code, HTTP status, message)
_FAULTS = {
    "capacity": ("InsufficientInstanceCapacity", 500,
                 "We currently do not have sufficient capacity in the Availability Zone you requested. "
                 "Our system will be working on provisioning additional capacity."),
    "quota": ("VcpuLimitExceeded", 400,
              "You have requested more vCPU capacity than your current vCPU limit allows for the "
              "instance bucket that the specified instance type belongs to."),
    "throttle": ("RequestLimitExceeded", 503, "Request limit exceeded."),
    "5xx": ("InternalError", 500, "An internal error has occurred."),
    "auth": ("UnauthorizedOperation", 403, "You are not authorized to perform this operation."),
    "invalid": ("InvalidParameterValue", 400, "Invalid value for parameter."),
}
# EC2's HTTP status for error codes a test may ask for by name.
_STATUS = {
    "InsufficientInstanceCapacity": 500, "InsufficientCapacity": 500, "InsufficientHostCapacity": 500,
    "InstanceLimitExceeded": 400, "VcpuLimitExceeded": 400, "MaxSpotInstanceCountExceeded": 400,
    "RequestLimitExceeded": 503, "Throttling": 400, "UnauthorizedOperation": 403, "AuthFailure": 401,
    "InvalidParameterValue": 400, "InvalidInstanceType": 400, "InvalidParameterCombination": 400,
    "InternalError": 500, "Unavailable": 503, "ServiceUnavailable": 503,
}
#: How long EC2 keeps listing a terminated instance: "about an hour after termination".
TERMINATED_RETENTION_S = 3600.0
#: The environment variable that sets :attr:`AwsCloud.terminated_retention_s` (seconds); not a
#: ``BROKER_`` name, which a broker started from the same environment would refuse as no setting.
RETENTION_ENV = "SANDBOX_EC2_TERMINATED_RETENTION_S"
_CREDENTIAL_REGION = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/ec2/")


@dataclass
class Call:
    """One EC2 API call as the mocked cloud received it."""

    action: str
    region: str
    params: dict[str, str]
    status: int = 0
    fault: str = ""


@dataclass
class _Fault:
    kind: str
    times: int  # <= 0: until cleared
    match: str
    code: str = ""


@dataclass
class _Reservation:
    id: str
    region: str
    instance_type: str
    zone: str
    total: int
    reservation_type: str = "default"
    tags: dict[str, str] = field(default_factory=dict)
    start: float = 0.0  # a Capacity Block's start and end dates (epoch s); 0 = always active
    end: float = 0.0
    offering_id: str = ""

    def state(self, now: float) -> str:
        if self.start and now < self.start:
            return "scheduled"
        if self.end and now >= self.end:
            return "expired"
        return "active"


class AwsCloud(LoopbackServer):
    """moto's EC2 on 127.0.0.1 with fault injection, a call log and the missing EC2 features."""

    thread_name = "fake-aws"

    def __init__(self, slow_s: float = 2.0, terminated_retention_s: float | None = None) -> None:
        self.slow_s = self.default_slow_s = slow_s
        if terminated_retention_s is None:
            terminated_retention_s = float(os.environ.get(RETENTION_ENV) or TERMINATED_RETENTION_S)
        if not terminated_retention_s >= 0:
            raise ValueError(f"terminated_retention_s must be >= 0 seconds, not {terminated_retention_s!r}")
        self.terminated_retention_s = self.default_terminated_retention_s = terminated_retention_s
        self._terminated_at: dict[str, float] = {}  # instance id -> when it was seen terminated (monotonic)
        self._swept_at = float("-inf")
        self._lock = threading.RLock()
        self._faults: list[_Fault] = []
        self._rate: tuple[float, tuple[str, ...], str, random.Random] | None = None
        self._calls: list[Call] = []
        self._groups: dict[tuple[str, str], dict[str, Any]] = {}
        self._reservations: dict[str, _Reservation] = {}
        # (action, region, ClientToken) -> (the request's parameters, status, headers, body answered)
        self._tokens: dict[tuple[str, str, str], tuple[tuple, int, list, bytes]] = {}
        self._capacity: dict[tuple[str, str], int] = {}  # (instance type, zone) -> nodes EC2 has now
        self._reclaim: dict[str, int] = {}  # instance type -> nodes terminated right at launch
        self._token_locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._saved_env: dict[str, str | None] = {}
        from broker_sandbox.aws_market import AwsMarket

        self.market = AwsMarket()  # pricing, service quotas, spot history and scores (moto lacks them)
        self.clock = time.time  # what Capacity Block states are judged by (a test may move it)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> "AwsCloud":
        # Server-side moto settings: real instance-type validation, no default AMIs (faster reset).
        for key, value in (("MOTO_EC2_LOAD_DEFAULT_AMIS", "false"),
                           ("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true")):
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
        return super().start()

    def make_server(self, host: str, port: int) -> HTTPServer:
        """moto's EC2 app behind :class:`_Front`, on werkzeug's threaded WSGI server (the front
        needs its ``werkzeug.socket`` to reset a connection)."""
        import moto.settings
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        moto.settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION = True
        _patch_moto_run_instances()
        _patch_moto_tag_lookup()
        _patch_moto_module_list()

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        return make_server(host, port, _Front(self, DomainDispatcherApplication(create_backend_app)), True,
                           request_handler=QuietHandler)

    def stop(self) -> None:
        super().stop()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()

    def reset(self) -> None:
        """Forget every resource, fault and logged call; the tunables back to their defaults."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
        with self._lock:
            self.slow_s = self.default_slow_s
            self.terminated_retention_s = self.default_terminated_retention_s
            self._faults.clear()
            self._rate = None
            self._calls.clear()
            self._groups.clear()
            self._reservations.clear()
            self._tokens.clear()
            self._terminated_at.clear()
            self._swept_at = float("-inf")
            self._capacity.clear()
            self._reclaim.clear()
            self.clock = time.time
        self.market.reset()

    # -- client side helpers --------------------------------------------------------------------

    @staticmethod
    def client_env() -> dict[str, str]:
        """Environment for a process whose boto3 talks to this cloud (fake credentials only)."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    def client(self, region: str = "us-east-1") -> Any:
        """A plain boto3 EC2 client on this cloud (for setting up and checking tests)."""
        import boto3
        from botocore.config import Config

        return boto3.client("ec2", region_name=region, endpoint_url=self.url,
                            aws_access_key_id="testing", aws_secret_access_key="testing",
                            config=Config(retries={"total_max_attempts": 1}))

    def register_image(self, region: str = "us-east-1", root_device: str = "/dev/sda1") -> str:
        """A GPU-ready AMI stand-in; returns its id."""
        return self.client(region).register_image(
            Name=f"gpu-{uuid.uuid4().hex[:8]}", RootDeviceName=root_device, Architecture="x86_64",
            BlockDeviceMappings=[{"DeviceName": root_device, "Ebs": {"VolumeSize": 8}}],
        )["ImageId"]

    def provider_settings(self, regions: Iterable[str] = ("us-east-1",), **extra: Any) -> dict[str, Any]:
        """A ``[providers.aws]`` table pointing at this cloud, with one registered AMI per region."""
        regions = list(regions)
        settings: dict[str, Any] = {
            "enabled": True,
            "regions": regions,
            "endpoint_url": self.url,
            "image_id": {r: self.register_image(r) for r in regions},
            "connect_timeout_s": 2,
            "read_timeout_s": 5,
            "terminate_timeout_s": 10,
        }
        settings.update(extra)
        return settings

    # -- faults -------------------------------------------------------------------------------

    def inject(self, kind: str, times: int = 1, match: str = "", code: str = "") -> None:
        """Fail the next ``times`` calls whose "Action path" contains ``match`` (times <= 0: all).

        ``code`` overrides the EC2 error code of the kind (e.g. ``"AuthFailure"`` for "auth").
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
        with self._lock:
            self._faults.append(_Fault(kind, times, match, code))

    def fail_rate(self, p: float, kinds: Iterable[str] = ("throttle", "5xx"), seed: int = 0,
                  match: str = "") -> None:
        """Fail a share ``p`` of the calls matching ``match`` with a kind drawn from ``kinds``."""
        kinds = tuple(kinds)
        bad = [k for k in kinds if k not in FAULT_KINDS]
        if bad or not 0 <= p <= 1:
            raise ValueError(f"fail_rate needs 0 <= p <= 1 and kinds from {FAULT_KINDS}")
        with self._lock:
            self._rate = (p, kinds, match, random.Random(seed)) if p > 0 and kinds else None

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._rate = None

    def _take_fault(self, op: str) -> _Fault | None:
        with self._lock:
            for f in self._faults:
                if f.match in op:
                    if f.times > 0:
                        f.times -= 1
                        if f.times == 0:
                            self._faults.remove(f)
                    return f
            if self._rate is not None:
                p, kinds, match, rng = self._rate
                if match in op and rng.random() < p:
                    return _Fault(rng.choice(kinds), 1, match)
        return None

    # -- observation --------------------------------------------------------------------------

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def count(self, action: str) -> int:
        """How many calls of ``action`` reached the cloud (faulted ones included)."""
        return sum(1 for c in self.calls if c.action == action)

    def _backends(self) -> Iterator[tuple[str, Any]]:
        from moto.backends import get_backend

        yield from dict.items(get_backend("ec2")[ACCOUNT_ID])

    def _instance(self, instance_id: str) -> tuple[str, Any]:
        for region, backend in self._backends():
            for reservation in backend.reservations.values():
                for inst in reservation.instances:
                    if inst.id == instance_id:
                        return region, inst
        raise KeyError(f"no instance {instance_id}")

    def instances(self, region: str | None = None) -> list[dict[str, Any]]:
        """Every instance as the server holds it, terminated ones included."""
        out = []
        for reg, backend in self._backends():
            if region and reg != region:
                continue
            for reservation in backend.reservations.values():
                for inst in reservation.instances:
                    ud = inst.user_data
                    out.append({
                        "id": inst.id,
                        "region": reg,
                        "zone": inst.placement.zone,
                        "instance_type": inst.instance_type,
                        "state": inst.state,
                        "state_reason": inst.state_reason.code,
                        "lifecycle": inst.lifecycle or "",
                        "tags": {t["key"]: t["value"] for t in inst.get_tags()},
                        "user_data_b64": ud.as_bytes().decode() if ud is not None else "",
                        "placement_group": inst.placement.group_name,
                        "capacity_reservation_id": getattr(inst, "capacity_reservation_id", "") or "",
                        "client_token": inst.client_token or "",
                        "image_id": inst.image_id,
                        "subnet_id": inst.subnet_id,
                        "key_name": inst.key_name,
                        "private_ip": inst.private_ip,
                        # As RunInstances asked for them (moto keeps one per device index only).
                        "network_interfaces": list(getattr(inst, "broker_network_interfaces", [])),
                    })
        return out

    def placement_groups(self, region: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(g) for (reg, _), g in self._groups.items() if not region or reg == region]

    def add_capacity_reservation(self, region: str, instance_type: str, zone: str, count: int,
                                 reservation_type: str = "default") -> str:
        """A targeted Capacity Reservation (``reservation_type`` "capacity-block" for ML blocks)."""
        rid = f"cr-{uuid.uuid4().hex[:17]}"
        with self._lock:
            self._reservations[rid] = _Reservation(rid, region, instance_type, zone, count, reservation_type)
        return rid

    def set_capacity(self, instance_type: str, zone: str, nodes: int) -> None:
        """EC2 has ``nodes`` of ``instance_type`` in ``zone`` ("" for every zone) for an instant
        Fleet: an override asking for more gets ``InsufficientInstanceCapacity`` (with a
        ``MinTargetCapacity`` above what is there) or what is there (without one)."""
        with self._lock:
            self._capacity[(instance_type, zone)] = nodes

    def reclaim_at_launch(self, instance_type: str, nodes: int = 1) -> None:
        """The next instant Fleet launching ``instance_type`` sees ``nodes`` of its instances go
        from pending to terminated at once, with the state reason EC2 gives a launch it could not
        complete (``Server.InsufficientInstanceCapacity``)."""
        with self._lock:
            self._reclaim[instance_type] = nodes

    def fleet_calls(self) -> list[Call]:
        """Every CreateFleet the cloud received, in order."""
        return [c for c in self.calls if c.action == "CreateFleet"]

    def capacity_blocks(self) -> list[_Reservation]:
        """The Capacity Blocks bought (PurchaseCapacityBlock), oldest first."""
        with self._lock:
            return [r for r in self._reservations.values() if r.offering_id]

    def interrupt(self, instance_id: str) -> None:
        """Reclaim a spot instance the way EC2 reports it."""
        from moto.ec2.models.instances import StateReason

        region, inst = self._instance(instance_id)
        if inst.lifecycle != "spot":
            raise ValueError(f"{instance_id} is not a spot instance; EC2 only interrupts spot capacity")
        inst.terminate()
        self._terminated([instance_id])
        inst._reason = "Service initiated (spot instance termination)"
        inst.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                        "Server.SpotInstanceTermination")

    # -- forgetting terminated instances ---------------------------------------------------------

    def _terminated(self, instance_ids: Iterable[str]) -> None:
        """``instance_ids`` were terminated now: their retention starts."""
        now = time.monotonic()
        ids = set(instance_ids)
        with self._lock:
            for iid in ids:
                self._terminated_at.setdefault(iid, now)
            # Its interfaces went with it: terminating it again (EC2 answers that as a success)
            # must not ask moto to delete them a second time (moto would answer NotFound).
            for _, backend in self._backends():
                # a copy: moto adds reservations from other request threads, outside this lock
                for reservation in list(backend.reservations.values()):
                    for inst in reservation.instances:
                        if inst.id in ids and inst.state == "terminated":
                            for nic in inst.nics.values():
                                nic.delete_on_termination = False

    def forget_terminated(self) -> int:
        """Forget the instances terminated longer than the retention ago, as EC2 does; returns how
        many. An instance terminated without a TerminateInstances (moto's own doing) starts its
        retention when a sweep first sees it terminated."""
        from moto.ec2.models.instances import Instance as MotoInstance

        now = time.monotonic()
        forgotten = 0
        with self._lock:
            self._swept_at = now
            known: set[str] = set()
            for _, backend in self._backends():
                for rid, reservation in list(backend.reservations.items()):
                    keep: list[MotoInstance] = []
                    for inst in reservation.instances:
                        known.add(inst.id)
                        if inst.state != "terminated":
                            keep.append(inst)
                        elif now - self._terminated_at.setdefault(inst.id, now) < self.terminated_retention_s:
                            keep.append(inst)
                        else:
                            backend.tags.pop(inst.id, None)
                            self._terminated_at.pop(inst.id, None)
                            forgotten += 1
                    if len(keep) == len(reservation.instances):
                        continue
                    if keep:
                        reservation.instances = keep  # a new list: a describe in flight keeps the old one
                    else:
                        backend.reservations.pop(rid, None)
            for iid in set(self._terminated_at) - known:  # named by a TerminateInstances, never existed
                del self._terminated_at[iid]
        return forgotten

    def _sweep(self) -> None:
        """Forget expired terminated instances, at most a few times per retention (and per second)."""
        with self._lock:
            due = time.monotonic() - self._swept_at >= min(1.0, self.terminated_retention_s / 4)
        if due:
            self.forget_terminated()

    # -- request handling (called by _Front) ----------------------------------------------------

    def _record(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)

    def _available(self, r: _Reservation) -> int:
        if r.state(self.clock()) != "active":
            return 0  # a block shows no capacity before its start, nor after its end
        return max(0, r.total - self._used(r.id))

    def _used(self, reservation_id: str) -> int:
        return sum(1 for i in self.instances()
                   if i["capacity_reservation_id"] == reservation_id
                   and i["state"] not in ("shutting-down", "terminated"))

    def _group_in_use(self, region: str, name: str) -> bool:
        return any(i["placement_group"] == name and i["state"] != "terminated"
                   for i in self.instances(region))


def _xml(action: str, inner: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{EC2_NS}">'
            f"<requestId>{uuid.uuid4()}</requestId>{inner}</{action}Response>").encode()


def _error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors>"
            f"<RequestID>{uuid.uuid4()}</RequestID></Response>").encode()


def _tag_set(tags: dict[str, str]) -> str:
    items = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in tags.items())
    return f"<tagSet>{items}</tagSet>"


def _indexed(params: dict[str, str], prefix: str) -> list[str]:
    """Values of ``Prefix.1``, ``Prefix.2``, ... in order."""
    out = []
    n = 1
    while f"{prefix}.{n}" in params:
        out.append(params[f"{prefix}.{n}"])
        n += 1
    return out


def _filters(params: dict[str, str]) -> dict[str, set[str]]:
    """``Filter.N.Name`` / ``Filter.N.Value.M`` of a query as {name: values}."""
    out: dict[str, set[str]] = {}
    n = 1
    while f"Filter.{n}.Name" in params:
        out[params[f"Filter.{n}.Name"]] = set(_indexed(params, f"Filter.{n}.Value"))
        n += 1
    return out


def _reservation_field(r: _Reservation, now: float, name: str) -> str:
    """What a DescribeCapacityReservations filter ``name`` matches of ``r`` (EC2's filter names)."""
    if name.startswith("tag:"):
        return r.tags.get(name[4:], "\0")
    return {"instance-type": r.instance_type, "availability-zone": r.zone, "state": r.state(now),
            "reservation-type": r.reservation_type}.get(name, "\0")


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


def _spec_tags(params: dict[str, str], resource_type: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    n = 1
    while f"TagSpecification.{n}.ResourceType" in params:
        if params[f"TagSpecification.{n}.ResourceType"] == resource_type:
            m = 1
            while f"TagSpecification.{n}.Tag.{m}.Key" in params:
                tags[params[f"TagSpecification.{n}.Tag.{m}.Key"]] = params.get(f"TagSpecification.{n}.Tag.{m}.Value", "")
                m += 1
        n += 1
    return tags


def _network_interfaces(p: dict[str, str]) -> list[dict[str, str]]:
    """``NetworkInterface.N.*`` of a RunInstances, checked the way EC2 checks EFA interfaces
    against the instance type (moto's copy of DescribeInstanceTypes: EfaSupported,
    MaximumNetworkCards, MaximumEfaInterfaces)."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    nics: list[dict[str, str]] = []
    n = 1
    while any(k.startswith(f"NetworkInterface.{n}.") for k in p):
        prefix = f"NetworkInterface.{n}."
        nics.append({k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)})
        n += 1
    if not nics:
        return nics
    if "SecurityGroupId.1" in p or "SecurityGroup.1" in p:
        raise _Error("InvalidParameterCombination", "Network interfaces and an instance-level security "
                     "groups may not be specified on the same request")
    info = (INSTANCE_TYPES.get(p.get("InstanceType", "")) or {}).get("NetworkInfo", {})
    cards = int(info.get("MaximumNetworkCards", 1))
    seen = set()
    for nic in nics:
        kind = nic.get("InterfaceType", "interface")
        card, device = int(nic.get("NetworkCardIndex", "0")), int(nic.get("DeviceIndex", "0"))
        if kind not in ("interface", "efa", "efa-only", "trunk"):
            raise _Error("InvalidParameterValue", f"Invalid value '{kind}' for InterfaceType.")
        if kind != "interface" and not info.get("EfaSupported"):
            raise _Error("InvalidParameterCombination",
                         f"Elastic Fabric Adapter is not supported on {p.get('InstanceType')}.")
        if card >= cards:
            raise _Error("InvalidParameterValue", f"Network card index {card} is out of range: "
                         f"{p.get('InstanceType')} has {cards} network cards.")
        if (card, device) in seen:
            raise _Error("InvalidParameterValue", "Each network interface requires a unique device index "
                         "on its network card.")
        if (card, device) == (0, 0) and kind == "efa-only":
            raise _Error("InvalidParameterCombination",
                         "An EFA-only network interface cannot be the primary network interface.")
        seen.add((card, device))
    if (0, 0) not in seen:
        raise _Error("InvalidParameterValue", "The primary network interface (device index 0 on "
                     "network card 0) is required.")
    efas = sum(1 for nic in nics if nic.get("InterfaceType") in ("efa", "efa-only"))
    if efas > int((info.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0) or 0) and efas:
        raise _Error("InvalidParameterCombination", f"{p.get('InstanceType')} supports fewer EFA interfaces.")
    return nics


# LaunchTemplateData members by their RunInstances query names, where they differ.
_RUN_NAMES = {"NetworkInterfaces": "NetworkInterface", "TagSpecifications": "TagSpecification",
              "BlockDeviceMappings": "BlockDeviceMapping", "SecurityGroupIds": "SecurityGroupId",
              "SecurityGroups": "SecurityGroup", "Tags": "Tag", "Groups": "SecurityGroupId"}


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{_RUN_NAMES.get(k, k)}" if prefix else _RUN_NAMES.get(k, k), v, out)
    elif isinstance(value, list):
        for i, v in enumerate(value, 1):
            _flatten(f"{prefix}.{i}", v, out)
    elif isinstance(value, bool):
        out[prefix] = "true" if value else "false"
    elif value is not None:
        out[prefix] = str(value)


def _run_params(data: dict[str, Any], instance_type: str, count: int, zone: str, subnet: str, spot: bool,
                max_price: str) -> dict[str, str]:
    """The RunInstances query a Fleet override makes of its launch template's data."""
    run: dict[str, str] = {"Action": "RunInstances", "Version": "2016-11-15"}
    _flatten("", {k: v for k, v in data.items() if k != "InstanceType"}, run)
    run.update({"InstanceType": instance_type, "MinCount": str(count), "MaxCount": str(count)})
    if zone:
        run["Placement.AvailabilityZone"] = zone
    if subnet:
        nics = [k for k in run if re.fullmatch(r"NetworkInterface\.\d+\.DeviceIndex", k)]
        for k in nics:
            run[k.replace(".DeviceIndex", ".SubnetId")] = subnet
        if not nics:
            run["SubnetId"] = subnet
    if spot:
        run["InstanceMarketOptions.MarketType"] = "spot"
        run["InstanceMarketOptions.SpotOptions.SpotInstanceType"] = "one-time"
        run["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] = "terminate"
        if max_price:
            run["InstanceMarketOptions.SpotOptions.MaxPrice"] = max_price
    return run


# The RunInstances being served on this thread decorates the instances moto creates for it.
_launching = threading.local()


def _patch_moto_run_instances() -> None:
    from moto.ec2.models.instances import InstanceBackend

    original = InstanceBackend.run_instances
    if getattr(original, "_broker_front", False):
        return

    def run_instances(self: Any, *args: Any, **kwargs: Any) -> Any:
        reservation = original(self, *args, **kwargs)
        decorate = getattr(_launching, "decorate", None)
        if decorate is not None:
            for inst in reservation.instances:
                decorate(inst)
        return reservation

    run_instances._broker_front = True  # type: ignore[attr-defined]
    InstanceBackend.run_instances = run_instances  # type: ignore[method-assign]


def _patch_moto_tag_lookup() -> None:
    """A resource's own tags by its id, as EC2 looks them up. moto finds them by matching the id
    against every tag of every resource, so a DescribeInstances with a tag filter costs the
    square of the instances it keeps (terminated ones included, as EC2 keeps them for a while):
    66 ms at 50 instances, 8.3 s at 800, past the SDKs' read timeouts within minutes of a soak.
    The answer is the same, in the same order."""
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    if getattr(TaggedEC2Resource.get_tags, "_broker_front", False):
        return

    def get_tags(self: Any) -> list[dict[str, str]]:
        rid = self.id
        if not rid:
            return []
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(rid), "")
        return [{"resource_id": rid, "key": k, "value": v, "resource_type": kind}
                for k, v in dict(self.ec2_backend.tags.get(rid, {})).items()]

    get_tags._broker_front = True  # type: ignore[attr-defined]
    TaggedEC2Resource.get_tags = get_tags  # type: ignore[method-assign]


def _patch_moto_module_list() -> None:
    """moto's server lists its own package directory (a stat per service) to route every request,
    holding the one lock all requests share: 3.7 ms each on this machine, which caps the mocked
    cloud near 270 calls a second whatever its threads. The list never changes: read it once."""
    import moto.backends as backends

    if getattr(backends.list_of_moto_modules, "_broker_front", False):
        return
    modules = tuple(backends.list_of_moto_modules())

    def list_of_moto_modules() -> tuple[str, ...]:
        return modules

    list_of_moto_modules._broker_front = True  # type: ignore[attr-defined]
    backends.list_of_moto_modules = list_of_moto_modules  # type: ignore[assignment]


class _Error(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class _Front:
    """The WSGI app in front of moto's: faults, call log, and the EC2 features moto lacks."""

    def __init__(self, cloud: AwsCloud, app: Any) -> None:
        self.cloud = cloud
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/moto-api"):
            return self.app(environ, start_response)
        size = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(size) if size else b""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        if self.cloud.market.handles_json(environ):
            call = Call(environ.get("HTTP_X_AMZ_TARGET", ""), self.cloud.market.region_of(environ), {})
            self.cloud._record(call)
            fault = self.cloud._take_fault(call.action)
            if fault is not None and fault.kind in ("html", "garbage"):
                call.fault = fault.kind
                return self._page(call, start_response, fault.kind)
            if fault is not None and fault.kind not in ("slow", "reset"):
                call.fault = fault.kind
                code = fault.code or {"throttle": "ThrottlingException", "auth": "AccessDeniedException",
                                      "5xx": "ServiceUnavailableException"}.get(fault.kind, "InternalFailure")
                status = {"throttle": 400, "auth": 400, "invalid": 400}.get(fault.kind, 503)
                return self._answer(call, start_response, status,
                                    [("Content-Type", "application/x-amz-json-1.1")],
                                    json.dumps({"__type": code, "Message": code}).encode())
            return self._answer(call, start_response, *self.cloud.market.json_call(environ, body))
        params = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        if environ.get("QUERY_STRING"):
            params.update(parse_qsl(environ["QUERY_STRING"], keep_blank_values=True))
        action = params.get("Action", "")
        if not action:
            return self.app(environ, start_response)
        match = _CREDENTIAL_REGION.search(environ.get("HTTP_AUTHORIZATION", ""))
        region = match.group(1) if match else "us-east-1"
        call = Call(action, region, params)
        self.cloud._record(call)
        self.cloud._sweep()

        fault = self.cloud._take_fault(f"{action} {path}")
        if fault is not None:
            call.fault = fault.kind
            if fault.kind == "reset":
                sock = environ.get("werkzeug.socket")
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
                call.status = 0
                return []
            if fault.kind in ("html", "garbage"):
                return self._page(call, start_response, fault.kind)
            if fault.kind != "slow":
                code, status, message = _FAULTS[fault.kind]
                if fault.code:
                    code, status = fault.code, _STATUS.get(fault.code, status)
                return self._answer(call, start_response, status, [("Content-Type", "text/xml")],
                                    _error(code, message))
        try:
            status, headers, out = self._dispatch(action, region, params, environ)
        except _Error as e:
            status, headers, out = e.status, [("Content-Type", "text/xml")], _error(e.code, e.message)
        if action == "TerminateInstances" and status == 200:
            self.cloud._terminated(_indexed(params, "InstanceId"))
        if fault is not None and fault.kind == "slow":
            time.sleep(self.cloud.slow_s)
        return self._answer(call, start_response, status, headers, out)

    def _page(self, call: Call, start_response: Any, kind: str) -> list[bytes]:
        if kind == "html":
            return self._answer(call, start_response, 502, [("Content-Type", "text/html")], HTML_PAGE)
        return self._answer(call, start_response, 200, [("Content-Type", "text/xml")], GARBAGE)

    @staticmethod
    def _answer(call: Call, start_response: Any, status: int, headers: list, body: bytes) -> list[bytes]:
        call.status = status
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(body))))
        start_response(f"{status} {'OK' if status < 400 else 'Error'}", headers)
        return [body]

    def _moto(self, environ: dict[str, Any]) -> tuple[int, list, bytes]:
        captured: dict[str, Any] = {}

        def start(status: str, headers: list, exc_info: Any = None) -> None:
            captured["status"], captured["headers"] = int(status.split()[0]), headers

        chunks = self.app(environ, start)
        try:
            body = b"".join(chunks)
        finally:
            if hasattr(chunks, "close"):
                chunks.close()
        return captured["status"], captured["headers"], body

    def _dispatch(self, action: str, region: str, p: dict[str, str], environ: dict) -> tuple[int, list, bytes]:
        xml = [("Content-Type", "text/xml")]
        cloud = self.cloud
        if action == "CreatePlacementGroup":
            name = p.get("GroupName", "")
            strategy = p.get("Strategy", "cluster")
            if strategy not in ("cluster", "spread", "partition"):
                raise _Error("InvalidParameterValue", f"Value ({strategy}) for parameter strategy is invalid.")
            with cloud._lock:
                if (region, name) in cloud._groups:
                    raise _Error("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
                group = {"GroupName": name, "Strategy": strategy, "State": "available",
                         "GroupId": f"pg-{uuid.uuid4().hex[:17]}", "Tags": _spec_tags(p, "placement-group")}
                cloud._groups[(region, name)] = group
            return 200, xml, _xml(action, f"<placementGroup>{self._group_xml(group)}</placementGroup>")
        if action == "DescribePlacementGroups":
            names = _indexed(p, "GroupName")
            with cloud._lock:
                groups = [g for (reg, n), g in cloud._groups.items() if reg == region and (not names or n in names)]
            missing = set(names) - {g["GroupName"] for g in groups}
            if missing:
                raise _Error("InvalidPlacementGroup.Unknown", f"The Placement Group '{sorted(missing)[0]}' is unknown.")
            items = "".join(f"<item>{self._group_xml(g)}</item>" for g in groups)
            return 200, xml, _xml(action, f"<placementGroupSet>{items}</placementGroupSet>")
        if action == "DeletePlacementGroup":
            name = p.get("GroupName", "")
            with cloud._lock:
                if (region, name) not in cloud._groups:
                    raise _Error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
                if cloud._group_in_use(region, name):
                    raise _Error("InvalidPlacementGroup.InUse", f"The Placement Group '{name}' is in use.")
                del cloud._groups[(region, name)]
            return 200, xml, _xml(action, "<return>true</return>")
        if action == "DescribeCapacityReservations":
            ids = _indexed(p, "CapacityReservationId")
            filters = _filters(p)
            with cloud._lock:
                found = [r for r in cloud._reservations.values() if r.region == region and (not ids or r.id in ids)
                         and all(_reservation_field(r, cloud.clock(), k) in v for k, v in filters.items())]
            missing = set(ids) - {r.id for r in found}
            if missing:
                raise _Error("InvalidCapacityReservationId.NotFound",
                             f"The capacity reservation ID '{sorted(missing)[0]}' does not exist")
            items = "".join(f"<item>{self._reservation_xml(r)}</item>" for r in found)
            return 200, xml, _xml(action, f"<capacityReservationSet>{items}</capacityReservationSet>")
        if action == "PurchaseCapacityBlock":
            return self._purchase_capacity_block(region, p)
        if action == "RunInstances":
            return self._run_instances(region, p, environ)
        if action == "CreateFleet" and p.get("Type") == "instant":
            return self._create_fleet(region, p, environ)
        if cloud.market.handles_query(action, region):
            return cloud.market.query_call(action, region, p)
        return self._moto(environ)

    def _group_xml(self, g: dict[str, Any]) -> str:
        return (f"<groupName>{escape(g['GroupName'])}</groupName><strategy>{g['Strategy']}</strategy>"
                f"<state>{g['State']}</state><groupId>{g['GroupId']}</groupId>{_tag_set(g['Tags'])}")

    def _purchase_capacity_block(self, region: str, p: dict[str, str]) -> tuple[int, list, bytes]:
        cloud = self.cloud
        for name in ("CapacityBlockOfferingId", "InstancePlatform"):
            if not p.get(name):
                raise _Error("MissingParameter", f"The request must contain the parameter {name}")
        if p["InstancePlatform"] not in ("Linux/UNIX", "Red Hat Enterprise Linux", "SUSE Linux", "Windows",
                                         "Ubuntu Pro", "Linux with SQL Server Standard"):
            raise _Error("InvalidParameterValue",
                         f"The value ({p['InstancePlatform']}) for parameter InstancePlatform is invalid.")
        oid = p["CapacityBlockOfferingId"]
        offer = cloud.market.offering(oid)
        if offer is None or not offer[0].startswith(region):
            raise _Error("InvalidCapacityBlockOfferingId.NotFound", f"The Capacity Block offering ID '{oid}' does not exist")
        zone, itype, start, hours, count, _fee = offer
        if start + hours * 3600 <= cloud.clock():
            raise _Error("InvalidCapacityBlockOfferingId.NotFound", f"The Capacity Block offering ID '{oid}' has expired")
        rid = f"cr-{uuid.uuid4().hex[:17]}"
        r = _Reservation(rid, region, itype, zone, count, "capacity-block", _spec_tags(p, "capacity-reservation"),
                         start, start + hours * 3600, oid)
        with cloud._lock:
            cloud._reservations[rid] = r
        return 200, [("Content-Type", "text/xml")], _xml(
            "PurchaseCapacityBlock", f"<capacityReservation>{self._reservation_xml(r)}</capacityReservation>")

    def _reservation_xml(self, r: _Reservation) -> str:
        available = self.cloud._available(r)
        dates = (f"<startDate>{_iso(r.start)}</startDate><endDate>{_iso(r.end)}</endDate><endDateType>limited"
                 f"</endDateType>" if r.start else "<endDateType>unlimited</endDateType>")
        return (f"<capacityReservationId>{r.id}</capacityReservationId><ownerId>{ACCOUNT_ID}</ownerId>"
                f"<instanceType>{escape(r.instance_type)}</instanceType><instancePlatform>Linux/UNIX</instancePlatform>"
                f"<availabilityZone>{r.zone}</availabilityZone><tenancy>default</tenancy>"
                f"<totalInstanceCount>{r.total}</totalInstanceCount>"
                f"<availableInstanceCount>{available}</availableInstanceCount><state>{r.state(self.cloud.clock())}"
                f"</state>{dates}<instanceMatchCriteria>targeted</instanceMatchCriteria>"
                f"<reservationType>{r.reservation_type}</reservationType>{_tag_set(r.tags)}")

    def _once(self, action: str, region: str, p: dict[str, str],
              call: Callable[[], tuple[int, list, bytes]]) -> tuple[int, list, bytes]:
        """``call()``, once per ClientToken as EC2 does: a request repeating a token that
        succeeded gets the same answer again (the same parameters) or IdempotentParameterMismatch
        (others); requests with one token wait for each other. Without a token, every request
        is new."""
        cloud = self.cloud
        token = p.get("ClientToken", "")
        if not token:
            return call()
        signature = tuple(sorted(p.items()))  # before ``call`` fills in what EC2 chose
        key = (action, region, token)
        with cloud._lock:
            lock = cloud._token_locks.setdefault(key, threading.Lock())
        with lock:
            with cloud._lock:
                cached = cloud._tokens.get(key)
            if cached is not None:
                if cached[0] != signature:
                    raise _Error("IdempotentParameterMismatch",
                                 "The client token you have provided is associated with a resource "
                                 "that has different parameters.")
                _, status, headers, body = cached
                return status, headers, body
            status, headers, body = call()
            if status == 200:
                with cloud._lock:
                    cloud._tokens[key] = (signature, status, headers, body)
            return status, headers, body

    def _run_instances(self, region: str, p: dict[str, str], environ: dict) -> tuple[int, list, bytes]:
        return self._once("RunInstances", region, p, lambda: self._run(region, p, environ))

    def _run(self, region: str, p: dict[str, str], environ: dict) -> tuple[int, list, bytes]:
        cloud = self.cloud
        count = int(p.get("MinCount", "1"))
        nics = _network_interfaces(p)
        zone = p.get("Placement.AvailabilityZone", "")
        group = p.get("Placement.GroupName", "")
        if group and (region, group) not in cloud._groups:
            raise _Error("InvalidPlacementGroup.Unknown", f"The Placement Group '{group}' is unknown.")
        market = p.get("InstanceMarketOptions.MarketType", "")
        target = p.get("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId", "")
        reservation = None
        if target:
            reservation = cloud._reservations.get(target)
            if reservation is None or reservation.region != region:
                raise _Error("InvalidCapacityReservationId.NotFound",
                             f"The capacity reservation ID '{target}' does not exist")
            if p.get("InstanceType") != reservation.instance_type or (zone and zone != reservation.zone):
                raise _Error("InvalidParameterCombination",
                             "The instance type and Availability Zone must match the capacity reservation.")
            if (reservation.reservation_type == "capacity-block") != (market == "capacity-block"):
                raise _Error("InvalidParameterCombination",
                             "Capacity Blocks are launched with the capacity-block market type.")
            if count > cloud._available(reservation):
                raise _Error("ReservationCapacityExceeded",
                             "The requested number of instances exceeds the available capacity "
                             "of the Capacity Reservation.")
            if not zone:
                # EC2 launches into the reservation's zone.
                p["Placement.AvailabilityZone"] = reservation.zone
                self._rewrite(environ, p)

        def decorate(inst: Any) -> None:
            """Give each new instance what EC2 records and moto ignores, before moto answers."""
            if group:
                inst.placement.group_name = group
            if market == "capacity-block":
                inst.lifecycle = "capacity-block"
            inst.broker_network_interfaces = [dict(n) for n in nics]
            if not nics:  # the primary interface EC2 made for it ends with it (moto would keep it)
                for nic in inst.nics.values():
                    nic.delete_on_termination = True
            if reservation is not None:
                inst.capacity_reservation_id = reservation.id
                inst.capacity_reservation_specification = {
                    "CapacityReservationTarget": {"CapacityReservationId": reservation.id}}

        _launching.decorate = decorate
        try:
            return self._moto(environ)
        finally:
            _launching.decorate = None

    def _create_fleet(self, region: str, p: dict[str, str], environ: dict) -> tuple[int, list, bytes]:
        """An instant EC2 Fleet, as EC2 answers it (moto's launches every override at once, ignores
        priorities and zones, and never reports an error): the overrides are tried best priority
        first (lower ``Priority``, then request order; EC2's price-based strategies are not
        modelled), each on its launch template through RunInstances, until one launches the
        target capacity; every override refused is an item of ``Errors`` with EC2's code."""
        return self._once("CreateFleet", region, p,
                          lambda: (200, [("Content-Type", "text/xml")], self._fleet(region, p, environ)))

    def _fleet(self, region: str, p: dict[str, str], environ: dict) -> bytes:
        from moto.backends import get_backend

        cloud = self.cloud
        total = int(p.get("TargetCapacitySpecification.TotalTargetCapacity", "0") or 0)
        kind = p.get("TargetCapacitySpecification.DefaultTargetCapacityType", "")
        if kind not in ("on-demand", "spot"):
            raise _Error("InvalidParameterValue", f"Value ({kind}) for parameter DefaultTargetCapacityType is invalid.")
        if total < 1:
            raise _Error("InvalidTargetCapacitySpecification", "TotalTargetCapacity must be at least 1.")
        opts = "SpotOptions." if kind == "spot" else "OnDemandOptions."
        minimum = int(p.get(opts + "MinTargetCapacity", "0") or 0)
        if minimum and not (p.get(opts + "SingleInstanceType") == "true"
                            or p.get(opts + "SingleAvailabilityZone") == "true"):
            raise _Error("InvalidParameterCombination", "MinTargetCapacity requires SingleInstanceType or "
                         "SingleAvailabilityZone.")
        backend = get_backend("ec2")[ACCOUNT_ID][region]
        overrides: list[tuple[float, int, Any, str, dict[str, str]]] = []
        n = 1
        while any(k.startswith(f"LaunchTemplateConfigs.{n}.") for k in p):
            spec = f"LaunchTemplateConfigs.{n}.LaunchTemplateSpecification."
            name, tid = p.get(spec + "LaunchTemplateName", ""), p.get(spec + "LaunchTemplateId", "")
            try:
                template = (backend.get_launch_template_by_name(name) if name
                            else backend.get_launch_template(template_id=tid))
            except Exception:  # noqa: BLE001 - moto's not-found errors
                raise _Error("InvalidLaunchTemplateName.NotFoundException",
                             f"The specified launch template, with template name {name or tid}, does not exist.") from None
            version = p.get(spec + "Version", "$Default")
            number = (template.latest_version_number if version == "$Latest" else
                      template.default_version_number if version == "$Default" else int(version))
            m = 1
            while any(k.startswith(f"LaunchTemplateConfigs.{n}.Overrides.{m}.") for k in p):
                prefix = f"LaunchTemplateConfigs.{n}.Overrides.{m}."
                over = {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}
                overrides.append((float(over.get("Priority", "inf")), len(overrides), template, str(number), over))
                m += 1
            n += 1
        if not overrides:
            raise _Error("MissingParameter", "The request must contain the parameter LaunchTemplateConfigs.")
        errors: list[str] = []
        got: list[str] = []
        for _, _, template, version, over in sorted(overrides, key=lambda o: o[:2]):
            itype = over.get("InstanceType") or template.get_version(int(version)).data.get("InstanceType", "")
            zone = over.get("AvailabilityZone", "")
            if not zone and over.get("SubnetId"):
                try:
                    zone = backend.get_subnet(over["SubnetId"]).availability_zone
                except Exception:  # noqa: BLE001
                    raise _Error("InvalidSubnetID.NotFound",
                                 f"The subnet ID '{over['SubnetId']}' does not exist") from None
            ref = (f"<launchTemplateSpecification><launchTemplateId>{template.id}</launchTemplateId>"
                   f"<launchTemplateName>{escape(template.name)}</launchTemplateName><version>{version}</version>"
                   f"</launchTemplateSpecification><overrides>"
                   + "".join(f"<{k[0].lower()}{k[1:]}>{escape(v)}</{k[0].lower()}{k[1:]}>" for k, v in over.items())
                   + "</overrides>")
            with cloud._lock:
                have = cloud._capacity.get((itype, zone), cloud._capacity.get((itype, ""), total))
            count = total if have >= total else (0 if minimum > have else have)
            if count < 1:
                errors.append(f"<item><launchTemplateAndOverrides>{ref}</launchTemplateAndOverrides>"
                              f"<lifecycle>{kind}</lifecycle><errorCode>InsufficientInstanceCapacity</errorCode>"
                              f"<errorMessage>{escape(_FAULTS['capacity'][2])}</errorMessage></item>")
                continue
            run = _run_params(template.get_version(int(version)).data, itype, count, zone, over.get("SubnetId", ""),
                              kind == "spot", over.get("MaxPrice", ""))
            sub = dict(environ)
            self._rewrite(sub, run)
            try:
                status, _, answer = self._run_instances(region, run, sub)
            except _Error as e:
                status, answer = e.status, _error(e.code, e.message)
            if status != 200:
                code = re.search(rb"<Code>([^<]*)</Code>", answer)
                message = re.search(rb"<Message>([^<]*)</Message>", answer)
                errors.append(f"<item><launchTemplateAndOverrides>{ref}</launchTemplateAndOverrides>"
                              f"<lifecycle>{kind}</lifecycle><errorCode>{(code.group(1) if code else b'').decode()}"
                              f"</errorCode><errorMessage>{(message.group(1) if message else b'').decode()}"
                              "</errorMessage></item>")
                continue
            ids = [m.decode() for m in re.findall(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", answer)]
            self._reclaim_now(itype, ids)
            got.append(f"<item><launchTemplateAndOverrides>{ref}</launchTemplateAndOverrides>"
                       f"<lifecycle>{kind}</lifecycle><instanceIds>"
                       + "".join(f"<item>{i}</item>" for i in ids)
                       + f"</instanceIds><instanceType>{escape(itype)}</instanceType><platform>Linux/UNIX</platform>"
                       "</item>")
            break
        return _xml("CreateFleet", f"<fleetId>fleet-{uuid.uuid4()}</fleetId><errorSet>{''.join(errors)}</errorSet>"
                                   f"<fleetInstanceSet>{''.join(got)}</fleetInstanceSet>")

    def _reclaim_now(self, instance_type: str, ids: list[str]) -> None:
        from moto.ec2.models.instances import StateReason

        with self.cloud._lock:
            doomed = self.cloud._reclaim.pop(instance_type, 0)
        for instance_id in ids[len(ids) - doomed:] if doomed else []:
            _, inst = self.cloud._instance(instance_id)
            inst.terminate()
            inst.state_reason = StateReason("Server.InsufficientInstanceCapacity: Insufficient capacity to "
                                            "satisfy launch request", "Server.InsufficientInstanceCapacity")

    @staticmethod
    def _rewrite(environ: dict, params: dict[str, str]) -> None:
        from urllib.parse import urlencode

        body = urlencode(params).encode()
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))


@pytest.fixture(scope="session")
def aws_cloud_server() -> Iterator[AwsCloud]:
    """One mocked EC2 for the whole test session."""
    cloud = AwsCloud().start()
    try:
        yield cloud
    finally:
        cloud.stop()


@pytest.fixture
def aws_cloud(aws_cloud_server: AwsCloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsCloud]:
    """The mocked EC2, reset after the test, with fake AWS credentials set for this test only."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in AwsCloud.client_env().items():
        monkeypatch.setenv(key, value)
    try:
        yield aws_cloud_server
    finally:
        aws_cloud_server.reset()


def decode_user_data(b64: str) -> str:
    return base64.b64decode(b64).decode()


def sandbox_cloud(market: bool = False) -> Any:
    """AWS's fakes for :class:`broker_sandbox.clouds.Clouds` (its registration's ``sandbox``): EC2
    and its market APIs in one server, two regions, anonymous signing."""
    from broker_sandbox import SandboxCloud

    cloud = AwsCloud().start()
    return SandboxCloud(
        fakes={"aws": cloud},
        table=lambda: cloud.provider_settings(["us-east-1", "us-west-2"], credentials="anonymous"),
        alive=lambda: [i for i in cloud.instances() if i.get("state") not in ("terminated", "shutting-down")],
        env=AwsCloud.client_env())
