"""policies.diagnose (pure) and the `broker diagnose` command on files."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.slurm.parse import parse_sinfo, parse_squeue
from broker.watchers.snapshot_json import dumps
from policies.diagnose import Cause, DiagnoseConfig, Diagnosis, diagnose, reason_kind
from policies.queue import ClusterNode, GpuSample, PendingJob, QueueSnapshot, RunningJob

FIX = Path(__file__).parent / "fixtures" / "slurm"
META = json.loads((FIX / "meta.json").read_text())
NOW = 10_000.0


def node(name, gpus=4, alloc=0, state=None, part=("gpu",), model="a100", reason=""):
    state = state or ("idle" if alloc == 0 else "alloc" if alloc >= gpus else "mix")
    return ClusterNode(name, state, gpus, alloc, model, part, reason)


def job(jid, gpus, reason="Resources", nodes=1, **kw):
    kw.setdefault("queue", "gpu")
    return PendingJob(jid, gpus, nodes=nodes, pending_reason=reason, **kw)


def snap(nodes=(), pending=(), running=(), samples=(), extra=None):
    return QueueSnapshot("test", NOW, tuple(pending), tuple(nodes), tuple(samples),
                         tuple(running), extra or {})


def kinds(d: Diagnosis) -> list[str]:
    return [c.kind for c in d.causes]


# ----------------------------------------------------------------------------- verdicts
def test_empty_queue_is_healthy():
    d = diagnose(snap([node("g1", alloc=2), node("g2")]), now=NOW)
    assert d.verdict == "healthy" and d.pending_gpus == 0
    assert d.allocation_rate == pytest.approx(0.25) and d.utilization is None
    assert d.actions == ("Nothing to do now: the queue is short.",)


def test_a_short_queue_is_healthy():
    nodes = [node(f"g{i}", gpus=8, alloc=8) for i in range(4)]  # 32 GPUs, full
    d = diagnose(snap(nodes, [job("1", 2, waited_s=60)]), now=NOW)  # 2 < 10 % of 32
    assert d.verdict == "healthy"
    d = diagnose(snap(nodes, [job("1", 2, waited_s=3600)]), now=NOW)  # but not a long wait
    assert d.verdict == "resource-bound"


def test_full_cluster_with_waiting_jobs_is_resource_bound():
    nodes = [node("g1", alloc=4), node("g2", alloc=4)]
    running = [RunningJob("r1", 4, nodes=("g1",)), RunningJob("r2", 4, nodes=("g2",))]
    pending = [job("p1", 2), job("p2", 2, reason="Priority"), job("p3", 1, reason="Priority",
                                                                  kind="eval")]
    d = diagnose(snap(nodes, pending, running), now=NOW)
    assert d.verdict == "resource-bound"
    assert d.allocation_rate == 1.0 and d.pending_gpus == 5
    cap = d.cause("capacity")
    assert cap.jobs == ("p1", "p2", "p3") and cap.gpus == 5
    assert d.cause("offloadable-work").jobs == ("p3",)
    assert d.cause("not-interruptible").jobs == ("p1", "p2")
    assert d.causes[0].kind == "capacity"
    assert d.actions[0].startswith("Burst the capacity-bound jobs")


def test_low_allocation_with_long_queue_is_scheduling_bound():
    nodes = [node("g1", alloc=1), node("g2", alloc=1)]
    pending = [job("p1", 4, exclusive=True), job("p2", 4)]
    d = diagnose(snap(nodes, pending), now=NOW)
    assert d.verdict == "scheduling-bound"
    assert d.allocation_rate == pytest.approx(0.25)
    assert any("under 70%" in s for s in d.signals)


def test_persistence_is_judged_on_the_history():
    nodes = [node("g1", alloc=2), node("g2", alloc=2)]  # 50 % now
    pending = [job("p1", 4, nodes=1)]  # 4 GPUs free but 2 + 2: fragmentation
    busy = [(NOW - 600 * i, 0.95) for i in range(1, 6)]
    d = diagnose(snap(nodes, pending), busy, now=NOW)
    assert not any("under 70%" in s for s in d.signals)  # one low sample is not persistent
    assert d.verdict == "scheduling-bound" and d.cause("fragmentation").jobs == ("p1",)
    idle = [(NOW - 600 * i, 0.4) for i in range(1, 6)]
    d2 = diagnose(snap(nodes, pending), idle, now=NOW)
    assert d2.verdict == "scheduling-bound"
    assert any("persistently under 70%" in s for s in d2.signals)
    # samples older than the window do not count
    old_idle = [(NOW - 7200 - 600 * i, 0.4) for i in range(1, 6)]
    d3 = diagnose(snap(nodes, pending), old_idle + busy, now=NOW)
    assert not any("persistently" in s for s in d3.signals)


def test_high_allocation_with_idle_allocated_gpus_is_mixed():
    nodes = [node("g1", alloc=4), node("g2", alloc=4)]
    running = [RunningJob("r1", 4, nodes=("g1",)), RunningJob("r2", 4, nodes=("g2",))]
    samples = [GpuSample("g1", i, 3.0) for i in range(4)] + \
              [GpuSample("g2", i, 95.0) for i in range(4)]
    d = diagnose(snap(nodes, [job("p1", 4)], running, samples), now=NOW)
    assert d.verdict == "mixed"
    idle = d.cause("idle-allocated")
    assert idle.nodes == ("g1",) and idle.jobs == ("r1",) and idle.gpus == 4
    assert d.utilization == pytest.approx(49.0)
    assert "g1 3 %" in idle.summary
    assert d.causes[0].kind == "idle-allocated"


def test_utilization_of_a_partly_allocated_node_takes_the_busiest_samples():
    nodes = [node("g1", alloc=2)]
    samples = [GpuSample("g1", 0, 80.0), GpuSample("g1", 1, 60.0), GpuSample("g1", 2, 0.0),
               GpuSample("g1", 3, 0.0)]
    d = diagnose(snap(nodes, samples=samples), now=NOW)
    assert d.utilization == pytest.approx(70.0)
    assert d.cause("idle-allocated") is None


def test_samples_without_a_known_node_give_a_cluster_mean():
    d = diagnose(snap([node("g1", alloc=2)], samples=[GpuSample("", 0, 20.0),
                                                      GpuSample("", 1, 40.0)]), now=NOW)
    assert d.utilization == pytest.approx(30.0)


# ----------------------------------------------------------------------------- causes
def test_drained_node_is_named_with_its_reason_and_blocked_jobs():
    nodes = [node("g1", alloc=4), node("g2", state="drain", reason="fan failure")]
    pending = [job("p1", 4), job("p2", 2)]
    d = diagnose(snap(nodes, pending), now=NOW)
    assert d.verdict == "scheduling-bound"
    dr = d.cause("drained-nodes")
    assert dr.nodes == ("g2",) and dr.gpus == 4
    assert dr.summary == "1 node drained with 4 GPUs out of service (g2: fan failure); 1 waiting job (4 GPUs) would " \
                         "run with them"
    assert dr.jobs == ("p1",)  # once g2's 4 GPUs are claimed, p2 needs capacity
    assert d.cause("capacity").jobs == ("p2",)
    assert "state=resume" in dr.action
    assert d.actions[0].startswith("Fix scheduling before buying capacity")


def test_req_node_not_avail_on_a_down_node():
    nodes = [node("g1", alloc=4), node("g2", state="down", reason="not responding")]
    pending = [job("p1", 1, reason="ReqNodeNotAvail, UnavailableNodes:g[2-3]")]
    d = diagnose(snap(nodes, pending), now=NOW)
    assert d.cause("down-nodes").jobs == ("p1",)
    assert d.cause("down-nodes").nodes == ("g2",)


def test_fragmentation_multi_gpu_request():
    nodes = [node("g1", alloc=2), node("g2", alloc=2), node("g3", alloc=3)]
    pending = [job("big", 4)]  # 5 GPUs free, none of the nodes has 4
    d = diagnose(snap(nodes, pending), now=NOW)
    frag = d.cause("fragmentation")
    assert frag.jobs == ("big",) and set(frag.nodes) == {"g1", "g2", "g3"}
    assert "multi-GPU request" in frag.summary and "5 GPUs are free" in frag.summary
    assert d.verdict == "scheduling-bound"
    assert "Right-size requests" in frag.action


def test_fragmentation_whole_node_request():
    nodes = [node("g1", alloc=1), node("g2", alloc=1)]
    d = diagnose(snap(nodes, [job("x", 2, exclusive=True)]), now=NOW)
    assert d.cause("fragmentation").jobs == ("x",)
    assert "whole-node (--exclusive) request" in d.cause("fragmentation").summary
    # an idle node takes it: no fragmentation, the GPUs are simply there
    nodes = [node("g1", alloc=1), node("g2")]
    d = diagnose(snap(nodes, [job("x", 2, exclusive=True)]), now=NOW)
    assert d.cause("fragmentation") is None and d.cause("reserved-capacity").jobs == ("x",)


def test_free_gpus_are_not_counted_twice():
    nodes = [node("g1", alloc=3), node("g2", alloc=4)]  # one free GPU
    pending = [job("a", 1, waited_s=100), job("b", 1, waited_s=50)]
    d = diagnose(snap(nodes, pending), now=NOW)
    assert d.cause("reserved-capacity").jobs == ("a",)  # the longest-waiting one fits
    assert d.cause("capacity").jobs == ("b",)


def test_priority_is_capacity_in_a_full_cluster_but_not_when_gpus_are_free():
    full = [node("g1", alloc=4)]
    d = diagnose(snap(full, [job("p", 2, reason="Priority")]), now=NOW)
    assert d.cause("capacity").jobs == ("p",) and d.cause("priority") is None
    free = [node("g1", alloc=1)]
    d = diagnose(snap(free, [job("p", 2, reason="Priority")]), now=NOW)
    assert d.cause("priority").jobs == ("p",) and d.verdict == "scheduling-bound"


@pytest.mark.parametrize("reason,kind", [
    ("QOSMaxGRESPerUser", "limits"), ("AssocGrpGRES", "limits"), ("Dependency", "dependency"),
    ("DependencyNeverSatisfied", "dependency"), ("BeginTime", "begin-time"),
    ("JobHeldUser", "held"), ("JobHeldAdmin", "held"), ("PartitionTimeLimit", "job-config"),
    ("ReqNodeNotAvail, UnavailableNodes:g9", "unavailable-nodes"), ("Resources", "capacity"),
    ("None", "capacity"), ("", "capacity"), ("SomethingNew", "capacity"),
])
def test_reason_kinds(reason, kind):
    assert reason_kind(reason) == kind


def test_reasons_capacity_cannot_fix_make_it_scheduling_bound():
    nodes = [node("g1", alloc=4), node("g2", alloc=4)]
    pending = [job("q", 4, reason="QOSMaxGRESPerUser"), job("d", 2, reason="Dependency"),
               job("h", 2, reason="JobHeldAdmin"), job("c", 1)]
    d = diagnose(snap(nodes, pending), now=NOW)
    assert d.verdict == "mixed"  # full cluster + capacity demand, but most wait on other things
    assert d.cause("limits").jobs == ("q",)
    assert d.cause("dependency").jobs == ("d",) and d.cause("held").jobs == ("h",)
    assert "scontrol release" in d.cause("held").action
    only_limits = diagnose(snap(nodes, pending[:3]), now=NOW)
    assert only_limits.verdict == "scheduling-bound"


def test_half_allocated_gangs_from_hints_and_het_jobs():
    nodes = [node("g1", alloc=4), node("g2", alloc=4)]
    running = [RunningJob("w0", 4, nodes=("g1",)), RunningJob("7+0", 4, nodes=("g2",))]
    pending = [job("w1", 4), job("7+1", 4)]
    d = diagnose(snap(nodes, pending, running, extra={"gangs": {"ddp": ["w0", "w1"]}}), now=NOW)
    gangs = [c for c in d.causes if c.kind == "half-allocated-gang"]
    assert {c.jobs for c in gangs} == {("w0", "w1"), ("7+0", "7+1")}
    assert all(c.gpus == 4 for c in gangs)
    assert d.verdict == "mixed"


def test_job_larger_than_any_node():
    d = diagnose(snap([node("g1", alloc=4)], [job("huge", 16, nodes=1)]), now=NOW)
    assert d.cause("no-onprem-fit").jobs == ("huge",)
    assert d.verdict == "resource-bound"


def test_gpu_model_and_partition_decide_where_a_job_fits():
    nodes = [node("a", alloc=0, model="v100"), node("b", alloc=4, model="a100"),
             node("c", alloc=0, part=("other",))]
    d = diagnose(snap(nodes, [job("j", 2, gpu_model="a100")]), now=NOW)
    assert d.cause("capacity").jobs == ("j",)


def test_cloud_nodes_do_not_count_as_onprem_capacity():
    nodes = [node("g1", alloc=4), ClusterNode("burst-1", "cloud", 8, 0, "h100", ("burst",))]
    d = diagnose(snap(nodes, [job("p", 4)]), now=NOW)
    assert d.gpus_total == 4 and d.allocation_rate == 1.0 and d.verdict == "resource-bound"


def test_no_onprem_gpus_at_all():
    d = diagnose(snap([], [job("p", 1)]), now=NOW)
    assert d.verdict == "resource-bound" and d.cause("no-onprem-gpus").jobs == ("p",)


def test_cpu_only_jobs_do_not_make_a_gpu_queue():
    d = diagnose(snap([node("g1", alloc=4)], [job("cpu", 0)]), now=NOW)
    assert d.verdict == "healthy"


def test_drained_nodes_are_reported_even_when_healthy():
    d = diagnose(snap([node("g1"), node("g2", state="drain", reason="disk")]), now=NOW)
    assert d.verdict == "healthy" and d.cause("drained-nodes").nodes == ("g2",)
    assert any("state=resume" in a for a in d.actions)


def test_long_job_lists_are_capped_but_counted():
    nodes = [node("g1", alloc=4)]
    pending = [job(str(i), 1) for i in range(80)]
    d = diagnose(snap(nodes, pending), now=NOW, thresholds=DiagnoseConfig(max_listed=10))
    cap = d.cause("capacity")
    assert len(cap.jobs) == 10 and cap.gpus == 80 and "80 jobs" in cap.summary


def test_bad_history_and_thresholds_are_rejected():
    with pytest.raises(ValueError, match=r"history\[1\]"):
        diagnose(snap(), [(1.0, 0.5), (2.0, 85.0)], now=NOW)
    with pytest.raises(ValueError, match="low_allocation must not exceed"):
        DiagnoseConfig(low_allocation=0.95, high_allocation=0.9)
    with pytest.raises(ValueError, match="persistence"):
        DiagnoseConfig(persistence=2)


def test_to_dict_is_json_friendly():
    nodes = [node("g1", alloc=4), node("g2", state="drain", reason="psu")]
    d = diagnose(snap(nodes, [job("p", 4)]), now=NOW)
    doc = json.loads(json.dumps(d.to_dict()))
    assert {"verdict", "allocation_rate", "utilization", "causes", "actions",
            "pending_gpus"} <= set(doc)
    assert doc["utilization"] is None
    assert doc["causes"][0]["kind"] == "drained-nodes" and doc["causes"][0]["nodes"] == ["g2"]
    assert Cause("x", "y", ("1",)).to_dict()["jobs"] == ["1"]


# ----------------------------------------------------------------------------- on the fixtures
def fixture_snapshot(fmt: str) -> QueueSnapshot:
    now = META["taken_at"]
    p, r, extra = parse_squeue((FIX / f"squeue.{fmt}").read_text(), now)
    nodes = parse_sinfo((FIX / f"sinfo.{fmt}").read_text())
    return QueueSnapshot("slurm:fixture", now, tuple(p), tuple(nodes), (), tuple(r), extra)


def test_diagnose_the_captured_cluster():
    d = diagnose(fixture_snapshot("json"), now=META["taken_at"])
    # 6 of 8 on-prem GPUs allocated, gpu-2 drained, big requests waiting: both signs
    assert d.verdict == "mixed"
    assert d.gpus_total == 8 and d.gpus_allocated == 6
    assert d.cause("drained-nodes").nodes == ("gpu-2",)
    assert META["roles"]["two_node"] in d.cause("drained-nodes").jobs
    assert d.cause("dependency").jobs == (META["roles"]["dependency"],)
    assert d.cause("held").jobs == (META["roles"]["held"],)
    assert d.cause("begin-time").jobs == (META["roles"]["begin"],)
    assert diagnose(fixture_snapshot("txt"), now=META["taken_at"]).to_dict() == d.to_dict()


# ----------------------------------------------------------------------------- the CLI on files
runner = CliRunner()


def cli(*args: str):
    return runner.invoke(app, ["diagnose", *args])


def now_opt() -> list[str]:
    return ["--now", str(META["taken_at"])]


@pytest.mark.parametrize("fmt", ["json", "txt"])
def test_cli_on_captured_files_json_output(fmt):
    r = cli("--squeue", str(FIX / f"squeue.{fmt}"), "--sinfo", str(FIX / f"sinfo.{fmt}"),
            "--format", "json", *now_opt())
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "mixed" and doc["allocation_rate"] == 0.75
    assert any(c["kind"] == "drained-nodes" and c["nodes"] == ["gpu-2"] for c in doc["causes"])
    assert doc["warnings"] and doc["actions"]


def test_cli_table_output():
    r = cli("--squeue", str(FIX / "squeue.json"), "--sinfo", str(FIX / "sinfo.json"), *now_opt())
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "Verdict: mixed" in out and "Allocation rate: 75.0%" in out
    assert "unknown (no GPU samples)" in out
    assert "drained-nodes" in out and "gpu-2" in out and "Actions" in out


def test_cli_snapshot_history_and_nvidia_smi(tmp_path):
    s = snap([node("g1", alloc=4), node("g2", alloc=4)], [job("p", 4)],
             [RunningJob("r1", 4, nodes=("g1",)), RunningJob("r2", 4, nodes=("g2",))])
    (tmp_path / "s.json").write_text(dumps(s))
    (tmp_path / "h.csv").write_text("time,allocation_rate\n9000,0.95\n9500,97%\n")
    (tmp_path / "g1.csv").write_text("index, utilization.gpu [%], memory.used [MiB]\n"
                                     + "".join(f"{i}, 2 %, 10 MiB\n" for i in range(4)))
    r = cli("--snapshot", str(tmp_path / "s.json"), "--history", str(tmp_path / "h.csv"),
            "--nvidia-smi", f"g1={tmp_path / 'g1.csv'}", "--format", "json",
            "--save-snapshot", str(tmp_path / "out.json"))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "mixed" and doc["utilization"] == 0.02  # a fraction, as allocation_rate
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["taken_at"])  # RFC 3339
    assert any(c["kind"] == "idle-allocated" and c["jobs"] == ["r1"] for c in doc["causes"])
    saved = json.loads((tmp_path / "out.json").read_text())
    assert len(saved["gpu_samples"]) == 4


def test_cli_bad_file_names_file_and_line(tmp_path):
    bad = tmp_path / "sinfo.txt"
    rows = (FIX / "sinfo.txt").read_text().splitlines()
    rows[1] = "gpu-9|on fire|gpu:4|gpu:0|gpu|none|"
    bad.write_text("\n".join(rows) + "\n")
    r = cli("--squeue", str(FIX / "squeue.txt"), "--sinfo", str(bad))
    assert r.exit_code == 2
    assert f"{bad} line 2: node gpu-9: unknown node state 'on fire'" in r.stderr
    assert "Traceback" not in r.output and r.stderr.count("\n") == 1


def test_cli_bad_snapshot_and_history(tmp_path):
    (tmp_path / "s.json").write_text('{"taken_at": 1,\n "pending": [{"job_id": "1"}]}\n')
    r = cli("--snapshot", str(tmp_path / "s.json"))
    assert r.exit_code == 2
    assert "s.json line 2: pending[0] lacks the required field 'gpus'" in r.stderr
    (tmp_path / "ok.json").write_text(dumps(snap()))
    (tmp_path / "h.csv").write_text("1,0.5\n2,1.7\n")
    r = cli("--snapshot", str(tmp_path / "ok.json"), "--history", str(tmp_path / "h.csv"))
    assert r.exit_code == 2 and "h.csv line 2: allocation rate 1.7 is outside 0..1" in r.stderr


def test_cli_bad_nvidia_smi_file(tmp_path):
    (tmp_path / "ok.json").write_text(dumps(snap()))
    (tmp_path / "g.csv").write_text("index, utilization.gpu [%], memory.used [MiB]\n0, ?, 1\n")
    r = cli("--snapshot", str(tmp_path / "ok.json"), "--nvidia-smi", str(tmp_path / "g.csv"))
    assert r.exit_code == 2 and "g.csv line 2: cannot read '?' as a number" in r.stderr


@pytest.mark.parametrize("args,msg", [
    (["--format", "yaml"], "--format must be table or json"),
    (["--squeue", "x.json"], "--squeue and --sinfo go together"),
    (["--snapshot", "s.json", "--squeue", "a", "--sinfo", "b"], "cannot be combined"),
    (["--squeue", "/nonexistent/q.json", "--sinfo", "/nonexistent/i.json"],
     "cannot read the squeue file /nonexistent/q.json"),
    (["--squeue-bin", "/nonexistent/squeue"], "is not an executable file"),
    (["--squeue-bin", "no-such-squeue-command"], "cannot find no-such-squeue-command on PATH"),
])
def test_cli_usage_errors(args, msg):
    r = cli(*args)
    assert r.exit_code == 2, r.output
    assert msg in r.stderr and "Traceback" not in r.output


def test_cli_live_slurm_unreachable(tmp_path):
    fake = tmp_path / "squeue"
    fake.write_text("#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    r = cli("--squeue-bin", str(fake), "--sinfo-bin", str(fake), "--scontrol-bin", str(fake))
    assert r.exit_code == 1
    assert "Unable to contact slurm controller" in r.stderr


# ----------------------------------------------------------------------------- one vocabulary
def test_verdicts_and_cause_kinds_are_one_vocabulary_used_everywhere():
    from broker import convert
    from broker.v1 import broker_pb2 as pb
    from policies.causes import ACTIONS, ORDER, CauseKind, Verdict
    from policies.triggers import TriggerConfig

    assert set(ACTIONS) == set(CauseKind)  # every kind has its action
    for verdict in Verdict:
        assert set(ORDER[verdict]) == set(CauseKind), verdict
    assert set(convert.VERDICT_TO_PB) == set(Verdict)
    assert {pb.Verdict.Name(v) for v in convert.VERDICT_TO_PB.values()} == {
        n for n in pb.Verdict.keys() if n != "VERDICT_UNSPECIFIED"}
    assert TriggerConfig(burst_verdicts=("mixed",)).burst_verdicts == (Verdict.MIXED,)
    with pytest.raises(ValueError, match="known: healthy, resource-bound, scheduling-bound, mixed"):
        Verdict.parse("busy")
    nodes = [node("g1", alloc=4), node("g2", alloc=4)]
    d = diagnose(snap(nodes, [job("p1", 2, waited_s=3600)]), now=NOW)
    assert d.verdict is Verdict.RESOURCE_BOUND and d.causes[0].kind is CauseKind.CAPACITY
    assert json.loads(json.dumps(d.to_dict()))["causes"][0]["kind"] == "capacity"


def test_scheduling_causes_name_the_causes_and_their_fix_but_not_capacity():
    nodes = [node("g1", alloc=2), node("g2", alloc=2), node("g3", state="drain", reason="ECC errors")]
    running = [RunningJob("r1", 2, nodes=("g1",))]
    samples = [GpuSample("g1", 0, 5.0), GpuSample("g1", 1, 3.0)]
    pending = [job("p1", 4, exclusive=True, waited_s=3600), job("p2", 4, waited_s=3000)]
    d = diagnose(snap(nodes, pending, running, samples), now=NOW)
    assert d.verdict == "scheduling-bound"
    text = d.scheduling_causes()
    assert text.startswith(d.signals[0])
    assert "g3: ECC errors" in text and "whole-node (--exclusive) request" in text
    assert "Fix: Repair the drained nodes" in text and "scontrol update nodename=" in text
    assert "Burst" not in text  # capacity is not the fix of a scheduling-bound queue
    assert d.capacity_jobs == frozenset()


def test_capacity_jobs_are_complete_even_when_the_listing_is_cut():
    nodes = [node("g1", alloc=4), node("g2", alloc=4)]
    pending = [job(f"p{i}", 2, waited_s=3600) for i in range(3)] + [job("d", 2, reason="Dependency")]
    d = diagnose(snap(nodes, pending), now=NOW, thresholds=DiagnoseConfig(max_listed=1))
    assert d.cause("capacity").jobs == ("p0",)
    assert d.capacity_jobs == {"p0", "p1", "p2"}


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_cli_empty_squeue_or_sinfo_file_is_an_error_not_an_empty_queue(tmp_path, content):
    empty = tmp_path / "squeue.txt"
    empty.write_text(content)
    r = cli("--squeue", str(empty), "--sinfo", str(FIX / "sinfo.txt"), *now_opt())
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"broker: {empty}: the squeue output is empty; an empty queue is "
                        "`squeue --json` output with an empty list, or the text format with its "
                        "header line.\n"), r.stderr
    r = cli("--squeue", str(FIX / "squeue.txt"), "--sinfo", str(empty), *now_opt())
    assert r.exit_code == 2 and "sinfo output is empty" in r.stderr and r.stderr.count("\n") == 1


def test_cli_valid_empty_squeue_outputs_are_an_empty_queue(tmp_path):
    header = (FIX / "squeue_header.txt").read_text().splitlines()[0] + "\n"
    (tmp_path / "header.txt").write_text(header)
    (tmp_path / "empty.json").write_text('{"jobs": [], "errors": [], "warnings": []}\n')
    for name in ("header.txt", "empty.json"):
        r = cli("--squeue", str(tmp_path / name), "--sinfo", str(FIX / "sinfo.txt"), "--format",
                "json", *now_opt())
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["pending_jobs"] == 0 and doc["verdict"] == "healthy"


# ----------------------------------------------------------------------------- exactly, at the edges
from policies.causes import CauseKind  # noqa: E402


def _busy_cluster():
    """35 on-prem GPUs, 32 allocated (3 free on three nodes), and 23 GPUs of jobs too big for them."""
    nodes = [node("g5", gpus=8, alloc=8), node("g4", gpus=1, alloc=0), node("g6", gpus=2, alloc=1),
             node("g1", gpus=8, alloc=8), node("g2", gpus=8, alloc=8), node("g3", gpus=8, alloc=7)]
    pending = [job("e1", 4, kind="eval", waited_s=5000), job("t1", 4, waited_s=4000),
               job("t2", 5, kind="tuning", waited_s=3000), job("i1", 4, interruptible=True, waited_s=100),
               job("t3", 6, waited_s=50)]
    # g4 is idle (its sample does not count), g5 and g2 report nothing, g6 has one GPU allocated
    # (its busier sample counts), g3 seven of eight (the seven busiest count); a sample from a
    # node the snapshot does not list counts only when no known node has one
    samples = ([GpuSample("ghost", 0, 0.0), GpuSample("g4", 0, 99.0), GpuSample("g6", 0, 95.0), GpuSample("g6", 1, 10.0),
                GpuSample("g1", 0, 90.0), GpuSample("g1", 1, 80.0)]
               + [GpuSample("g3", i, 10.0 * i) for i in range(8)])
    return snap(nodes, pending, samples=samples)


def test_a_resource_bound_report_in_full():
    d = diagnose(_busy_cluster(), now=NOW)
    assert d.utilization == pytest.approx((95 + 90 + 80 + 70 + 60 + 50 + 40 + 30 + 20 + 10) / 10)
    burst = "Burst the capacity-bound jobs to the cloud: interruptible ones to spot, the rest on-demand."
    offload = ("Move tuning/eval/inference off the main queue (own partition with MIG or time-sliced GPUs, or "
               "burst them): they are short and easy to place.")
    checkpoint = ("Add checkpointing and mark these interruptible (comment broker:interruptible=1,checkpoint=MIN) "
                  "so they can join a preemptible queue or run on spot.")
    assert d.to_dict() == {
        "verdict": "resource-bound", "allocation_rate": 0.9143, "utilization": 0.545,
        "pending_gpus": 23, "pending_jobs": 5, "gpus_total": 35, "gpus_allocated": 32, "gpus_free": 3,
        "signals": ["allocation 91% >= 90% and 23 GPUs of demand wait for capacity"],
        "causes": [
            {"kind": "capacity", "summary": "5 jobs (23 GPUs) waiting for GPUs: every GPU that could hold them "
             "is allocated", "jobs": ["e1", "t1", "t2", "i1", "t3"], "nodes": [], "action": burst, "gpus": 23},
            {"kind": "offloadable-work", "summary": "2 tuning/eval/inference jobs (9 GPUs) in the training "
             "queue waiting for capacity", "jobs": ["e1", "t2"], "nodes": [], "action": offload, "gpus": 9},
            {"kind": "not-interruptible", "summary": "2 training jobs (10 GPUs) waiting for capacity cannot be "
             "preempted or run on spot (no interruptible/checkpoint hint)", "jobs": ["t1", "t3"], "nodes": [],
             "action": checkpoint, "gpus": 10}],
        "actions": [burst, offload, checkpoint],
    }
    assert d.capacity_jobs == {"e1", "t1", "t2", "i1", "t3"}
    assert d.scheduling_causes() == "allocation 91% >= 90% and 23 GPUs of demand wait for capacity"


def test_one_offloadable_job_of_one_gpu_is_said_in_the_singular():
    d = diagnose(snap([node("g1", alloc=4)], [job("e", 1, kind="inference", waited_s=4000)]), now=NOW)
    assert [(c.kind, c.summary, c.jobs, c.gpus) for c in d.causes] == [
        ("capacity", "1 job (1 GPU) waiting for GPUs: every GPU that could hold them is allocated", ("e",), 1),
        ("offloadable-work", "1 tuning/eval/inference job (1 GPU) in the training queue waiting for capacity",
         ("e",), 1)]


def test_scheduling_causes_take_the_first_signal_the_first_fixable_causes_and_each_fix_once():
    K = CauseKind
    causes = (Cause(K.DRAINED_NODES, "2 nodes drained", action="Repair them."),
              Cause(K.CAPACITY, "capacity", action="Burst."),
              Cause(K.FRAGMENTATION, "scattered", action="Pack."),
              Cause(K.DOWN_NODES, "1 node down", action="Repair them."),
              Cause(K.IDLE_ALLOCATED, "idle", action="Find idle jobs."))
    d = Diagnosis("scheduling-bound", 0.5, None, 8, causes, signals=("low allocation", "second signal"))
    assert d.scheduling_causes() == "low allocation; 2 nodes drained; scattered; 1 node down. Fix: Repair them. Pack."
    assert d.scheduling_causes(limit=4) == ("low allocation; 2 nodes drained; scattered; 1 node down; idle. Fix: "
                                            "Repair them. Pack. Find idle jobs.")
    assert d.scheduling_causes(limit=1) == "low allocation; 2 nodes drained. Fix: Repair them."
    assert Diagnosis("mixed", 0.5, None, 8, causes[1:2], signals=("s",)).scheduling_causes() == "s"


def test_utilisation_rounds_as_a_fraction_and_causes_list_their_names():
    d = Diagnosis("healthy", 0.123456, 12.34567, 0, (Cause(CauseKind.HELD, "held", ("a", "b"), ("n",), "x", 3),))
    doc = d.to_dict()
    assert (doc["allocation_rate"], doc["utilization"]) == (0.1235, 0.1235)
    assert doc["causes"] == [{"kind": "held", "summary": "held", "jobs": ["a", "b"], "nodes": ["n"], "action": "x",
                              "gpus": 3}]
    assert doc["signals"] == [] and doc["actions"] == []


@pytest.mark.parametrize("max_listed,names", [(0, ()), (1, ("a",)), (2, ("a", "b")), (5, ("a", "b", "c"))])
def test_named_jobs_are_distinct_and_at_most_max_listed(max_listed, names):
    nodes = [node("g1", alloc=4)]
    pending = [job("a", 1, waited_s=30), job("b", 1, waited_s=20), job("c", 1, waited_s=10)]
    d = diagnose(snap(nodes, pending), now=NOW, thresholds=DiagnoseConfig(max_listed=max_listed))
    assert d.cause("capacity").jobs == names and d.cause("capacity").gpus == 3


def test_each_waiting_job_is_placed_by_its_own_shape():
    # the first job fits nowhere, even on an empty cluster; the next would fit there: capacity
    full = [node("g1", alloc=4), node("g2", alloc=4)]
    d = diagnose(snap(full, [job("giant", 16, waited_s=900), job("four", 4, waited_s=100)]), now=NOW)
    assert d.cause("no-onprem-fit").jobs == ("giant",) and d.cause("capacity").jobs == ("four",)
    # a big job refused by the free GPUs does not stop a small one from fitting them
    part = [node("g1", alloc=2), node("g2", alloc=4)]
    d = diagnose(snap(part, [job("big", 4, waited_s=900), job("small", 1, waited_s=100)]), now=NOW)
    assert d.cause("capacity").jobs == ("big",) and d.cause("reserved-capacity").jobs == ("small",)
    # a job no node could hold does not stop a smaller one the drained node would
    drained = [node("g1", alloc=4), node("g2", state="drain", reason="psu")]
    d = diagnose(snap(drained, [job("huge", 6, waited_s=900), job("two", 2, waited_s=100)]), now=NOW)
    assert d.cause("no-onprem-fit").jobs == ("huge",) and d.cause("drained-nodes").jobs == ("two",)


def test_a_job_the_down_node_would_hold_is_the_down_nodes_cause():
    nodes = [node("g1", alloc=4), node("g2", state="down", reason="not responding")]
    d = diagnose(snap(nodes, [job("two", 2)]), now=NOW)
    assert d.cause("down-nodes").jobs == ("two",) and d.cause("drained-nodes") is None


def test_node_causes_count_gpu_nodes_and_the_gpus_they_take_out_of_service():
    nodes = [node("g1", alloc=4), node("g2", gpus=1, state="drain", reason="psu"),
             node("g3", gpus=4, alloc=3, state="drain"), node("cpu1", gpus=0, state="drain", reason="bios"),
             node("g4", gpus=2, state="down")]
    d = diagnose(snap(nodes), now=NOW)
    dr, dn = d.cause("drained-nodes"), d.cause("down-nodes")
    assert (dr.summary, dr.nodes, dr.gpus) == ("2 nodes drained with 2 GPUs out of service (g2: psu)",
                                               ("g2", "g3"), 2)
    assert (dn.summary, dn.nodes, dn.gpus) == ("1 node down with 2 GPUs out of service", ("g4",), 2)
    assert dr.jobs == () and dn.jobs == ()


def test_a_job_waiting_for_nodes_neither_drained_nor_down_is_not_blamed_on_them():
    nodes = [node("g1", alloc=4), node("g2", state="down")]
    d = diagnose(snap(nodes, [job("p", 1, reason="ReqNodeNotAvail, UnavailableNodes:g7")]), now=NOW)
    assert d.cause("unavailable-nodes").jobs == ("p",) and d.cause("down-nodes").jobs == ()


def test_two_hinted_gangs_are_two_causes():
    nodes = [node("g1", alloc=4), node("g2", alloc=4)]
    running = [RunningJob("a0", 4, nodes=("g1",)), RunningJob("b0", 4, nodes=("g2",))]
    d = diagnose(snap(nodes, [job("a1", 4), job("b1", 4)], running,
                      extra={"gangs": {"ddp-a": ["a0", "a1"], "ddp-b": ["b0", "b1"]}}), now=NOW)
    assert sorted(c.jobs for c in d.causes if c.kind == "half-allocated-gang") == [("a0", "a1"), ("b0", "b1")]


def test_what_an_operator_reads_for_a_fragmented_queue_with_low_history():
    nodes = [node("g1", alloc=2), node("g2", alloc=2), node("g3", alloc=3)]  # 12 GPUs, 7 allocated
    pending = [job("x1", 4, exclusive=True, waited_s=4000), job("m1", 4, waited_s=3000), job("m2", 3, waited_s=2000)]
    d = diagnose(snap(nodes, pending), [(NOW - 600 * i, 0.4) for i in range(1, 6)], now=NOW)
    assert d.verdict == "scheduling-bound"
    assert d.signals == ("allocation 58% persistently under 70% with 11 GPUs waiting",
                         "11 of 11 waiting GPUs are held up by scheduling, not capacity")
    assert [c.summary for c in d.causes] == [
        "1 whole-node (--exclusive) request and 2 multi-GPU requests (11 GPUs) wait while 5 GPUs are free, "
        "scattered over 3 nodes none of which can hold them alone"]
    assert d.actions[0] == ("Fix scheduling before buying capacity: bursting would not start most of the "
                            "waiting GPUs.")


def test_what_an_operator_reads_for_idle_allocations_beside_a_half_started_gang():
    nodes = [node("g1", alloc=4), node("g2", alloc=4), node("g3", alloc=4)]
    running = [RunningJob("r1", 4, nodes=("g1",)), RunningJob("w0", 4, nodes=("g2",)),
               RunningJob("r3", 4, nodes=("g3",))]
    samples = ([GpuSample("g1", i, 3.0) for i in range(4)] + [GpuSample("g2", i, 95.0) for i in range(4)]
               + [GpuSample("g3", i, 97.0) for i in range(4)])
    d = diagnose(snap(nodes, [job("w1", 4, waited_s=3000), job("c1", 2, waited_s=100)], running, samples,
                      extra={"gangs": {"ddp": ["w0", "w1"]}}), now=NOW)
    assert d.verdict == "mixed"
    assert d.signals == ("allocation 100% >= 90% and 6 GPUs of demand wait for capacity",
                         "8 allocated GPUs idle or held by half-started gangs")
    assert [(c.kind, c.summary, c.gpus) for c in d.causes] == [
        ("idle-allocated", "4 allocated GPUs on 1 node run under 30 % utilisation (g1 3 %)", 4),
        ("half-allocated-gang", "gang ddp: 1 member run holding 4 GPUs while 1 member wait", 4),
        ("capacity", "2 jobs (6 GPUs) waiting for GPUs: every GPU that could hold them is allocated", 6),
        ("not-interruptible", "2 training jobs (6 GPUs) waiting for capacity cannot be preempted or run on spot "
         "(no interruptible/checkpoint hint)", 6)]
    assert d.actions[:2] == (
        "Right-size GPU requests, share GPUs (MIG or time-slicing) for light jobs, and move tuning/eval/inference "
        "off the main training queue.",
        "Gang-schedule these jobs (submit them as one job or heterogeneous job), or stop the started part until "
        "the rest can run.")


# ----------------------------------------------------------------------------- what an operator reads
# The signals, summaries and actions word for word, and the verdict on each side of the marks it is
# read from.
def busy(name, gpus=4, pct=95.0):
    return [GpuSample(name, i, pct) for i in range(gpus)]


def summaries(d):
    return [(c.kind, c.summary, c.jobs, c.nodes, c.gpus) for c in d.causes]


FULL32 = [node(f"g{i}", gpus=8, alloc=8) for i in range(4)]  # the long-queue mark: 10 % of 32 = 3.2 GPUs


# ------------------------------------------------------------------------------- the long-queue mark
def test_a_short_queue_says_how_much_waits_under_which_mark_and_for_how_long():
    d = diagnose(snap(FULL32, [job("1", 2, waited_s=125)]), now=NOW)
    assert d.verdict == "healthy"
    assert d.signals == ("1 GPU job (2 GPUs) wait, under the long-queue mark of 4 GPUs, longest 2 min",)
    assert d.actions == ("Nothing to do now: the queue is short.",)
    d = diagnose(snap(FULL32, [job("1", 1, waited_s=60), job("2", 2, waited_s=0)]), now=NOW)
    assert d.signals == ("2 GPU jobs (3 GPUs) wait, under the long-queue mark of 4 GPUs, longest 1 min",)
    d = diagnose(snap(FULL32, [job("cpu", 0, waited_s=9000)]), now=NOW)
    assert d.signals == ("0 GPU jobs (0 GPUs) wait, under the long-queue mark of 4 GPUs",)


@pytest.mark.parametrize("gpus,waited,verdict", [(3, 899, "healthy"), (3, 900, "resource-bound"),
                                                 (4, 0, "resource-bound"), (2, 899, "healthy")])
def test_a_queue_is_long_from_the_mark_in_gpus_or_from_the_long_wait(gpus, waited, verdict):
    assert diagnose(snap(FULL32, [job("j", gpus, waited_s=waited)]), now=NOW).verdict == verdict


@pytest.mark.parametrize("gpus,verdict", [(1, "healthy"), (2, "resource-bound")])
def test_the_mark_is_never_under_min_queue_gpus(gpus, verdict):
    # 8 GPUs: 10 % is 0.8, the floor of 2 GPUs decides
    nodes = [node("g1", alloc=4), node("g2", alloc=4)]
    d = diagnose(snap(nodes, [job("j", gpus)]), now=NOW, thresholds=DiagnoseConfig(min_queue_gpus=2))
    assert d.verdict == verdict
    if verdict == "healthy":
        assert d.signals == ("1 GPU job (1 GPUs) wait, under the long-queue mark of 2 GPUs, longest 0 min",)


def test_without_on_prem_gpus_the_waiting_gpus_are_named_and_every_job_is_listed():
    d = diagnose(snap([], [job("p", 3, waited_s=5000), job("q", 2)]), now=NOW)
    assert d.verdict == "resource-bound"
    assert d.signals == ("5 GPUs wait and there are no on-prem GPUs",)
    gpus = d.cause("no-onprem-gpus")
    assert (gpus.summary, gpus.jobs, gpus.nodes, gpus.gpus) == ("no on-prem node has GPUs", ("p", "q"), (), 5)


# ------------------------------------------------------------------------------- the signals
def test_low_allocation_without_history_is_not_called_persistent():
    nodes = [node("g1", alloc=1), node("g2", alloc=1)]
    d = diagnose(snap(nodes, [job("p1", 4, exclusive=True), job("p2", 4)]), now=NOW)
    assert d.verdict == "scheduling-bound"
    assert d.signals == ("allocation 25% under 70% with 8 GPUs waiting",
                         "8 of 8 waiting GPUs are held up by scheduling, not capacity")
    assert summaries(d) == [
        ("fragmentation", "1 whole-node (--exclusive) request and 1 multi-GPU request (8 GPUs) wait while 6 GPUs "
         "are free, scattered over 2 nodes none of which can hold them alone", ("p1", "p2"), ("g1", "g2"), 8)]


def test_whole_node_requests_alone_are_named_alone():
    nodes = [node("g1", alloc=1), node("full", alloc=4), node("g2", alloc=1)]
    d = diagnose(snap(nodes, [job("x", 4, exclusive=True)]), now=NOW)
    assert d.cause("fragmentation").nodes == ("g1", "g2")  # not the full node
    assert d.cause("fragmentation").summary == (
        "1 whole-node (--exclusive) request (4 GPUs) wait while 6 GPUs are free, scattered over 2 nodes none of "
        "which can hold them alone")


DEFAULTS = DiagnoseConfig()


def _between(cap_gpus, sched_gpus, cfg=DEFAULTS):
    """80 % allocated (8 of 10 GPUs), a job of ``cap_gpus`` GPUs of a model no node has, one of ``sched_gpus`` held."""
    pending = [job("c", cap_gpus, gpu_model="h100", waited_s=1000)] if cap_gpus else []
    pending += [job("h", sched_gpus, reason="JobHeldUser")] if sched_gpus else []
    return diagnose(snap([node("g1", gpus=10, alloc=8)], pending), now=NOW, thresholds=cfg)


@pytest.mark.parametrize("cap,sched,verdict", [(3, 1, "mixed"), (4, 1, "resource-bound"), (5, 0, "resource-bound")])
def test_between_the_marks_a_quarter_of_the_waiting_gpus_each_way_is_mixed(cap, sched, verdict):
    d = _between(cap, sched)
    assert d.verdict == verdict
    assert d.signals == (f"allocation 80% is between 70% and 90%; {cap} waiting GPUs need capacity, "
                         f"{sched} wait on scheduling",)


@pytest.mark.parametrize("cap,sched,verdict", [(1, 5, "scheduling-bound"), (2, 6, "mixed"), (3, 3, "mixed")])
def test_between_the_marks_more_held_than_needing_capacity_is_scheduling_bound(cap, sched, verdict):
    # with the scheduling share at 100 %, a share of held GPUs under it is read between the marks
    d = _between(cap, sched, DiagnoseConfig(scheduling_share=1.0))
    assert d.verdict == verdict
    if verdict == "scheduling-bound":
        assert d.actions[0] == ("Use the GPUs already there before buying more: allocation is low while the queue "
                                "is long.")


def test_held_gpus_from_exactly_the_scheduling_share_make_it_scheduling_bound():
    d = _between(2, 2)  # 2 of 4 held: exactly half
    assert d.verdict == "scheduling-bound"
    assert d.signals == ("2 of 4 waiting GPUs are held up by scheduling, not capacity",)
    assert d.actions[0] == ("Fix scheduling before buying capacity: bursting would not start most of the waiting "
                            "GPUs.")
    assert "Burst the capacity-bound jobs" not in " ".join(d.actions)
    assert _between(3, 2).verdict == "mixed"  # 2 of 5: under half, read between the marks


def _full_with_idle(idle_alloc, idle_pct=3.0, cfg=DEFAULTS):
    """Ten nodes of 4 GPUs (40, mark 4 GPUs), nine busy and full; g0 with ``idle_alloc`` GPUs allocated."""
    nodes = [node("g0", alloc=idle_alloc)] + [node(f"g{i}", alloc=4) for i in range(1, 10)]
    samples = busy("g0", 4, idle_pct) + [s for i in range(1, 10) for s in busy(f"g{i}")]
    running = [RunningJob("idle", idle_alloc, nodes=("g0",)), RunningJob("cpu", 0, nodes=("g0",)),
               RunningJob("r1", 4, nodes=("g1",))]
    return diagnose(snap(nodes, [job("p", 4, waited_s=1000)], running, samples), now=NOW, thresholds=cfg)


def test_idle_allocations_from_the_mark_make_a_full_cluster_mixed():
    d = _full_with_idle(4)
    assert d.verdict == "mixed"
    assert d.signals == ("allocation 100% >= 90% and 4 GPUs of demand wait for capacity",
                         "4 allocated GPUs idle or held by half-started gangs")
    idle = d.cause("idle-allocated")
    assert (idle.summary, idle.jobs, idle.nodes, idle.gpus) == (
        "4 allocated GPUs on 1 node run under 30 % utilisation (g0 3 %)", ("idle",), ("g0",), 4)
    assert d.actions[0].startswith("Right-size GPU requests")
    d = _full_with_idle(3)  # 3 idle GPUs, under the mark of 4
    assert d.verdict == "resource-bound"
    assert d.signals == ("allocation 98% >= 90% and 4 GPUs of demand wait for capacity",)
    assert d.cause("idle-allocated").summary == "3 allocated GPUs on 1 node run under 30 % utilisation (g0 3 %)"


@pytest.mark.parametrize("pct,idle", [(29.9, True), (30.0, False)])
def test_a_node_is_idle_under_the_utilisation_mark_not_at_it(pct, idle):
    d = _full_with_idle(4, pct)
    assert (d.cause("idle-allocated") is not None) is idle
    assert d.verdict == ("mixed" if idle else "resource-bound")


def test_the_idle_mark_is_said_as_configured():
    d = _full_with_idle(4, 20.0, DiagnoseConfig(idle_utilization_pct=25.0))
    assert d.cause("idle-allocated").summary == "4 allocated GPUs on 1 node run under 25 % utilisation (g0 20 %)"


def test_one_idle_gpu_is_waste_on_a_small_cluster():
    # 9 GPUs: 10 % is 0.9, so one idle GPU is the mark
    nodes = [node("g1", alloc=4), node("g2", alloc=4), node("g3", gpus=1, alloc=1)]
    samples = busy("g1") + busy("g2") + busy("g3", 1, 5.0)
    d = diagnose(snap(nodes, [job("p", 4, waited_s=1000)], samples=samples), now=NOW)
    assert d.verdict == "mixed"
    assert d.signals[1] == "1 allocated GPU idle or held by half-started gangs"
    assert d.cause("idle-allocated").summary == "1 allocated GPU on 1 node run under 30 % utilisation (g3 5 %)"


def test_samples_of_a_node_with_nothing_allocated_count_nowhere():
    nodes = [node("g1", alloc=4), node("g2", alloc=0)]
    samples = busy("g1", 4, 80.0) + busy("g2", 4, 0.0)
    d = diagnose(snap(nodes, samples=samples), now=NOW)
    assert d.utilization == pytest.approx(80.0) and d.cause("idle-allocated") is None


# ------------------------------------------------------------------------------- gangs
def test_a_half_started_gang_names_its_members_nodes_and_gpus():
    nodes = [node("g1", alloc=4), node("g2", alloc=4), node("g3", alloc=4)]
    running = [RunningJob("a0", 4, nodes=("g1",)), RunningJob("a1", 4, nodes=("g2",)),
               RunningJob("7+0", 4, nodes=("g3",)), RunningJob("b0", 0, nodes=("g3",))]
    pending = [job("a2", 4, waited_s=100), job("7+1", 2, waited_s=50), job("7+2", 2, waited_s=40),
               job("c2", 4, waited_s=30)]
    gangs = {"ddp": ["a0", "a1", "a2"], 3: [41, 42], "cold": ["c0", "c2"], "done": ["b0"]}
    d = diagnose(snap(nodes, pending, running, extra={"gangs": gangs}), now=NOW)
    got = [(c.summary, c.jobs, c.nodes, c.gpus) for c in d.causes if c.kind == "half-allocated-gang"]
    assert got == [
        ("gang ddp: 2 members run holding 8 GPUs while 1 member wait", ("a0", "a1", "a2"), ("g1", "g2"), 8),
        ("gang het:7: 1 member run holding 4 GPUs while 2 members wait", ("7+0", "7+1", "7+2"), ("g3",), 4)]
    assert "12 allocated GPUs idle or held by half-started gangs" in d.signals


def test_to_dict_carries_the_counts_an_operator_reads():
    d = _full_with_idle(4)
    doc = d.to_dict()
    assert (doc["gpus_total"], doc["gpus_allocated"], doc["gpus_free"], doc["pending_jobs"], doc["pending_gpus"]) \
        == (40, 40, 0, 1, 4)
    assert doc["signals"] == list(d.signals) and doc["actions"] == list(d.actions)


def test_gpus_a_job_takes_now_are_not_counted_again_for_the_drained_nodes_tally():
    # g1 has 2 free GPUs; g2 (5) and g3 (1) are drained. "a" (7 GPUs) would run on g2 and g1 with
    # them back; "b" takes g1's 2 free GPUs now; "c" (1 GPU) would then still run on g3 once back.
    nodes = [node("g1", alloc=2), node("g2", gpus=5, state="drain"), node("g3", gpus=1, state="drain")]
    pending = [job("a", 7, nodes=0, waited_s=300), job("b", 2, nodes=0, waited_s=200),
               job("c", 1, nodes=0, waited_s=100)]
    d = diagnose(snap(nodes, pending), now=NOW)
    assert d.cause("drained-nodes").jobs == ("a", "c")
    assert d.cause("reserved-capacity").jobs == ("b",) and d.cause("capacity") is None


def test_drained_nodes_name_each_reason_and_a_fully_allocated_one_loses_no_gpu():
    nodes = [node("g1", alloc=4), node("g2", gpus=2, state="drain", reason="psu"),
             node("g3", gpus=4, alloc=4, state="drain", reason="fan")]
    dr = diagnose(snap(nodes), now=NOW).cause("drained-nodes")
    assert (dr.summary, dr.gpus) == ("2 nodes drained with 2 GPUs out of service (g2: psu; g3: fan)", 2)
    one = diagnose(snap([node("g1", alloc=4), node("g3", gpus=4, alloc=4, state="drain")]), now=NOW)
    assert one.cause("drained-nodes").summary == "1 node drained with 0 GPUs out of service"


def test_idle_nodes_are_each_named_with_their_utilisation_and_every_gpu_job_on_them():
    nodes = [node("g1", alloc=1), node("g2", alloc=4), node("g3", alloc=4)]
    samples = busy("g1", 1, 3.0) + busy("g2", 4, 12.0) + busy("g3")
    running = [RunningJob("one", 1, nodes=("g1",)), RunningJob("four", 4, nodes=("g2",)),
               RunningJob("busy", 4, nodes=("g3",))]
    idle = diagnose(snap(nodes, running=running, samples=samples), now=NOW).cause("idle-allocated")
    assert (idle.summary, idle.jobs, idle.nodes, idle.gpus) == (
        "5 allocated GPUs on 2 nodes run under 30 % utilisation (g1 3 %, g2 12 %)", ("one", "four"), ("g1", "g2"), 5)


def test_one_held_gpu_of_two_is_the_scheduling_share():
    d = _between(1, 1)
    assert d.verdict == "scheduling-bound"
    assert d.signals == ("1 of 2 waiting GPUs are held up by scheduling, not capacity",)


def test_with_no_scheduling_share_set_no_held_gpu_is_no_scheduling_signal():
    d = _between(3, 0, DiagnoseConfig(scheduling_share=0.0))
    assert d.verdict == "resource-bound"
    assert d.signals == ("allocation 80% is between 70% and 90%; 3 waiting GPUs need capacity, 0 wait on scheduling",)


def test_history_rates_from_0_to_1_are_taken_and_a_bad_item_is_named():
    d = diagnose(snap(FULL32), [(NOW - 60, 0.0), (NOW - 30, 1.0)], now=NOW)
    assert d.verdict == "healthy"
    with pytest.raises(ValueError, match=r"^history\[0\]: allocation rate must be within 0\.\.1, got 1\.5$"):
        diagnose(snap(FULL32), [(NOW, 1.5)], now=NOW)
    with pytest.raises(ValueError, match=r"^history\[1\] must be a \(time, allocation_rate\) pair$"):
        diagnose(snap(FULL32), [(NOW, 0.5), (NOW,)], now=NOW)


def test_a_healthy_queue_still_gets_the_action_for_idle_allocations_ranked_after_fragmentation():
    # 64 GPUs, one 4-GPU job short of a node (fragmentation, under the long-queue mark), g3 idle
    nodes = [node("g1", alloc=2), node("g2", alloc=2)] + [node(f"g{i}", gpus=8, alloc=8) for i in range(3, 10)]
    samples = busy("g3", 8, 3.0) + [s for i in range(4, 10) for s in busy(f"g{i}", 8)]
    d = diagnose(snap(nodes, [job("f", 4, waited_s=60)], samples=samples), now=NOW)
    assert d.verdict == "healthy"
    assert [c.kind for c in d.causes] == ["fragmentation", "idle-allocated"]
    assert d.actions == ("Nothing to do now: the queue is short.", d.cause("idle-allocated").action)


def test_a_scheduling_bound_queue_gets_the_actions_ranked_after_its_capacity_causes():
    d = _between(1, 5, DiagnoseConfig(scheduling_share=1.0))
    assert [c.kind for c in d.causes] == ["no-onprem-fit", "held"]
    assert d.actions == ("Use the GPUs already there before buying more: allocation is low while the queue is long.",
                         d.cause("held").action)
