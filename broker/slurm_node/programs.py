"""Slurm's power-saving programs (``broker slurm resume|suspend|resume-fail HOSTLIST``, run by
slurmctld through deploy/slurm/*.sh).

:func:`resume` reads ``SLURM_RESUME_FILE``, groups the nodes by job (a multi-node job's nodes are one gang lease; a node in no job is a
  lease of its own), quotes each group from its node shape on the broker server, launches offer 1
  of the quote with the Slurm node names (the lease fails over across the quote's other offers
  by itself), and points Slurm at the instances (``scontrol update nodename=N nodeaddr=IP
  nodehostname=N``). When a group cannot be launched its nodes are set DOWN with the reason
  (``reason="broker: …"``), so Slurm requeues their jobs at once instead of waiting for
  ResumeTimeout. :func:`suspend` releases the live leases whose instances carry the suspended
  node names; :func:`resume_fail` releases them too. Everything is logged as structlog JSON to a
  file, because slurmctld discards the programs' output.

Idempotency: the lease of a group is launched under the key ``slurm-<hostlist>-<digest>``, the
digest taken over the resume file (or, without one, the host list and the 10-minute window), so a
re-run of the same resume returns the same lease and launches nothing. A node that already has
a live lease is never launched again. Only a key whose lease has ended (released or failed: the
node was suspended, or the launch failed) is followed by a new one (``…-<digest>.2``), because
then Slurm really asks for the node again.
"""
from __future__ import annotations

import contextvars
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import hostlist
import structlog

from broker.lease import SERVING, LeaseState
from broker.slurm.commands import Scontrol, SlurmHandoffError
from broker.slurm.records import SlurmJob
from broker.slurm.settings import SlurmSettings
from broker.slurm_node.groups import (Group, ResumeRequest, demand_for, expand, group_nodes, idempotency_key,
                                      lease_nodes, resume_digest, split_by_shape)
from policies.demand import Demand

log = structlog.get_logger("broker.slurm")

# Leases that serve their nodes or are about to; any other (draining, released, failed) is on its
# way out, and Slurm asking for its nodes again needs a new lease.
SERVING_STATES = [s.value for s in LeaseState if s in SERVING]


def node_reason(text: str) -> str:
    """A node reason: one line, printable, short enough for Slurm."""
    one = " ".join(str(text).split())
    return f"broker: {one}"[:240]



# ---------------------------------------------------------------------------------------------
# the programs
class BrokerApi(Protocol):
    def quote(self, demand: Demand, top: int = 0) -> dict[str, Any]: ...
    def launch(self, request: Any) -> dict[str, Any]: ...
    def list_leases(self, states: list[str] = (), tenant: str = "", limit: int = 0) -> list[dict[str, Any]]: ...
    def release(self, lease_id: str, reason: str = "") -> dict[str, Any]: ...


@dataclass
class Outcome:
    """What a program did, for the log and the exit code."""

    launched: list[dict] = field(default_factory=list)  # {"nodes", "lease_id", "jobs", ...}
    reused: list[dict] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    kept: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)  # {"nodes", "error"}
    ignored: list[str] = field(default_factory=list)  # nodes that are not the broker's

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def _live_by_node(broker: BrokerApi) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for lease in broker.list_leases(SERVING_STATES):
        for n in lease_nodes(lease):
            out[n] = lease
    return out


def _launch_request(group: Group, quote_id: str, key: str, settings: SlurmSettings, job: SlurmJob | None):
    from broker.v1 import broker_pb2 as pb

    req = pb.LaunchRequest(idempotency_key=key, tenant=settings.tenant, bootstrap=settings.bootstrap,
                           node_names=list(group.nodes))
    req.quote_offer.quote_id, req.quote_offer.rank = quote_id, 1
    if group.job_ids:
        req.job.job_id = group.job_ids[0]
        if job is not None:
            req.job.owner, req.job.queue = job.user, job.partition
        req.job.env["SLURM_JOB_IDS"] = ",".join(group.job_ids)
    return req


def _launch_group(group: Group, settings: SlurmSettings, broker: BrokerApi, scontrol: Scontrol,
                  digest: str, jobs: Sequence[SlurmJob]) -> dict:
    lg = log.bind(nodes=group.hostlist, jobs=list(group.job_ids))
    demand = demand_for(group, jobs, settings.tenant)
    lg.info("quoting", gpus=demand.gpus, gpu_model=demand.gpu_model, node_count=demand.nodes,
            hours=round(demand.hours, 3), interruptible=demand.interruptible)
    q = broker.quote(demand)
    if not q["offers"]:
        reasons = sorted({e["reason"] for e in q["excluded"]})[:3]
        raise SlurmHandoffError(f"no cloud offer fits {demand.nodes} x {demand.gpus // demand.nodes} "
                                f"{demand.gpu_model or 'GPU'}: " + ("; ".join(reasons) or "nothing quoted"))
    lease = None
    for attempt in range(1, 6):
        key = idempotency_key(group, digest, attempt)
        lease = broker.launch(_launch_request(group, q["quote_id"], key, settings, jobs[0] if jobs else None))
        if lease["state"] in SERVING:
            break
        lg.info("key_ended", key=key, lease=lease["lease_id"], state=lease["state"],
                why="that lease has ended: Slurm asks for the nodes again")
    else:
        raise SlurmHandoffError(f"five leases for {group.hostlist} have ended under this resume; giving up")
    lg = lg.bind(lease=lease["lease_id"], provider=lease["provider"])
    lg.info("launched", state=lease["state"], region=lease["region"], instance_type=lease["instance_type"],
            market=lease["market"], key=key, quote=q["quote_id"])
    try:
        if lease["state"] != LeaseState.RUNNING:
            raise SlurmHandoffError(f"lease {lease['lease_id']} is {lease['state']}: {lease['state_reason']}")
        by_name = {i["node_name"]: i for i in lease["instances"]}
        missing = [n for n in group.nodes if n not in by_name]
        if missing:
            raise SlurmHandoffError(f"lease {lease['lease_id']} has no instance for {','.join(missing)}")
        if settings.set_node_addr:
            for n in group.nodes:
                ip = by_name[n].get("private_ip", "")
                if not ip:
                    raise SlurmHandoffError(f"instance {by_name[n]['instance_id']} of {n} has no private IP")
                scontrol.set_node_addr(n, ip, n)
                lg.info("node_addr_set", node=n, addr=ip)
    except Exception as e:
        try:
            broker.release(lease["lease_id"], f"slurm resume of {group.hostlist} failed: {e}")
            lg.info("released_after_failure")
        except Exception as e2:  # the resume-fail program and the reconciler get it later
            lg.error("release_failed", error=str(e2))
        raise
    return {"nodes": group.hostlist, "lease_id": lease["lease_id"], "jobs": list(group.job_ids),
            "provider": lease["provider"], "region": lease["region"],
            "instance_type": lease["instance_type"], "market": lease["market"]}


def resume(nodes_arg: str, settings: SlurmSettings, broker: BrokerApi, *,
           request: ResumeRequest | None = None, scontrol: Scontrol | None = None,
           now: float | None = None, workers: int = 8) -> Outcome:
    """ResumeProgram: launch the nodes of ``nodes_arg`` (see the module doc)."""
    scontrol = scontrol or Scontrol(settings.scontrol, settings.env, settings.command_timeout_s)
    now = time.time() if now is None else now
    nodes = expand(nodes_arg)
    out = Outcome()
    if request is not None and request.all_nodes and set(request.all_nodes) != set(nodes):
        log.warning("resume_file_mismatch", all_nodes=hostlist.collect_hostlist(list(request.all_nodes)),
                    argument=nodes_arg, note="the argument decides")
    groups, unknown = split_by_shape(group_nodes(nodes, request), settings)
    if unknown:
        out.ignored = unknown
        log.error("nodes_without_shape", nodes=hostlist.collect_hostlist(unknown),
                  shapes=sorted(settings.shapes),
                  note="not the broker's: left to Slurm; add a [slurm.shapes] entry or exclude them "
                       "from power saving (SuspendExcNodes)")
    digest = resume_digest(nodes_arg, request, now)
    live: dict[str, dict] | None = None
    err = ""
    try:
        live = _live_by_node(broker)
    except Exception as e:
        err = f"cannot list the broker's leases: {_error_text(e)}"
    todo: list[Group] = []
    for g in groups:
        if live is None:
            out.failed.append({"nodes": g.hostlist, "error": err})
            continue
        have = [n for n in g.nodes if n in live]
        for n in have:
            lease = live[n]
            out.reused.append({"nodes": n, "lease_id": lease["lease_id"], "state": lease["state"]})
            log.info("already_leased", node=n, lease=lease["lease_id"], state=lease["state"])
        rest = tuple(n for n in g.nodes if n not in live)
        if rest:
            todo.append(dataclasses.replace(g, nodes=rest))

    def read_jobs(g: Group) -> list[SlurmJob]:
        jobs = []
        for jid in g.job_ids:
            try:
                j = scontrol.job(jid)
            except Exception as e:  # the shape's defaults do; the resume must not fail on this
                log.warning("job_unreadable", job=jid, error=str(e))
                continue
            if j is not None:
                jobs.append(j)
        return jobs

    def one(g: Group) -> tuple[Group, dict | None, str]:
        try:
            return g, _launch_group(g, settings, broker, scontrol, digest, read_jobs(g)), ""
        except Exception as e:  # every failure of a group ends in its nodes set DOWN
            return g, None, _error_text(e)

    if todo:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo))),
                                thread_name_prefix="resume") as pool:
            # each task runs in a copy of this context: the log's bound command/hostlist go along
            futures = [pool.submit(contextvars.copy_context().run, one, g) for g in todo]
            results = [f.result() for f in futures]
        for g, done, error in results:
            if done is not None:
                out.launched.append(done)
            else:
                out.failed.append({"nodes": g.hostlist, "error": error})
    down: dict[str, list[str]] = {}  # reason -> nodes: one scontrol call per distinct reason
    for f in out.failed:
        log.error("resume_failed", nodes=f["nodes"], error=f["error"])
        down.setdefault(node_reason(f["error"]), []).extend(expand(f["nodes"]))
    for reason, failed_nodes in down.items():
        names = hostlist.collect_hostlist(failed_nodes)
        try:
            scontrol.mark_down(failed_nodes, reason)
            log.info("nodes_down", nodes=names, reason=reason)
        except Exception as e:
            log.error("mark_down_failed", nodes=names, error=str(e))
    return out


def _error_text(e: Exception) -> str:
    from broker.client import ClientError

    if isinstance(e, ClientError):
        return f"broker {e.code.name.lower()}: {e}"
    return str(e) or type(e).__name__


def suspend(nodes_arg: str, settings: SlurmSettings, broker: BrokerApi, *,
            scontrol: Scontrol | None = None) -> Outcome:
    """SuspendProgram: release the live leases of these nodes. A gang lease whose other nodes
    Slurm still runs is kept until they are suspended too (their jobs must not lose nodes)."""
    scontrol = scontrol or Scontrol(settings.scontrol, settings.env, settings.command_timeout_s)
    nodes = set(expand(nodes_arg))
    out = Outcome()
    seen: set[str] = set()
    for lease in broker.list_leases(SERVING_STATES):
        carried = lease_nodes(lease)
        hit = carried & nodes
        if not hit:
            continue
        seen |= hit
        others = sorted(carried - nodes)
        if others:
            try:
                states = scontrol.node_states(others)
            except Exception as e:
                states = None
                log.warning("node_states_unreadable", nodes=hostlist.collect_hostlist(others), error=str(e))
            up = [n for n in others if states is not None and n in states and not (
                states[n] & {"POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"})]
            if states is None or up:
                out.kept.append({"lease_id": lease["lease_id"], "nodes": sorted(hit), "still_up": up or others})
                log.info("lease_kept", lease=lease["lease_id"], suspended=sorted(hit), still_up=up or others)
                continue
        _release(broker, lease, f"slurm suspended {hostlist.collect_hostlist(sorted(hit))}", out)
    for n in sorted(nodes - seen):
        log.info("no_lease", node=n, note="no live lease carries this node: nothing to release")
    return out


def resume_fail(nodes_arg: str, settings: SlurmSettings, broker: BrokerApi) -> Outcome:
    """ResumeFailProgram: the nodes did not come up in ResumeTimeout (Slurm has set them DOWN and
    requeued their jobs): release every live lease that carries one of them."""
    nodes = set(expand(nodes_arg))
    out = Outcome()
    seen: set[str] = set()
    for lease in broker.list_leases(SERVING_STATES):
        hit = lease_nodes(lease) & nodes
        if hit:
            seen |= hit
            _release(broker, lease, f"slurm: {hostlist.collect_hostlist(sorted(hit))} did not come up "
                                    f"within ResumeTimeout", out)
    log.warning("resume_failed_nodes", nodes=nodes_arg, with_lease=sorted(seen), without_lease=sorted(nodes - seen))
    return out


def _release(broker: BrokerApi, lease: Mapping[str, Any], reason: str, out: Outcome) -> None:
    try:
        done = broker.release(lease["lease_id"], reason)
        out.released.append(lease["lease_id"])
        log.info("released", lease=lease["lease_id"], provider=lease.get("provider", ""),
                 nodes=sorted(lease_nodes(lease)), state=done.get("state", ""), reason=reason)
    except Exception as e:
        out.failed.append({"nodes": ",".join(sorted(lease_nodes(lease))), "lease_id": lease["lease_id"],
                           "error": _error_text(e)})
        log.error("release_failed", lease=lease["lease_id"], error=_error_text(e))


# ---------------------------------------------------------------------------------------------
# logging to a file (slurmctld discards the programs' output)
def configure_file_logging(path: str, level: str = "info") -> str:
    """structlog JSON lines appended to ``path``; falls back to stderr when it cannot be opened.
    Returns where the log goes."""
    import logging
    import sys

    target = path
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        stream = open(path, "a", buffering=1, encoding="utf-8")
    except OSError as e:
        stream = sys.stderr
        target = f"stderr (cannot open {path}: {e.strerror or e})"
    lvl = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    return target
