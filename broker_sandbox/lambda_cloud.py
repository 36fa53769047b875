"""A fake Lambda Cloud API on loopback, for tests and ``broker sandbox``.

It serves the paths and JSON of the Lambda Cloud API spec 1.8.3
(``https://cloud.lambda.ai/api/v1/openapi.json``, read through its copy in
``alexandervaneck/lambda-ai-cloud-api-client`` ``openapi-1.8.3.json``, and the 1.5.3 copy in
``konfig-sdks/openapi-examples`` ``lambda/openapi.yaml``):

* ``GET /api/v1/instance-types`` → ``{"data": {NAME: {"instance_type": {name, description,
  gpu_description, price_cents_per_hour, specs: {vcpus, memory_gib, storage_gib, gpus}},
  "regions_with_capacity_available": [{name, description}]}}}``, built from the bundled catalog's
  Lambda rows; a region is listed while :meth:`FakeLambdaCloud.set_capacity` leaves it capacity.
* ``GET /api/v1/instances`` (running instances only) and ``GET /api/v1/instances/{id}``
  (``{"data": Instance}``; 404 ``global/object-does-not-exist`` for an unknown id). An Instance:
  ``id, name, ip, private_ip, status (booting|active|unhealthy|terminating|terminated),
  ssh_key_names, file_system_names, region {name, description}, instance_type {...}, hostname,
  tags [{key, value}]``. A new instance is ``booting`` and turns ``active`` after
  ``boot_polls`` reads of it.
* ``POST /api/v1/instance-operations/launch`` (``InstanceLaunchRequest``: ``region_name``,
  ``instance_type_name``, exactly one of ``ssh_key_names``, optional ``name`` ≤ 64, ``hostname``,
  ``image``, ``user_data`` ≤ 1 MB, ``tags``, ``file_system_names``) → ``{"data": {"instance_ids":
  [id]}}``. One instance per call. Errors as the spec's 400 ``ApiError*`` schemas:
  ``instance-operations/launch/insufficient-capacity`` (no capacity for the type in the region),
  ``global/quota-exceeded`` (more running instances than :attr:`quota`),
  ``global/invalid-parameters``, ``global/object-does-not-exist`` (unknown SSH key, type or
  region: the spec's ``LaunchResourceNotFound``).
* ``POST /api/v1/instance-operations/terminate`` (``{"instance_ids": [...]}``) →
  ``{"data": {"terminated_instances": [Instance]}}``; an unknown id fails the call with 404.
* ``GET /api/v1/ssh-keys`` → ``{"data": [{id, name, public_key}]}``.
* Authentication: ``Authorization: Bearer <key>`` or ``Basic base64(<key>:)``; anything else is 401
  ``global/invalid-api-key``. Every error is ``{"error": {"code", "message", "suggestion"}}``.

Fault injection, like the other fakes: ``inject(kind, times, match)`` and ``fail_rate(p, kinds)``
with kinds ``capacity`` and ``quota`` (launches only), ``throttle`` (429 in the API's envelope;
its code is assumed, the spec names none for 429), ``ratelimit`` (429 as Cloudflare's plain
"error code: 1015", which Lambda's rate-limit page describes), ``5xx`` (503
``provider/internal-unavailable``, the spec's example of a provider error), ``auth`` (401),
``forbidden`` (403 ``global/account-inactive``), ``slow`` (answers after ``slow_seconds``),
``html`` (a proxy's 502 page) and ``garbage`` (a 200 that is not JSON).
Test controls: :meth:`kill` (terminated outside the broker), :meth:`seed_instance` (an instance
the broker did not make, e.g. an orphan), :attr:`calls`.
"""
from __future__ import annotations

import argparse
import base64
import csv
import json
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Iterator

import providers
from broker_sandbox.loopback import LoopbackServer

try:  # the pytest fixtures (the sandbox runs these fakes where pytest may be absent)
    import pytest
except ImportError:  # pragma: no cover
    from broker_sandbox import _no_pytest as pytest  # type: ignore[no-redef]

DATA = Path(providers.__file__).resolve().parent / "data"
API_KEY = "secret_fake-lambda-key.0123456789abcdef"
SSH_KEY_NAME = "broker"
FAULT_KINDS = ("capacity", "quota", "throttle", "ratelimit", "5xx", "auth", "forbidden", "slow", "html", "garbage")
LAUNCH_FAULTS = ("capacity", "quota")
HTML_PAGE = (b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><center><h1>502 Bad "
             b"Gateway</h1></center><hr><center>cloudflare</center></body></html>\n")
GARBAGE = b"\x00\x01<<not an answer>> \xff\xfe garbage"
TAG_KEY_RE = re.compile(r"^[a-z][a-z0-9-:]+$")
HOSTNAME_RE = re.compile(r"^[a-z0-9][0-9a-z-]{0,62}$")
LAUNCH_FIELDS = {"region_name", "instance_type_name", "ssh_key_names", "file_system_names", "file_system_mounts",
                 "hostname", "name", "image", "user_data", "tags", "firewall_rulesets", "quantity"}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, suggestion: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.suggestion = status, code, message, suggestion

    def body(self) -> dict:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.suggestion is not None:
            err["suggestion"] = self.suggestion
        return {"error": err}


def _invalid(message: str) -> ApiError:
    return ApiError(400, "global/invalid-parameters", message, "Check the request parameters and try again.")


def _not_found(what: str) -> ApiError:
    return ApiError(404, "global/object-does-not-exist", f"Specified {what} does not exist.")


@dataclass
class Call:
    method: str
    path: str
    body: Any
    status: int = 0
    fault: str = ""


@dataclass
class Fault:
    kind: str
    times: int
    match: str = ""


def _catalog() -> tuple[dict[str, dict], dict[str, str]]:
    """The bundled catalog's Lambda instance types (as the API shows them) and regions."""
    types: dict[str, dict] = {}
    regions: dict[str, str] = {}
    with (DATA / "regions.csv").open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["provider"] == "lambda":
                regions[r["region"]] = r.get("location", "")
    prices: dict[str, str] = {}
    with (DATA / "prices.csv").open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["provider"] == "lambda":
                prices.setdefault(r["instance_type"], r["on_demand_usd"])
    with (DATA / "instances.csv").open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["provider"] != "lambda" or r["instance_type"] not in prices:
                continue
            n, gpu, mem = int(r["gpus"]), r["gpu"], r["gpu_memory_gb"]
            types[r["instance_type"]] = {
                "name": r["instance_type"], "description": f"{n}x {gpu} ({mem} GB)",
                "gpu_description": f"{gpu} ({mem} GB)",
                "price_cents_per_hour": round(float(prices[r["instance_type"]]) * 100),
                "specs": {"vcpus": int(r["vcpus"]), "memory_gib": int(r["ram_gb"]), "storage_gib": 0, "gpus": n}}
    return types, regions


class FakeLambdaCloud(LoopbackServer):
    """A threaded Lambda Cloud API server on 127.0.0.1 (an ephemeral port unless ``port`` is given)."""

    thread_name = "fake-lambda"

    def __init__(self, *, port: int = 0, api_key: str = API_KEY, capacity: int = 4, quota: int = 16,
                 boot_polls: int = 1, slow_seconds: float = 2.0) -> None:
        self.api_key, self.default_capacity, self.default_quota = api_key, capacity, quota
        self.boot_polls, self.slow_seconds = boot_polls, slow_seconds
        self._port = port
        self._lock = threading.RLock()
        self.types, self.regions = _catalog()
        self.reset()

    # -- lifecycle -----------------------------------------------------------------------------

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_handler(self)

    def reset(self) -> None:
        """Forget every instance, fault and logged call; capacity and quota back to their defaults."""
        with self._lock:
            self._instances: dict[str, dict] = {}
            self._reads: dict[str, int] = {}
            self.user_data: dict[str, str] = {}  # instance id -> the cloud-init user data it was launched with
            self._capacity: dict[tuple[str, str], int] = {}
            self.quota = self.default_quota
            self.ssh_keys = {SSH_KEY_NAME: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBroKerTestKey broker@test"}
            self._faults: list[Fault] = []
            self._rate: tuple[float, tuple[str, ...], random.Random] | None = None
            self.calls: list[Call] = []

    def provider_settings(self, regions: list[str] | None = None, **extra: Any) -> dict[str, Any]:
        """A ``[providers.lambda]`` table pointing at this fake (the key comes from ``$LAMBDA_API_KEY``
        or ``api_key_file``: it is never a setting)."""
        out: dict[str, Any] = {"enabled": True, "endpoint": self.url, "regions": regions or ["us-east-1", "us-west-1"],
                               "ssh_key_name": SSH_KEY_NAME, "timeout_s": 5, "retries": 1, "backoff_s": 0.01,
                               "launch_interval_s": 0}
        out.update(extra)
        return out

    # -- test controls -------------------------------------------------------------------------

    def inject(self, kind: str, times: int = 1, match: str = "") -> None:
        """Fail the next ``times`` calls whose ``"METHOD /path name"`` contains ``match`` ("" = any;
        name = the launched instance's). capacity/quota apply to launches only."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {FAULT_KINDS}")
        with self._lock:
            self._faults.append(Fault(kind, times, match))

    def fail_rate(self, p: float, kinds: tuple[str, ...] | list[str] = ("5xx",), seed: int = 0) -> None:
        bad = [k for k in kinds if k not in FAULT_KINDS]
        if bad:
            raise ValueError(f"unknown fault kinds {bad}")
        with self._lock:
            self._rate = (p, tuple(kinds), random.Random(seed)) if p > 0 else None

    def set_capacity(self, instance_type: str, region: str, count: int) -> None:
        """How many more instances of ``instance_type`` ``region`` can launch (default ``capacity``)."""
        with self._lock:
            self._capacity[(instance_type, region)] = count

    def capacity(self, instance_type: str, region: str) -> int:
        with self._lock:
            return self._capacity.get((instance_type, region), self.default_capacity)

    def instances(self, *, alive: bool = True) -> list[dict]:
        with self._lock:
            return [dict(i) for i in self._instances.values() if not alive or i["status"] != "terminated"]

    def kill(self, instance_id: str) -> None:
        """Terminate an instance outside the broker (someone in the dashboard)."""
        with self._lock:
            self._terminate_one(self._instances[instance_id])

    def seed_instance(self, region: str, instance_type: str, *, tags: dict[str, str] | None = None,
                      name: str = "", status: str = "active") -> str:
        with self._lock:
            inst = self._new(region, instance_type, name, "", tags or {})
            inst["status"] = status
            return inst["id"]

    def launch_calls(self) -> list[Call]:
        return [c for c in self.calls if c.method == "POST" and c.path.endswith("/launch")]

    # -- request handling ----------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: Any, body_bytes: bytes) -> tuple[int, Any]:
        try:
            body = json.loads(body_bytes) if body_bytes else None
        except ValueError:
            body = "<unreadable>"
        call = Call(method, path, body)
        with self._lock:
            self.calls.append(call)
            fault = self._take_fault(method, path, body)
        call.fault = fault.kind if fault else ""
        status, out = self._answer(method, path, headers, body, fault)
        call.status = status
        return status, out

    def _answer(self, method: str, path: str, headers: Any, body: Any, fault: Fault | None) -> tuple[int, Any]:
        if fault and fault.kind == "slow":
            time.sleep(self.slow_seconds)
            fault = None
        if fault and fault.kind == "html":
            return 502, HTML_PAGE
        if fault and fault.kind == "garbage":
            return 200, GARBAGE
        if fault and fault.kind == "ratelimit":
            return 429, b"error code: 1015"
        try:
            if not self._authorized(headers.get("Authorization", "")):
                raise ApiError(401, "global/invalid-api-key", "API key was invalid, expired, or deleted.",
                               "Check your API key or create a new one, then try again.")
            if fault:
                raise self._fault_error(fault.kind)
            with self._lock:
                return 200, self._route(method, path, body)
        except ApiError as e:
            return e.status, e.body()

    def _authorized(self, header: str) -> bool:
        scheme, _, value = header.partition(" ")
        if scheme == "Bearer":
            return value == self.api_key
        if scheme == "Basic":
            try:
                decoded = base64.b64decode(value).decode()
            except ValueError:
                decoded = value
            return decoded in (f"{self.api_key}:", self.api_key) or value == self.api_key
        return False

    def _fault_error(self, kind: str) -> ApiError:
        return {
            "capacity": ApiError(400, "instance-operations/launch/insufficient-capacity",
                                 "Not enough capacity to fulfill launch request.",
                                 "Choose an instance type with more availability, or try again later."),
            "quota": ApiError(400, "global/quota-exceeded", "Quota exceeded.",
                              "Contact Support to increase your quota."),
            # The spec lists no code for a 429; this one is assumed (the client goes by the status).
            "throttle": ApiError(429, "global/too-many-requests", "Too many requests.", "Try again shortly."),
            "5xx": ApiError(503, "provider/internal-unavailable", "Provider unavailable", "Try again shortly"),
            "auth": ApiError(401, "global/invalid-api-key", "API key was invalid, expired, or deleted.",
                             "Check your API key or create a new one, then try again."),
            "forbidden": ApiError(403, "global/account-inactive", "Your account is inactive.",
                                  "Make sure you have verified your email address and have a valid payment method."),
        }[kind]

    def _take_fault(self, method: str, path: str, body: Any) -> Fault | None:
        is_launch = method == "POST" and path.endswith("/instance-operations/launch")
        subject = f"{method} {path} {body.get('name', '') if isinstance(body, dict) else ''}"
        for f in self._faults:
            if f.times > 0 and f.match in subject and (is_launch or f.kind not in LAUNCH_FAULTS):
                f.times -= 1
                return f
        if self._rate:
            p, kinds, rng = self._rate
            usable = [k for k in kinds if is_launch or k not in LAUNCH_FAULTS]
            if usable and rng.random() < p:
                return Fault(rng.choice(usable), 0)
        return None

    def _route(self, method: str, path: str, body: Any) -> Any:
        if method == "GET" and path == "/api/v1/instance-types":
            return {"data": self._types_json()}
        if method == "GET" and path == "/api/v1/instances":
            return {"data": [self._read(i) for i in list(self._instances.values()) if i["status"] != "terminated"]}
        m = re.fullmatch(r"/api/v1/instances/([0-9a-f]+)", path)
        if method == "GET" and m:
            inst = self._instances.get(m.group(1))
            if inst is None:
                raise _not_found("instance")
            return {"data": self._read(inst)}
        if method == "POST" and path == "/api/v1/instance-operations/launch":
            return {"data": {"instance_ids": [self._launch(body)]}}
        if method == "POST" and path == "/api/v1/instance-operations/terminate":
            return {"data": {"terminated_instances": self._terminate(body)}}
        if method == "GET" and path == "/api/v1/ssh-keys":
            return {"data": [{"id": uuid.uuid5(uuid.NAMESPACE_DNS, n).hex, "name": n, "public_key": k}
                             for n, k in self.ssh_keys.items()]}
        raise ApiError(404, "global/object-does-not-exist", f"The requested URL {path} was not found.")

    def _types_json(self) -> dict:
        out = {}
        for name, t in self.types.items():
            regions = [{"name": r, "description": d} for r, d in self.regions.items() if self.capacity(name, r) > 0]
            out[name] = {"instance_type": t, "regions_with_capacity_available": regions}
        return out

    def _read(self, inst: dict) -> dict:
        if inst["status"] == "booting":
            self._reads[inst["id"]] = self._reads.get(inst["id"], 0) + 1
            if self._reads[inst["id"]] > self.boot_polls:
                inst["status"] = "active"
        return dict(inst)

    def _launch(self, body: Any) -> str:
        if not isinstance(body, dict):
            raise _invalid("The request body must be a JSON object.")
        unknown = sorted(set(body) - LAUNCH_FIELDS)
        if unknown:
            raise _invalid(f"Unknown field(s): {', '.join(unknown)}.")
        for key in ("region_name", "instance_type_name", "ssh_key_names"):
            if key not in body:
                raise _invalid(f"Missing required field '{key}'.")
        region, itype, keys = body["region_name"], body["instance_type_name"], body["ssh_key_names"]
        if not isinstance(keys, list) or len(keys) != 1:
            raise _invalid("Exactly one SSH key must be specified.")
        if keys[0] not in self.ssh_keys:
            raise _not_found("SSH key")
        if region not in self.regions:
            raise _not_found("region")
        if itype not in self.types:
            raise _not_found("instance type")
        name, hostname = body.get("name") or "", body.get("hostname") or ""
        if len(name) > 64:
            raise _invalid("Instance name must be 64 characters or fewer.")
        if hostname and not HOSTNAME_RE.match(hostname):
            raise _invalid("Hostname must be 1-63 lowercase letters, digits and hyphens.")
        if len((body.get("user_data") or "").encode()) > 1 << 20:
            raise _invalid("User data cannot exceed 1MB in size.")
        tags = body.get("tags") or []
        if not isinstance(tags, list) or not all(isinstance(t, dict) and set(t) == {"key", "value"}
                                                 and TAG_KEY_RE.match(str(t["key"])) for t in tags):
            raise _invalid("Tags must be a list of {key, value} with keys matching ^[a-z][a-z0-9-:]+$.")
        if sum(1 for i in self._instances.values() if i["status"] != "terminated") >= self.quota:
            raise self._fault_error("quota")
        if self.capacity(itype, region) <= 0:
            raise self._fault_error("capacity")
        self._capacity[(itype, region)] = self.capacity(itype, region) - 1
        return self._new(region, itype, name, hostname, {t["key"]: t["value"] for t in tags},
                         user_data=body.get("user_data") or "")["id"]

    def _new(self, region: str, itype: str, name: str, hostname: str, tags: dict[str, str],
             user_data: str = "") -> dict:
        n = len(self._instances) + 2
        t = self.types.get(itype, {"name": itype, "description": itype, "gpu_description": "",
                                   "price_cents_per_hour": 0, "specs": {}})
        inst = {"id": uuid.uuid4().hex, "name": name or None, "ip": f"198.51.100.{n % 250}",
                "private_ip": f"10.0.{n // 250}.{n % 250}", "status": "booting", "ssh_key_names": [SSH_KEY_NAME],
                "file_system_names": [], "region": {"name": region, "description": self.regions.get(region, "")},
                "instance_type": t, "hostname": hostname or f"198-51-100-{n % 250}",
                "jupyter_token": uuid.uuid4().hex, "jupyter_url": None, "is_reserved": False,
                "tags": [{"key": k, "value": v} for k, v in tags.items()]}
        self._instances[inst["id"]] = inst
        self.user_data[inst["id"]] = user_data
        return inst

    def _terminate(self, body: Any) -> list[dict]:
        ids = body.get("instance_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids:
            raise _invalid("instance_ids must be a non-empty list.")
        missing = [i for i in ids if i not in self._instances]
        if missing:
            raise _not_found("instance")
        return [self._terminate_one(self._instances[i]) for i in ids]

    def _terminate_one(self, inst: dict) -> dict:
        if inst["status"] != "terminated":
            key = (inst["instance_type"]["name"], inst["region"]["name"])
            self._capacity[key] = self.capacity(*key) + 1
        answer = dict(inst, status="terminating")
        inst["status"] = "terminated"
        return answer


def _make_handler(fake: FakeLambdaCloud) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            try:
                status, out = fake.handle(self.command, self.path.split("?", 1)[0], self.headers, body)
            except Exception as e:  # a bug in the fake: answer 500 rather than hang the client
                status, out = 500, ApiError(500, "global/unknown", f"fake error: {e!r}").body()
            raw = isinstance(out, bytes)
            data = out if raw else json.dumps(out).encode()
            ctype = ("text/html; charset=UTF-8" if out is HTML_PAGE else "text/plain") if raw else "application/json"
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                pass

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


def sandbox_cloud(market: bool = False) -> Any:
    """Lambda Cloud's fake for :class:`broker_sandbox.clouds.Clouds` (its registration's ``sandbox``),
    with the fake API key in the environment a broker process gets.

    The fake always runs (``clouds.lambda_cloud``), but its ``[providers.lambda]`` table is enabled
    only for ``broker sandbox`` (``market=True``): the suite's multi-cloud tests were written for
    AWS, GCP and Azure and rank their offers among those three; Lambda's own tests enable it."""
    from broker_sandbox import SandboxCloud

    fake = FakeLambdaCloud().start()
    return SandboxCloud(fakes={"lambda_cloud": fake},
                        table=lambda: fake.provider_settings(enabled=market),
                        alive=lambda: fake.instances(), env={"LAMBDA_API_KEY": API_KEY})


@pytest.fixture
def fake_lambda() -> Iterator[FakeLambdaCloud]:
    """A started fake Lambda Cloud API for one test."""
    with FakeLambdaCloud() as fake:
        yield fake


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve a fake Lambda Cloud API on 127.0.0.1.")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    fake = FakeLambdaCloud(port=args.port).start()
    print(fake.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
