"""An in-memory :class:`providers.base.Provider` for fast tests of the lifecycle, the reconciler
and failover: no HTTP, no SDK, the same four calls and the same contract.

It keeps the contract the real providers keep (and that ``tests/test_provider_*.py`` check
against the mocked clouds): ``launch`` is all-or-nothing and idempotent on the client token, it
tags every node with its lease, ``describe``/``list_managed`` show what still exists (an
interrupted or stopped VM is still listed until it is terminated), ``terminate`` is safe to
repeat. Failures are scripted: :meth:`FakeProvider.fail` makes the next call(s) of a method raise
a given :class:`providers.base.ProviderError`; :attr:`FakeProvider.capacity` limits how many
nodes of a shape a region can hold. :class:`FakeShapes` launches several shapes in one request
(EC2 Fleet, GCP bulkInsert) and :class:`FakeBlocks` sells Capacity Blocks, on the same terms.
"""
from __future__ import annotations

import itertools
import threading
from collections import defaultdict, deque
from dataclasses import replace
from typing import Callable, Sequence

from providers.base import (TAG_LEASE, BlockOrder, BlockState, BoughtBlock, CapacityError, Instance, InstanceState,
                            InvalidRequestError, LaunchSpec, NoShapeAvailable, ProviderError, Scope, Shape,
                            StopReason)


class FakeProvider:
    """One cloud in memory. ``capacity[(region, instance_type)]`` caps live nodes of that shape
    there (absent = unlimited); ``clock`` stamps ``launched_at``."""

    def __init__(self, name: str, *, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.name = name
        self.clock = clock
        self.capacity: dict[tuple[str, str], int] = {}
        self.instances: dict[str, Instance] = {}  # instance id -> what the cloud holds now
        self.calls: list[tuple[str, object]] = []  # (method, argument), in order
        self._tokens: dict[str, list[str]] = {}  # client token -> the instance ids it made
        self._failures: dict[str, deque[BaseException | Callable[..., None]]] = defaultdict(deque)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # -- scripting ----------------------------------------------------------------------------
    def fail(self, method: str, error: BaseException | Callable[..., None], times: int = 1) -> None:
        """The next ``times`` calls of ``method`` raise ``error`` — a :class:`ProviderError`, or
        anything an SDK lets escape — or call it with the argument, so a test can fail after a
        side effect (e.g. launch, then lose the answer)."""
        assert method in ("launch", "launch_shapes", "describe", "list_managed", "terminate", "buy_capacity_block",
                          "capacity_block"), method
        self._failures[method].extend([error] * times)

    def interrupt(self, instance_id: str, detail: str = "spot capacity reclaimed") -> Instance:
        """The cloud reclaims a node: it stops with reason ``interrupted`` and stays listed."""
        with self._lock:
            i = self.instances[instance_id] = replace(self.instances[instance_id], state=InstanceState.TERMINATED,
                                                      stop_reason=StopReason.INTERRUPTED, stop_detail=detail)
        return i

    def vanish(self, instance_id: str) -> None:
        """The node disappears without a trace (a reclaimed VM whose action is delete)."""
        with self._lock:
            del self.instances[instance_id]

    def plant(self, lease_id: str, region: str, instance_type: str, market, *, zone: str = "", node_name: str = "",
              instance_id: str = "") -> Instance:
        """A tagged node nobody launched through this object (another replica's, a leftover)."""
        with self._lock:
            iid = instance_id or f"{self.name}-i-{next(self._ids)}"
            inst = Instance(self.name, iid, region, zone or f"{region}-a", instance_type, market,
                            InstanceState.RUNNING, lease_id, node_name, "10.0.0.1", launched_at=self.clock())
            self.instances[iid] = inst
        return inst

    def alive(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.state in (InstanceState.PENDING, InstanceState.RUNNING)]

    def _scripted(self, method: str, arg: object) -> None:
        with self._lock:
            self.calls.append((method, arg))
            queued = self._failures[method]
            failure = queued.popleft() if queued else None
        if isinstance(failure, BaseException):
            raise failure
        if failure is not None:
            failure(arg)

    # -- the protocol --------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> list[Instance]:
        self._scripted("launch", spec)
        if spec.provider != self.name:  # the real providers refuse a spec made for another cloud
            raise InvalidRequestError(f"launch spec is for provider {spec.provider!r}, not {self.name}",
                                      provider=self.name, code="WrongProvider", scope=Scope.CLOUD)
        if spec.count < 1 or len(spec.node_names) != spec.count:
            raise InvalidRequestError(f"launch spec asks for {spec.count} nodes but names {len(spec.node_names)}",
                                      provider=self.name, code="BadNodeCount", region=spec.region)
        with self._lock:
            made = self._tokens.get(spec.client_token)
            if made is not None:  # the same call again: what it made, not more
                return [self.instances[k] for k in made if k in self.instances]
            key = (spec.region, spec.instance.name)
            used = sum(1 for i in self.alive() if (i.region, i.instance_type) == key)
            if key in self.capacity and used + spec.count > self.capacity[key]:
                raise CapacityError(f"no capacity for {spec.count} x {spec.instance.name} in {spec.region}",
                                    provider=self.name, code="InsufficientCapacity", region=spec.region,
                                    zone=spec.zone)
            zone = spec.zone or f"{spec.region}-a"
            out = []
            for n in range(spec.count):
                iid = f"{self.name}-i-{next(self._ids)}"
                out.append(Instance(self.name, iid, spec.region, zone, spec.instance.name, spec.market,
                                    InstanceState.RUNNING, spec.tags.get(TAG_LEASE, ""), spec.node_names[n],
                                    f"10.0.0.{len(self.instances) % 250 + 1}", launched_at=self.clock()))
            for i in out:
                self.instances[i.instance_id] = i
            self._tokens[spec.client_token] = [i.instance_id for i in out]
            return out

    def describe(self, lease_id: str, region: str) -> list[Instance]:
        self._scripted("describe", (lease_id, region))
        with self._lock:
            return [i for i in self.instances.values() if i.lease_id == lease_id and i.region == region]

    def list_managed(self, regions: Sequence[str] | None = None) -> list[Instance]:
        self._scripted("list_managed", regions)
        with self._lock:
            return [i for i in self.instances.values() if i.lease_id and (regions is None or i.region in regions)]

    def terminate(self, instances: Sequence[Instance]) -> None:
        self._scripted("terminate", [i.instance_id for i in instances])
        with self._lock:
            for i in instances:
                self.instances.pop(i.instance_id, None)


class FakeShapes(FakeProvider):
    """A cloud that launches one lease on the first of several shapes in one request, as an EC2
    Fleet ``instant`` request or a GCP ``bulkInsert`` does (:class:`providers.base.ShapesProvider`):
    each shape is tried in order as :meth:`FakeProvider.launch` would, and the first it has
    capacity for is launched; when none is, :class:`NoShapeAvailable` names each refusal."""

    def launch_shapes(self, spec: LaunchSpec, shapes: Sequence[Shape]) -> tuple[Shape, list[Instance]]:
        self._scripted("launch_shapes", (spec, tuple(shapes)))
        failures: list[tuple[Shape, ProviderError]] = []
        for shape in shapes:
            try:
                return shape, self.launch(replace(spec, instance=shape.instance, zone=shape.zone, market=shape.market))
            except CapacityError as e:
                failures.append((shape, e))
        raise NoShapeAvailable(f"none of {len(shapes)} shapes available", provider=self.name,
                               code=failures[0][1].code, region=spec.region, failures=failures)


class FakeBlocks(FakeProvider):
    """A cloud that sells Capacity Blocks (:class:`providers.base.BlockBuyer`): a purchase is
    idempotent on the lease and makes a scheduled block; :meth:`set_block` moves it on (active,
    cancelled) as the cloud would at its start."""

    def __init__(self, name: str, *, clock: Callable[[], float] = lambda: 0.0) -> None:
        super().__init__(name, clock=clock)
        self.blocks: dict[str, BoughtBlock] = {}  # lease id -> the block bought for it

    def buy_capacity_block(self, order: BlockOrder, lease_id: str) -> BoughtBlock:
        self._scripted("buy_capacity_block", (order, lease_id))
        with self._lock:
            if lease_id not in self.blocks:
                self.blocks[lease_id] = BoughtBlock(f"cr-{len(self.blocks) + 1}", order.zone, BlockState.SCHEDULED,
                                                    order.starts_at, order.starts_at + order.duration_h * 3600,
                                                    order.max_fee_micros)
            return self.blocks[lease_id]

    def capacity_block(self, region: str, reservation_id: str) -> BoughtBlock:
        self._scripted("capacity_block", (region, reservation_id))
        with self._lock:
            return next(b for b in self.blocks.values() if b.reservation_id == reservation_id)

    def set_block(self, reservation_id: str, state: BlockState) -> None:
        with self._lock:
            for lease_id, b in self.blocks.items():
                if b.reservation_id == reservation_id:
                    self.blocks[lease_id] = replace(b, state=state)
