"""Parsers for Slurm and nvidia-smi output, and the snapshot JSON.

Slurm fixtures are real output captured from this project's own test Slurm
(`python -m tests.slurm.capture`, see tests/fixtures/slurm/meta.json for the scenario's roles);
nvidia-smi samples are read in place from the shared data directory.
"""
from __future__ import annotations

import json
from dataclasses import replace
import os
import stat
import time
from pathlib import Path

import pytest

from broker.watchers import ParseError
from broker.watchers.nvidia_smi import count_gpu_rows, parse_nvidia_smi_csv
from broker.slurm.commands import SlurmCommandError
from broker.slurm.parse import (node_state, parse_scontrol_fields, parse_scontrol_job, parse_sinfo,
                                parse_sinfo_json, parse_sinfo_text, parse_squeue, parse_squeue_json,
                                parse_squeue_text)
from broker.slurm.records import parse_duration, parse_gpu_tres, parse_node_gres
from broker.watchers.hints import parse_job_hints
from broker.slurm.watcher import SlurmWatcher
from broker.watchers.snapshot_json import dumps, load_snapshot, loads, snapshot_from_dict
from policies.queue import ClusterNode, GpuSample, PendingJob, QueueSnapshot, RunningJob

FIX = Path(__file__).parent / "fixtures" / "slurm"
META = json.loads((FIX / "meta.json").read_text())
ROLES = META["roles"]
NOW = META["taken_at"]


def text(name: str) -> str:
    return (FIX / name).read_text()


@pytest.fixture(autouse=True)
def capture_timezone(monkeypatch):
    """Text formats print local time: read them in the zone they were captured in."""
    monkeypatch.setenv("TZ", "UTC" if META["tz"] == "+0000" else META["tzname"])
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def by_id(items):
    return {j.job_id: j for j in items}


# ----------------------------------------------------------------------------- squeue --json
def test_squeue_json_keeps_pending_and_running_and_drops_finished():
    pending, running = parse_squeue_json(text("squeue.json"), NOW)
    p, r = by_id(pending), by_id(running)
    assert ROLES["done"] not in p and ROLES["done"] not in r  # COMPLETED, still in --json
    assert set(r) == {ROLES["train"], ROLES["eval"], ROLES["tune"], ROLES["burst"]}
    arr = ROLES["array"]
    assert {f"{arr}_1", f"{arr}_2", f"{arr}_3"} <= set(p)  # pending array record expanded
    assert arr not in p
    for role in ("whole_node", "four_gpu", "dependency", "begin", "held", "two_node",
                 "bad_hint"):
        assert ROLES[role] in p, role


def test_squeue_json_gpu_requests():
    pending, running = parse_squeue_json(text("squeue.json"), NOW)
    p, r = by_id(pending), by_id(running)
    assert r[ROLES["train"]].gpus == 3 and r[ROLES["train"]].nodes == ("gpu-1",)
    assert r[ROLES["tune"]].gpus == 2  # --gpus=2: tres_per_job
    assert r[ROLES["burst"]].gpus == 8 and r[ROLES["burst"]].nodes == ("burst-1",)
    assert p[ROLES["two_node"]].gpus == 4 and p[ROLES["two_node"]].nodes == 2
    assert p[ROLES["whole_node"]].exclusive and p[ROLES["whole_node"]].gpus == 4
    assert not p[ROLES["four_gpu"]].exclusive
    assert all(j.queue == "gpu" for j in pending)
    assert r[ROLES["burst"]].queue == "burst"


def test_squeue_json_reasons_waits_and_limits():
    pending, running = parse_squeue_json(text("squeue.json"), NOW)
    p = by_id(pending)
    assert p[ROLES["dependency"]].pending_reason == "Dependency"
    assert p[ROLES["begin"]].pending_reason == "BeginTime"
    assert p[ROLES["held"]].pending_reason == "JobHeldUser"
    assert p[ROLES["two_node"]].pending_reason == "ReqNodeNotAvail, UnavailableNodes:gpu-2"
    assert p[ROLES["whole_node"]].pending_reason in ("Resources", "Priority")
    assert all(0 <= j.waited_s < 600 for j in pending)
    assert p[ROLES["whole_node"]].time_limit_s == 0  # UNLIMITED
    train, ev = by_id(running)[ROLES["train"]], by_id(running)[ROLES["eval"]]
    assert 0 <= train.runtime_s < 600
    # a running job's time limit says when it is expected to end (the wait predictor's input)
    assert (train.time_limit_s, ev.time_limit_s) == (7200, 3600)
    assert train.remaining_s == 7200 - train.runtime_s
    # the eval job's comment says runtime=20 (minutes): the estimate wins over the limit
    assert ev.est_runtime_s == 1200 and ev.remaining_s == 1200 - ev.runtime_s


def test_squeue_json_hints_from_comment_and_name():
    pending, _ = parse_squeue_json(text("squeue.json"), NOW)
    p = by_id(pending)
    four = p[ROLES["four_gpu"]]
    assert four.interruptible and four.checkpoint_minutes == 15 and four.kind == "training"
    assert p[ROLES["dependency"]].kind == "inference"  # infer-after-train
    assert p[ROLES["begin"]].kind == "eval"  # eval-later
    assert p[f"{ROLES['array']}_2"].kind == "tuning"  # hpo-trials
    assert p[ROLES["bad_hint"]].kind == "training"  # bad hint skipped


def test_squeue_extra_warnings_and_gangs():
    pending, running, extra = parse_squeue(text("squeue.json"), NOW)
    bad = ROLES["bad_hint"]
    assert any(w.startswith(f"job {bad}:") and "kind" in w for w in extra["warnings"])
    assert any("checkpoint must be a whole number" in w for w in extra["warnings"])
    assert extra["gangs"] == {"ddp": [ROLES["two_node"]]}


def test_running_job_hints_time_limit_and_runtime_estimate():
    from broker.slurm.parse import parse_squeue_jobs_json

    jobs = {j.job_id: j for j in parse_squeue_jobs_json(text("squeue.json"))}
    assert jobs[ROLES["train"]].time_limit_s == 7200
    assert jobs[ROLES["eval"]].time_limit_s == 3600
    assert jobs[ROLES["train"]].gpu_model == "a100"
    assert jobs[ROLES["burst"]].gpu_model == "h100"


# ----------------------------------------------------------------------------- text formats
def test_squeue_text_matches_json():
    pj, rj, ej = parse_squeue(text("squeue.json"), NOW)
    pt, rt, et = parse_squeue(text("squeue.txt"), NOW)
    key = lambda j: j.job_id  # noqa: E731
    # the text format (records.SQUEUE_FIELDS) carries no QOS or priority; JSON does (classes)
    assert any(j.priority > 0 for j in pj)
    pj = [replace(j, qos="", priority=0) for j in pj]
    assert sorted(pt, key=key) == sorted(pj, key=key)
    assert sorted(rt, key=key) == sorted(rj, key=key)
    assert et == ej


def test_squeue_text_with_header_line():
    pt, rt = parse_squeue_text(text("squeue.txt"), NOW)
    ph, rh = parse_squeue_text(text("squeue_header.txt"), NOW)
    assert (ph, rh) == (pt, rt)


def test_sinfo_text_matches_json_and_reads_states():
    nj = parse_sinfo_json(text("sinfo.json"))
    nt = parse_sinfo_text(text("sinfo.txt"))
    assert nt == nj
    n = {x.name: x for x in nj}
    assert n["gpu-1"] == ClusterNode("gpu-1", "mix", 4, 4, "a100", ("gpu",), "")
    assert n["gpu-2"].state == "drain" and n["gpu-2"].reason == "fan failure"
    assert n["gpu-2"].gpus_allocated == 2 and n["gpu-2"].gpus_free == 0
    assert n["burst-1"].state == "cloud" and n["burst-1"].gpus_allocated == 8  # powering up
    assert n["burst-2"].state == "cloud" and n["burst-2"].gpu_model == "h100"
    assert n["burst-2"].partitions == ("burst",)


def test_sinfo_text_merges_a_node_listed_per_partition():
    rows = ("gpu-1|mixed|gpu:a100:4|gpu:a100:1(IDX:0)|gpu*|none|\n"
            "gpu-1|mixed|gpu:a100:4|gpu:a100:1(IDX:0)|debug|none|\n")
    (node,) = parse_sinfo_text(rows)
    assert node.partitions == ("gpu", "debug") and node.gpus_allocated == 1


def test_format_autodetect():
    assert parse_sinfo(text("sinfo.json")) == parse_sinfo(text("sinfo.txt"))


# ----------------------------------------------------------------------------- scontrol
def test_scontrol_oneliner_and_multiline_agree():
    one = parse_scontrol_job(text("scontrol_job_oneliner.txt"))
    multi = parse_scontrol_job(text("scontrol_job.txt"))
    assert one == multi
    jobs = by_id(one)
    assert jobs[ROLES["train"]].gpus == 3 and jobs[ROLES["train"]].gpu_model == "a100"
    assert jobs[ROLES["train"]].comment.startswith("broker:kind=training")
    assert jobs[ROLES["tune"]].gpus == 2  # TresPerJob
    assert jobs[ROLES["whole_node"]].exclusive
    assert jobs[ROLES["two_node"]].gpus == 4 and jobs[ROLES["two_node"]].node_count == 2
    assert {f"{ROLES['array']}_{i}" for i in (1, 2, 3)} <= set(jobs)
    assert jobs[ROLES["done"]].state == "COMPLETED"
    assert jobs[ROLES["train"]].user == "root"


def test_scontrol_agrees_with_squeue_on_pending_gpus():
    from broker.slurm.records import jobs_to_queue

    ps, rs, _ = jobs_to_queue(parse_scontrol_job(text("scontrol_job.txt")), NOW)
    pj, rj = parse_squeue_json(text("squeue.json"), NOW)
    assert {j.job_id: j.gpus for j in ps} == {j.job_id: j.gpus for j in pj}
    assert {j.job_id: j.nodes for j in rs} == {j.job_id: j.nodes for j in rj}


def test_scontrol_comment_with_spaces_and_empty_values():
    line = text("scontrol_job_oneliner.txt").splitlines()[0]
    line = line.replace("WorkDir=", "Comment=run two epochs WorkDir=", 1)
    (_, fields), = parse_scontrol_fields(line)
    assert fields["Comment"] == "run two epochs"
    assert fields["Power"] == ""


def test_scontrol_no_jobs():
    assert parse_scontrol_job("No jobs in the system\n") == []


# ----------------------------------------------------------------------------- unhappy paths
def test_squeue_json_syntax_error_names_line():
    broken = text("squeue.json").replace('"job_state"', '"job_state" "', 1)
    with pytest.raises(ParseError) as e:
        parse_squeue_json(broken, NOW)
    assert e.value.line is not None and e.value.line > 1
    assert "not valid squeue JSON" in str(e.value)


def test_squeue_json_bad_gpu_count_names_job_and_line():
    src = text("squeue.json")
    broken = src.replace('"tres_per_node": "gres:gpu:a100:3"', '"tres_per_node": "gres:gpu:a:b"')
    assert broken != src
    with pytest.raises(ParseError) as e:
        parse_squeue_json(broken, NOW)
    msg = str(e.value)
    assert f"job {ROLES['train']}" in msg and "GPU count" in msg
    lines = broken.splitlines()
    assert f'"job_id": {ROLES["train"]},' in lines[e.value.line - 1]


def test_squeue_json_shapes_rejected():
    with pytest.raises(ParseError, match="'jobs' list"):
        parse_squeue_json('{"meta": {}}', NOW)
    with pytest.raises(ParseError, match="must be an object"):
        parse_squeue_json("[1, 2]", NOW)
    with pytest.raises(ParseError, match="reported an error: Unable to contact"):
        parse_squeue_json('{"errors": [{"error": "Unable to contact slurm controller"}], '
                          '"jobs": []}', NOW)
    with pytest.raises(ParseError, match="job_id is missing"):
        parse_squeue_json('{"jobs": [{"job_state": "PENDING"}]}', NOW)


def test_squeue_json_newer_data_parser_shape():
    doc = {"jobs": [{
        "job_id": 7, "job_state": ["PENDING"], "state_reason": "Resources",
        "tres_per_node": "gres/gpu:h100:2", "node_count": {"set": True, "infinite": False,
                                                           "number": 2},
        "time_limit": {"set": True, "infinite": False, "number": 90},
        "submit_time": {"set": True, "infinite": False, "number": 1000},
        "partition": "gpu", "user_name": "ann", "name": "eval_big", "comment": "",
        "shared": [], "exclusive": ["true"], "array_job_id": {"set": True, "number": 0},
    }, {
        "job_id": 8, "job_state": ["COMPLETED"], "tres_per_job": "gres/gpu:1",
    }]}
    pending, running = parse_squeue_json(json.dumps(doc), 1600)
    assert pending == [PendingJob(job_id="7", gpus=4, user="ann", queue="gpu", gpu_model="h100",
                                  nodes=2, time_limit_s=5400, est_runtime_s=5400, waited_s=600,
                                  pending_reason="Resources", kind="eval", exclusive=True)]
    assert running == []


def test_squeue_text_malformed_lines_name_the_line():
    good = text("squeue.txt").splitlines()
    bad = good[:2] + ["17|PENDING|Resources"] + good[2:]
    with pytest.raises(ParseError) as e:
        parse_squeue_text("\n".join(bad), NOW)
    assert e.value.line == 3 and "expected 17" in str(e.value)
    fields = good[0].split("|")
    fields[7] = "soon"  # TimeLimit
    with pytest.raises(ParseError, match=r"line 1: job .*cannot read the time 'soon'"):
        parse_squeue_text("|".join(fields), NOW)
    fields = good[0].split("|")
    fields[0] = "abc"
    with pytest.raises(ParseError, match="cannot read the job id 'abc'"):
        parse_squeue_text("|".join(fields), NOW)


def test_sinfo_text_malformed_lines_name_the_line():
    rows = text("sinfo.txt").splitlines()
    rows[2] = rows[2].replace("mixed", "sleepy", 1)
    with pytest.raises(ParseError) as e:
        parse_sinfo_text("\n".join(rows))
    assert e.value.line == 3 and "unknown node state 'sleepy'" in str(e.value)
    with pytest.raises(ParseError, match="line 1: expected 6"):
        parse_sinfo_text("gpu-1 idle\n")
    with pytest.raises(ParseError, match="cannot read the node list"):
        parse_sinfo_text("gpu-[1-|idle|gpu:4|gpu:0|gpu|none|\n")


def test_sinfo_json_bad_state_names_node_and_line():
    src = text("sinfo.json")
    broken = src.replace('"state": "mixed"', '"state": "weird"', 1)
    with pytest.raises(ParseError) as e:
        parse_sinfo_json(broken)
    assert "unknown node state 'weird'" in str(e.value).lower()
    node = str(e.value).split("node ", 1)[1].split(" ", 1)[0]
    assert e.value.line is not None
    assert f'"name": "{node}"' in broken.splitlines()[e.value.line - 1]


def test_scontrol_garbage_names_the_line():
    with pytest.raises(ParseError) as e:
        parse_scontrol_job("JobId=1 JobName=x JobState=PENDING\nthis is not scontrol\n")
    assert e.value.line == 2


# ----------------------------------------------------------------------------- value parsers
@pytest.mark.parametrize("spec,expected", [
    ("gres:gpu:1", (1, "")), ("gres:gpu:a100:2", (2, "a100")), ("gres/gpu=4", (4, "")),
    ("gres/gpu:h100=8", (8, "h100")), ("gpu:a100", (1, "a100")), ("gpu", (1, "")),
    ("gres:mps:100,gres:gpu:2", (2, "")), ("N/A", (0, "")), ("", (0, "")), ("(null)", (0, "")),
    ("license:matlab:1", (0, "")), ("gres:gpu:2K", (2048, "")),
])
def test_parse_gpu_tres(spec, expected):
    assert parse_gpu_tres(spec) == expected


@pytest.mark.parametrize("spec,expected", [
    ("gpu:4", (4, "")), ("gpu:a100:4(S:0-1)", (4, "a100")), ("gpu:a100:2(IDX:0,2)", (2, "a100")),
    ("gpu:a100:0(IDX:N/A)", (0, "a100")), ("gpu:a100:2(S:0),gpu:v100:4(S:1)", (6, "v100")),
    ("gpu:a100:4(S:0-1),mps:400", (4, "a100")), ("(null)", (0, "")),
])
def test_parse_node_gres(spec, expected):
    assert parse_node_gres(spec) == expected


@pytest.mark.parametrize("state,flags,expected", [
    ("idle", [], "idle"), ("mixed", ["DRAIN"], "drain"), ("idle", ["CLOUD", "POWERED_DOWN"], "cloud"),
    ("down", ["NOT_RESPONDING"], "down"), ("idle~", [], "idle"), ("down*", [], "down"),
    ("mixed*", [], "down"), ("drained", [], "drain"), ("draining", [], "drain"),
    ("allocated+drain", [], "drain"), ("idle+cloud+powered_down", [], "cloud"),
    ("mixed-", [], "mix"), ("allocated", [], "alloc"), ("future", [], "future"),
    ("idle", ["MAINTENANCE", "RESERVED"], "idle"),
])
def test_node_state(state, flags, expected):
    assert node_state(state, flags) == expected


@pytest.mark.parametrize("value,seconds", [
    ("UNLIMITED", 0), ("365-00:00:00", 0), ("2:00:00", 7200), ("30:00", 1800),
    ("1-12:00:00", 129600), ("45", 2700), ("N/A", 0), ("1-02", 93600),
])
def test_parse_duration(value, seconds):
    assert parse_duration(value) == seconds


def test_parse_duration_rejects_garbage():
    with pytest.raises(ValueError, match="cannot read the time"):
        parse_duration("two hours")


def test_job_hints_convention():
    h = parse_job_hints("nightly run; broker:kind=eval,interruptible=1,checkpoint=30,data_gb=200,"
                        "gpu_mem=40,runtime=90,gang=g1 (owner ann)")
    assert (h.kind, h.interruptible, h.checkpoint_minutes, h.data_gb, h.gpu_mem_gb, h.runtime_s,
            h.gang, h.problems) == ("eval", True, 30, 200.0, 40, 5400, "g1", ())
    assert parse_job_hints("", "tune-lr").kind == "tuning"
    assert parse_job_hints("", "serve_api").kind == "inference"
    assert parse_job_hints("", "evaluation").kind == "eval"
    assert parse_job_hints("", "evaluator2").kind == "training"  # no separator: not a prefix
    assert parse_job_hints("broker:kind=train", "eval-x").kind == "training"  # comment wins
    bad = parse_job_hints("broker:interruptible=maybe,color=red,data_gb=-1")
    assert len(bad.problems) == 3 and not bad.interruptible


# ----------------------------------------------------------------------------- the watcher
def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_watcher_falls_back_to_text_when_json_plugin_is_missing(tmp_path):
    squeue = _script(tmp_path / "squeue", f"""case "$*" in
  *--json*) echo "squeue: unrecognized option '--json'" >&2; exit 1;;
  *) echo "$@" > {tmp_path}/squeue.args; cat {FIX / 'squeue.txt'};;
esac
""")
    sinfo = _script(tmp_path / "sinfo", f"""case "$*" in
  *--json*) echo "sinfo: error: Unable to find plugin: serializer/json" >&2; exit 1;;
  *) cat {FIX / 'sinfo.txt'};;
esac
""")
    w = SlurmWatcher(squeue=squeue, sinfo=sinfo, scontrol="/bin/false", source="slurm:test")
    snap = w.snapshot(NOW)
    assert snap.extra["formats"] == {"squeue": "text", "sinfo": "text"}
    assert snap.source == "slurm:test" and snap.taken_at == NOW
    pj, rj = parse_squeue_json(text("squeue.json"), NOW)
    assert {j.job_id for j in snap.pending} == {j.job_id for j in pj}
    assert len(snap.nodes) == 4
    args = (tmp_path / "squeue.args").read_text()
    assert "--Format=JobArrayID:|,State:|" in args and "--noheader" in args


def test_watcher_reports_a_failing_command(tmp_path):
    squeue = _script(tmp_path / "squeue", "echo 'squeue: error: Unable to contact slurm "
                                          "controller (connect failure)' >&2; exit 1\n")
    w = SlurmWatcher(squeue=squeue, sinfo=squeue, scontrol=squeue)
    with pytest.raises(SlurmCommandError, match="exited 1: squeue: error: Unable to contact"):
        w.snapshot(NOW)
    with pytest.raises(SlurmCommandError, match="command not found"):
        SlurmWatcher(squeue=str(tmp_path / "nope"), sinfo=squeue).snapshot(NOW)


def test_watcher_names_the_command_when_output_is_malformed(tmp_path):
    squeue = _script(tmp_path / "squeue", "echo '{\"jobs\": [ {'\n")
    w = SlurmWatcher(squeue=squeue, sinfo=squeue)
    with pytest.raises(ParseError, match=r"squeue output line \d+: not valid squeue JSON"):
        w.snapshot(NOW)


# ----------------------------------------------------------------------------- nvidia-smi
CSV = """index, utilization.gpu [%], memory.used [MiB]
0, 35 %, 1000 MiB
1, 5 %, 20 MiB
"""


def test_nvidia_smi_csv_with_units_and_header():
    assert parse_nvidia_smi_csv(CSV, node="gpu-1") == [
        GpuSample("gpu-1", 0, 35.0, 1000.0), GpuSample("gpu-1", 1, 5.0, 20.0)]


def test_nvidia_smi_csv_noheader_nounits_and_na():
    out = parse_nvidia_smi_csv("0, 35, 1000\n1, [N/A], 20\n2, 100, 3\n", node="n")
    assert out == [GpuSample("n", 0, 35.0, 1000.0), GpuSample("n", 2, 100.0, 3.0)]


def test_nvidia_smi_repeated_readings_are_averaged_and_hostname_wins():
    rows = ("utilization.gpu [%], index, hostname, memory.used [MiB]\n"
            "10 %, 0, node-a, 100 MiB\n20 %, 0, node-a, 300 MiB\n"
            "utilization.gpu [%], index, hostname, memory.used [MiB]\n"
            "60 %, 0, node-a, 200 MiB\n")
    assert parse_nvidia_smi_csv(rows, node="ignored") == [GpuSample("node-a", 0, 30.0, 200.0)]


@pytest.mark.parametrize("body,line,msg", [
    (CSV + "2, lots, 1 MiB\n", 4, "cannot read 'lots'"),
    (CSV + "2, 5 %\n", 4, "expected 3 values"),
    (CSV.replace("35 %", "135 %"), 2, "not a percentage"),
    ("0, 35\n", 1, "expected 3 values"),
    (CSV.replace("0, 35", "x, 35"), 2, "GPU index"),
])
def test_nvidia_smi_errors_name_the_line(body, line, msg):
    with pytest.raises(ParseError) as e:
        parse_nvidia_smi_csv(body)
    assert e.value.line == line and msg in str(e.value)


def _sample(shared_data: Path, name: str) -> str:
    path = shared_data / "samples" / "nvidia-smi" / name
    if not path.is_file():
        pytest.skip(f"nvidia-smi sample {path} is absent")
    return path.read_text()


def test_nvidia_smi_real_capture_h100(shared_data):
    t = _sample(shared_data, "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    (s,) = parse_nvidia_smi_csv(t, node="h100-node")
    # the capture holds an idle (0 %, 0 MiB) and a load (100 %, 19818 MiB) reading of GPU 0
    assert (s.node, s.index, s.utilization_pct, s.memory_used_mb) == ("h100-node", 0, 50.0, 9909.0)


def test_nvidia_smi_real_capture_mig_has_no_utilization(shared_data):
    t = _sample(shared_data, "linux-x86_64__nvidia-h200-mig__590.48.01.txt")
    assert parse_nvidia_smi_csv(t, node="h200") == []  # utilization.gpu is [N/A] under MIG
    assert count_gpu_rows(t) == 2


def test_nvidia_smi_real_capture_l40s(shared_data):
    t = _sample(shared_data, "linux-x86_64__nvidia-l40s__595.80.txt")
    (s,) = parse_nvidia_smi_csv(t)
    assert s.index == 0 and s.utilization_pct == pytest.approx((100 + 9) / 2)


# ----------------------------------------------------------------------------- snapshot JSON
def _snapshot() -> QueueSnapshot:
    return QueueSnapshot(
        source="slurm:a", taken_at=1000.0,
        pending=(PendingJob("1", 2, kind="eval", interruptible=True, data_gb=1.5),),
        nodes=(ClusterNode("gpu-1", "mix", 4, 2, "a100", ("gpu",)),),
        gpu_samples=(GpuSample("gpu-1", 0, 12.5, 100.0),),
        running=(RunningJob("2", 2, nodes=("gpu-1",), runtime_s=60),),
        extra={"gangs": {"g": ["1", "2"]}})


def test_snapshot_json_round_trip(tmp_path):
    snap = _snapshot()
    assert loads(dumps(snap)) == snap
    assert loads(dumps(snap)).extra == snap.extra
    path = tmp_path / "snap.json"
    path.write_text(dumps(snap))
    assert load_snapshot(path) == snap


def test_snapshot_json_defaults_and_iso_time():
    snap = snapshot_from_dict({"taken_at": "2026-01-01T00:00:00Z",
                               "pending": [{"job_id": "9", "gpus": 1}]})
    assert snap.taken_at == 1767225600.0 and snap.pending[0].kind == "training"


@pytest.mark.parametrize("mutate,msg,needle", [
    (lambda d: d["pending"][0].update(gpus="2"), "pending[0].gpus must be a whole number",
     '"gpus": "2"'),
    (lambda d: d["pending"][0].update(colour="red"), "unknown field 'colour'", '"colour"'),
    (lambda d: d["nodes"][0].update(state="broken"), "nodes[0].state must be one of",
     '"state": "broken"'),
    (lambda d: d["nodes"][0].pop("gpus_total"), "lacks the required field 'gpus_total'",
     '"name": "gpu-1"'),
    (lambda d: d.update(taken_at="yesterday"), "taken_at must be", '"taken_at"'),
    (lambda d: d["gpu_samples"][0].update(utilization_pct=140), "at most 100",
     '"utilization_pct": 140'),
    # the gRPC edge's bounds (broker.fields.FIELDS), which a file given to diagnose meets too
    (lambda d: d["pending"][0].update(gpus=1e300), "pending[0].gpus must be at most 100,000, got 1e+300",
     '"gpus": 1e+300'),
    (lambda d: d["nodes"][0].update(gpus_total=10 ** 12), "nodes[0].gpus_total must be at most 1,024",
     '"gpus_total": 1000000000000'),
    (lambda d: d["pending"][0].update(priority=2 ** 60), "pending[0].priority must be at most 9,007,199,254,740,992",
     '"priority": 1152921504606846976'),
    (lambda d: d["pending"][0].update(job_id="a\x00b"), "pending[0].job_id contains a NUL character (U+0000)",
     '"job_id": "a\\u0000b"'),
    (lambda d: d["pending"][0].update(queue="q" * 200), "pending[0].queue is 200 characters long; at most 128",
     '"queue": "qqq'),
    (lambda d: d["running"][0].update(nodes=["gpu-1", "gpu\x1b[2J"]), "running[0].nodes contains a control",
     '"nodes": ['),
    (lambda d: d.update(taken_at=1e300), "taken_at must be a time of the years 1 to 9999", '"taken_at"'),
    (lambda d: d["pending"].append(dict(d["pending"][0])), "pending[1].job_id '1' is also pending[0]'s",
     '"job_id": "1"'),
    (lambda d: d["pending"][0].update(job_id=""), "pending[0].job_id is empty", '"job_id": ""'),
    (lambda d: d["nodes"].append(dict(d["nodes"][0])), "nodes[1].name 'gpu-1' is listed twice", '"name": "gpu-1"'),
    (lambda d: d.update(extra={"gangs": "g"}), "extra.gangs must map each gang to a list of job ids", '"extra"'),
    (lambda d: d.update(extra={"warnings": "abc"}), "extra.warnings must be a list of strings", '"extra"'),
])
def test_snapshot_json_errors_name_field_and_line(tmp_path, mutate, msg, needle):
    doc = json.loads(dumps(_snapshot()))
    mutate(doc)
    body = json.dumps(doc, indent=2)
    path = tmp_path / "bad.json"
    path.write_text(body)
    with pytest.raises(ParseError) as e:
        load_snapshot(path)
    assert msg in str(e.value) and str(path) in str(e.value)
    assert needle in body.splitlines()[e.value.line - 1]


@pytest.mark.parametrize("what, field, value, words", [
    ("squeue", "time_limit", 1e308, "job 1 (jobs[0]): expected a number Slurm writes, got 1e+308"),
    ("squeue", "submit_time", float("inf"), "expected a number Slurm writes, got inf"),
    ("squeue", "node_count", float("nan"), "expected a number Slurm writes, got nan"),
    ("squeue", "job_id", 1e308, "(jobs[0]): expected a number Slurm writes"),
    ("sinfo", "partitions", 5, "(nodes[0]): state_flags and partitions must be lists of names"),
    ("sinfo", "state_flags", True, "(nodes[0]): state_flags and partitions must be lists of names"),
])
def test_a_saved_slurm_output_with_a_field_slurm_never_writes_is_refused_by_job_or_node(what, field, value, words):
    """A hand-edited or corrupted capture (numbers past any count or time, a list that is a
    number) is a ParseError naming the job or node, never an OverflowError or TypeError."""
    doc = json.loads((FIX / f"{what}.json").read_text())
    doc["jobs" if what == "squeue" else "nodes"][0][field] = value
    with pytest.raises(ParseError) as e:
        parse_squeue(json.dumps(doc), 1767225600.0) if what == "squeue" else parse_sinfo(json.dumps(doc))
    assert words in str(e.value), e.value


def test_a_stored_snapshot_keeps_what_the_scheduler_wrote():
    """The edge's bounds are for what a person or a client sends; a snapshot the watcher took
    from Slurm's own commands and stored is read back as it was (an operator's drain reason
    with an escape in it must not make the autoscaler's stored queue unreadable)."""
    doc = json.loads(dumps(_snapshot()))
    doc["nodes"][0]["reason"] = "bad fan \x1b[31m"
    assert snapshot_from_dict(doc).nodes[0].reason == "bad fan \x1b[31m"
    with pytest.raises(ParseError, match=r"nodes\[0\]\.reason contains a control character \(U\+001B\)"):
        loads(json.dumps(doc))


def test_snapshot_json_syntax_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "taken_at": 1,\n  "pending": [,]\n}\n')
    with pytest.raises(ParseError, match=r"bad.json line 3: not valid JSON"):
        load_snapshot(path)


def test_fixture_capture_is_documented():
    assert META["slurm"].endswith(("22.05.8", "22.05.8-4+deb12u3")) or "22.05" in META["slurm"]
    assert os.path.basename(str(FIX)) == "slurm"
