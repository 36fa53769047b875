"""The Slurm hand-off without a Slurm: resume file, grouping, shapes, demand, and the programs
against a real broker gRPC server on the mocked clouds, with a fake ``scontrol`` (a script
written here that records its argv and answers from a JSON file) standing in for Slurm's CLI.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import ConfigError
from broker.slurm.commands import Scontrol, SlurmHandoffError
from broker.slurm.records import SlurmJob
from broker.slurm.settings import settings_from_config
from broker.slurm.watcher import SlurmBurstTarget, slurm_source
from broker.slurm_node.groups import (Group, ResumeFileError, demand_for, group_nodes, idempotency_key,
                                      nodes_from_key, parse_resume_file, read_resume_file, split_by_shape)
from broker.slurm_node.programs import resume, resume_fail, suspend
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.conftest import ROOT
from tests.grpc_server import running_server

pytestmark = pytest.mark.timeout(120)

SHAPES = {"burst": {"gpu": "L4", "gpus": 1, "hours": 2.0},
          "big": {"gpu": "H100", "gpus": 8}}


# ---------------------------------------------------------------------------------------------
# a fake scontrol: records argv, answers from scontrol.json next to it
FAKE_SCONTROL = r'''#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
with open(os.path.join(here, "scontrol.calls"), "a") as f:
    f.write(json.dumps({{"argv": args, "path": os.environ.get("PATH"), "conf": os.environ.get("SLURM_CONF")}}) + "\n")
try:
    with open(os.path.join(here, "scontrol.json")) as f:
        spec = json.load(f)
except FileNotFoundError:
    spec = {{}}
if args[:2] == ["show", "job"]:
    out = spec.get("jobs", {{}}).get(args[-1])
    if out is None:
        sys.stderr.write("slurm_load_jobs error: Invalid job id specified\n")
        sys.exit(1)
    print(out)
elif args[:2] == ["show", "node"]:
    print("\n".join(spec.get("nodes", [])))
elif args and args[0] == "update":
    if spec.get("fail_update"):
        sys.stderr.write("slurm_update error: Access/permission denied\n")
        sys.exit(1)
'''


class FakeScontrol:
    def __init__(self, d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / "scontrol"
        self.path.write_text(FAKE_SCONTROL.format(python=sys.executable))
        self.path.chmod(0o755)
        self.spec_file = d / "scontrol.json"
        self.calls_file = d / "scontrol.calls"
        self.spec: dict = {"jobs": {}, "nodes": []}
        self.save()

    def save(self) -> None:
        self.spec_file.write_text(json.dumps(self.spec))

    def job(self, job_id: str, *, partition="gpu", state="PENDING", limit="02:00:00", comment="",
            gres="gres:gpu:1", user="ana") -> None:
        self.spec["jobs"][job_id] = (
            f"JobId={job_id} JobName=train-{job_id} UserId={user}(1000) GroupId={user}(1000) "
            f"Priority=1 JobState={state} Reason=Resources TimeLimit={limit} "
            f"SubmitTime=2026-12-01T10:00:00 Partition={partition} NumNodes=1 NumCPUs=1 NumTasks=1 "
            f"TresPerNode={gres} Comment={comment or '(null)'}")
        self.save()

    def nodes(self, **states: str) -> None:
        self.spec["nodes"] = [f"NodeName={n} Arch=x86_64 State={s} Partitions=burst" for n, s in states.items()]
        self.save()

    def calls(self) -> list[list[str]]:
        if not self.calls_file.exists():
            return []
        return [json.loads(ln)["argv"] for ln in self.calls_file.read_text().splitlines()]

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c and c[0] == "update"]


@pytest.fixture
def fake(tmp_path) -> FakeScontrol:
    return FakeScontrol(tmp_path / "bin")


def settings(fake: FakeScontrol | None = None, **kw):
    section = {"shapes": SHAPES, "set_node_addr": False, **kw}
    if fake is not None:
        section["scontrol"] = str(fake.path)
    return settings_from_config(section)


# ---------------------------------------------------------------------------------------------
# resume file and grouping
def test_resume_file_is_parsed_with_host_lists(tmp_path):
    p = tmp_path / "resume.json"
    p.write_text('{"jobs":[{"job_id":11,"nodes":"burst-[1-2]"},{"job_id":"12","nodes":"big-1"}],'
                 '"all_nodes":"big-1,burst-[1-2]"}')
    r = read_resume_file(str(p))
    assert r.jobs == (("11", ("burst-1", "burst-2")), ("12", ("big-1",)))
    assert r.all_nodes == ("big-1", "burst-1", "burst-2")
    assert parse_resume_file('{"jobs":[],"all_nodes":"burst-3"}').jobs == ()  # a manual power_up


@pytest.mark.parametrize("text, words", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"jobs": {"job_id": 1}}', '"jobs" must be a list'),
    ('{"jobs": [{"nodes": "burst-1"}]}', "jobs[0].job_id is missing"),
    ('{"jobs": [{"job_id": true, "nodes": "burst-1"}]}', "jobs[0].job_id"),
    ('{"jobs": [{"job_id": 3}]}', "jobs[0].nodes is missing"),
    ('{"jobs": [{"job_id": 3, "nodes": "burst-[1-"}]}', "cannot read the jobs[0].nodes"),
    ('{"jobs": [], "all_nodes": 7}', '"all_nodes" must be a host list'),
])
def test_malformed_resume_file_is_a_clear_error(text, words):
    with pytest.raises(ResumeFileError) as e:
        parse_resume_file(text, "resume file /proc/1/fd/3")
    assert words in str(e.value) and str(e.value).startswith("resume file /proc/1/fd/3")


def test_unreadable_resume_file(tmp_path):
    with pytest.raises(ResumeFileError, match="cannot read the resume file .*missing"):
        read_resume_file(str(tmp_path / "missing"))


def test_grouping_by_job():
    req = parse_resume_file('{"jobs":[{"job_id":11,"nodes":"burst-[1-2]"},{"job_id":12,"nodes":"burst-2"},'
                            '{"job_id":13,"nodes":"burst-4"},{"job_id":14,"nodes":"burst-9"}],'
                            '"all_nodes":"burst-[1-5]"}')
    groups = group_nodes(["burst-1", "burst-2", "burst-3", "burst-4", "burst-5"], req)
    # 11 and 12 share burst-2: one gang; 13 alone; burst-3/5 are in no job; 14's node is not asked for
    assert [(g.nodes, g.job_ids) for g in groups] == [
        (("burst-1", "burst-2"), ("11", "12")), (("burst-3",), ()), (("burst-4",), ("13",)), (("burst-5",), ())]
    assert [g.nodes for g in group_nodes(["burst-1", "burst-2"], None)] == [("burst-1",), ("burst-2",)]


def test_shapes_by_longest_prefix_and_nodes_of_no_shape():
    s = settings_from_config({"shapes": {"burst": {"gpu": "L4"}, "burst8": {"gpu": "H100", "gpus": 8}}})
    assert s.shape_for("burst-3").prefix == "burst"
    assert s.shape_for("burst8-1").prefix == "burst8"
    assert s.shape_for("burst12").prefix == "burst"  # "burst" + digits
    assert s.shape_for("gpu-1") is None and s.shape_for("burstx-1") is None
    groups, unknown = split_by_shape([Group(("burst-1", "burst8-1", "gpu-1"), ("7",))], s)
    assert [(g.nodes, g.shape.prefix, g.job_ids) for g in groups] == [
        (("burst-1",), "burst", ("7",)), (("burst8-1",), "burst8", ("7",))]
    assert unknown == ["gpu-1"]


# ---------------------------------------------------------------------------------------------
# demand
def job(jid="11", limit_s=0, comment="", name="train"):
    return SlurmJob(job_id=jid, state="PENDING", name=name, time_limit_s=limit_s, comment=comment)


def test_demand_from_shape_and_jobs():
    s = settings()
    g = Group(("big-1", "big-2"), ("11",), s.shapes["big"])
    d = demand_for(g, [job(limit_s=3 * 3600)], tenant="team-a")
    assert (d.gpus, d.nodes, d.gpu_model, d.hours, d.interruptible, d.tenant) == (16, 2, "H100", 3.0, False, "team-a")
    # no job: the shape's default hours
    d = demand_for(Group(("burst-4",), (), s.shapes["burst"]), [])
    assert (d.gpus, d.nodes, d.gpu_model, d.hours) == (1, 1, "L4", 2.0)
    # interruptible (may take spot) only when every job says so; hints for runtime and memory
    spot = job("11", comment="broker:interruptible=1,checkpoint=20,gpu_mem=24,data_gb=5")
    d = demand_for(Group(("burst-1",), ("11",), s.shapes["burst"]), [spot])
    assert d.interruptible and d.checkpoint_minutes == 20 and d.min_gpu_memory_gb == 24 and d.data_in_gb == 5
    assert d.hours == 2.0  # no time limit, no runtime hint
    d = demand_for(Group(("burst-1",), ("11", "12"), s.shapes["burst"]), [spot, job("12", limit_s=1800)])
    assert not d.interruptible and d.hours == 0.5
    d = demand_for(Group(("burst-1",), ("11", "12"), s.shapes["burst"]), [spot])  # 12 unreadable
    assert not d.interruptible
    d = demand_for(Group(("burst-1",), ("11",), s.shapes["burst"]), [job(comment="broker:runtime=90")])
    assert d.hours == 1.5


@pytest.mark.parametrize("section, words", [
    ({"sbatch": "/usr/bin/sbatch"}, "slurm.sbatch is not a setting"),
    ({"scontrol": "scontrol"}, "slurm.scontrol must be an absolute path"),
    ({"set_node_addr": "no"}, "slurm.set_node_addr must be true or false"),
    ({"onprem_partitions": ["gpu", "burst"]}, "must not name the burst partition"),
    ({"shapes": {"burst": {"gpus": 1}}}, "slurm.shapes.burst.gpu or min_gpu_memory_gb is required"),
    ({"shapes": {"burst": {"gpu": "L4", "gpus": 0}}}, "slurm.shapes.burst.gpus must be a whole number"),
    ({"shapes": {"burst": {"gpu": "L4", "cpus": 4}}}, "slurm.shapes.burst.cpus is not a setting"),
    ({"rpc_timeout_s": 0}, "slurm.rpc_timeout_s must be a number > 0"),
])
def test_config_errors_name_the_key(section, words):
    with pytest.raises(ConfigError) as e:
        settings_from_config(section)
    assert words in str(e.value)


def test_keys_name_their_nodes():
    g = Group(("burst-1", "burst-2", "burst-3"))
    key = idempotency_key(g, "0123456789ab")
    assert key == "slurm-burst-[1-3]-0123456789ab"
    assert nodes_from_key(key) == ["burst-1", "burst-2", "burst-3"]
    assert nodes_from_key(idempotency_key(g, "0123456789ab", 2)) == ["burst-1", "burst-2", "burst-3"]
    assert nodes_from_key("cli-1234") == []


# ---------------------------------------------------------------------------------------------
# the autoscaler side
def test_allow_burst_adds_the_burst_partition(fake):
    fake.job("11")
    fake.job("12", partition="gpu,burst")  # already allowed: nothing to do
    fake.job("13", state="RUNNING")  # started on-prem meanwhile: skipped
    SlurmBurstTarget(settings(fake)).allow_burst(["11", "12", "13"])
    assert fake.updates() == [["update", "jobid=11", "partition=gpu,burst"]]


def test_allow_burst_names_each_job_it_could_not_hand_over(fake):
    fake.job("11", partition="debug")
    fake.job("12")
    target = SlurmBurstTarget(settings(fake, onprem_partitions=["gpu"]))
    with pytest.raises(SlurmHandoffError) as e:
        target.allow_burst(["11", "12", "99"])
    assert "job 11: its partition debug is not an on-prem partition (gpu)" in str(e.value)
    assert "job 99: Slurm does not know it" in str(e.value)
    assert fake.updates() == [["update", "jobid=12", "partition=gpu,burst"]]
    fake.spec["fail_update"] = True
    fake.save()
    fake.job("14")
    with pytest.raises(SlurmHandoffError, match="job 14: .*permission denied"):
        target.allow_burst(["14"])


def test_slurm_source_for_the_autoscaler(fake):
    from broker.watchers.base import BurstHandoff, DrainNodes, OffloadJobs, SchedulerWatcher

    watcher = slurm_source({"enabled": True, "cluster": "prod", "scontrol": str(fake.path),
                            "squeue": "/opt/slurm/bin/squeue", "slurm_conf": "/etc/slurm/x.conf",
                            "offload_partition": "light"})
    assert watcher.source == "slurm:prod" and watcher.offload_queue == "light"
    assert watcher.squeue == "/opt/slurm/bin/squeue" and watcher.env["SLURM_CONF"] == "/etc/slurm/x.conf"
    assert watcher.burst_partition == "burst"
    for protocol in (SchedulerWatcher, BurstHandoff, OffloadJobs, DrainNodes):
        assert isinstance(watcher, protocol)
    fake.job("11")
    watcher.allow_burst(["11"])  # through the scontrol the settings name
    assert fake.updates() == [["update", "jobid=11", "partition=gpu,burst"]]


def test_the_watcher_leaves_out_jobs_that_are_not_the_brokers_to_burst(monkeypatch):
    from policies.queue import PendingJob, QueueSnapshot
    from broker.slurm.watcher import SlurmWatcher

    jobs = (PendingJob("1", 1, queue="gpu"), PendingJob("2", 1, queue="gpu,burst"),
            PendingJob("3", 1, queue="debug"), PendingJob("4", 1, queue="debug,gpu"))
    monkeypatch.setattr(SlurmWatcher, "snapshot", lambda self, now=None: QueueSnapshot("slurm:x", 0.0, jobs))
    watcher = slurm_source({"onprem_partitions": ["gpu"]})
    assert [j.job_id for j in watcher.snapshot(0.0).pending] == ["1", "4"]
    watcher = slurm_source({})
    assert [j.job_id for j in watcher.snapshot(0.0).pending] == ["1", "3", "4"]


# ---------------------------------------------------------------------------------------------
# the programs against a real broker server on the mocked clouds
@pytest.fixture
def broker(clouds, tmp_path):  # noqa: F811
    from broker.client import BrokerClient
    from providers.registry import build_enabled

    tables = clouds.provider_tables()
    with running_server(tmp_path, providers=build_enabled(tables, "broker-test"),
                        config={"providers": tables}) as (addr, svc):
        with BrokerClient(addr) as client:
            yield client, addr, clouds


def alive_names(clouds) -> set[str]:  # noqa: F811
    alive = clouds.alive_instances()
    names = {(i.get("tags") or {}).get("Name", "") for i in alive["aws"]}
    names |= {i["name"] for i in alive["gcp"]} | {i["name"] for i in alive["azure"]}
    return names - {""}


def test_resume_launches_one_lease_per_job_and_is_idempotent(broker, fake):
    client, _, clouds = broker  # noqa: F811
    fake.job("11", limit="04:00:00")
    s = settings(fake, set_node_addr=True)
    req = parse_resume_file('{"jobs":[{"job_id":11,"nodes":"big-[1-2]"}],"all_nodes":"big-[1-2],burst-3"}')
    out = resume("big-[1-2],burst-3", s, client, request=req, scontrol=Scontrol(str(fake.path)))
    assert out.exit_code == 0 and not out.failed, out
    assert sorted(d["nodes"] for d in out.launched) == ["big-[1-2]", "burst-3"]
    leases = {tuple(sorted(i["node_name"] for i in l["instances"])): l for l in client.list_leases()}
    gang = leases[("big-1", "big-2")]
    assert gang["nodes"] == 2 and gang["state"] == "running" and gang["job"]["job_id"] == "11"
    assert gang["idempotency_key"].startswith("slurm-big-[1-2]-")
    assert leases[("burst-3",)]["nodes"] == 1 and not leases[("burst-3",)]["job"]
    assert alive_names(clouds) == {"big-1", "big-2", "burst-3"}
    # each node's address told to Slurm
    addrs = {c[1]: c[2] for c in fake.updates()}
    for lease in leases.values():
        for i in lease["instances"]:
            assert addrs[f"nodename={i['node_name']}"] == f"nodeaddr={i['private_ip']}"
    # the same resume again: no new lease, no new instance
    again = resume("big-[1-2],burst-3", s, client, request=req, scontrol=Scontrol(str(fake.path)))
    assert again.launched == [] and sorted(r["nodes"] for r in again.reused) == ["big-1", "big-2", "burst-3"]
    assert len(client.list_leases()) == 2 and len(alive_names(clouds)) == 3


def test_a_suspended_node_resumed_again_gets_a_new_lease(broker, fake):
    client, _, clouds = broker  # noqa: F811
    s = settings(fake)
    req = parse_resume_file('{"jobs":[{"job_id":21,"nodes":"burst-1"}],"all_nodes":"burst-1"}')
    first = resume("burst-1", s, client, request=req, scontrol=Scontrol(str(fake.path)))
    assert suspend("burst-1", s, client, scontrol=Scontrol(str(fake.path))).released == [first.launched[0]["lease_id"]]
    # Slurm requeued job 21 onto burst-1 again: the same resume file, a new lease
    second = resume("burst-1", s, client, request=req, scontrol=Scontrol(str(fake.path)))
    assert second.launched and second.launched[0]["lease_id"] != first.launched[0]["lease_id"]
    keys = sorted(l["idempotency_key"] for l in client.list_leases())
    assert keys[1] == keys[0] + ".2"
    assert alive_names(clouds) == {"burst-1"}


def test_suspend_releases_the_lease_of_each_node_and_waits_for_a_whole_gang(broker, fake):
    client, _, clouds = broker  # noqa: F811
    s = settings(fake)
    sc = Scontrol(str(fake.path))
    req = parse_resume_file('{"jobs":[{"job_id":31,"nodes":"big-[1-2]"}],"all_nodes":"big-[1-2],burst-[1-2]"}')
    assert resume("big-[1-2],burst-[1-2]", s, client, request=req, scontrol=sc).exit_code == 0
    by_nodes = {tuple(sorted(i["node_name"] for i in l["instances"])): l["lease_id"] for l in client.list_leases()}
    out = suspend("burst-[1-2],burst-9", s, client, scontrol=sc)  # burst-9 has no lease: nothing to do
    assert sorted(out.released) == sorted([by_nodes[("burst-1",)], by_nodes[("burst-2",)]])
    # half a gang: big-2 still runs its job, so the lease stays
    fake.nodes(**{"big-2": "ALLOCATED+CLOUD"})
    out = suspend("big-1", s, client, scontrol=sc)
    assert out.released == [] and out.kept[0]["still_up"] == ["big-2"]
    assert alive_names(clouds) == {"big-1", "big-2"}
    fake.nodes(**{"big-1": "IDLE+CLOUD+POWERED_DOWN"})
    out = suspend("big-2", s, client, scontrol=sc)
    assert out.released == [by_nodes[("big-1", "big-2")]]
    assert alive_names(clouds) == set()
    assert [l["state"] for l in client.list_leases()] == ["released"] * 3


def test_resume_fail_releases_what_the_nodes_had(broker, fake):
    client, _, clouds = broker  # noqa: F811
    s = settings(fake)
    resume("burst-[1-2]", s, client, scontrol=Scontrol(str(fake.path)))
    out = resume_fail("burst-2", s, client)
    assert len(out.released) == 1
    assert alive_names(clouds) == {"burst-1"}
    reasons = [l["state_reason"] for l in client.list_leases() if l["state"] == "released"]
    assert "did not come up within ResumeTimeout" in reasons[0]


def test_failures_set_the_nodes_down_with_the_reason(broker, fake):
    client, _, clouds = broker  # noqa: F811
    shapes = {**SHAPES, "burst": {"gpu": "L4", "gpus": 1, "providers": ["aws"]}, "rare": {"gpu": "L4", "gpus": 3}}
    s = settings_from_config({"scontrol": str(fake.path), "set_node_addr": False, "shapes": shapes})
    clouds.aws.inject("capacity", times=0)  # every AWS launch: no capacity in any zone
    req = parse_resume_file('{"jobs":[{"job_id":41,"nodes":"burst-1"},{"job_id":42,"nodes":"rare-1"}],'
                            '"all_nodes":"burst-1,gpu-7,rare-1"}')
    out = resume("burst-1,gpu-7,rare-1", s, client, request=req, scontrol=Scontrol(str(fake.path)))
    assert out.exit_code == 1 and out.ignored == ["gpu-7"]
    down = {c[1]: c for c in fake.updates()}
    assert set(down) == {"nodename=burst-1", "nodename=rare-1"}  # gpu-7 is not the broker's: untouched
    assert down["nodename=burst-1"][2] == "state=down"
    assert down["nodename=burst-1"][3].startswith("reason=broker: broker failed_precondition: lease ")
    assert "could not be launched" in down["nodename=burst-1"][3]
    assert down["nodename=rare-1"][3].startswith("reason=broker: no cloud offer fits 1 x 3 L4")
    assert all(len(c[3]) <= 250 and "\n" not in c[3] for c in down.values())
    assert alive_names(clouds) == set()
    assert [l["state"] for l in client.list_leases()] == ["failed"]


def test_an_unreachable_broker_sets_the_nodes_down(fake):
    from broker.client import BrokerClient

    s = settings(fake)
    with BrokerClient("127.0.0.1:1", timeout=5) as client:
        out = resume("burst-[1-2]", s, client, scontrol=Scontrol(str(fake.path)))
    assert out.exit_code == 1
    (call,) = fake.updates()
    assert call[:3] == ["update", "nodename=burst-[1-2]", "state=down"]
    assert "no broker answering at 127.0.0.1:1" in call[3]


# ---------------------------------------------------------------------------------------------
# the command as slurmctld runs it: one argument, SLURM_RESUME_FILE, no PATH, output discarded
def run_program(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker.cli", "slurm", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


def write_config(path: Path, fake: FakeScontrol, server: str, **extra) -> Path:
    import tomli_w

    path.write_bytes(tomli_w.dumps({"slurm": {"scontrol": str(fake.path), "server": server,
                                              "set_node_addr": False, "shapes": SHAPES, **extra}}).encode())
    return path


def log_events(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_resume_and_suspend_commands_as_slurm_runs_them(broker, fake, tmp_path):
    client, addr, clouds = broker  # noqa: F811
    cfg = write_config(tmp_path / "broker.toml", fake, addr)
    resume_file = tmp_path / "resume.json"
    resume_file.write_text('{"jobs":[{"job_id":51,"nodes":"burst-1"}],"all_nodes":"burst-1"}')
    fake.job("51", limit="00:30:00")
    log = tmp_path / "log" / "slurm.log"
    env = {"SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_RESUME_FILE": str(resume_file)}
    r = run_program(["resume", "burst-1", "--config", str(cfg), "--log", str(log)], env)
    assert r.returncode == 0, r.stderr + log.read_text()
    assert alive_names(clouds) == {"burst-1"}
    events = log_events(log)
    assert {e["event"] for e in events} >= {"start", "resume_file", "quoting", "launched", "done"}
    assert all(e["command"] == "resume" and e["hostlist"] == "burst-1" for e in events)
    quoting = next(e for e in events if e["event"] == "quoting")
    assert quoting["hours"] == 0.5 and quoting["jobs"] == ["51"]
    # scontrol ran by its absolute path, with no PATH, with slurmctld's SLURM_CONF
    calls = [json.loads(ln) for ln in fake.calls_file.read_text().splitlines()]
    assert calls and all(c["path"] is None and c["conf"] == "/etc/slurm/slurm.conf" for c in calls)
    r = run_program(["suspend", "burst-1", "--config", str(cfg), "--log", str(log)],
                    {"SLURM_CONF": "/etc/slurm/slurm.conf"})
    assert r.returncode == 0, r.stderr
    assert alive_names(clouds) == set()
    assert log_events(log)[-1]["event"] == "done" and log_events(log)[-1]["released"]


def test_malformed_resume_file_from_slurm_exits_2_and_sets_the_nodes_down(fake, tmp_path):
    cfg = write_config(tmp_path / "broker.toml", fake, "127.0.0.1:1")
    bad = tmp_path / "resume.json"
    bad.write_text('{"jobs":[{"job_id":61}]}')
    log = tmp_path / "slurm.log"
    r = run_program(["resume", "burst-[1-2]", "--config", str(cfg), "--log", str(log)],
                    {"SLURM_RESUME_FILE": str(bad)})
    assert r.returncode == 2
    (call,) = fake.updates()
    assert call[:3] == ["update", "nodename=burst-[1-2]", "state=down"]
    assert "jobs[0].nodes is missing" in call[3]
    err = next(e for e in log_events(log) if e["event"] == "resume_file_error")
    assert f"resume file {bad}" in err["error"]


def test_bad_input_exits_2_with_one_sentence(fake, tmp_path):
    cfg = write_config(tmp_path / "broker.toml", fake, "127.0.0.1:1")
    log = tmp_path / "slurm.log"
    r = run_program(["suspend", "burst-[1-", "--config", str(cfg), "--log", str(log)], {})
    assert r.returncode == 2 and r.stderr.startswith("broker: cannot read the node list")
    assert "Traceback" not in r.stderr
    bad_cfg = tmp_path / "bad.toml"
    bad_cfg.write_text('[slurm]\nscontrol = "scontrol"\n')
    r = run_program(["resume", "burst-1", "--config", str(bad_cfg), "--log", str(log)], {})
    assert r.returncode == 2 and "slurm.scontrol must be an absolute path" in r.stderr
    assert any(e["event"] == "config_error" for e in log_events(log))


def test_log_goes_to_broker_home_by_default(fake, tmp_path):
    cfg = write_config(tmp_path / "broker.toml", fake, "127.0.0.1:1")
    r = run_program(["resume-fail", "burst-1", "--config", str(cfg), "--server", "127.0.0.1:1"],
                    {"BROKER_HOME": str(tmp_path / "home")})
    assert r.returncode == 7 and "no broker answering" in r.stderr  # unavailable, as the error table says
    events = log_events(tmp_path / "home" / "slurm.log")
    assert events[-1]["event"] == "resume_fail_crashed" and "no broker answering" in events[-1]["error"]
