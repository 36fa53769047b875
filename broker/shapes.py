"""Several shapes in one launch request: a failover list whose offers one cloud can take in one
call (an EC2 Fleet ``instant`` request, a GCP ``bulkInsert``) is tried as one attempt, and the lease
records the shape the cloud chose. :class:`ShapeAttempts` is a part of
:class:`broker.lifecycle.Lifecycle`, kept apart so each file stays one concern."""
from __future__ import annotations

import dataclasses
import traceback
from typing import Sequence

import structlog

from broker.attempts import FLEET_MARKETS, ProviderFault, alive, attempt_record, launch_tries
from broker.errors import BrokerError
from broker.lease import Lease
from broker.quote import Target
from broker.store import StaleLease
from providers.base import CapacityError, Instance, NoShapeAvailable, ProviderError, Shape, ShapesProvider

log = structlog.get_logger("broker.lifecycle")


class ShapeAttempts:
    """Launching several shapes of one cloud and region in one request (mixed into Lifecycle)."""

    def _shapes(self, first: Target, rest: Sequence[Target], taken: set[Target]) -> list[Target]:
        """The targets one several-shape request asks for, best first: ``first`` and every later
        target of the same cloud and region (other types, zones, markets) that is not blocked,
        when the cloud launches several shapes at once (:class:`ShapesProvider`) and they are
        more than one offer (type and market). Reserved and queued capacity, tied to one
        reservation or block, is launched on its own."""
        if first.market not in FLEET_MARKETS or first.reservation or \
                not isinstance(self.providers.get(first.provider), ShapesProvider):
            return [first]
        out = [first]
        for t in rest:
            if (t.provider, t.region, t.nodes) == (first.provider, first.region, first.nodes) and \
                    t.market in FLEET_MARKETS and not t.reservation and t not in taken and t not in out \
                    and self._blocked_reason(t) is None:
                out.append(t)
        if len({(t.instance_type, t.market) for t in out}) < 2:
            return [first]  # one offer (in however many zones) is launched zone by zone, as ever
        return out

    def _try_shapes(self, lease: Lease, shapes: list[Target],
                    attempts: list) -> tuple[Lease, list[Instance] | None, ProviderError | None]:
        """Launch on the first of ``shapes`` the cloud has capacity for, in one request (EC2 Fleet,
        Compute bulkInsert): (lease at the shape it got, instances, None), or (lease, None, the
        error). Every shape the cloud refused is an attempt of the lease and blocks its scope;
        throttling and 5xx repeat the request with backoff, as for one offer."""
        first = shapes[0]
        tries = launch_tries(self.settings.retries, self.settings.backoff_s, self.sleep,
                             lease=lease.lease_id, provider=first.provider)
        try:
            for call in tries:
                with call:
                    lease = self._begin_attempt(lease, first, attempts, shapes=len(shapes))
                    try:
                        got, instances = self._launch_shapes(lease, shapes)
                    except NoShapeAvailable as e:
                        self._no_shape(lease, shapes, e, attempts)
                        return lease, None, e
                    except ProviderError as e:
                        attempts.append(attempt_record(first, e))
                        log.warning("launch_failed", lease=lease.lease_id, provider=first.provider,
                                    region=first.region, code=e.code, scope=str(e.scope), shapes=len(shapes))
                        raise
        except ProviderError as e:
            self._refused(lease, first, e, attempts)
            return lease, None, e
        if call.retry_state.attempt_number > 1:
            self._discard_attempt(lease, first, keep=instances)
        if got != first:  # the lease records the shape it got, at that shape's price
            zone = instances[0].zone if instances else got.zone
            lease = self._write(lease, message=f"launched {got.nodes} x {got.instance_type} "
                                f"({got.market.value}) in {got.provider}/{zone or got.region}",
                                zone=zone, instance_type=got.instance_type, market=got.market.value,
                                hourly_micros=got.hourly_micros, reservation=got.reservation)
        return lease, instances, None

    def _no_shape(self, lease: Lease, shapes: list[Target], e: NoShapeAvailable, attempts: list) -> None:
        """Every shape the cloud refused is an attempt of the lease and blocks its scope; what
        the request may have made is rolled back."""
        first = shapes[0]
        for shape, refused in e.failures:
            t = self._target_of(shapes, shape)
            attempts.append(attempt_record(t, refused))
            self._block_named(refused, t, attempts)
        log.warning("launch_failed", lease=lease.lease_id, provider=first.provider, region=first.region,
                    code=e.code, scope=str(e.scope), shapes=len(shapes))
        self._discard_attempt(lease, first)

    @staticmethod
    def _target_of(targets: Sequence[Target], shape: Shape) -> Target:
        for t in targets:
            if (t.instance_type, t.zone, t.market) == (shape.instance.name, shape.zone, shape.market):
                return t
        for t in targets:  # a zone the cloud chose among those the shapes allowed
            if (t.instance_type, t.market) == (shape.instance.name, shape.market):
                return dataclasses.replace(t, zone=shape.zone)
        return targets[0]

    def _launch_shapes(self, lease: Lease, targets: list[Target]) -> tuple[Target, list[Instance]]:
        """``launch_shapes`` on the lease's cloud, held to its contract: ``spec.count`` live nodes
        all of one of the shapes asked for, or nothing."""
        first = targets[0]
        provider = self.providers[first.provider]
        assert isinstance(provider, ShapesProvider)
        spec = self.spec_for(lease)
        shapes = []
        for t in targets:
            it = self.engine.catalog.instance(t.provider, t.instance_type)
            if it is not None:
                shapes.append(Shape(it, t.zone, t.market, t.hourly_micros))
        try:
            shape, instances = provider.launch_shapes(spec, shapes)
        except (ProviderError, BrokerError, StaleLease):
            raise
        except Exception as e:  # a provider's bug: this request failed, said in one line
            said = (str(e).strip().splitlines() or [""])[0][:200]
            frame = traceback.extract_tb(e.__traceback__)[-1]
            log.error("launch_crashed", lease=lease.lease_id, provider=first.provider, region=first.region,
                      error=f"{type(e).__name__}: {said}", at=f"{frame.filename}:{frame.lineno} in {frame.name}")
            raise ProviderFault(f"{first.provider} raised {type(e).__name__}{': ' + said if said else ''}",
                                provider=first.provider, code=type(e).__name__, region=first.region) from e
        got = self._target_of(targets, shape)
        up = [x for x in instances if alive(x)]
        if len(up) == spec.count and all(shape.matches(x) for x in up) and shape in shapes:
            return got, up
        try:
            provider.terminate(instances)
        except ProviderError as e:  # _discard_attempt and the reconciler try again
            log.warning("terminate_failed", lease=spec.lease_id, provider=first.provider, error=str(e))
        raise CapacityError(f"only {len(up)} of {spec.count} nodes of one asked-for shape came up",
                            provider=first.provider, code="PartialLaunch", region=first.region, zone=shape.zone)

