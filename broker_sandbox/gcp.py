"""A fake Google Compute Engine (compute/v1 REST) on loopback, for tests.

It speaks the real paths and JSON that ``google-cloud-compute``'s REST transport sends and reads,
so product code runs unchanged against it (only ``api_endpoint`` and anonymous credentials
differ). What it models, after the public API reference:

* ``instances``: insert (returns a zonal Operation), get, list, delete (Operation),
  ``aggregated/instances``; ``filter`` (AIP-160 subset: ``=``, ``!=``, ``:``, ``eq``/``ne``,
  parentheses, ``AND``/``OR``, implicit AND), ``maxResults``/``pageToken`` paging.
* ``requestId``: must be a non-zero UUID; the same id in the same zone returns the original
  Operation and creates nothing (as the real API does, even when that operation failed).
* Operations go PENDING → RUNNING → DONE, one step per ``get`` poll (``wait`` runs them to DONE),
  or on their own after ``op_seconds``; failures carry ``error.errors[].code`` plus
  ``httpErrorStatusCode``/``httpErrorMessage``.
* Insert validation like the real API: name (RFC 1035), machine type known in the zone, a boot
  disk, a network interface, GPUs (attached or built-in) need ``onHostMaintenance: TERMINATE``,
  ``instanceTerminationAction`` only with ``provisioningModel: SPOT`` or ``FLEX_START`` (which
  needs a ``maxRunDuration`` of at most 7 days and DELETE), spot cannot restart
  automatically or consume a reservation, a specific reservation must exist, label and metadata
  key rules, name conflicts (409). Errors use Compute's shape:
  ``{"error": {"code", "message", "errors": [{"domain", "reason", "message"}]}}``.
* ``regions/R/instances/bulkInsert``: several VMs of one ``instanceProperties`` in one zone the
  ``locationPolicy`` allows, all of ``minCount`` or none (``set_capacity``), as a regional
  ``bulkInsert`` operation with ``instancesBulkInsertOperationMetadata``.
* ``regions/R/resourcePolicies`` (compact placement): insert/get/delete with regional
  operations; instances may only name existing policies of their region, and a policy in use
  cannot be deleted (``resourceInUseByAnotherResource``).
* Preemption (``interrupt``): the VM goes TERMINATED with ``lastStopTimestamp``, a DONE
  ``compute.instances.preempted`` operation is recorded, and with
  ``instanceTerminationAction: DELETE`` the VM is then deleted.
* Fault injection: ``inject(kind, times, match)`` and ``fail_rate(p, kinds, seed)``; besides
  Compute's own errors, a proxy's HTML page ("html") and a 200 whose body is no answer
  ("garbage", "truncated" — the real answer cut short, the call done — and "shape").

Use ``FakeGcpCompute().start()`` (``.url``, ``.stop()``) from any test, or the ``fake_gcp``
fixture; ``python -m broker_sandbox.gcp --port N`` serves it on its own.
"""
from __future__ import annotations

import argparse
import base64
import csv
import datetime as dt
import json
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs, urlsplit

import providers

try:  # the pytest fixtures (the sandbox runs these fakes where pytest may be absent)
    import pytest
except ImportError:  # pragma: no cover
    from broker_sandbox import _no_pytest as pytest  # type: ignore[no-redef]

from broker_sandbox.loopback import LoopbackServer
from broker_sandbox.gcp_market import MARKET_ROUTES, GcpMarketMixin

LINK = "https://www.googleapis.com/compute/v1"
CATALOG = Path(providers.__file__).resolve().parent / "data" / "instances.csv"

# kind → what the fake answers. capacity/quota finish the insert operation with an error, as the
# real API does; the others answer the HTTP request itself.
FAULT_KINDS = ("capacity", "quota", "throttle", "ratelimit", "5xx", "slow", "auth", "forbidden", "html",
               "garbage", "truncated", "shape")
# "html": what a proxy or load balancer in front of the API answers instead of Compute's JSON.
# A 200 whose body is no answer: "garbage" is not JSON (nothing is done), "truncated" is the real
# answer cut short (the call took effect), "shape" is JSON of the wrong shape (nothing is done).
GARBAGE_KINDS = ("garbage", "truncated", "shape")
GARBAGE = b"\x00\x01<<not an answer>> \xff\xfe garbage"
WRONG_SHAPE = b'[{"kind": 7, "items": "none", "id": {"not": "a number"}}]'
HTML_PAGE = (b"<!DOCTYPE html>\n<html lang=en><meta charset=utf-8><title>Error 502 (Server Error)!!1</title>"
             b"<p><b>502.</b> <ins>That's an error.</ins><p>The server encountered a temporary error and "
             b"could not complete your request.<p>Please try again in 30 seconds.</html>\n")
OP_FAULTS = ("capacity", "quota")

NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
METADATA_KEY_RE = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
RESERVATION_KEY = "compute.googleapis.com/reservation-name"

# machine type → (vCPUs, memory GB, built-in accelerator type, built-in count)
BUILTIN_MACHINE_TYPES: dict[str, tuple[int, float, str, int]] = {
    "a3-highgpu-8g": (208, 1872, "nvidia-h100-80gb", 8),
    "a3-megagpu-8g": (208, 1872, "nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": (224, 2952, "nvidia-h200-141gb", 8),
    "a2-highgpu-1g": (12, 85, "nvidia-tesla-a100", 1),
    "a2-highgpu-2g": (24, 170, "nvidia-tesla-a100", 2),
    "a2-highgpu-4g": (48, 340, "nvidia-tesla-a100", 4),
    "a2-highgpu-8g": (96, 680, "nvidia-tesla-a100", 8),
    "a2-megagpu-16g": (96, 1360, "nvidia-tesla-a100", 16),
    "a2-ultragpu-1g": (12, 170, "nvidia-a100-80gb", 1),
    "a2-ultragpu-8g": (96, 1360, "nvidia-a100-80gb", 8),
    "g2-standard-4": (4, 16, "nvidia-l4", 1),
    "g2-standard-8": (8, 32, "nvidia-l4", 1),
    "g2-standard-12": (12, 48, "nvidia-l4", 1),
    "g2-standard-16": (16, 64, "nvidia-l4", 1),
    "g2-standard-24": (24, 96, "nvidia-l4", 2),
    "g2-standard-32": (32, 128, "nvidia-l4", 1),
    "g2-standard-48": (48, 192, "nvidia-l4", 4),
    "g2-standard-96": (96, 384, "nvidia-l4", 8),
    **{f"n1-standard-{n}": (n, n * 3.75, "", 0) for n in (1, 2, 4, 8, 16, 32, 64, 96)},
    **{f"n1-highmem-{n}": (n, n * 6.5, "", 0) for n in (2, 4, 8, 16, 32, 64, 96)},
}
ATTACHABLE_ACCELERATORS = ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100", "nvidia-tesla-p4")


class HttpError(Exception):
    """An error answer in Compute's JSON shape."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"message": self.message, "domain": "global", "reason": self.reason}]}}


def _check_flex_start(body: dict, sched: dict) -> None:
    """A flex-start VM as Compute Engine takes it: a maxRunDuration of at most seven days, deleted
    at its end, terminated on host maintenance, never restarted, never in a reservation."""
    seconds = int((sched.get("maxRunDuration") or {}).get("seconds") or 0)
    if not sched.get("maxRunDuration"):
        raise HttpError(400, "required", "Required field 'resource.scheduling.maxRunDuration' not specified")
    if not 0 < seconds <= 7 * 24 * 3600:
        raise _invalid("resource.scheduling.maxRunDuration.seconds", seconds,
                       "The max run duration of a FLEX_START instance must be between 1 second and 7 days.")
    if sched.get("instanceTerminationAction") != "DELETE":
        raise _invalid("resource.scheduling.instanceTerminationAction", sched.get("instanceTerminationAction"),
                       "FLEX_START instances must use the DELETE termination action.")
    if sched.get("automaticRestart") or sched.get("onHostMaintenance", "TERMINATE") != "TERMINATE":
        raise _invalid("resource.scheduling", "", "FLEX_START instances must have automaticRestart false and "
                                                  "onHostMaintenance TERMINATE.")
    aff = (body.get("reservationAffinity") or {}).get("consumeReservationType", "NO_RESERVATION")
    if aff != "NO_RESERVATION":
        raise _invalid("resource.reservationAffinity.consumeReservationType", aff,
                       "FLEX_START instances cannot consume reservations.")


def _invalid(field_: str, value: Any, why: str) -> HttpError:
    return HttpError(400, "invalid", f"Invalid value for field '{field_}': '{value}'. {why}")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def _tail(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _builtin_accelerator(row: dict) -> str:
    """Compute's accelerator type name for a catalog row's GPU model."""
    gpu, mem = (row.get("gpu") or "").strip().upper(), (row.get("gpu_memory_gb") or "").strip()
    known = {"H100": "nvidia-h100-80gb", "H200": "nvidia-h200-141gb", "L4": "nvidia-l4", "B200": "nvidia-b200",
             "A100": "nvidia-a100-80gb" if mem.startswith("80") else "nvidia-tesla-a100"}
    return known.get(gpu, f"nvidia-{gpu.lower()}")


def _load_catalog_types() -> tuple[dict[str, tuple[int, float, str, int]], set[str]]:
    """GCP machine types and attachable accelerators named by the bundled catalog, if present."""
    types: dict[str, tuple[int, float, str, int]] = {}
    accels: set[str] = set()
    try:
        with CATALOG.open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if (row.get("provider") or "").strip() != "gcp":
                    continue
                accel = (row.get("accelerator_type") or "").strip()
                name = (row.get("machine_type") or "").strip() or (row.get("instance_type") or "").strip()
                if not name:
                    continue
                if accel:
                    accels.add(accel)
                    types.setdefault(name, (int(float(row.get("vcpus") or 0)), float(row.get("ram_gb") or 0), "", 0))
                else:
                    types.setdefault(name, (int(float(row.get("vcpus") or 0)), float(row.get("ram_gb") or 0),
                                            _builtin_accelerator(row), int(float(row.get("gpus") or 0))))
    except (OSError, ValueError, csv.Error):
        pass
    return types, accels


# ---------------------------------------------------------------------------------------------
# Filters: the subset of AIP-160 / Compute list filters that clients use.

_TOKEN_RE = re.compile(
    r"""\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<and>AND\b)|(?P<or>OR\b)|(?P<not>NOT\b)
    |(?P<cmp>(?P<field>[A-Za-z_][\w.\-]*)\s*(?P<op>!=|=|:|\beq\b|\bne\b)\s*
       (?P<value>"(?:[^"\\]|\\.)*"|[^\s()]+)))""",
    re.X,
)


def _lookup(resource: dict, path: str) -> Any:
    cur: Any = resource
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return None
    return cur


def _as_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


def compile_filter(expr: str) -> Callable[[dict], bool]:
    """Parse a Compute list filter; raise HttpError(400) if it is not one."""
    text = (expr or "").strip()
    if not text:
        return lambda r: True
    tokens: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise _invalid("filter", expr, "Invalid list filter expression.")
        pos = m.end()
        if m.group("cmp"):
            raw = m.group("value")
            value = json.loads(raw) if raw.startswith('"') else raw
            tokens.append(("cmp", (m.group("field"), m.group("op"), value)))
        else:
            tokens.append((next(k for k in ("lp", "rp", "and", "or", "not") if m.group(k)), None))

    def cmp(field_: str, op: str, value: str) -> Callable[[dict], bool]:
        def test(r: dict) -> bool:
            actual = _lookup(r, field_)
            if op == ":":
                if value == "*":
                    return actual is not None
                if isinstance(actual, (list, dict)):
                    return value in actual
                return value in _as_text(actual)
            if op in ("eq", "ne"):
                hit = actual is not None and re.fullmatch(value, _as_text(actual)) is not None
                return hit if op == "eq" else not hit
            hit = actual is not None and _as_text(actual) == value
            return hit if op == "=" else not hit
        return test

    i = 0

    def peek() -> str:
        return tokens[i][0] if i < len(tokens) else ""

    def factor() -> Callable[[dict], bool]:
        nonlocal i
        kind = peek()
        if kind == "not":
            i += 1
            inner = factor()
            return lambda r: not inner(r)
        if kind == "lp":
            i += 1
            inner = conj()
            if peek() != "rp":
                raise _invalid("filter", expr, "Invalid list filter expression.")
            i += 1
            return inner
        if kind == "cmp":
            i += 1
            return cmp(*tokens[i - 1][1])
        raise _invalid("filter", expr, "Invalid list filter expression.")

    def disj() -> Callable[[dict], bool]:
        nonlocal i
        parts = [factor()]
        while peek() == "or":
            i += 1
            parts.append(factor())
        return lambda r: any(p(r) for p in parts)

    def conj() -> Callable[[dict], bool]:
        nonlocal i
        parts = [disj()]
        while peek() in ("and", "lp", "cmp", "not"):
            if peek() == "and":
                i += 1
            parts.append(disj())
        return lambda r: all(p(r) for p in parts)

    result = conj()
    if i != len(tokens):
        raise _invalid("filter", expr, "Invalid list filter expression.")
    return result


# ---------------------------------------------------------------------------------------------


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int = 0
    fault: str = ""


@dataclass
class Fault:
    kind: str
    times: int
    match: str = ""
    seconds: float = 0.0


@dataclass
class _Op:
    name: str
    project: str
    zone: str  # the zone, or the region of a regional operation
    op_type: str
    target: str  # the target resource's name
    target_id: str
    request_id: str = ""
    polls: int = 0
    born: float = field(default_factory=time.monotonic)
    status: str = "PENDING"
    insert_time: str = field(default_factory=_now)
    end_time: str = ""
    error_code: str = ""
    error_message: str = ""
    http_status: int = 0
    status_message: str = ""
    user: str = "broker@example.iam.gserviceaccount.com"
    seq: int = 0
    regional: bool = False
    target_kind: str = "instances"
    bulk: list = field(default_factory=list)  # (zone, name) of the instances a bulkInsert creates
    extra: dict = field(default_factory=dict)  # further fields of the operation's resource

    def json(self) -> dict:
        scope = "regions" if self.regional else "zones"
        zone_link = f"{LINK}/projects/{self.project}/{scope}/{self.zone}"
        out: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(abs(hash(self.name)) % (10**18)),
            "name": self.name,
            "region" if self.regional else "zone": zone_link,
            "operationType": self.op_type,
            "targetLink": f"{zone_link}/{self.target_kind}/{self.target}",
            "targetId": self.target_id,
            "status": self.status,
            "user": self.user,
            "progress": {"PENDING": 0, "RUNNING": 50, "DONE": 100}[self.status],
            "insertTime": self.insert_time,
            "startTime": self.insert_time,
            "selfLink": f"{zone_link}/operations/{self.name}",
        }
        if self.request_id:
            out["clientOperationId"] = self.request_id
        if self.status_message:
            out["statusMessage"] = self.status_message
        if self.op_type == "bulkInsert":
            out["targetLink"] = zone_link
        out.update(self.extra)
        if self.status == "DONE":
            out["endTime"] = self.end_time
            if self.error_code:
                out["error"] = {"errors": [{"code": self.error_code, "message": self.error_message}]}
                out["httpErrorStatusCode"] = self.http_status
                out["httpErrorMessage"] = {403: "FORBIDDEN", 503: "SERVICE UNAVAILABLE",
                                           400: "BAD REQUEST"}.get(self.http_status, "ERROR")
        return out


class FakeGcpCompute(GcpMarketMixin, LoopbackServer):
    """A threaded Compute REST server on 127.0.0.1 (an ephemeral port unless ``port`` is given)."""

    thread_name = "fake-gcp"

    def __init__(self, project: str = "test-project", *, port: int = 0, page_size: int = 500,
                 op_seconds: float = 1.0, slow_seconds: float = 2.0) -> None:
        self.project = project
        self.page_size = page_size
        self.op_seconds = op_seconds
        self.slow_seconds = slow_seconds
        self._port = port
        self._lock = threading.RLock()
        types, accels = _load_catalog_types()
        self.machine_types: dict[str, tuple[int, float, str, int]] = {**types, **BUILTIN_MACHINE_TYPES}
        self.accelerator_types: set[str] = set(ATTACHABLE_ACCELERATORS) | accels | {
            a for (_, _, a, _) in BUILTIN_MACHINE_TYPES.values() if a}
        self.reset()

    # -- lifecycle -----------------------------------------------------------------------------

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_handler(self)

    def reset(self) -> None:
        """Forget every instance, operation, reservation, fault and logged call."""
        with self._lock:
            self._instances: dict[tuple[str, str], dict] = {}  # (zone, name) → resource
            self._ops: dict[tuple[str, str], _Op] = {}  # (zone, op name) → op
            self._open: dict[tuple[str, str], _Op] = {}  # the ops not DONE yet: each request ticks these
            self._op_zones: set[str] = set()
            self._by_request: dict[tuple[str, str], str] = {}  # (zone, requestId) → op name
            self._reservations: dict[tuple[str, str], dict] = {}
            self._policies: dict[tuple[str, str], dict] = {}  # (region, name) → resource policy
            self._capacity: dict[tuple[str, str], int] = {}  # (machine type, zone or "") → VMs Compute has
            self._faults: list[Fault] = []
            self._rate: tuple[float, tuple[str, ...], random.Random] | None = None
            self.calls: list[Call] = []
            self._seq = 0
            self._ip = 1
            self._reset_market()

    # -- test controls -------------------------------------------------------------------------

    def set_capacity(self, machine_type: str, zone: str, count: int) -> None:
        """Compute has room for ``count`` VMs of ``machine_type`` in ``zone`` ("" for every zone)
        for a bulkInsert: a zone with fewer than the request's ``minCount`` is not chosen, and a
        request no allowed zone can take fails with ``ZONE_RESOURCE_POOL_EXHAUSTED``."""
        with self._lock:
            self._capacity[(machine_type, zone)] = count

    def inject(self, kind: str, times: int = 1, match: str = "", seconds: float | None = None) -> None:
        """Fail the next ``times`` matching calls. ``match`` is a substring of
        ``"METHOD /path name"`` (name = the inserted instance's); "" matches every call.
        capacity/quota apply to instance inserts only (the operation ends in that error)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {FAULT_KINDS}")
        with self._lock:
            self._faults.append(Fault(kind, times, match, self.slow_seconds if seconds is None else seconds))

    def fail_rate(self, p: float, kinds: tuple[str, ...] | list[str] = ("5xx",), seed: int = 0) -> None:
        """Fail each call with probability ``p`` with one of ``kinds`` (p=0 turns it off)."""
        bad = [k for k in kinds if k not in FAULT_KINDS]
        if bad:
            raise ValueError(f"unknown fault kinds {bad}")
        with self._lock:
            self._rate = (p, tuple(kinds), random.Random(seed)) if p > 0 else None

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._rate = None

    def add_reservation(self, zone: str, name: str, machine_type: str, count: int,
                        accelerator: str = "", accelerator_count: int = 0) -> None:
        with self._lock:
            self._reservations[(zone, name)] = {"machineType": machine_type, "count": count,
                                                "accelerator": accelerator,
                                                "accelerator_count": accelerator_count}

    def seed_instance(self, zone: str, name: str, *, labels: dict[str, str] | None = None,
                      machine_type: str = "n1-standard-4", status: str = "RUNNING", **extra: Any) -> dict:
        """Put an instance in place without going through insert (someone else's VM)."""
        with self._lock:
            inst = self._new_instance(zone, {"name": name, "machineType": f"zones/{zone}/machineTypes/{machine_type}",
                                             "labels": labels or {}, **extra})
            inst["status"] = status
            self._instances[(zone, name)] = inst
            return json.loads(json.dumps(inst))

    def instances(self) -> list[dict]:
        """Every instance as the API would return it (copies)."""
        with self._lock:
            self._tick_all()
            return [json.loads(json.dumps(i)) for i in self._instances.values()]

    def instance(self, name: str, zone: str | None = None) -> dict | None:
        return next((i for i in self.instances() if i["name"] == name
                     and (zone is None or _tail(i["zone"]) == zone)), None)

    def operations(self, op_type: str | None = None) -> list[dict]:
        with self._lock:
            return [o.json() for o in sorted(self._ops.values(), key=lambda o: o.seq)
                    if op_type is None or o.op_type == op_type]

    def calls_to(self, method: str, path_suffix: str = "") -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method and c.path.endswith(path_suffix)]

    @property
    def insert_count(self) -> int:
        """Instance inserts that reached the API (de-duplicated retries included)."""
        return len([c for c in self.calls_to("POST", "/instances")])

    def interrupt(self, name: str, zone: str | None = None, *, keep: bool = False, stopping: bool = False) -> dict:
        """Preempt a spot VM like the cloud does: TERMINATED with lastStopTimestamp, a DONE
        ``compute.instances.preempted`` operation, then deleted when its termination action
        is DELETE (unless ``keep``). Returns the operation.

        ``stopping``: only the start of it, as the guest's ~30 s of ACPI soft-off: the operation
        is recorded and the VM is STOPPING; :meth:`finish_preemption` ends it."""
        with self._lock:
            if stopping:
                self._tick_all()
                key = next((k for k in self._instances if k[1] == name and (zone is None or k[0] == zone)), None)
                if key is None:
                    raise KeyError(f"no instance {name!r}")
                inst = self._instances[key]
                inst["status"] = "STOPPING"
                op = self._new_op(key[0], "compute.instances.preempted", name, inst["id"])
                op.status, op.end_time = "DONE", _now()
                op.status_message = "Instance was preempted."
                op.user = "system"
                return op.json()
            return self._preempt(name, zone, keep)

    def finish_preemption(self, name: str, zone: str | None = None, *, keep: bool = False) -> None:
        """The end of a preemption started with ``interrupt(stopping=True)``."""
        with self._lock:
            key = next((k for k in self._instances if k[1] == name and (zone is None or k[0] == zone)), None)
            if key is None:
                raise KeyError(f"no instance {name!r}")
            inst = self._instances[key]
            inst["status"] = "TERMINATED"
            inst["lastStopTimestamp"] = _now()
            if inst.get("scheduling", {}).get("instanceTerminationAction") == "DELETE" and not keep:
                del self._instances[key]

    def _preempt(self, name: str, zone: str | None, keep: bool) -> dict:
        with self._lock:
            self._tick_all()
            key = next((k for k in self._instances if k[1] == name and (zone is None or k[0] == zone)), None)
            if key is None:
                raise KeyError(f"no instance {name!r}")
            inst = self._instances[key]
            sched = inst.get("scheduling", {})
            if sched.get("provisioningModel") != "SPOT" and not sched.get("preemptible"):
                raise ValueError(f"{name} is not a spot VM; only spot VMs are preempted")
            inst["status"] = "TERMINATED"
            inst["lastStopTimestamp"] = _now()
            op = self._new_op(key[0], "compute.instances.preempted", name, inst["id"])
            op.status, op.end_time = "DONE", _now()
            op.status_message = "Instance was preempted."
            op.user = "system"
            if sched.get("instanceTerminationAction") == "DELETE" and not keep:
                del self._instances[key]
            return op.json()

    # -- request handling ----------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, body_bytes: bytes) -> tuple[int, dict]:
        parts = urlsplit(raw_path)
        path = parts.path
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        try:
            body = json.loads(body_bytes) if body_bytes else None
        except ValueError:
            body = None
        call = Call(method, path, query, body)
        with self._lock:
            self.calls.append(call)
            fault = self._take_fault(method, path, body)
        call.fault = fault.kind if fault else ""
        if fault and fault.kind == "slow":
            time.sleep(fault.seconds)
            fault = None
        if fault and fault.kind == "html":
            call.status = 502
            return 502, HTML_PAGE
        if fault and fault.kind in ("garbage", "shape"):
            call.status = 200
            return 200, GARBAGE if fault.kind == "garbage" else WRONG_SHAPE
        try:
            if fault and fault.kind not in (*OP_FAULTS, "truncated"):
                raise self._fault_error(fault.kind)
            status, out = self._route(method, path, query, body, None if fault and fault.kind == "truncated" else fault)
        except HttpError as e:
            status, out = e.status, e.body()
        call.status = status
        if fault and fault.kind == "truncated":
            whole = json.dumps(out).encode()
            return 200, whole[:len(whole) // 2]
        return status, out

    def _fault_error(self, kind: str) -> HttpError:
        if kind == "throttle":
            return HttpError(429, "rateLimitExceeded",
                             "Rate Limit Exceeded: too many requests for project, try again later.")
        if kind == "ratelimit":  # Compute's documented rate-quota answer: 403 rateLimitExceeded
            return HttpError(403, "rateLimitExceeded",
                             "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'.")
        if kind == "5xx":
            return HttpError(503, "backendError", "Internal error. Please try again or contact Google Support.")
        if kind == "auth":
            return HttpError(401, "authError", "Request had invalid authentication credentials.")
        return HttpError(403, "forbidden", f"Required 'compute.instances.create' permission for "
                                           f"'projects/{self.project}'")

    def _take_fault(self, method: str, path: str, body: Any) -> Fault | None:
        is_insert = method == "POST" and path.endswith("/instances")
        subject = f"{method} {path} {body.get('name', '') if isinstance(body, dict) else ''}"
        for f in self._faults:
            if f.times > 0 and f.match in subject and (is_insert or f.kind not in OP_FAULTS):
                f.times -= 1
                return f
        if self._rate:
            p, kinds, rng = self._rate
            usable = [k for k in kinds if is_insert or k not in OP_FAULTS]
            if usable and rng.random() < p:
                return Fault(rng.choice(usable), 0, "", self.slow_seconds)
        return None

    def _route(self, method: str, path: str, query: dict, body: Any, fault: Fault | None) -> tuple[int, dict]:
        for verb, pattern, name in ROUTES:
            m = pattern.fullmatch(path)
            if m and verb == method:
                args = m.groupdict()
                if args.pop("project") != self.project:
                    raise HttpError(404, "notFound", f"The resource 'projects/{m.group('project')}' was not found")
                with self._lock:
                    self._tick_all()
                    return getattr(self, name)(query=query, body=body, fault=fault, **args)
        raise HttpError(404, "notFound", f"The requested URL {path} was not found on this server.")

    # -- operations ----------------------------------------------------------------------------

    def _new_op(self, zone: str, op_type: str, target: str, target_id: str, request_id: str = "",
                regional: bool = False) -> _Op:
        self._seq += 1
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}"
        op = _Op(name, self.project, zone, op_type, target, target_id, request_id, seq=self._seq,
                 regional=regional, target_kind="resourcePolicies" if regional else "instances")
        self._ops[(zone, name)] = self._open[(zone, name)] = op
        self._op_zones.add(zone)
        if request_id:
            self._by_request[(zone, request_id)] = name
        return op

    def _tick_all(self) -> None:
        for key, op in list(self._open.items()):
            self._advance(op, step=False)
            if op.status == "DONE":
                del self._open[key]

    def _advance(self, op: _Op, step: bool) -> None:
        if op.status == "DONE":
            return
        if step:
            op.polls += 1
        age = time.monotonic() - op.born
        new = ("DONE" if op.polls >= 2 or age >= self.op_seconds
               else "RUNNING" if op.polls >= 1 or age >= self.op_seconds / 2 else "PENDING")
        if new == op.status:
            return
        op.status = new
        if op.regional:
            if new == "DONE":
                op.end_time = _now()
                for zone, name in op.bulk:
                    inst = self._instances.get((zone, name))
                    if inst is not None and not op.error_code:
                        inst["status"] = "RUNNING"
                        inst["lastStartTimestamp"] = op.end_time
                policy = self._policies.get((op.zone, op.target))
                if policy is not None and op.op_type == "insert" and not op.error_code:
                    policy["status"] = "READY"
                elif policy is not None and op.op_type == "delete":
                    del self._policies[(op.zone, op.target)]
            return
        inst = self._instances.get((op.zone, op.target))
        if new == "RUNNING" and inst is not None:
            inst["status"] = "STAGING" if op.op_type == "insert" else "STOPPING"
        if new == "DONE":
            op.end_time = _now()
            if op.op_type == "insert" and inst is not None and not op.error_code:
                inst["status"] = "RUNNING"
                inst["lastStartTimestamp"] = op.end_time
            elif op.op_type == "delete" and inst is not None and inst["id"] == op.target_id:
                del self._instances[(op.zone, op.target)]

    def _op(self, zone: str, operation: str) -> _Op:
        op = self._ops.get((zone, operation))
        if op is None:
            raise HttpError(404, "notFound",
                            f"The resource 'projects/{self.project}/zones/{zone}/operations/{operation}' was not found")
        return op

    def get_region_operation(self, *, region: str, operation: str, **_: Any) -> tuple[int, dict]:
        return self.get_operation(zone=region, operation=operation)

    def wait_region_operation(self, *, region: str, operation: str, **_: Any) -> tuple[int, dict]:
        return self.wait_operation(zone=region, operation=operation)

    # -- resource policies (compact placement) -------------------------------------------------

    def policies(self) -> list[dict]:
        with self._lock:
            self._tick_all()
            return [json.loads(json.dumps(p)) for p in self._policies.values()]

    def _policy(self, region: str, name: str) -> dict:
        policy = self._policies.get((region, name))
        if policy is None:
            raise HttpError(404, "notFound", f"The resource 'projects/{self.project}/regions/{region}/"
                                             f"resourcePolicies/{name}' was not found")
        return policy

    def insert_policy(self, *, region: str, query: dict, body: Any, **_: Any) -> tuple[int, dict]:
        rid = self._check_request_id(query)
        if rid and (region, rid) in self._by_request:
            return 200, self._ops[(region, self._by_request[(region, rid)])].json()
        if not isinstance(body, dict) or not body.get("name"):
            raise HttpError(400, "required", "Required field 'resource.name' not specified")
        name = body["name"]
        if not NAME_RE.match(name):
            raise _invalid("resource.name", name, "Must be a match of regex '[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?'")
        placement = body.get("groupPlacementPolicy") or {}
        if placement.get("collocation") not in (None, "COLLOCATED", "UNSPECIFIED_COLLOCATION"):
            raise _invalid("resource.groupPlacementPolicy.collocation", placement.get("collocation"),
                           "Unknown collocation.")
        if (region, name) in self._policies:
            raise HttpError(409, "alreadyExists", f"The resource 'projects/{self.project}/regions/{region}/"
                                                  f"resourcePolicies/{name}' already exists")
        link = f"{LINK}/projects/{self.project}/regions/{region}/resourcePolicies/{name}"
        policy = {**json.loads(json.dumps(body)), "kind": "compute#resourcePolicy", "id": str(random.getrandbits(62)),
                  "creationTimestamp": _now(), "region": f"{LINK}/projects/{self.project}/regions/{region}",
                  "selfLink": link, "status": "CREATING"}
        self._policies[(region, name)] = policy
        op = self._new_op(region, "insert", name, policy["id"], rid, regional=True)
        return 200, op.json()

    def get_policy(self, *, region: str, name: str, **_: Any) -> tuple[int, dict]:
        return 200, self._policy(region, name)

    def delete_policy(self, *, region: str, name: str, query: dict, **_: Any) -> tuple[int, dict]:
        rid = self._check_request_id(query)
        if rid and (region, rid) in self._by_request:
            return 200, self._ops[(region, self._by_request[(region, rid)])].json()
        policy = self._policy(region, name)
        users = [n for (_z, n), i in self._instances.items()
                 if any(_tail(p) == name for p in i.get("resourcePolicies") or [])]
        if users:
            raise HttpError(400, "resourceInUseByAnotherResource",
                            f"The resource_policy resource '{policy['selfLink']}' is already being used by "
                            f"'{users[0]}'")
        op = self._new_op(region, "delete", name, policy["id"], rid, regional=True)
        return 200, op.json()

    def get_operation(self, *, zone: str, operation: str, **_: Any) -> tuple[int, dict]:
        op = self._op(zone, operation)
        self._advance(op, step=True)
        return 200, op.json()

    def wait_operation(self, *, zone: str, operation: str, **_: Any) -> tuple[int, dict]:
        op = self._op(zone, operation)
        while op.status != "DONE":
            self._advance(op, step=True)
        return 200, op.json()

    def list_operations(self, *, zone: str, query: dict, **_: Any) -> tuple[int, dict]:
        keep = compile_filter(query.get("filter", ""))
        ops = [o.json() for o in sorted(self._ops.values(), key=lambda o: o.seq) if o.zone == zone]
        page, token = self._page([o for o in ops if keep(o)], query)
        out = {"kind": "compute#operationList", "id": f"projects/{self.project}/zones/{zone}/operations",
               "items": page, "selfLink": f"{LINK}/projects/{self.project}/zones/{zone}/operations"}
        if token:
            out["nextPageToken"] = token
        return 200, out

    # -- instances -----------------------------------------------------------------------------

    def _page(self, items: list, query: dict) -> tuple[list, str]:
        try:
            size = int(query.get("maxResults") or self.page_size)
            start = int(base64.urlsafe_b64decode(query["pageToken"]).decode()) if query.get("pageToken") else 0
        except (ValueError, UnicodeDecodeError):
            raise _invalid("pageToken", query.get("pageToken"), "Invalid page token.") from None
        size = max(1, min(size, 500))
        end = start + size
        token = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else ""
        return items[start:end], token

    def list_instances(self, *, zone: str, query: dict, **_: Any) -> tuple[int, dict]:
        keep = compile_filter(query.get("filter", ""))
        items = [i for (z, _n), i in sorted(self._instances.items()) if z == zone and keep(i)]
        page, token = self._page(items, query)
        out: dict[str, Any] = {"kind": "compute#instanceList",
                               "id": f"projects/{self.project}/zones/{zone}/instances",
                               "selfLink": f"{LINK}/projects/{self.project}/zones/{zone}/instances"}
        if page:
            out["items"] = page
        if token:
            out["nextPageToken"] = token
        return 200, out

    def aggregated_instances(self, *, query: dict, **_: Any) -> tuple[int, dict]:
        keep = compile_filter(query.get("filter", ""))
        rows = [(z, i) for (z, _n), i in sorted(self._instances.items()) if keep(i)]
        page, token = self._page(rows, query)
        items: dict[str, dict] = {}
        for z, inst in page:
            items.setdefault(f"zones/{z}", {"instances": []})["instances"].append(inst)
        for z in sorted({z for (z, _n) in self._instances} | self._op_zones):
            items.setdefault(f"zones/{z}", {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope "
                f"'zones/{z}' on this page.", "data": [{"key": "scope", "value": f"zones/{z}"}]}})
        out: dict[str, Any] = {"kind": "compute#instanceAggregatedList",
                               "id": f"projects/{self.project}/aggregated/instances", "items": items,
                               "selfLink": f"{LINK}/projects/{self.project}/aggregated/instances"}
        if token:
            out["nextPageToken"] = token
        return 200, out

    def _instance(self, zone: str, name: str) -> dict:
        inst = self._instances.get((zone, name))
        if inst is None:
            raise HttpError(404, "notFound",
                            f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found")
        return inst

    def get_instance(self, *, zone: str, name: str, **_: Any) -> tuple[int, dict]:
        return 200, self._instance(zone, name)

    def delete_instance(self, *, zone: str, name: str, query: dict, **_: Any) -> tuple[int, dict]:
        rid = self._check_request_id(query)
        if rid and (zone, rid) in self._by_request:
            return 200, self._ops[(zone, self._by_request[(zone, rid)])].json()
        inst = self._instance(zone, name)
        op = self._new_op(zone, "delete", name, inst["id"], rid)
        return 200, op.json()

    def _check_request_id(self, query: dict) -> str:
        rid = query.get("requestId", "")
        if rid:
            try:
                ok = uuid.UUID(rid).int != 0
            except ValueError:
                ok = False
            if not ok:
                raise _invalid("requestId", rid, "The request ID must be a valid UUID with the exception that "
                                                 "zero UUID is not supported "
                                                 "(00000000-0000-0000-0000-000000000000).")
        return rid

    def insert_instance(self, *, zone: str, query: dict, body: Any, fault: Fault | None, **_: Any) -> tuple[int, dict]:
        rid = self._check_request_id(query)
        if rid and (zone, rid) in self._by_request:
            return 200, self._ops[(zone, self._by_request[(zone, rid)])].json()
        if not isinstance(body, dict):
            raise HttpError(400, "parseError", "Parse Error")
        self._validate(zone, body)
        name = body["name"]
        if (zone, name) in self._instances:
            raise HttpError(409, "alreadyExists",
                            f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists")
        if fault and fault.kind in OP_FAULTS:
            op = self._new_op(zone, "insert", name, str(random.getrandbits(62)), rid)
            if fault.kind == "capacity":
                op.error_code, op.http_status = "ZONE_RESOURCE_POOL_EXHAUSTED", 503
                op.error_message = (f"The zone 'projects/{self.project}/zones/{zone}' does not have enough "
                                    "resources available to fulfill the request.  Try a different zone, "
                                    "or try again later.")
            else:
                op.error_code, op.http_status = "QUOTA_EXCEEDED", 403
                op.error_message = "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."
            return 200, op.json()
        inst = self._new_instance(zone, body)
        self._instances[(zone, name)] = inst
        op = self._new_op(zone, "insert", name, inst["id"], rid)
        return 200, op.json()

    def bulk_insert_region(self, *, region: str, query: dict, body: Any, **_: Any) -> tuple[int, dict]:
        """``regionInstances.bulkInsert``: ``count`` VMs of ``instanceProperties`` named by
        ``perInstanceProperties`` (or ``namePattern``) in one zone the ``locationPolicy`` allows
        (the first, in the order given, with room for ``minCount``); all of them or none. The
        answer is a regional operation whose ``instancesBulkInsertOperationMetadata`` gives what
        each location got."""
        rid = self._check_request_id(query)
        if rid and (region, rid) in self._by_request:
            return 200, self._ops[(region, self._by_request[(region, rid)])].json()
        if not isinstance(body, dict):
            raise HttpError(400, "parseError", "Parse Error")
        count = int(body.get("count") or 0)
        minimum = int(body.get("minCount") or count)
        if count < 1:
            raise _invalid("bulkInsertInstanceResource.count", count, "Count must be a positive number.")
        if not 1 <= minimum <= count:
            raise _invalid("bulkInsertInstanceResource.minCount", minimum, "minCount must be between 1 and count.")
        per = body.get("perInstanceProperties") or {}
        pattern = body.get("namePattern") or ""
        if not per and not pattern:
            raise HttpError(400, "required", "Either namePattern or perInstanceProperties must be specified.")
        if len(per) > count or (len(per) < count and not pattern):
            raise _invalid("bulkInsertInstanceResource.perInstanceProperties", len(per),
                           "The number of perInstanceProperties must not exceed count; without namePattern "
                           "it must equal count.")
        props = body.get("instanceProperties")
        if not isinstance(props, dict):
            raise HttpError(400, "required", "Required field 'instanceProperties' not specified")
        policy = body.get("locationPolicy") or {}
        zones = [k.split("/", 1)[-1] for k, v in (policy.get("locations") or {}).items()
                 if (v or {}).get("preference", "ALLOW") != "DENY"]
        if not zones:
            raise HttpError(400, "required", "Required field 'locationPolicy.locations' not specified")
        for z in zones:
            if z.rsplit("-", 1)[0] != region:
                raise _invalid("locationPolicy.locations", f"zones/{z}", f"Zone is not in region '{region}'.")
        if policy.get("targetShape", "ANY") not in ("ANY", "ANY_SINGLE_ZONE", "BALANCED"):
            raise _invalid("locationPolicy.targetShape", policy.get("targetShape"), "Unknown target shape.")
        names = [str((v or {}).get("name") or k) for k, v in per.items()]
        width = len(max(re.findall(r"#+", pattern) or [""], key=len))
        number = 1
        while len(names) < count:
            generated = re.sub(r"#+", str(number).zfill(width), pattern, count=1)
            number += 1
            if generated not in names:
                names.append(generated)
        mt = _tail(str(props.get("machineType", "")))
        bodies = {z: [self._bulk_body(region, z, props, name) for name in names] for z in zones}
        for z, bs in bodies.items():
            for b in bs:
                self._validate(z, b)
                if any((zz, b["name"]) in self._instances for zz in zones):
                    raise HttpError(409, "alreadyExists", f"The resource 'projects/{self.project}/zones/{z}/"
                                                          f"instances/{b['name']}' already exists")
        op = self._new_op(region, "bulkInsert", "", str(random.getrandbits(62)), rid, regional=True)
        status: dict[str, dict] = {}
        chosen = ""
        for z in zones:
            room = self._capacity.get((mt, z), self._capacity.get((mt, ""), count))
            if not chosen and room >= minimum:
                chosen, made = z, min(count, room)
                status[f"zones/{z}"] = {"status": "FULFILLED", "targetVmCount": count, "createdVmCount": made,
                                        "failedToCreateVmCount": 0, "deletedVmCount": 0}
            else:
                status[f"zones/{z}"] = {"status": "SKIPPED" if chosen else "FAILED", "targetVmCount": count,
                                        "createdVmCount": 0, "failedToCreateVmCount": 0 if chosen else count,
                                        "deletedVmCount": 0}
        op.extra = {"instancesBulkInsertOperationMetadata": {"perLocationStatus": status}}
        if not chosen:
            op.error_code, op.http_status = "ZONE_RESOURCE_POOL_EXHAUSTED", 503
            op.error_message = (f"The zones {', '.join(zones)} do not have enough resources available to fulfill "
                                f"the request for {minimum} {mt}.  Try a different zone, or try again later.")
            return 200, op.json()
        for b in bodies[chosen][:made]:
            inst = self._new_instance(chosen, b)
            self._instances[(chosen, b["name"])] = inst
            op.bulk.append((chosen, b["name"]))
        return 200, op.json()

    def _bulk_body(self, region: str, zone: str, props: dict, name: str) -> dict:
        """One VM of a bulkInsert: its ``instanceProperties`` with the zonal URLs an insert names."""
        b = json.loads(json.dumps(props))
        b["name"] = name
        b["machineType"] = f"zones/{zone}/machineTypes/{_tail(str(b.get('machineType', '')))}"
        for d in b.get("disks") or []:
            init = d.get("initializeParams") or {}
            if init.get("diskType"):
                init["diskType"] = f"zones/{zone}/diskTypes/{_tail(init['diskType'])}"
        for acc in b.get("guestAccelerators") or []:
            acc["acceleratorType"] = f"zones/{zone}/acceleratorTypes/{_tail(acc.get('acceleratorType', ''))}"
        if b.get("resourcePolicies"):
            b["resourcePolicies"] = [f"projects/{self.project}/regions/{region}/resourcePolicies/{_tail(p)}"
                                     for p in b["resourcePolicies"]]
        return b

    def _new_instance(self, zone: str, body: dict) -> dict:
        inst = json.loads(json.dumps(body))
        zone_link = f"{LINK}/projects/{self.project}/zones/{zone}"
        self._ip += 1
        inst.update({
            "kind": "compute#instance",
            "id": str(random.getrandbits(62)),
            "creationTimestamp": _now(),
            "zone": zone_link,
            "status": "PROVISIONING",
            "selfLink": f"{zone_link}/instances/{body['name']}",
            "machineType": f"{zone_link}/machineTypes/{_tail(body.get('machineType', 'n1-standard-4'))}",
            "labelFingerprint": uuid.uuid4().hex[:12],
            "cpuPlatform": "Intel Cascade Lake",
        })
        sched = inst.setdefault("scheduling", {})
        sched.setdefault("provisioningModel", "STANDARD")
        sched.setdefault("onHostMaintenance", "MIGRATE")
        sched.setdefault("automaticRestart", sched["provisioningModel"] not in ("SPOT", "FLEX_START"))
        sched.setdefault("preemptible", False)
        for nic_i, nic in enumerate(inst.get("networkInterfaces") or [{}]):
            nic.update({"name": f"nic{nic_i}", "networkIP": f"10.128.{self._ip // 250}.{self._ip % 250 + 2}"})
        for d_i, disk in enumerate(inst.get("disks") or []):
            disk.pop("initializeParams", None)
            disk.update({"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE", "index": d_i,
                         "deviceName": "persistent-disk-0" if d_i == 0 else f"disk-{d_i}",
                         "source": f"{zone_link}/disks/{body['name']}" + ("" if d_i == 0 else f"-{d_i}")})
        for acc in inst.get("guestAccelerators") or []:
            acc["acceleratorType"] = f"{LINK}/projects/{self.project}/zones/{zone}/acceleratorTypes/" \
                                     f"{_tail(acc['acceleratorType'])}"
        meta = inst.setdefault("metadata", {})
        meta.update({"kind": "compute#metadata", "fingerprint": uuid.uuid4().hex[:12]})
        return inst

    def _validate(self, zone: str, body: dict) -> None:
        name = body.get("name")
        if not name:
            raise HttpError(400, "required", "Required field 'resource.name' not specified")
        if not NAME_RE.match(name):
            raise _invalid("resource.name", name, "Must be a match of regex "
                                                  "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'")
        mt_url = body.get("machineType")
        if not mt_url:
            raise HttpError(400, "required", "Required field 'resource.machineType' not specified")
        mt = _tail(mt_url)
        m = re.search(r"zones/([^/]+)/machineTypes/", mt_url)
        if m and m.group(1) != zone:
            raise _invalid("resource.machineType", mt_url, f"Machine type is not in zone '{zone}'.")
        if mt not in self.machine_types:
            raise _invalid("resource.machineType", mt_url,
                           f"Machine type with name '{mt}' does not exist in zone '{zone}'.")
        disks = body.get("disks") or []
        if not disks:
            raise HttpError(400, "required", "Required field 'resource.disks' not specified")
        boots = [d for d in disks if d.get("boot")]
        if len(boots) != 1:
            raise _invalid("resource.disks", "", "Exactly one boot disk must be specified.")
        if not (boots[0].get("source") or (boots[0].get("initializeParams") or {}).get("sourceImage")):
            raise HttpError(400, "required", "Required field 'resource.disks[0].initializeParams.sourceImage' "
                                             "not specified")
        if not body.get("networkInterfaces"):
            raise HttpError(400, "required", "Required field 'resource.networkInterfaces' not specified")
        self._validate_nics(_tail(body.get("machineType", "")), body["networkInterfaces"])
        sched = body.get("scheduling") or {}
        model = sched.get("provisioningModel", "STANDARD")
        spot = model == "SPOT" or sched.get("preemptible") is True
        if sched.get("instanceTerminationAction") and model not in ("SPOT", "FLEX_START"):
            raise _invalid("resource.scheduling.instanceTerminationAction", sched["instanceTerminationAction"],
                           "Instance termination action is only supported for SPOT and FLEX_START "
                           "provisioning models.")
        if model == "FLEX_START":
            _check_flex_start(body, sched)
        if sched.get("instanceTerminationAction") not in (None, "", "STOP", "DELETE"):
            raise _invalid("resource.scheduling.instanceTerminationAction", sched["instanceTerminationAction"],
                           "Unknown termination action.")
        if spot and sched.get("automaticRestart", False):
            raise _invalid("resource.scheduling.automaticRestart", "true",
                           "Scheduling must have preemptible be false when AutomaticRestart is true.")
        if spot and sched.get("onHostMaintenance", "TERMINATE") != "TERMINATE":
            raise _invalid("resource.scheduling.onHostMaintenance", sched.get("onHostMaintenance"),
                           "Scheduling must have preemptible be false when OnHostMaintenance isn't TERMINATE.")
        accels = body.get("guestAccelerators") or []
        _cpus, _mem, builtin, _n = self.machine_types[mt]
        for acc in accels:
            a_name = _tail(acc.get("acceleratorType", ""))
            if a_name not in self.accelerator_types:
                raise _invalid("resource.guestAccelerators[0].acceleratorType", acc.get("acceleratorType"),
                               f"Accelerator type '{a_name}' does not exist in zone '{zone}'.")
            if builtin:
                raise _invalid("resource.guestAccelerators", a_name,
                               f"Machine type '{mt}' comes with its own accelerators; no others can be attached.")
            if int(acc.get("acceleratorCount", 0)) not in (1, 2, 4, 8):
                raise _invalid("resource.guestAccelerators[0].acceleratorCount", acc.get("acceleratorCount"),
                               "Accelerator count must be 1, 2, 4 or 8.")
        if (accels or builtin) and sched.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
            raise HttpError(400, "badRequest", "Instances with guest accelerators do not support live migration.")
        aff = body.get("reservationAffinity") or {}
        if aff.get("consumeReservationType") == "SPECIFIC_RESERVATION":
            if spot:
                raise _invalid("resource.reservationAffinity", "SPECIFIC_RESERVATION",
                               "Spot VMs cannot consume reservations.")
            if aff.get("key") != RESERVATION_KEY or not aff.get("values"):
                raise _invalid("resource.reservationAffinity.key", aff.get("key"),
                               f"Specific reservation affinity requires key '{RESERVATION_KEY}' and a value.")
            res = self._reservations.get((zone, aff["values"][0]))
            if res is None:
                raise HttpError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}/"
                                                 f"reservations/{aff['values'][0]}' was not found")
            if res["machineType"] != mt:
                raise _invalid("resource.reservationAffinity", aff["values"][0],
                               f"Reservation is for machine type '{res['machineType']}', not '{mt}'.")
        region = zone.rsplit("-", 1)[0]
        for url in body.get("resourcePolicies") or []:
            m = re.search(r"regions/([^/]+)/resourcePolicies/([^/]+)$", url)
            if not m or m.group(1) != region:
                raise _invalid("resource.resourcePolicies", url, f"Resource policy must be in region '{region}'.")
            policy = self._policy(region, m.group(2))
            if policy.get("groupPlacementPolicy", {}).get("collocation") == "COLLOCATED" and \
                    sched.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
                raise _invalid("resource.scheduling.onHostMaintenance", sched.get("onHostMaintenance", "MIGRATE"),
                               "Compact placement policies require onHostMaintenance TERMINATE.")
        labels = body.get("labels") or {}
        if len(labels) > 64:
            raise _invalid("resource.labels", len(labels), "At most 64 labels are allowed.")
        for k, v in labels.items():
            if not LABEL_KEY_RE.match(k):
                raise _invalid("resource.labels.key", k, "Label keys must start with a lowercase letter and "
                               "contain only lowercase letters, digits, '_' and '-' (at most 63).")
            if not LABEL_VALUE_RE.match(str(v)):
                raise _invalid("resource.labels.value", v, "Label values may contain only lowercase letters, "
                               "digits, '_' and '-' (at most 63).")
        items = (body.get("metadata") or {}).get("items") or []
        for item in items:
            if not METADATA_KEY_RE.match(item.get("key", "")):
                raise _invalid("resource.metadata.items.key", item.get("key"), "Invalid metadata key.")
        if sum(len(i.get("key", "")) + len(i.get("value", "")) for i in items) > 512 * 1024:
            raise _invalid("resource.metadata", "", "Metadata is larger than 512 KB.")

    @staticmethod
    def _validate_nics(machine_type: str, nics: list[dict]) -> None:
        """Compute's NIC rules: a known nicType, each NIC of a VM in its own VPC network, at most 8
        NICs (A3 machine types: 9), and gVNIC for A3's GPU NICs."""
        limit = 9 if machine_type.startswith("a3-") else 8
        if len(nics) > limit:
            raise _invalid("resource.networkInterfaces", len(nics),
                           f"Machine type '{machine_type}' supports at most {limit} network interfaces.")
        seen: set[str] = set()
        for i, nic in enumerate(nics):
            kind = nic.get("nicType", "")
            if kind not in ("", "GVNIC", "VIRTIO_NET", "IDPF", "MRDMA", "IRDMA"):
                raise _invalid(f"resource.networkInterfaces[{i}].nicType", kind, "Unknown NIC type.")
            net = _tail(nic.get("network") or "default")
            if net in seen:
                raise _invalid(f"resource.networkInterfaces[{i}].network", nic.get("network"),
                               "Networks must be distinct for NICs attached to a VM.")
            seen.add(net)
            if len(nics) > 1 and machine_type.startswith("a3-") and kind != "GVNIC":
                raise _invalid(f"resource.networkInterfaces[{i}].nicType", kind or "VIRTIO_NET",
                               "GPUDirect network interfaces require nicType GVNIC.")

    # -- machine and accelerator types ---------------------------------------------------------

    def _machine_type_json(self, zone: str, name: str) -> dict:
        cpus, mem, accel, count = self.machine_types[name]
        out = {"kind": "compute#machineType", "id": str(abs(hash(name)) % 10**12), "name": name,
               "description": f"{cpus} vCPUs, {mem:g} GB RAM", "guestCpus": cpus,
               "memoryMb": int(mem * 1024), "zone": zone, "isSharedCpu": False,
               "selfLink": f"{LINK}/projects/{self.project}/zones/{zone}/machineTypes/{name}"}
        if accel and count:
            out["accelerators"] = [{"guestAcceleratorType": accel, "guestAcceleratorCount": count}]
        return out

    def get_machine_type(self, *, zone: str, name: str, **_: Any) -> tuple[int, dict]:
        if name not in self.machine_types:
            raise HttpError(404, "notFound",
                            f"The resource 'projects/{self.project}/zones/{zone}/machineTypes/{name}' was not found")
        return 200, self._machine_type_json(zone, name)

    def list_machine_types(self, *, zone: str, query: dict, **_: Any) -> tuple[int, dict]:
        keep = compile_filter(query.get("filter", ""))
        rows = [j for j in (self._machine_type_json(zone, n) for n in sorted(self.machine_types)) if keep(j)]
        page, token = self._page(rows, query)
        out: dict[str, Any] = {"kind": "compute#machineTypeList", "items": page}
        if token:
            out["nextPageToken"] = token
        return 200, out

    def _accel_json(self, zone: str, name: str) -> dict:
        return {"kind": "compute#acceleratorType", "name": name, "description": name,
                "zone": f"{LINK}/projects/{self.project}/zones/{zone}", "maximumCardsPerInstance": 8,
                "selfLink": f"{LINK}/projects/{self.project}/zones/{zone}/acceleratorTypes/{name}"}

    def list_accelerator_types(self, *, zone: str, query: dict, **_: Any) -> tuple[int, dict]:
        keep = compile_filter(query.get("filter", ""))
        rows = [j for j in (self._accel_json(zone, n) for n in sorted(self.accelerator_types)) if keep(j)]
        page, token = self._page(rows, query)
        out: dict[str, Any] = {"kind": "compute#acceleratorTypeList", "items": page}
        if token:
            out["nextPageToken"] = token
        return 200, out

    def get_accelerator_type(self, *, zone: str, name: str, **_: Any) -> tuple[int, dict]:
        if name not in self.accelerator_types:
            raise HttpError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}/"
                                             f"acceleratorTypes/{name}' was not found")
        return 200, self._accel_json(zone, name)


_P = r"/compute/v1/projects/(?P<project>[^/]+)"
_Z = _P + r"/zones/(?P<zone>[a-z]+-[a-z]+[0-9]+-[a-z])"
_R = _P + r"/regions/(?P<region>[a-z]+-[a-z]+[0-9]+)"
ROUTES: list[tuple[str, re.Pattern, str]] = [
    ("POST", re.compile(_R + r"/resourcePolicies"), "insert_policy"),
    ("POST", re.compile(_R + r"/instances/bulkInsert"), "bulk_insert_region"),
    ("GET", re.compile(_R + r"/resourcePolicies/(?P<name>[^/]+)"), "get_policy"),
    ("DELETE", re.compile(_R + r"/resourcePolicies/(?P<name>[^/]+)"), "delete_policy"),
    ("GET", re.compile(_R + r"/operations/(?P<operation>[^/]+)"), "get_region_operation"),
    ("POST", re.compile(_R + r"/operations/(?P<operation>[^/]+)/wait"), "wait_region_operation"),
    ("POST", re.compile(_Z + r"/instances"), "insert_instance"),
    ("GET", re.compile(_Z + r"/instances"), "list_instances"),
    ("GET", re.compile(_Z + r"/instances/(?P<name>[^/]+)"), "get_instance"),
    ("DELETE", re.compile(_Z + r"/instances/(?P<name>[^/]+)"), "delete_instance"),
    ("GET", re.compile(_P + r"/aggregated/instances"), "aggregated_instances"),
    ("GET", re.compile(_Z + r"/operations"), "list_operations"),
    ("GET", re.compile(_Z + r"/operations/(?P<operation>[^/]+)"), "get_operation"),
    ("POST", re.compile(_Z + r"/operations/(?P<operation>[^/]+)/wait"), "wait_operation"),
    ("GET", re.compile(_Z + r"/machineTypes"), "list_machine_types"),
    ("GET", re.compile(_Z + r"/machineTypes/(?P<name>[^/]+)"), "get_machine_type"),
    ("GET", re.compile(_Z + r"/acceleratorTypes"), "list_accelerator_types"),
    ("GET", re.compile(_Z + r"/acceleratorTypes/(?P<name>[^/]+)"), "get_accelerator_type"),
    *MARKET_ROUTES,
]


def _make_handler(fake: FakeGcpCompute) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            try:
                status, out = fake.handle(self.command, self.path, body)
            except Exception as e:  # a bug in the fake: answer 500 rather than hang the client
                status, out = 500, HttpError(500, "backendError", f"fake error: {e!r}").body()
            raw = isinstance(out, bytes)  # a proxy's HTML page or garbage, not Compute's JSON
            data = out if raw else json.dumps(out).encode()
            page = raw and data.lstrip().startswith(b"<")
            try:
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=UTF-8" if page else
                                 "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                pass

        do_GET = do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


@pytest.fixture
def fake_gcp() -> Iterator[FakeGcpCompute]:
    """A started fake Compute API for one test."""
    with FakeGcpCompute() as fake:
        yield fake


def sandbox_cloud(market: bool = False) -> Any:
    """Google Cloud's fakes for :class:`broker_sandbox.clouds.Clouds` (its registration's
    ``sandbox``): Compute, two regions; with ``market``, the Cloud Billing Catalog too."""
    from broker_sandbox import SandboxCloud

    compute = FakeGcpCompute().start()
    fakes: dict[str, Any] = {"gcp": compute}
    if market:
        from broker_sandbox.gcp_billing import FakeCloudBilling

        fakes["gcp_billing"] = FakeCloudBilling().start()

    def table() -> dict[str, Any]:
        out = {"enabled": True, "project": "test-project", "regions": ["us-central1", "europe-west4"],
               "api_endpoint": compute.url, "credentials": "anonymous", "timeout_s": 5}
        if market:
            out["billing_api_endpoint"] = fakes["gcp_billing"].url
        return out

    return SandboxCloud(fakes=fakes, table=table,
                        alive=lambda: [i for i in compute.instances() if i.get("status") not in ("TERMINATED", "STOPPING")])


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve a fake Compute Engine API on 127.0.0.1.")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--project", default="test-project")
    args = ap.parse_args()
    fake = FakeGcpCompute(args.project, port=args.port).start()
    print(fake.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
