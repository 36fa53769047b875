"""The bounds of every field a client or a file may set, by "Message.field" (the proto's names,
which are also the snapshot document's): numbers inside a range, strings of at most so many
characters and free of the characters no cloud, database or log line takes, lists of at most so
many entries. The gRPC edge (:mod:`broker.limits`) applies them to every request, the snapshot
document (:mod:`broker.watchers.snapshot_json`) to every record; this module imports nothing
heavy, so a command that reads a file pays nothing for gRPC.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from broker.paging import MAX_PAGE

TEN_YEARS_S = 10 * 365 * 24 * 3600
#: A tenant's name: what a token acts for, a budget is kept for, a lease is charged to.
TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
# Timestamp range of google.protobuf.Timestamp: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
TS_MIN, TS_MAX = -62135596800, 253402300799


@dataclass(frozen=True)
class Rule:
    lo: float | None = None
    hi: float | None = None
    chars: int | None = None   # strings: at most this many characters
    items: int | None = None   # lists: at most this many entries
    text: bool = False         # free text: tab, line feed and carriage return are allowed


# C0 and C1 controls, DEL, non-characters and surrogates; FREE_TEXT lets tab, LF and CR through.
_NONCHARS = "\ufdd0-\ufdef" + "".join(f"\\U{p + 0xFFFE:08x}\\U{p + 0xFFFF:08x}" for p in range(0, 0x110000, 0x10000))
_BAD = re.compile(f"[\x00-\x1f\x7f-\x9f\ud800-\udfff{_NONCHARS}]")
_BAD_IN_TEXT = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff{_NONCHARS}]")


def bad_character(value: str, text: bool = False) -> str:
    """How the first character no cloud takes is described ("U+0001, a control character"), or
    "" when ``value`` has none."""
    m = (_BAD_IN_TEXT if text else _BAD).search(value)
    if m is None:
        return ""
    cp = ord(m.group())
    kind = ("a NUL character" if cp == 0 else "a control character" if cp < 0xA0
            else "a lone surrogate" if 0xD800 <= cp <= 0xDFFF else "a Unicode non-character")
    return f"U+{cp:04X}, {kind}"


NAME, ID = Rule(chars=128), Rule(chars=256)
COUNT = Rule(0, 1_000_000)
SECONDS = Rule(0, TEN_YEARS_S)
GB = Rule(0, 1e7)  # 10 PB
# Field rules by "Message.field"; node counts and node lists are bounded by max_nodes (Bounds).
FIELDS: dict[str, Rule] = {
    "Demand.gpu_model": NAME, "Demand.tenant": NAME, "Demand.data_location": NAME,
    "Demand.gpus": Rule(0, 100_000), "Demand.min_gpu_memory_gb": Rule(0, 10_000),
    "Demand.hours": Rule(0, 24 * 365 * 10), "Demand.data_in_gb": GB, "Demand.data_out_gb": GB,
    "Demand.checkpoint_minutes": Rule(0, 60 * 24 * 365), "Demand.min_sla_pct": Rule(0, 100),
    "Demand.providers": Rule(items=16, chars=32), "Demand.regions": Rule(items=256, chars=64),
    "Demand.residency": Rule(items=64, chars=64),
    "QuoteRequest.top": Rule(0, 100_000),
    "QuoteOffer.quote_id": ID, "QuoteOffer.rank": Rule(0, 100_000),
    "Offering.provider": NAME, "Offering.region": NAME, "Offering.zone": NAME, "Offering.instance_type": NAME,
    "LaunchRequest.idempotency_key": ID, "LaunchRequest.tenant": NAME, "LaunchRequest.bootstrap": NAME,
    "LaunchRequest.max_lifetime_s": SECONDS, "LaunchRequest.node_names": Rule(chars=128),
    "Job.job_id": ID, "Job.owner": NAME, "Job.queue": NAME, "Job.env": Rule(items=512),
    "GetLeaseRequest.lease_id": ID, "ReleaseRequest.lease_id": ID, "HandoffRequest.lease_id": ID,
    "WatchLeasesRequest.lease_id": ID, "WatchLeasesRequest.after_event_id": Rule(0, 2**62),
    "ListLeasesRequest.tenant": NAME, "ListLeasesRequest.limit": Rule(0, MAX_PAGE),
    "ListLeasesRequest.page_token": Rule(chars=1024),
    "ListLeasesRequest.states": Rule(items=16), "ListDecisionsRequest.limit": Rule(0, MAX_PAGE),
    "ReleaseRequest.reason": Rule(chars=1024, text=True), "PendingJob.pending_reason": Rule(text=True),
    "ClusterNode.reason": Rule(text=True),
    "PendingJob.job_id": ID, "PendingJob.user": NAME, "PendingJob.queue": NAME, "PendingJob.gpus": Rule(0, 100_000),
    "PendingJob.gpu_model": NAME, "PendingJob.min_gpu_memory_gb": Rule(0, 10_000),
    "PendingJob.time_limit_s": SECONDS, "PendingJob.est_runtime_s": SECONDS, "PendingJob.waited_s": SECONDS,
    "PendingJob.checkpoint_minutes": Rule(0, 60 * 24 * 365), "PendingJob.data_gb": GB, "PendingJob.kind": NAME,
    "ClusterNode.name": NAME, "ClusterNode.state": NAME, "ClusterNode.gpus_total": Rule(0, 1024),
    "ClusterNode.gpus_allocated": Rule(0, 1024), "ClusterNode.gpu_model": NAME,
    "ClusterNode.partitions": Rule(items=256, chars=128),
    "GpuSample.node": NAME, "GpuSample.index": Rule(0, 1024), "GpuSample.utilization_pct": Rule(0, 100),
    "GpuSample.memory_used_mb": Rule(0, 1e9),
    "RunningJob.job_id": ID, "RunningJob.user": NAME, "RunningJob.queue": NAME, "RunningJob.gpus": Rule(0, 100_000),
    "RunningJob.runtime_s": SECONDS, "RunningJob.time_limit_s": SECONDS, "RunningJob.est_runtime_s": SECONDS,
    "QueueSnapshot.source": NAME,
    "LaunchRequest.max_restarts": Rule(0, 1000), "Job.restarts": Rule(0, 1_000_000),
    "Job.max_restarts": Rule(0, 1000), "ReportJobRequest.lease_id": ID, "ReportJobRequest.job_id": ID,
    "ReportJobRequest.checkpoint_uri": Rule(chars=2048), "ReportJobRequest.progress": Rule(0, 1),
}
