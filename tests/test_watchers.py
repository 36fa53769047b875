"""The scheduler interface (broker.watchers.base) and registry (broker.watchers.registry): every
registered kind is complete, a kind's table is a top-level table of the configuration, and the
core acts on a scheduler through the capabilities its watcher offers, whatever scheduler it is."""
from __future__ import annotations

import json

import msgspec
import pytest

from broker import config as cfgmod
from broker.autoscaler import Autoscaler
from broker.watchers import registry
from broker.watchers.base import (BurstHandoff, DrainNodes, HandoffError, JoinNodes, OffloadJobs,
                                  SchedulerWatcher, Unsupported, capability)
from policies.queue import ClusterNode, PendingJob, QueueSnapshot
from providers.base import Instance, InstanceState, Market
from providers.notices import Notice, NoticeKind
from providers.settings import SettingsError, convert
from tests import fake_scheduler as fake
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.lease_kit import service

pytestmark = pytest.mark.timeout(120)

# ---------------------------------------------------------------------------------------------
# the registry
def test_every_registered_kind_is_complete():
    core = set(cfgmod.Config.__struct_fields__) - set(cfgmod.SchedulerTables.__struct_fields__)
    names = [k.name for k in registry.kinds()]
    assert "slurm" in names and len(names) == len(set(names))
    for k in registry.kinds():
        assert k.name not in core, f"scheduler kind {k.name} shadows the core table [{k.name}]"
        assert k.name in cfgmod.Config.__struct_fields__
        assert k.settings().enabled is False, f"[{k.name}] must be off unless enabled"
        assert k.summary
        table = convert({"enabled": True}, k.settings, k.name)
        watcher = k.build(table)  # builds without touching the scheduler
        assert isinstance(watcher, SchedulerWatcher) and watcher.source


def test_a_kind_without_an_enabled_flag_or_with_a_bad_name_is_refused():
    class NoFlag(msgspec.Struct):
        x: int = 0

    with pytest.raises(ValueError, match="need an `enabled` key"):
        registry.SchedulerKind("nope", NoFlag, lambda s: None)
    with pytest.raises(ValueError, match="lower-case TOML key"):
        registry.SchedulerKind("Kube-1", fake.FakeSettings, fake.build)


@pytest.fixture
def with_fake_kind(monkeypatch):
    """The registry with the fake kind added (as one line in KIND_MODULES would)."""
    monkeypatch.setattr(registry, "KIND_MODULES", (*registry.KIND_MODULES, "tests.fake_scheduler"))
    registry.kinds.cache_clear()
    yield
    monkeypatch.undo()
    registry.kinds.cache_clear()


def test_a_registered_kind_gets_its_own_table_and_its_watcher_when_enabled(with_fake_kind):
    tables = registry.settings_struct()
    assert {"slurm", "fakesched"} <= set(tables.__struct_fields__)
    cfg = convert({"fakesched": {"enabled": True, "name": "lab"}}, tables)
    assert set(registry.enabled_settings(cfg)) == {"fakesched"}
    (w,) = registry.build_watchers(cfg).items()
    assert w[0] == "fake:lab" and isinstance(w[1], fake.Capable)
    assert registry.build_watchers(convert({}, tables)) == {}  # nothing enabled, nothing built
    with pytest.raises(SettingsError) as e:  # its keys are checked, and named, like any table's
        convert({"fakesched": {"enabled": True, "nmae": "x"}}, tables)
    assert "fakesched.nmae" in str(e.value)
    with pytest.raises(SettingsError, match="fakesched.name must not start or end with a space"):
        convert({"fakesched": {"name": " x"}}, tables)


def test_two_schedulers_reporting_as_one_source_are_refused(with_fake_kind, monkeypatch):
    tables = registry.settings_struct()
    cfg = convert({"fakesched": {"enabled": True, "name": "x"}, "slurm": {"enabled": True}}, tables)
    monkeypatch.setattr(fake, "KIND", registry.SchedulerKind(
        "fakesched", fake.FakeSettings, lambda s: fake.Capable(source="slurm:default"), "clash"))
    registry.kinds.cache_clear()
    with pytest.raises(ValueError, match="two schedulers report as source 'slurm:default'"):
        registry.build_watchers(cfg)


def test_the_configuration_reads_the_slurm_table_through_the_registry():
    cfg = cfgmod.load(None, environ={"BROKER_SLURM__ENABLED": "true", "BROKER_SLURM__CLUSTER": "prod"})
    assert cfg.schedulers["slurm"].enabled and cfg.schedulers["slurm"].cluster == "prod"
    assert list(registry.build_watchers(cfg)) == ["slurm:prod"]
    with pytest.raises(cfgmod.ConfigError, match="names slurm.burst_partiton, which is not a setting .did you mean BROKER_SLURM__BURST_PARTITION"):
        cfgmod.load(None, environ={"BROKER_SLURM__BURST_PARTITON": "x"})


def test_capability_answers_none_or_unsupported():
    plain, capable, joining = fake.Plain(), fake.Capable(), fake.Joining()
    assert capability(plain, BurstHandoff) is None and capability(plain, OffloadJobs) is None
    assert capability(capable, BurstHandoff) is capable and capability(capable, DrainNodes) is capable
    assert capability(joining, JoinNodes) is joining and capability(capable, JoinNodes) is None
    with pytest.raises(Unsupported, match="fake:one cannot DrainNodes"):
        capability(plain, DrainNodes, required=True)
    assert str(HandoffError.of([("7", "gone"), ("8", "no")])) == "job 7: gone; job 8: no"


# ---------------------------------------------------------------------------------------------
# the autoscaler acts through the capabilities
AUTOSCALER = {"enabled": True, "default_gpu_model": "L4",
              "trigger": {"stabilization_s": 0, "cooldown_s": 0, "pending_gpus_threshold": 2}}


def full_queue(*extra: PendingJob) -> QueueSnapshot:
    nodes = tuple(ClusterNode(f"gpu-{i}", "alloc", 8, 8, "A100") for i in range(4))
    pending = tuple(PendingJob(str(i), 1, user="ana", queue="gpu", gpu_model="L4", est_runtime_s=7200,
                               waited_s=600, pending_reason="Resources") for i in range(4))
    return QueueSnapshot("x", 0.0, pending + extra, nodes)


def scaler(svc, *watchers) -> Autoscaler:
    s = svc.config.autoscaler
    return Autoscaler(svc, s, s.trigger_config(), s.diagnose_config(), watchers={w.source: w for w in watchers})


def decisions(svc, action: str) -> list:
    return [d for d in svc.store.list_decisions(limit=100) if d.action == action]


def test_a_watcher_that_hands_bursts_over_gets_the_jobs_and_no_lease_is_launched(clouds, tmp_path):  # noqa: F811
    w = fake.Capable(snap=full_queue(), refuse=frozenset())
    with service(tmp_path, clouds, autoscaler=AUTOSCALER) as svc:
        (d,) = scaler(svc, w).tick()
        assert d.action == "burst", d.reason
        (call,) = [c for c in w.calls if c[0] == "allow_burst"]
        assert set(call[1]) <= {"0", "1", "2", "3"} and call[1]
        assert svc.store.list_leases() == []
        (rec,) = decisions(svc, "burst")
        assert json.loads(rec.data)["handoff"] == "scheduler" and json.loads(rec.job_ids) == list(call[1])


def test_a_refused_hand_off_is_recorded_naming_the_job(clouds, tmp_path):  # noqa: F811
    w = fake.Capable(snap=full_queue(), refuse=frozenset({"0", "1", "2", "3"}))
    with service(tmp_path, clouds, autoscaler=AUTOSCALER) as svc:
        a = scaler(svc, w)
        a.tick()
        (failed,) = decisions(svc, "burst_failed")
        assert "hand-off failed: job " in failed.reason and "refused by the fake" in failed.reason
        assert not a.sources["fake:one"].burst_jobs  # they may be burst again
        a.tick()
        assert len(decisions(svc, "burst_failed")) == 1  # the same failure is recorded once


def test_a_watcher_that_cannot_hand_over_gets_leases_that_join_its_cluster(clouds, tmp_path):  # noqa: F811
    w = fake.Joining(snap=full_queue())
    with service(tmp_path, clouds, autoscaler=AUTOSCALER) as svc:
        (d,) = scaler(svc, w).tick()
        assert d.action == "burst", d.reason
        leases = svc.store.list_leases()
        assert leases and all(l.bootstrap == "container" for l in leases)
        for l in leases:
            assert l.job["source"] == "fake:one" and l.job["env"] == {"FAKE_CLUSTER": "fake:one",
                                                                        "FAKE_JOB": l.job["job_id"]}


def test_a_plain_watcher_gets_leases_with_no_boot_template(clouds, tmp_path):  # noqa: F811
    w = fake.Plain(snap=full_queue())
    with service(tmp_path, clouds, autoscaler=AUTOSCALER) as svc:
        (d,) = scaler(svc, w).tick()
        assert d.action == "burst"
        leases = svc.store.list_leases()
        assert leases and all(l.bootstrap == "" and "env" not in l.job for l in leases)


def test_blocking_light_jobs_are_offloaded_through_the_watcher_before_training_bursts(clouds, tmp_path):  # noqa: F811
    evals = [PendingJob(f"e{i}", 1, queue="gpu", kind="eval", gpu_model="L4", waited_s=600,
                        pending_reason="Resources") for i in range(2)]
    with service(tmp_path, clouds, autoscaler=AUTOSCALER) as svc:
        w = fake.Capable(snap=full_queue(*evals))
        scaler(svc, w).tick()
        assert w.calls[0] == ("offload", ("e0", "e1"))
        (off,) = decisions(svc, "offload")
        assert off.reason.startswith("moved 2 tuning/eval/inference jobs") and "partition light" in off.reason
        burst = [c for c in w.calls if c[0] == "allow_burst"]
        assert burst and not {"e0", "e1"} & set(burst[0][1])  # the moved jobs do not burst
    # a watcher with no offload queue moves nothing: the diagnosis names them only
    with service(tmp_path / "2", clouds, autoscaler=AUTOSCALER) as svc:
        w2 = fake.Capable(snap=full_queue(*evals), offload_queue="")
        scaler(svc, w2).tick()
        assert not [c for c in w2.calls if c[0] == "offload"] and not decisions(svc, "offload")
        assert [c for c in w2.calls if c[0] == "allow_burst"]


def test_a_watcher_that_cannot_be_read_is_skipped_and_the_others_are_read(clouds, tmp_path):  # noqa: F811
    broken = fake.Plain(source="fake:broken", fail="connection refused")
    good = fake.Capable(snap=full_queue())
    with service(tmp_path, clouds, autoscaler=AUTOSCALER) as svc:
        out = scaler(svc, broken, good).tick()
        assert len(out) == 1 and out[0].action == "burst"


def test_the_service_builds_the_watchers_of_the_enabled_kinds(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds, autoscaler=AUTOSCALER, slurm={"enabled": True, "cluster": "lab"}) as svc:
        assert list(svc.schedulers) == ["slurm:lab"]
        assert svc.autoscaler.watchers == svc.schedulers
    with service(tmp_path / "2", clouds, autoscaler=AUTOSCALER) as svc:
        assert svc.schedulers == {} and svc.autoscaler.watchers == {}


# ---------------------------------------------------------------------------------------------
# interruption notices go to the scheduler that knows the nodes
def scheduler_lease(svc, node: str, iid: str):
    from broker.lifecycle import Target

    lc = svc.lifecycle
    t = Target("aws", "us-east-1", "us-east-1a", "g5.xlarge", Market.SPOT, 1, 500_000)
    lease, _ = lc.create(idempotency_key=f"sched-{node}", target=t, job={"node_names": [node]})
    lease = lc._begin_attempt(lease, t, [])
    return lc.adopt(lease, [Instance("aws", iid, "us-east-1", "us-east-1a", "g5.xlarge", Market.SPOT,
                                     InstanceState.RUNNING, lease.lease_id, node)])


def test_a_notice_drains_through_the_scheduler_that_knows_the_nodes(clouds, tmp_path):  # noqa: F811
    other = fake.Capable(source="fake:other", nodes=("x-1",))
    mine = fake.Capable(source="fake:mine", nodes=("burst-1",))
    with service(tmp_path, clouds) as svc:
        svc.schedulers = {w.source: w for w in (other, mine)}
        lease = scheduler_lease(svc, "burst-1", "i-0123456789abcdef0")
        (out,) = svc.notices.handle(Notice("aws", NoticeKind.PREEMPTION, ("i-0123456789abcdef0",), "aws.ec2"))
        assert out.acted and out.requeued == ["job-on-burst-1"] and out.scheduler == "fake:mine"
        assert other.calls == [("drain", ("burst-1",))] and mine.calls == [("drain", ("burst-1",))]
        (ev,) = [e for e in svc.store.events_of(lease.lease_id) if e.kind == "interruption_notice"]
        assert "fake:mine jobs job-on-burst-1 requeued" in ev.message
        assert not out.replacement  # the scheduler resumes nodes for its jobs


def test_a_notice_for_nodes_no_scheduler_knows_says_so(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc:
        svc.schedulers = {"fake:other": fake.Capable(source="fake:other", nodes=("x-1",))}
        scheduler_lease(svc, "burst-2", "i-0fedcba9876543210")
        (out,) = svc.notices.handle(Notice("aws", NoticeKind.PREEMPTION, ("i-0fedcba9876543210",), "aws.ec2"))
        assert out.requeued == [] and out.note == "no watched scheduler knows nodes burst-2"


def test_a_kinds_check_spanning_tables_runs_only_when_it_is_enabled(with_fake_kind):
    from types import SimpleNamespace

    tables = registry.settings_struct()
    on = convert({"fakesched": {"enabled": True, "name": "lab"}}, tables)
    cfg = SimpleNamespace(**{k.name: getattr(on, k.name) for k in registry.kinds()}, quote=SimpleNamespace(ttl_s=900))
    with pytest.raises(ValueError, match='fakesched.name "lab" needs quote.ttl_s of 3600 or more, got 900'):
        registry.check(cfg)
    cfg.quote.ttl_s = 3600
    registry.check(cfg)
    cfg.quote.ttl_s, cfg.fakesched = 900, convert({"name": "lab"}, fake.FakeSettings)
    registry.check(cfg)  # not enabled: not checked


def test_the_config_runs_the_kinds_checks(monkeypatch):
    seen = []

    def refuse(settings, config) -> None:
        seen.append(config.owner)
        raise ValueError("cluster is refused by the test")

    kinds = tuple(registry.SchedulerKind(k.name, k.settings, k.build, k.summary, refuse) for k in registry.kinds())
    monkeypatch.setattr(registry, "kinds", lambda: kinds)
    with pytest.raises(cfgmod.ConfigError, match="slurm.cluster is refused by the test"):
        cfgmod.load(None, environ={}, overrides={"slurm.enabled": True, "owner": "me"})
    assert seen == ["me"]
    cfgmod.load(None, environ={}, overrides={"owner": "me"})  # not enabled: not checked


def test_the_service_stops_the_watchers_that_run_threads(clouds, tmp_path):  # noqa: F811
    w = fake.Joining(snap=full_queue())
    with service(tmp_path, clouds) as svc:
        svc.schedulers = {w.source: w, "fake:plain": fake.Plain(source="fake:plain")}
    assert w.stopped == 1
