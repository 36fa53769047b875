"""The Lambda Cloud API over ``httpx``: one client per account, the API key kept out of every
log line, error and ``repr``, answers decoded into typed records.

Paths and shapes follow the Lambda Cloud API spec 1.8.3 (``/api/v1/...``, every success answer
``{"data": ...}``, every failure ``{"error": {...}}``; see :mod:`providers.lambda_cloud.errors`).
Authentication is ``Authorization: Bearer <key>``, the form the spec recommends (HTTP Basic with
the key and a trailing colon is the alternative it documents for ``curl -u``).
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Generator, Sequence

import httpx
import msgspec
import structlog

from providers.base import ProviderError, ThrottledError, TransientError
from providers.files import SMALL_BYTES, read_bytes
from providers.lambda_cloud.errors import NAME, NOT_FOUND, from_body, unreadable
from providers.lambda_cloud.settings import LAMBDA_API_URL, LambdaSettings
from providers.settings import SettingsError

log = structlog.get_logger("providers.lambda")

ENV_KEY = "LAMBDA_API_KEY"
ENV_ENDPOINT = "LAMBDA_API_ENDPOINT"
MAX_WAIT_S = 30.0  # the longest single back-off, whatever Retry-After says
MAX_BODY_BYTES = 64 * 1024 * 1024  # an answer is read up to this; a listing of 1,000 instances is ~2 MB


class ApiKey:
    """The API key: usable by the client, invisible to ``repr``, ``str`` and logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value.strip()

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "ApiKey(***)"

    __str__ = __repr__

    @classmethod
    def load(cls, settings: LambdaSettings, environ: Any = None) -> "ApiKey":
        """From ``api_key_file``, else ``$LAMBDA_API_KEY``; a sentence naming both when neither has one."""
        environ = os.environ if environ is None else environ
        if settings.api_key_file:
            try:
                raw = read_bytes(Path(settings.api_key_file).expanduser(), SMALL_BYTES, regular=True)
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise SettingsError("providers.lambda.api_key_file is not UTF-8 text",
                                    "providers.lambda.api_key_file") from None
            except OSError as e:
                raise SettingsError(f"providers.lambda.api_key_file cannot be read ({e.strerror or e})",
                                    "providers.lambda.api_key_file") from None
            if not text:
                raise SettingsError(f"providers.lambda.api_key_file {settings.api_key_file} is empty",
                                    "providers.lambda.api_key_file")
            return cls(text)
        if environ.get(ENV_KEY, "").strip():
            return cls(environ[ENV_KEY])
        raise SettingsError(f"Lambda Cloud needs an API key: set providers.lambda.api_key_file or the {ENV_KEY} "
                            "environment variable", "providers.lambda.api_key_file")


class _Bearer(httpx.Auth):
    def __init__(self, key: ApiKey) -> None:
        self._key = key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._key.reveal()}"
        yield request

    def __repr__(self) -> str:
        return "_Bearer(***)"


# -- the API's records (only the fields the broker reads; the rest is ignored) -------------------


class Region(msgspec.Struct, frozen=True):
    name: str
    description: str = ""


class Specs(msgspec.Struct, frozen=True):
    vcpus: int = 0
    memory_gib: int = 0
    storage_gib: int = 0
    gpus: int = 0


class InstanceType(msgspec.Struct, frozen=True):
    name: str
    price_cents_per_hour: int | str  # an integer; older spec examples quote it
    description: str = ""
    gpu_description: str = ""
    specs: Specs = Specs()


class TypeAvailability(msgspec.Struct, frozen=True):
    instance_type: InstanceType
    regions_with_capacity_available: list[Region] = []


class Tag(msgspec.Struct, frozen=True):
    key: str
    value: str


class TypeRef(msgspec.Struct, frozen=True):
    name: str


class RemoteInstance(msgspec.Struct, frozen=True):
    id: str
    status: str
    name: str | None = None
    ip: str | None = None
    private_ip: str | None = None
    hostname: str | None = None
    region: Region | None = None
    instance_type: TypeRef | None = None
    tags: list[Tag] = []
    #: Why part of this record could not be read ("" when all of it could): see :func:`_lenient`.
    problem: str = ""

    def tag(self, key: str) -> str:
        return next((t.value for t in self.tags if t.key == key), "")


class _Types(msgspec.Struct):
    data: dict[str, TypeAvailability]


class _Instances(msgspec.Struct):
    data: list[msgspec.Raw]


class _Instance(msgspec.Struct):
    data: RemoteInstance


class _Launched(msgspec.Struct):
    instance_ids: list[str]


class _Launch(msgspec.Struct):
    data: _Launched


class _Terminated(msgspec.Struct):
    terminated_instances: list[RemoteInstance] = []


class _Terminate(msgspec.Struct):
    data: _Terminated


def endpoint_of(settings: LambdaSettings, environ: Any = None) -> str:
    environ = os.environ if environ is None else environ
    return settings.endpoint or environ.get(ENV_ENDPOINT, "").strip().rstrip("/") or LAMBDA_API_URL


class LambdaClient:
    """The account's API: instance types, instances, launch and terminate. Throttled and transient
    answers are retried ``settings.retries`` times with back-off (a launch only after a 429, which
    the API answers before doing anything: a launch that timed out may have happened). Launches
    are paced ``settings.launch_interval_s`` apart (the API allows one per 12 s), and a throttled
    launch waits at least that long before its retry."""

    def __init__(self, settings: LambdaSettings, key: ApiKey, *, endpoint: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
        self.endpoint = endpoint or endpoint_of(settings)
        self._http = httpx.Client(base_url=self.endpoint, auth=_Bearer(key), timeout=settings.timeout_s,
                                  headers={"Accept": "application/json"}, transport=transport,
                                  follow_redirects=False)
        self._launch_lock = threading.Lock()
        self._last_launch = float("-inf")

    def __repr__(self) -> str:
        return f"LambdaClient({self.endpoint})"

    def close(self) -> None:
        self._http.close()

    # -- calls ---------------------------------------------------------------------------------

    def instance_types(self) -> dict[str, TypeAvailability]:
        return self._call("GET", "/api/v1/instance-types", _Types).data

    def instances(self) -> list[RemoteInstance]:
        """Every instance of the account. One record the broker cannot read never hides the others:
        it is decoded as far as it goes (:func:`_lenient`) and carries its ``problem``."""
        out = []
        for raw in self._call("GET", "/api/v1/instances", _Instances).data:
            try:
                out.append(msgspec.json.decode(raw, type=RemoteInstance))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                found = _lenient(raw, str(e))
                if found is not None:
                    out.append(found)
        return out

    def instance(self, instance_id: str) -> RemoteInstance | None:
        try:
            return self._call("GET", f"/api/v1/instances/{instance_id}", _Instance).data
        except ProviderError as e:
            if e.code == NOT_FOUND:
                return None
            raise

    def launch(self, body: dict[str, Any], region: str) -> list[str]:
        with self._launch_lock:  # one launch at a time, paced
            wait = self._last_launch + self.settings.launch_interval_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                return self._call("POST", "/api/v1/instance-operations/launch", _Launch, body=body,
                                  region=region, launch=True).data.instance_ids
            finally:
                self._last_launch = time.monotonic()

    def terminate(self, ids: Sequence[str]) -> list[RemoteInstance]:
        return self._call("POST", "/api/v1/instance-operations/terminate", _Terminate,
                          body={"instance_ids": list(ids)}).data.terminated_instances

    # -- plumbing ------------------------------------------------------------------------------

    def _call(self, method: str, path: str, typ: Any, *, body: Any = None, region: str = "",
              launch: bool = False) -> Any:
        pause = self.settings.backoff_s
        for attempt in range(self.settings.retries + 1):
            try:
                return self._once(method, path, typ, body, region)
            except ProviderError as e:
                last = attempt == self.settings.retries
                if last or not e.retryable or (launch and not isinstance(e, ThrottledError)):
                    raise
                wait = min(getattr(e, "retry_after", 0.0) or pause, MAX_WAIT_S)
                if launch:
                    wait = max(wait, self.settings.launch_interval_s)
                log.info("lambda.retry", path=path, code=e.code, attempt=attempt + 1, wait_s=round(wait, 2))
                time.sleep(wait)
                pause = min(pause * 2, MAX_WAIT_S)
        raise AssertionError("unreachable")

    def _once(self, method: str, path: str, typ: Any, body: Any, region: str) -> Any:
        try:
            with self._http.stream(method, path, json=body) as r:
                content = _body(r, f"{method} {path}", region)
        except httpx.TimeoutException as e:
            raise TransientError(f"Lambda Cloud call {method} {path} timed out ({type(e).__name__})",
                                 provider=NAME, code="TIMEOUT", region=region) from None
        except httpx.TransportError as e:
            raise TransientError(f"cannot reach Lambda Cloud at {self.endpoint} ({type(e).__name__})",
                                 provider=NAME, code="CONNECTION_ERROR", region=region) from None
        if r.is_success:
            try:
                return msgspec.json.decode(content, type=typ)
            except msgspec.DecodeError:
                raise unreadable(r.status_code, region=region) from None
        try:
            decoded = msgspec.json.decode(content)
        except msgspec.DecodeError:
            decoded = None
        err = from_body(r.status_code, decoded, region=region)
        if isinstance(err, ThrottledError):
            err.retry_after = _retry_after(r.headers.get("Retry-After"))  # type: ignore[attr-defined]
        log.info("lambda.error", method=method, path=path, status=r.status_code, code=err.code)
        raise err


def _body(r: httpx.Response, call: str, region: str) -> bytes:
    """The answer's body, read up to :data:`MAX_BODY_BYTES` (an endless or runaway answer is
    a transient failure of this call, not a read until memory runs out)."""
    chunks, size = [], 0
    for chunk in r.iter_bytes():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise TransientError(f"Lambda Cloud answered {call} with more than {MAX_BODY_BYTES:,} bytes",
                                 provider=NAME, code="RESPONSE_TOO_LARGE", region=region)
        chunks.append(chunk)
    return b"".join(chunks)


def _lenient(raw: msgspec.Raw, why: str) -> RemoteInstance | None:
    """What can be read of an instance record of an unexpected shape: its id, status, region,
    type and the tags that are strings, with ``problem`` saying why (logged and counted as the
    provider error ``UnreadableInstance``). A record without a string id names no instance: it is
    logged, counted and left out."""
    try:
        rec = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        rec = None
    rec = rec if isinstance(rec, dict) else {}
    ident = rec.get("id")
    problem = f"instance record {ident if isinstance(ident, str) else '?'} cannot be read ({why[:200]})"
    TransientError(problem, provider=NAME, code="UnreadableInstance")  # counted
    log.warning("lambda.instance.unreadable", provider=NAME, instance_id=ident if isinstance(ident, str) else "",
                reason=why[:200])
    if not isinstance(ident, str) or not ident:
        return None

    def text(value: Any) -> str | None:
        return value if isinstance(value, str) else None

    def named(value: Any, cls: Any) -> Any:
        return cls(name=value["name"]) if isinstance(value, dict) and isinstance(value.get("name"), str) else None

    region = rec.get("region")
    tags = [Tag(key=t["key"], value=t["value"]) for t in rec.get("tags") or [] if isinstance(rec.get("tags"), list)
            and isinstance(t, dict) and isinstance(t.get("key"), str) and isinstance(t.get("value"), str)]
    return RemoteInstance(
        id=ident, status=text(rec.get("status")) or "unknown", name=text(rec.get("name")),
        ip=text(rec.get("ip")), private_ip=text(rec.get("private_ip")), hostname=text(rec.get("hostname")),
        region=Region(name=region["name"], description=text(region.get("description")) or "")
        if isinstance(region, dict) and isinstance(region.get("name"), str) else None,
        instance_type=named(rec.get("instance_type"), TypeRef), tags=tags, problem=problem)


def _retry_after(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0
