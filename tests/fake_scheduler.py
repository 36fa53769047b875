"""A scheduler kind that is no real scheduler, for the registry's tests: its watcher returns the
snapshot it is given and records what the core asks of it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from msgspec import Meta

from broker.watchers.base import HandoffError, JoinSpec, UnknownNodes
from broker.watchers.registry import SchedulerKind
from policies.queue import PendingJob, QueueSnapshot
from providers.settings import Table, bad


class FakeSettings(Table):
    enabled: bool = False
    name: Annotated[str, Meta(min_length=1)] = "one"
    nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.name != self.name.strip():
            raise bad("name", "must not start or end with a space")


@dataclass
class Plain:
    """A watcher with no capability: reads a queue, nothing more."""

    source: str = "fake:one"
    snap: QueueSnapshot | None = None
    fail: str = ""

    def snapshot(self, now: float) -> QueueSnapshot:
        if self.fail:
            raise RuntimeError(self.fail)
        assert self.snap is not None
        return QueueSnapshot(self.source, now, self.snap.pending, self.snap.nodes, running=self.snap.running)


@dataclass
class Capable(Plain):
    """Every capability; ``refuse`` job ids fail their hand-off or move."""

    offload_queue: str = "light"
    bootstrap: str = ""
    nodes: tuple[str, ...] = ()
    refuse: frozenset[str] = frozenset()
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def _do(self, what: str, job_ids: list[str]) -> list[str]:
        self.calls.append((what, tuple(job_ids)))
        bad_ones = [(j, "refused by the fake") for j in job_ids if j in self.refuse]
        if bad_ones:
            raise HandoffError.of(bad_ones)
        return list(job_ids)

    def allow_burst(self, job_ids: list[str]) -> None:
        self._do("allow_burst", job_ids)

    def offload(self, job_ids: list[str]) -> list[str]:
        return self._do("offload", job_ids)

    def drain_and_requeue(self, nodes, reason: str) -> list[str]:
        self.calls.append(("drain", tuple(nodes)))
        if not set(nodes) & set(self.nodes):
            raise UnknownNodes(f"{self.source} has no node {', '.join(nodes)}")
        return [f"job-on-{n}" for n in nodes]


@dataclass
class Joining(Plain):
    """A watcher whose burst nodes boot into its cluster."""

    stopped: int = 0

    def join_spec(self, job: PendingJob) -> JoinSpec:
        return JoinSpec(bootstrap="container", env={"FAKE_CLUSTER": self.source, "FAKE_JOB": job.job_id})

    def stop(self) -> None:
        self.stopped += 1


def build(settings: FakeSettings) -> Capable:
    return Capable(source=f"fake:{settings.name}", nodes=settings.nodes)


def check(settings: FakeSettings, config) -> None:
    """A check spanning tables: a cluster named "lab" needs a [quote] TTL of an hour or more."""
    if settings.name == "lab" and config.quote.ttl_s < 3600:
        raise bad("name", f"\"lab\" needs quote.ttl_s of 3600 or more, got {config.quote.ttl_s}")


KIND = SchedulerKind(name="fakesched", settings=FakeSettings, build=build, summary="for the tests",
                     check=check)
