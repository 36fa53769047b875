"""Helpers for the lease tests: an in-process Service on the three mocked clouds (real providers,
real SQLite store), its gRPC server, a settable clock, a provider wrapper that lets a test look
at the store at the moment of a cloud call, a WatchLeases collector, and the clouds' own view of
which lease owns which live instance."""
from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc

from broker import config as cfgmod
from broker.lifecycle import Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.reconciler import Reconciler
from broker.serving import build_server
from broker.service import Service
from broker.store import Store
from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.fake_provider import FakeProvider

# Fast, deterministic defaults for tests: short backoff, the reconciler only when a test runs it.
TEST_LIFECYCLE = {"backoff_s": 0.05}
TEST_RECONCILER = {"interval_s": 3600, "orphan_grace_s": 0}


class Clock:
    """A clock a test moves by hand (Service(clock=...))."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def config(tmp_path: Path, clouds, **sections: Any) -> cfgmod.Config:
    """A Config on the three fakes; ``sections`` are whole tables (lifecycle={...}, budgets={...})."""
    overrides: dict[str, Any] = {"store.url": f"sqlite:///{tmp_path / 'broker.db'}", "owner": "broker-test",
                                 "providers": clouds.provider_tables()}
    overrides["lifecycle"] = {**TEST_LIFECYCLE, **sections.pop("lifecycle", {})}
    overrides["reconciler"] = {**TEST_RECONCILER, **sections.pop("reconciler", {})}
    overrides.update(sections)
    return cfgmod.load(None, environ={}, overrides=overrides)


@contextlib.contextmanager
def service(tmp_path: Path, clouds, *, clock: Callable[[], float] | None = None,
            wrap: Callable[[str, Any], Any] | None = None, **sections: Any) -> Iterator[Service]:
    """A Service with the real providers (``wrap(name, provider)`` may replace each)."""
    from providers.registry import build_enabled

    cfg = config(tmp_path, clouds, **sections)
    providers = build_enabled(cfg.providers, cfg.owner)
    if wrap is not None:
        providers = {n: wrap(n, p) for n, p in providers.items()}
    svc = Service(cfg, providers=providers, **({"clock": clock} if clock else {}))
    try:
        yield svc
    finally:
        svc.stop()


@contextlib.contextmanager
def serving(svc: Service) -> Iterator[pb_grpc.BrokerStub]:
    """The service behind a real gRPC server on 127.0.0.1; yields a stub on a real channel."""
    server, port = build_server(svc, "127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.BrokerStub(channel)
    stub.address = f"127.0.0.1:{port}"
    try:
        yield stub
    finally:
        channel.close()
        server.stop(grace=0).wait()


class Watched:
    """A provider whose every call first runs ``before(op, arg)`` and is logged in ``calls``."""

    def __init__(self, inner: Any, before: Callable[[str, Any], None] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.before = before
        self.calls: list[tuple[str, Any]] = []

    def _call(self, op: str, arg: Any) -> None:
        self.calls.append((op, arg))
        if self.before is not None:
            self.before(op, arg)

    def launch(self, spec):
        self._call("launch", spec)
        return self.inner.launch(spec)

    def describe(self, lease_id, region):
        self._call("describe", (lease_id, region))
        return self.inner.describe(lease_id, region)

    def list_managed(self, regions=None):
        self._call("list_managed", regions)
        return self.inner.list_managed(regions)

    def terminate(self, instances):
        self._call("terminate", list(instances))
        return self.inner.terminate(instances)

    def ops(self, op: str) -> list[Any]:
        return [a for o, a in self.calls if o == op]


class Watch:
    """WatchLeases on a real channel, collected by a thread; ``wait_for`` a matching event."""

    def __init__(self, stub: pb_grpc.BrokerStub, lease_id: str = "") -> None:
        self.events: list[pb.WatchLeasesResponse] = []
        self._cond = threading.Condition()
        self._call = stub.WatchLeases(pb.WatchLeasesRequest(lease_id=lease_id))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for ev in self._call:
                with self._cond:
                    self.events.append(ev)
                    self._cond.notify_all()
        except grpc.RpcError:
            pass

    def wait_for(self, pred: Callable[[pb.WatchLeasesResponse], bool], timeout: float = 30.0) -> pb.WatchLeasesResponse:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self.events:
                    if pred(ev):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no such event within {timeout} s; got "
                                         f"{[(pb.LeaseEventKind.Name(e.kind), e.message) for e in self.events]}")
                self._cond.wait(left)

    def opened(self, store, timeout: float = 30.0) -> "Watch":
        """Wait until the server streams: the stream starts after the last event at its start,
        so add marker events until one comes through."""
        deadline = time.monotonic() + timeout
        while True:
            store.add_event("", "decision", "watch marker", time.time(), data={"action": "marker"})
            try:
                self.wait_for(lambda e: e.message == "watch marker", timeout=0.5)
                return self
            except AssertionError:
                if time.monotonic() > deadline:
                    raise

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(5)


def wait_until(pred: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        out = pred()
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or pred}")
        time.sleep(interval)


# -- what the clouds themselves hold ------------------------------------------------------------

def live_by_lease(clouds) -> dict[str, list[tuple[str, str]]]:
    """Every live (not stopped, not terminated) instance in the three fakes, by its lease tag/label:
    lease id -> [(provider, instance id)]; untagged instances under ""."""
    out: dict[str, list[tuple[str, str]]] = {}
    for i in clouds.aws.instances():
        if i["state"] in ("pending", "running"):
            out.setdefault(i["tags"].get("broker:lease", ""), []).append(("aws", i["id"]))
    for i in clouds.gcp.instances():
        if i.get("status") in ("PROVISIONING", "STAGING", "RUNNING"):
            meta = {m["key"]: m["value"] for m in (i.get("metadata") or {}).get("items", [])}
            lease = meta.get("broker-lease") or (i.get("labels") or {}).get("broker-lease", "")
            out.setdefault(lease, []).append(("gcp", i["name"]))
    for i in clouds.azure.instances():
        if i["properties"].get("provisioningState") not in ("Failed", "Deleting"):
            out.setdefault((i.get("tags") or {}).get("broker:lease", ""), []).append(("azure", i["name"]))
    return out


def existing_by_lease(clouds) -> dict[str, list[tuple[str, str]]]:
    """Every instance that still exists in the three fakes, whatever its state (a stopped GCP VM
    or an Azure VM whose creation failed keeps its disk): lease id -> [(provider, instance id)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for i in clouds.aws.instances():
        if i["state"] != "terminated":
            out.setdefault(i["tags"].get("broker:lease", ""), []).append(("aws", i["id"]))
    for i in clouds.gcp.instances():
        meta = {m["key"]: m["value"] for m in (i.get("metadata") or {}).get("items", [])}
        lease = meta.get("broker-lease") or (i.get("labels") or {}).get("broker-lease", "")
        out.setdefault(lease, []).append(("gcp", i["name"]))
    for i in clouds.azure.instances():
        out.setdefault((i.get("tags") or {}).get("broker:lease", ""), []).append(("azure", i["name"]))
    return out


def live_count(clouds) -> int:
    return sum(len(v) for v in live_by_lease(clouds).values())


def duplicates(clouds, store) -> dict[str, tuple[int, int]]:
    """Leases with more live instances than nodes: lease id -> (instances, nodes)."""
    counts = Counter({k: len(v) for k, v in live_by_lease(clouds).items()})
    out = {}
    for lease_id, n in counts.items():
        lease = store.get_lease(lease_id) if lease_id else None
        nodes = lease.nodes if lease is not None else 0
        if n > nodes:
            out[lease_id] = (n, nodes)
    return out


def events(store, lease_id: str) -> list[tuple[str, str, str, str]]:
    """(kind, from_state, to_state, message) of a lease's events, in order."""
    return [(e.kind, e.from_state, e.to_state, e.message) for e in store.events_of(lease_id)]


def states(store, lease_id: str) -> list[str]:
    """The states a lease went through, in order (from its state_changed events)."""
    return [to for kind, _, to, _ in events(store, lease_id) if kind == "state_changed"]


def instances_of(lease) -> tuple:
    return lease.instances


def offering(provider: str, region: str, instance_type: str, market: str = "on_demand", count: int = 1,
             zone: str = "") -> pb.Offering:
    from broker.convert import MARKET_TO_PB

    return pb.Offering(provider=provider, region=region, zone=zone, instance_type=instance_type,
                       market=MARKET_TO_PB[market], count=count)


def target(svc: Service, provider: str, region: str, instance_type: str, market: str = "on_demand",
           count: int = 1, zone: str = ""):
    return svc.lifecycle.target_explicit(provider, region, zone, instance_type, market, count)


def created_by_lease(clouds) -> dict[str, set[tuple[str, str]]]:
    """Every instance the three fakes ever created since their last reset, by lease tag/label
    (EC2 keeps terminated instances listed; for GCP and Azure, the accepted creates)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for i in clouds.aws.instances():
        out.setdefault(i["tags"].get("broker:lease", ""), set()).add(("aws", i["id"]))
    for c in clouds.gcp.calls_to("POST", "/instances"):
        if c.status == 200 and isinstance(c.body, dict):
            zone = c.path.split("/zones/")[1].split("/")[0]
            lease = (c.body.get("labels") or {}).get("broker-lease", "")
            out.setdefault(lease, set()).add(("gcp", f"{zone}/{c.body['name']}"))
    for c in clouds.azure.calls_matching("PUT", "/virtualMachines/"):
        if c.status in (200, 201) and isinstance(c.body, dict):
            lease = (c.body.get("tags") or {}).get("broker:lease", "")
            out.setdefault(lease, set()).add(("azure", c.path.rsplit("/", 1)[1].lower()))
    return out


def lifecycle_kit(tmp_path: Path, catalog, *, grace_s: float, **settings: Any):
    """A Lifecycle on three in-memory clouds (``tests.fake_provider``) and a SQLite store, with a
    hand-driven clock and no back-off: (lifecycle, reconciler, clouds, clock, store)."""
    clock = Clock(1_800_000_000.0)
    clouds = {name: FakeProvider(name, clock=clock) for name in ("aws", "gcp", "azure")}
    store = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    lc = Lifecycle(store, clouds, QuoteEngine(catalog), owner="test", clock=clock,
                   settings=Settings(backoff_s=0.0, **settings), sleep=lambda s: None)
    return lc, Reconciler(lc, orphan_grace_s=grace_s, clock=clock), clouds, clock, store
