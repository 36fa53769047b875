"""Protobuf messages ⇄ the broker's dict/domain shapes. The gRPC layer and its client only."""
from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp

from broker.lease import EventKind, LeaseState
from broker.v1 import broker_pb2 as pb
from policies.causes import Verdict
from policies.cost import ExclusionKind
from policies.demand import Demand
from broker.records import ExplicitOffer, Job, LaunchOrder
from broker.times import as_of, iso


if TYPE_CHECKING:  # at run time imported where used: broker.jobs brings the store's SQL layer
    from broker.jobs import JobReport
    from broker.quote import Quote

MARKET_TO_PB = {"on_demand": pb.MARKET_ON_DEMAND, "spot": pb.MARKET_SPOT, "reserved": pb.MARKET_RESERVED,
                "queued": pb.MARKET_QUEUED}
MARKET_FROM_PB = {v: k for k, v in MARKET_TO_PB.items()}
STATE_TO_PB = {s.value: pb.LeaseState.Value(f"LEASE_STATE_{s.name}") for s in LeaseState}
STATE_FROM_PB = {v: k for k, v in STATE_TO_PB.items()}
#: Every event kind has its protobuf value (LEASE_EVENT_KIND_<NAME>; a test checks both ways).
EVENT_TO_PB = {k: pb.LeaseEventKind.Value(f"LEASE_EVENT_KIND_{k.name}") for k in EventKind}
JOB_STATE_TO_PB = {"running": pb.JOB_STATE_RUNNING, "succeeded": pb.JOB_STATE_SUCCEEDED,
                   "failed": pb.JOB_STATE_FAILED, "cancelled": pb.JOB_STATE_CANCELLED}
JOB_STATE_FROM_PB = {v: k for k, v in JOB_STATE_TO_PB.items()}
ACTION_TO_PB = {"continue": pb.JOB_ACTION_CONTINUE, "checkpoint": pb.JOB_ACTION_CHECKPOINT,
                "stop": pb.JOB_ACTION_STOP}
EXCLUSION_TO_PB = {k: pb.ExclusionKind.Value(f"EXCLUSION_KIND_{k.name}") for k in ExclusionKind}
EXCLUSION_FROM_PB = {v: k.value for k, v in EXCLUSION_TO_PB.items()}
VERDICT_TO_PB = {v: pb.Verdict.Value(f"VERDICT_{v.name}") for v in Verdict}


def ts(seconds: float | None) -> Timestamp | None:
    if not seconds:
        return None
    t = Timestamp()
    t.FromNanoseconds(int(seconds * 1e9))
    return t


def from_ts(t: Timestamp) -> float | None:
    return t.ToNanoseconds() / 1e9 if (t.seconds or t.nanos) else None


def money(value: float | Decimal | int) -> str:
    return format(Decimal(str(value)).quantize(Decimal("0.0001")), "f")


def ten_thousandths(micros: int) -> int:
    """Micro-dollars in ten-thousandths of a dollar, rounded half to even (as
    :func:`broker.quote.usd` rounds), in integers only."""
    if micros >= 0:
        q, r = divmod(micros, 100)
        return q + 1 if r > 50 or (r == 50 and q & 1) else q
    q, r = divmod(-micros, 100)
    return -(q + 1) if r > 50 or (r == 50 and q & 1) else -q


def usd_text(micros: int) -> str:
    """``money(usd(micros))`` without a Decimal: "12.3400" from 12_340_000 micro-dollars."""
    t = ten_thousandths(micros)
    return _usd_4dp(t) if t or micros >= 0 else "-0.0000"


def _usd_4dp(t: int) -> str:
    """Ten-thousandths of a dollar as "D.DDDD"."""
    if t >= 0:
        return f"{t // 10000}.{t % 10000:04d}"
    return f"-{-t // 10000}.{-t % 10000:04d}"


# -- demand ------------------------------------------------------------------------------------
def demand_from_pb(m: pb.Demand) -> Demand:
    return Demand(
        gpus=m.gpus, hours=m.hours, gpu_model=m.gpu_model, min_gpu_memory_gb=m.min_gpu_memory_gb,
        nodes=m.nodes, data_in_gb=m.data_in_gb, data_location=m.data_location or "onprem",
        data_out_gb=m.data_out_gb, interruptible=m.interruptible, checkpoint_minutes=m.checkpoint_minutes,
        providers=tuple(m.providers), regions=tuple(m.regions), residency=tuple(m.residency),
        min_sla_pct=m.min_sla_pct, deadline=from_ts(m.deadline) if m.HasField("deadline") else None,
        tenant=m.tenant or "default",
    )


def demand_to_pb(d: Demand) -> pb.Demand:
    m = pb.Demand(
        gpu_model=d.gpu_model, min_gpu_memory_gb=d.min_gpu_memory_gb, gpus=d.gpus, nodes=d.nodes,
        hours=d.hours, data_in_gb=d.data_in_gb, data_location=d.data_location, data_out_gb=d.data_out_gb,
        interruptible=d.interruptible, checkpoint_minutes=d.checkpoint_minutes, providers=list(d.providers),
        regions=list(d.regions), residency=list(d.residency), min_sla_pct=d.min_sla_pct,
        tenant="" if d.tenant == "default" else d.tenant,  # unnamed: the server decides (token or default)
    )
    if d.deadline:
        m.deadline.CopyFrom(ts(d.deadline))
    return m


# -- quote -------------------------------------------------------------------------------------
def quote_to_pb(q: "Quote") -> pb.Quote:
    m = quote_body_pb(q)
    m.quote_id = q.quote_id
    m.valid_until.CopyFrom(ts(q.valid_until))
    return m


def quote_body_pb(q: "Quote") -> pb.Quote:
    """The part of a Quote message that a repeated demand shares (everything but the id and
    validity). Money is formatted from the integer micro-dollars (no Decimal on this path):
    each line rounded half to even to the ten-thousandth, the total the sum of the rounded lines."""
    from broker.views import market_fields, queued_fields

    m = pb.Quote(catalog_as_of=q.catalog_as_of, demand=demand_to_pb(q.demand), spot_model=q.spot_model,
                 prices_only=q.prices_only)
    add_offer, add_excluded = m.offers.add, m.excluded.add
    for r in q.offers:
        p, o, it, c = r.priced, r.priced.offering, r.priced.offering.instance, r.priced.cost
        lines = [ten_thousandths(x) for x in c]  # compute, interruption, storage, data transfer, SLA risk
        text = [_usd_4dp(t) if t or x >= 0 else "-0.0000" for t, x in zip(lines, c)]
        add_offer(
            rank=r.rank, provider=it.provider, region=o.region, zone=p.zone, instance_type=it.name,
            gpu=it.gpu, gpus_per_node=it.gpus, gpu_memory_gb=it.gpu_memory_gb, nodes=p.nodes,
            market=MARKET_TO_PB[o.market.value], hourly_usd=usd_text(o.hourly_micros),
            interconnect=it.interconnect, interconnect_gbps=it.interconnect_gbps, sla_pct=o.sla_pct,
            runtime_hours=p.runtime_hours, **market_fields(o, q.created_at),
            cost=pb.CostBreakdown(
                compute_usd=text[0], interruption_usd=text[1], storage_usd=text[2], data_transfer_usd=text[3],
                sla_risk_usd=text[4], total_usd=_usd_4dp(sum(lines)),
            ),
        )
    for e in q.excluded:
        o = e.offering
        add_excluded(provider=o.instance.provider, region=o.region, instance_type=o.instance.name,
                     market=MARKET_TO_PB[o.market.value], reason=e.reason, kind=EXCLUSION_TO_PB[e.kind],
                     **queued_fields(o, q.created_at))
    return m


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def quote_response_bytes(q: "Quote", body: bytes) -> bytes:
    """The encoded ``QuoteResponse`` of ``q`` whose shared part ``body`` (quote_body_pb's
    encoding) is already made: the id and validity are encoded per call and put before it, in
    field order, so the bytes are exactly what serialising the whole message would give."""
    head = pb.Quote(quote_id=q.quote_id)
    head.valid_until.FromNanoseconds(int(q.valid_until * 1e9))
    quote = head.SerializeToString() + body
    return b"\x0a" + _varint(len(quote)) + quote  # QuoteResponse.quote: field 1, length-delimited


def _queued_of(m: Any) -> dict[str, Any]:
    """A protobuf Offer's / ExcludedOffer's queued-capacity fields, as :func:`broker.views.queued_fields`."""
    return {"starts_at": m.starts_at, "upfront_usd": m.upfront_usd, "max_run_hours": m.max_run_hours}


def quote_from_pb(q: pb.Quote) -> dict[str, Any]:
    """The same dict `broker quote --format json` prints in-process."""
    from broker.views import demand_to_dict

    return {
        "quote_id": q.quote_id,
        "valid_until": iso(from_ts(q.valid_until)),
        "catalog_as_of": as_of(q.catalog_as_of),
        "demand": demand_to_dict(demand_from_pb(q.demand)),
        "offers": [
            {
                "rank": o.rank, "provider": o.provider, "region": o.region, "zone": o.zone,
                "instance_type": o.instance_type, "gpu": o.gpu, "gpus_per_node": o.gpus_per_node,
                "nodes": o.nodes, "market": MARKET_FROM_PB[o.market], "hourly_usd": float(o.hourly_usd),
                "interconnect_gbps": o.interconnect_gbps, "sla_pct": o.sla_pct,
                "cost_usd": {
                    "compute": float(o.cost.compute_usd), "interruption": float(o.cost.interruption_usd),
                    "storage": float(o.cost.storage_usd), "data_transfer": float(o.cost.data_transfer_usd),
                    "sla_risk": float(o.cost.sla_risk_usd), "total": float(o.cost.total_usd),
                },
                "price_as_of": as_of(o.price_as_of), "price_source": o.price_source, "stale": o.stale,
                "zones": list(o.zones), "interruptions_per_hour": o.interruptions_per_hour,
                "interruption_source": o.interruption_source, **_queued_of(o),
            }
            for o in q.offers
        ],
        "excluded": [
            {"provider": e.provider, "region": e.region, "instance_type": e.instance_type,
             "market": MARKET_FROM_PB[e.market], "kind": EXCLUSION_FROM_PB.get(e.kind, "unspecified"), "reason": e.reason,
             **_queued_of(e)}
            for e in q.excluded
        ],
        "spot_model": q.spot_model,
        "prices_only": q.prices_only,
    }


# -- leases ------------------------------------------------------------------------------------
def job_to_pb(job: dict) -> pb.Job:
    return pb.Job(job_id=job.get("job_id", ""), owner=job.get("owner", ""), queue=job.get("queue", ""),
                  checkpoint_uri=job.get("checkpoint_uri", ""), dataset_uri=job.get("dataset_uri", ""),
                  env=dict(job.get("env", {})), state=JOB_STATE_TO_PB.get(job.get("state", ""), pb.JOB_STATE_UNSPECIFIED),
                  restarts=int(job.get("restarts") or 0), max_restarts=int(job.get("max_restarts") or 0))


def job_view_from_pb(j: pb.Job) -> dict:
    """A lease's job as shown (what a client sends in a Job is :func:`job_from_pb`)."""
    out = job_from_pb(j)
    if j.state:
        out.update(state=JOB_STATE_FROM_PB.get(j.state, ""), restarts=j.restarts, max_restarts=j.max_restarts)
    return out


def report_from_pb(m: pb.ReportJobRequest) -> JobReport:
    from broker.jobs import JobReport

    return JobReport(m.lease_id, m.job_id, JOB_STATE_FROM_PB.get(m.state, "unspecified"),
                     m.exit_code if m.HasField("exit_code") else None, m.checkpoint_uri,
                     m.progress if m.HasField("progress") else None)


def job_from_pb(j: pb.Job) -> dict:
    return {"job_id": j.job_id, "owner": j.owner, "queue": j.queue, "checkpoint_uri": j.checkpoint_uri,
            "dataset_uri": j.dataset_uri, "env": dict(j.env)}


def job_record_from_pb(j: pb.Job) -> Job:
    """A hand-off's job as the lease's record of it."""
    return Job(job_id=j.job_id, owner=j.owner, queue=j.queue, checkpoint_uri=j.checkpoint_uri,
               dataset_uri=j.dataset_uri, env=dict(j.env))


def launch_from_pb(m: pb.LaunchRequest, tenant: str) -> LaunchOrder:
    """A LaunchRequest as the service's LaunchOrder, for the tenant the caller acts as."""
    which = m.WhichOneof("target")
    offer = None
    if which == "offering":
        o = m.offering
        offer = ExplicitOffer(o.provider, o.region, o.zone, o.instance_type,
                              MARKET_FROM_PB.get(o.market, "unspecified"), o.count)
    return LaunchOrder(
        idempotency_key=m.idempotency_key, tenant=tenant,
        quote_id=m.quote_offer.quote_id if which == "quote_offer" else "",
        rank=m.quote_offer.rank if which == "quote_offer" else 0, offer=offer,
        job=job_record_from_pb(m.job) if m.HasField("job") else Job(), node_names=tuple(m.node_names),
        bootstrap=m.bootstrap, max_lifetime_s=m.max_lifetime_s,
        max_restarts=m.max_restarts if m.HasField("max_restarts") else None,
    )


def lease_to_pb(d: dict[str, Any]) -> pb.Lease:
    """``d`` is :func:`broker.lifecycle.lease_view` output."""
    m = pb.Lease(
        lease_id=d["lease_id"], state=STATE_TO_PB[d["state"]], state_reason=d["state_reason"],
        provider=d["provider"], region=d["region"], zone=d["zone"], instance_type=d["instance_type"],
        market=MARKET_TO_PB[d["market"]], nodes=d["nodes"], hourly_usd=money(d["hourly_usd"]),
        cost_so_far_usd=money(d["cost_so_far_usd"]), idempotency_key=d["idempotency_key"],
        tenant=d["tenant"], quote_id=d["quote_id"], job=job_to_pb(d.get("job") or {}),
    )
    for i in d["instances"]:
        m.instances.add(instance_id=i["instance_id"], node_name=i.get("node_name", ""), zone=i.get("zone", ""),
                        private_ip=i.get("private_ip", ""), state=i.get("state", ""))
    m.created_at.CopyFrom(ts(d["created_at"]))
    m.updated_at.CopyFrom(ts(d["updated_at"]))
    return m


def lease_from_pb(m: pb.Lease) -> dict[str, Any]:
    return {
        "lease_id": m.lease_id, "state": STATE_FROM_PB.get(m.state, "unknown"), "state_reason": m.state_reason,
        "provider": m.provider, "region": m.region, "zone": m.zone, "instance_type": m.instance_type,
        "market": MARKET_FROM_PB.get(m.market, ""), "nodes": m.nodes, "hourly_usd": float(m.hourly_usd or 0),
        "cost_so_far_usd": float(m.cost_so_far_usd or 0), "tenant": m.tenant,
        "idempotency_key": m.idempotency_key, "quote_id": m.quote_id,
        "instances": [{"instance_id": i.instance_id, "node_name": i.node_name, "zone": i.zone,
                       "private_ip": i.private_ip, "state": i.state} for i in m.instances],
        "job": job_view_from_pb(m.job) if m.job.job_id else {},
        "created_at": iso(from_ts(m.created_at)), "updated_at": iso(from_ts(m.updated_at)),
    }


EVENT_FROM_PB = {v: k.value for k, v in EVENT_TO_PB.items()}


def decision_from_pb(d: pb.Decision) -> dict[str, Any]:
    """A decision as `broker decisions --format json` and `broker watch` print it."""
    return {"decision_id": d.decision_id, "at": iso(from_ts(d.at)), "action": d.action, "reason": d.reason,
            "job_ids": list(d.job_ids), "lease_id": d.lease_id}


def event_from_pb(m: pb.WatchLeasesResponse) -> dict[str, Any]:
    """A lease event in the CLI's one JSON dialect: the lease exactly as `broker lease --format
    json` prints it, lower-case kinds, RFC 3339 times."""
    out: dict[str, Any] = {"event_id": m.event_id, "kind": EVENT_FROM_PB.get(m.kind, "unspecified"),
                           "at": iso(from_ts(m.at)), "message": m.message}
    if m.HasField("lease"):
        out["lease"] = lease_from_pb(m.lease)
    if m.HasField("job"):
        out["job"] = job_from_pb(m.job)
    if m.HasField("decision"):
        out["decision"] = decision_from_pb(m.decision)
    return out


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
