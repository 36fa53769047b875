"""What one reconciler pass counts, says and leaves alone, on clouds in memory
(tests/fake_provider.py) and a clock the test moves: every adoption, loss, release, resume and
failure of a pass counted (not only the first), a cloud that cannot be listed or a lease another
writer moved stopping no other lease, a listing that lags, instances and lease rows whose record
cannot be read, and the log lines an operator reads (limits in money and time: test_reconciler_limits.py)."""
from __future__ import annotations

import dataclasses
import json

import pytest
from sqlalchemy import text
from structlog.testing import capture_logs

from broker.budget import Budgets
from broker.config import Budget
from broker.lease import LeaseState
from broker.lifecycle import Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.reconciler import PassReport, Reconciler
from broker.records import Job
from broker.store import StaleLease, Store
from providers.base import InstanceState, Market, StopReason, TransientError
from tests.fake_provider import FakeProvider
from tests.lease_kit import Clock

S = LeaseState
T0 = 1_800_000_000.0
GRACE_S = 60.0
WHERE = {"aws": ("us-east-1", "p5.48xlarge"), "gcp": ("us-central1", "a3-highgpu-8g"),
         "azure": ("eastus", "Standard_ND96isr_H100_v5")}


@dataclasses.dataclass
class Kit:
    lc: Lifecycle
    rec: Reconciler
    clouds: dict[str, FakeProvider]
    clock: Clock
    store: Store
    errors: list[tuple[str, str]]  # what the pass reported to on_error

    def target(self, count: int = 1, provider: str = "aws"):
        region, itype = WHERE[provider]
        return self.lc.target_explicit(provider, region, "", itype, "on_demand", count)

    def launch(self, key: str, count: int = 1, provider: str = "aws", **kw):
        return self.lc.launch(idempotency_key=key, target=self.target(count, provider), **kw)

    def node(self, lease) -> str:
        (iid,) = lease.instance_ids
        return iid

    def crashed_launch(self, key: str, count: int = 1):
        """A lease whose launch reached the cloud and whose process died before recording it."""
        lease, _ = self.lc.create(idempotency_key=key, target=self.target(count))
        lease = self.lc._begin_attempt(lease, self.target(count), [])
        return lease, self.clouds["aws"].launch(self.lc.spec_for(lease))

    def events(self, lease_id: str, kind: str):
        return [e for e in self.store.events_of(lease_id) if e.kind == kind]


@pytest.fixture
def make(tmp_path, mini_catalog):
    made: list[Kit] = []

    def build(grace_s: float = GRACE_S, budgets: dict[str, Budget] | None = None,
              on_exhausted: str = "finish_running", **settings) -> Kit:
        clock = Clock(T0)
        clouds = {name: FakeProvider(name, clock=clock) for name in WHERE}
        store = Store(f"sqlite:///{tmp_path / 'broker.db'}")
        lc = Lifecycle(store, clouds, QuoteEngine(mini_catalog), owner="test", clock=clock,
                       budgets=Budgets(store, budgets, on_exhausted) if budgets else None,
                       settings=Settings(backoff_s=0.0, **settings), sleep=lambda s: None)
        errors: list[tuple[str, str]] = []
        rec = Reconciler(lc, orphan_grace_s=grace_s, clock=clock, on_error=lambda *a: errors.append(a))
        made.append(Kit(lc, rec, clouds, clock, store, errors))
        return made[-1]

    yield build
    for kit in made:
        kit.store.close()


# -- every one of a pass counted ----------------------------------------------------------------------
def test_every_launch_adopted_in_a_pass_is_counted_logged_and_not_taken_for_orphans(make):
    k = make(grace_s=0)  # an instance no running lease lists is terminated at first sight
    a, made_a = k.crashed_launch("a", count=2)
    b, made_b = k.crashed_launch("b")
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert (report.adopted, report.orphans_terminated, report.errors) == (2, 0, 0)
    assert [k.lc.get(x.lease_id).state for x in (a, b)] == [S.RUNNING, S.RUNNING]
    assert {i.instance_id for i in k.clouds["aws"].alive()} == {i.instance_id for i in made_a + made_b}
    assert sorted((e for e in logs if e["event"] == "adopted"), key=lambda e: e["nodes"]) == [
        {"event": "adopted", "log_level": "info", "lease": b.lease_id, "provider": "aws", "nodes": 1},
        {"event": "adopted", "log_level": "info", "lease": a.lease_id, "provider": "aws", "nodes": 2}]


def test_every_draining_lease_released_in_a_pass_is_counted_and_none_stops_the_next(make):
    k = make()
    aws = k.clouds["aws"]
    emptied = []
    for key in ("a", "b"):  # nothing left in the cloud: released in the sync phase
        lease = k.launch(key)
        aws.terminate([i for i in aws.alive() if i.lease_id == lease.lease_id])
        emptied.append(k.lc.drain(k.lc.get(lease.lease_id), "going"))
    last = k.lc.drain(k.launch("c"), "going")  # its node still up: finished in the step phase
    aws.calls.clear()
    report = k.rec.run_pass()
    assert report.released == 3
    assert [k.lc.get(x.lease_id).state for x in (*emptied, last)] == [S.RELEASED] * 3
    assert aws.alive() == []
    # the listing settled the two emptied ones: only the third's nodes were asked about and terminated
    assert [(m, arg) for m, arg in aws.calls if m != "list_managed"] == [
        ("describe", (last.lease_id, "us-east-1")), ("terminate", sorted(last.instance_ids))]


def test_every_lost_lease_of_a_pass_is_counted_with_its_full_reason(make):
    k = make()
    aws = k.clouds["aws"]
    idle = [k.launch(f"i{n}") for n in range(2)]
    busy = [k.launch(f"b{n}", job=Job(job_id=f"j{n}")) for n in range(2)]
    for lease in idle + busy:
        aws.vanish(k.node(lease))
    report = k.rec.run_pass()
    assert (report.failed, report.lost, report.interrupted, report.replaced) == (2, 2, 0, 2)
    for lease in idle:
        assert k.lc.get(lease.lease_id).state_reason == "instances lost: instances vanished"
    for lease in busy:
        (new,) = [x for x in k.store.list_leases() if x.replaces == lease.lease_id]
        assert k.lc.get(lease.lease_id).state_reason == (
            f"lost instance: instances vanished; replacement lease {new.lease_id} requested")


def test_a_lost_leases_reason_names_each_stopped_node_and_why_it_stopped(make):
    k = make()
    aws = k.clouds["aws"]
    lease, other = k.launch("k", count=2), k.launch("o")  # the other stays up: listed alive beside the stopped
    first, second = sorted(lease.instance_ids)
    aws.instances[first] = dataclasses.replace(aws.instances[first], state=InstanceState.TERMINATED,
                                               stop_reason=StopReason.USER, stop_detail="deleted in the console")
    aws.instances[second] = dataclasses.replace(aws.instances[second], state=InstanceState.STOPPING)
    assert k.rec.run_pass().failed == 1
    assert k.lc.get(lease.lease_id).state_reason == (
        f"instances lost: {first}: user deleted in the console, {second}: stopping")
    assert k.lc.get(other.lease_id).state is S.RUNNING


def test_every_launch_resumed_in_a_pass_is_counted_and_each_that_fails(make):
    k = make()
    k.clouds["aws"].capacity[("us-east-1", "p5.48xlarge")] = 0
    leases = []
    for key in ("a", "b"):  # provisioning, abandoned mid-call
        lease, _ = k.lc.create(idempotency_key=key, target=k.target())
        leases.append(k.lc._begin_attempt(lease, k.target(), []))
    for key in ("c", "d"):  # replacements, launched at once
        leases.append(k.lc.create(idempotency_key=key, target=k.target(), replaces=f"l-{key}")[0])
    k.clock.advance(k.lc.settings.resume_after_s)
    report = k.rec.run_pass()
    assert (report.resumed, report.failed) == (4, 4)
    assert [k.lc.get(x.lease_id).state for x in leases] == [S.FAILED] * 4


def test_every_launch_timed_out_in_a_pass_is_counted(make):
    k = make()
    leases = []
    for key in ("a", "b"):
        lease, _ = k.lc.create(idempotency_key=key, target=k.target())
        leases.append(k.lc._begin_attempt(lease, k.target(), []))
        k.lc.inflight.add(lease.lease_id)  # stuck in this process: never resumed
    k.clock.advance(k.lc.settings.provision_timeout_s)
    assert k.rec.run_pass().failed == 2
    assert [k.lc.get(x.lease_id).state for x in leases] == [S.RELEASED] * 2


def test_every_lease_expired_in_a_pass_is_counted(make):
    k = make()
    leases = [k.launch(key) for key in ("a", "b")]
    k.clock.advance(k.lc.settings.idle_timeout_s)
    assert k.rec.run_pass().expired == 2
    assert [k.lc.get(x.lease_id).state for x in leases] == [S.RELEASED] * 2
    assert [k.events(x.lease_id, "budget") for x in leases] == [[], []]  # not a budget's doing


def test_orphans_of_every_cloud_are_counted_and_each_logged(make):
    k = make()
    g = k.clouds["gcp"].plant("l-gone-1", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    z = k.clouds["azure"].plant("l-gone-2", "eastus", "Standard_ND96isr_H100_v5", Market.ON_DEMAND)
    k.rec.run_pass()
    k.clock.advance(GRACE_S)
    with capture_logs() as logs:
        assert k.rec.run_pass().orphans_terminated == 2
    assert [e for e in logs if e["event"] == "orphan_terminated"] == [
        {"event": "orphan_terminated", "log_level": "warning", "provider": "gcp", "instance": g.instance_id,
         "lease": "l-gone-1"},
        {"event": "orphan_terminated", "log_level": "warning", "provider": "azure", "instance": z.instance_id,
         "lease": "l-gone-2"}]
    assert k.clouds["gcp"].instances == {} and k.clouds["azure"].instances == {}


def test_a_node_of_a_lease_that_ended_is_an_orphan(make):
    k = make()
    launching, (theirs,) = k.crashed_launch("l")  # listed first: a launching lease's node, not an orphan
    k.lc.inflight.add(launching.lease_id)
    lease = k.launch("k")
    k.lc.release(lease.lease_id)
    late = k.clouds["aws"].plant(lease.lease_id, "us-east-1", "p5.48xlarge", Market.ON_DEMAND)  # made after
    k.rec.run_pass()
    k.clock.advance(GRACE_S)
    assert k.rec.run_pass().orphans_terminated == 1 and late.instance_id not in k.clouds["aws"].instances
    assert theirs.instance_id in k.clouds["aws"].instances


def test_an_orphan_the_cloud_still_lists_after_its_terminate_waits_another_grace_period(make, monkeypatch):
    k = make()
    gcp = k.clouds["gcp"]
    orphan = gcp.plant("l-gone", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    asked: list[list[str]] = []  # the cloud accepts each terminate and keeps listing the VM (shutting down)
    monkeypatch.setattr(gcp, "terminate", lambda insts: asked.append([i.instance_id for i in insts]))
    k.rec.run_pass()
    k.clock.advance(GRACE_S)
    assert k.rec.run_pass().orphans_terminated == 1
    k.clock.advance(1)
    assert k.rec.run_pass().orphans_terminated == 0  # seen again: its grace starts over
    k.clock.advance(GRACE_S - 1)
    assert k.rec.run_pass().orphans_terminated == 0
    k.clock.advance(1)
    assert k.rec.run_pass().orphans_terminated == 1
    assert asked == [[orphan.instance_id]] * 2


# -- no one unit stops the others ----------------------------------------------------------------------
def test_every_failed_unit_of_a_pass_is_counted_reported_and_logged(make):
    k = make()
    g = k.clouds["gcp"].plant("l-gone-1", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    z = k.clouds["azure"].plant("l-gone-2", "eastus", "Standard_ND96isr_H100_v5", Market.ON_DEMAND)
    k.rec.run_pass()
    k.clock.advance(GRACE_S)
    refused = TransientError("503 busy", provider="gcp", code="ServiceUnavailable")
    k.clouds["gcp"].fail("terminate", refused)
    k.clouds["azure"].fail("terminate", KeyError("properties " * 100))  # an SDK bug, not a cloud's answer
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert (report.errors, report.orphans_terminated) == (2, 0)
    assert k.errors == [("orphans", "gcp"), ("orphans", "azure")]
    warned, bug = [e for e in logs if e["event"] == "orphans_failed"]
    assert warned == {"event": "orphans_failed", "log_level": "warning", "provider": "gcp", "error": str(refused),
                      "instances": [g.instance_id]}
    assert bug.pop("exc_info") is True and bug == {
        "event": "orphans_failed", "log_level": "error", "provider": "azure",
        "error": repr(KeyError("properties " * 100))[:500], "instances": [z.instance_id]}


def test_a_cloud_that_cannot_be_listed_stops_no_other_clouds_sync(make):
    k = make()
    on_gcp = k.launch("g", provider="gcp")
    on_aws = k.launch("a")
    k.clouds["gcp"].vanish(k.node(on_gcp))
    k.clouds["aws"].vanish(k.node(on_aws))
    refused = TransientError("503", provider="gcp", code="ServiceUnavailable")
    k.clouds["gcp"].fail("list_managed", refused)
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert report.skipped_providers == ["gcp"] and (report.failed, report.errors) == (1, 1)
    assert k.errors == [("list", "gcp")] and [e for e in logs if e["event"].endswith("_failed")] == [
        {"event": "list_failed", "log_level": "warning", "provider": "gcp", "error": str(refused)}]
    assert k.lc.get(on_gcp.lease_id).state is S.RUNNING  # nothing concluded from silence
    assert k.lc.get(on_aws.lease_id).state is S.RELEASED


def test_a_lease_whose_sync_fails_is_counted_logged_and_synced_on_the_next_pass(make):
    k = make()
    lease = k.launch("k")
    k.clouds["aws"].vanish(k.node(lease))
    refused = TransientError("describe throttled", provider="aws", code="RequestLimitExceeded")
    k.clouds["aws"].fail("describe", refused)
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert report.errors == 1 and k.errors == [("sync", "aws")] and k.lc.get(lease.lease_id).state is S.RUNNING
    assert [e for e in logs if e["event"].endswith("_failed")] == [
        {"event": "sync_failed", "log_level": "warning", "provider": "aws", "error": str(refused),
         "lease": lease.lease_id}]
    assert k.rec.run_pass().failed == 1 and k.lc.get(lease.lease_id).state is S.RELEASED


def test_a_lease_whose_step_fails_is_counted_logged_and_stepped_on_the_next_pass(make):
    k = make()
    lease = k.lc.drain(k.launch("k"), "going")
    refused = TransientError("describe throttled", provider="aws", code="RequestLimitExceeded")
    k.clouds["aws"].fail("describe", refused)
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert (report.errors, report.released) == (1, 0) and k.errors == [("step", "aws")]
    assert [e for e in logs if e["event"].endswith("_failed")] == [
        {"event": "step_failed", "log_level": "warning", "provider": "aws", "error": str(refused),
         "lease": lease.lease_id}]
    assert k.lc.get(lease.lease_id).state is S.DRAINING
    assert k.rec.run_pass().released == 1 and k.lc.get(lease.lease_id).state is S.RELEASED


def test_a_lease_already_warned_stops_no_later_leases_release(make):
    k = make(lifetime_warning_s=100, idle_timeout_s=950)
    warned = k.launch("w", max_lifetime_s=1000, job=Job(job_id="j"))
    idle = k.launch("i")
    k.clock.advance(900)
    k.rec.run_pass()
    assert k.lc.get(warned.lease_id).job.lifetime_warned
    k.clock.advance(50)  # the warned lease has nothing more to do yet; the idle one is due
    assert k.rec.run_pass().expired == 1
    assert [k.lc.get(x.lease_id).state for x in (warned, idle)] == [S.RUNNING, S.RELEASED]


def test_a_launch_left_to_this_process_stops_no_other_leases_sync(make):
    k = make()
    launching, _ = k.crashed_launch("l")
    k.lc.inflight.add(launching.lease_id)
    lost = k.launch("r")
    k.clouds["aws"].vanish(k.node(lost))
    assert k.rec.run_pass().failed == 1
    assert k.lc.get(launching.lease_id).state is S.PROVISIONING and k.lc.get(lost.lease_id).state is S.RELEASED


def test_a_lease_another_writer_moved_meanwhile_is_left_to_the_next_pass(make, monkeypatch):
    k = make()
    lease, _ = k.crashed_launch("k")
    adopt = k.lc.adopt

    def raced(lease, instances):
        raise StaleLease(lease.lease_id)

    monkeypatch.setattr(k.lc, "adopt", raced)
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert report.errors == 0 and k.errors == [] and k.lc.get(lease.lease_id).state is S.PROVISIONING
    assert [e for e in logs if e["event"].endswith(("_superseded", "_failed"))] == [
        {"event": "sync_superseded", "log_level": "info", "provider": "aws", "lease": lease.lease_id}]
    monkeypatch.setattr(k.lc, "adopt", adopt)
    assert k.rec.run_pass().adopted == 1 and k.lc.get(lease.lease_id).state is S.RUNNING


def test_a_node_missing_from_a_lagging_listing_is_asked_about_and_nothing_is_concluded(make, monkeypatch):
    """The lease's listed node and the one the listing lacks stay its own; a node it does not list
    (an earlier attempt's) is an orphan all the same."""
    k = make(grace_s=0)
    aws = k.clouds["aws"]
    lease = k.launch("k", count=2, job=Job(job_id="j"))
    extra = aws.plant(lease.lease_id, "us-east-1", "p5.48xlarge", Market.ON_DEMAND)
    hidden = sorted(lease.instance_ids)[0]
    listed = aws.list_managed
    monkeypatch.setattr(aws, "list_managed", lambda regions=None: [i for i in listed(regions) if i.instance_id != hidden])
    assert k.rec.run_pass() == PassReport(orphans_terminated=1)
    assert [arg for m, arg in aws.calls if m == "describe"] == [(lease.lease_id, "us-east-1")]
    assert k.lc.get(lease.lease_id).state is S.RUNNING and set(aws.instances) == lease.instance_ids
    assert extra.instance_id not in aws.instances


def test_a_spot_interruptions_reason_is_the_clouds_own_word(make):
    k = make()
    lease = k.lc.launch(idempotency_key="k", target=k.lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge",
                                                                          "spot", 1))
    k.clouds["aws"].interrupt(k.node(lease), detail="Server.SpotInstanceTermination")
    assert k.rec.run_pass().interrupted == 1
    assert k.lc.get(lease.lease_id).state_reason == (
        "spot interruption: Server.SpotInstanceTermination; no replacement: launched without a demand "
        "(explicit offering)")


# -- what a cloud's answer cannot carry ----------------------------------------------------------------
def _garble(cloud: FakeProvider, iid: str, problem: str, **fields) -> None:
    cloud.instances[iid] = dataclasses.replace(cloud.instances[iid], problem=problem, **fields)


def test_a_node_whose_lease_tag_cannot_be_read_stays_with_the_running_lease_that_lists_it(make):
    k = make(grace_s=0)
    aws = k.clouds["aws"]
    mine = k.launch("a")
    lost = k.launch("b", job=Job(job_id="j"))
    problem = "tag broker:lease holds characters the answer cannot carry: " + "\ufffd" * 600
    _garble(aws, k.node(mine), problem, lease_id="l-\ufffd")
    aws.vanish(k.node(lost))  # the rest of the listing is reconciled as usual...
    stray = aws.plant("l-gone", "us-east-1", "p5.48xlarge", Market.ON_DEMAND)  # ...its orphans too
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert (report.errors, report.orphans_terminated, report.lost) == (1, 1, 1) and k.errors == [("list", "aws")]
    assert stray.instance_id not in aws.instances
    assert k.lc.get(mine.lease_id).state is S.RUNNING and k.node(mine) in aws.instances
    (told,) = k.events(mine.lease_id, "instance_unreadable")
    assert (told.message, told.at, json.loads(told.data)) == (problem[:500], T0, {"instance_id": k.node(mine)})
    assert [e for e in logs if e["event"] == "instance_unreadable"] == [
        {"event": "instance_unreadable", "log_level": "warning", "provider": "aws", "instance": k.node(mine),
         "lease": mine.lease_id, "problem": problem}]
    k.clock.advance(1)
    report = k.rec.run_pass()  # counted on every pass, told once
    assert report.errors == 1 and k.errors == [("list", "aws")] * 2
    assert len(k.events(mine.lease_id, "instance_unreadable")) == 1
    assert k.lc.get(mine.lease_id).state is S.RUNNING and k.node(mine) in aws.instances


def test_a_stopped_node_whose_lease_tag_cannot_be_read_still_loses_its_lease(make):
    k = make()
    aws = k.clouds["aws"]
    lease = k.launch("a")
    aws.interrupt(k.node(lease))
    _garble(aws, k.node(lease), "tag broker:lease unreadable", lease_id="l-\ufffd")
    report = k.rec.run_pass()
    assert (report.errors, report.failed) == (1, 1)
    assert k.lc.get(lease.lease_id).state_reason == "instances lost: instances vanished"


def test_an_unreadable_node_of_no_known_lease_is_an_orphan_and_told_to_no_lease(make):
    k = make()
    aws = k.clouds["aws"]
    stray = aws.plant("l-\ufffd", "us-east-1", "p5.48xlarge", Market.ON_DEMAND)
    _garble(aws, stray.instance_id, "tag broker:lease unreadable")
    with capture_logs() as logs:
        k.rec.run_pass()
    assert k.store.events_of("") == [] and k.errors == [("list", "aws")]
    assert [e["lease"] for e in logs if e["event"] == "instance_unreadable"] == [""]
    k.clock.advance(GRACE_S)
    assert k.rec.run_pass().orphans_terminated == 1 and aws.instances == {}


def test_an_unreadable_node_is_told_again_after_it_was_read_and_a_new_one_despite_an_old_one(make):
    k = make()
    aws = k.clouds["aws"]
    a, b = k.launch("a"), k.launch("b")
    _garble(aws, k.node(a), "Name unreadable")
    k.rec.run_pass()
    _garble(aws, k.node(b), "Name unreadable")  # listed after a's, which was told already
    assert k.rec.run_pass().errors == 2  # each counted
    assert [len(k.events(x.lease_id, "instance_unreadable")) for x in (a, b)] == [1, 1]
    _garble(aws, k.node(a), "")  # read in full again...
    k.rec.run_pass()
    _garble(aws, k.node(a), "Name unreadable")  # ...and then not
    k.rec.run_pass()
    assert [len(k.events(x.lease_id, "instance_unreadable")) for x in (a, b)] == [2, 1]
    assert [k.lc.get(x.lease_id).state for x in (a, b)] == [S.RUNNING, S.RUNNING]


def test_an_unreadable_node_of_a_launching_lease_is_told_to_that_lease(make):
    k = make()
    lease, (node,) = k.crashed_launch("k")
    k.lc.inflight.add(lease.lease_id)  # still launching in this process
    _garble(k.clouds["aws"], node.instance_id, "Name unreadable")
    k.rec.run_pass()
    (told,) = k.events(lease.lease_id, "instance_unreadable")
    assert json.loads(told.data) == {"instance_id": node.instance_id}


def test_an_unreadable_node_that_cannot_be_told_is_counted_logged_and_told_next_pass(make, monkeypatch):
    k = make()
    lease = k.launch("a")
    _garble(k.clouds["aws"], k.node(lease), "Name unreadable")
    add_event = k.store.add_event

    def locked(*args, **kw):
        raise RuntimeError("database is locked")

    monkeypatch.setattr(k.store, "add_event", locked)
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert report.errors == 2 and k.errors == [("list", "aws")] * 2  # the node, and telling of it
    (failed,) = [e for e in logs if e["event"].endswith("_failed")]
    assert failed.pop("exc_info") is True and failed == {
        "event": "list_failed", "log_level": "error", "provider": "aws", "error": "RuntimeError('database is locked')",
        "instance": k.node(lease)}
    monkeypatch.setattr(k.store, "add_event", add_event)
    k.rec.run_pass()
    assert len(k.events(lease.lease_id, "instance_unreadable")) == 1


@pytest.mark.parametrize("garbage", ["not json", '[{"instance_id": "i-x"}],[{"instance_id": "i-y"}]', "[[]]", "{}"])
def test_a_lease_row_with_an_unreadable_instance_list_stops_no_other_lease(make, garbage):
    """A lease whose stored ``instances`` column cannot be read (a hand edit, a bad restore) is
    that lease's error on every pass; every other lease is still synced and an orphan elsewhere
    still reaped, and no node is taken for an orphan of it."""
    k = make()
    bad, good = k.launch("b"), k.launch("g")
    orphan = k.clouds["gcp"].plant("l-long-gone", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    with k.store.engine.begin() as conn:
        conn.execute(text("UPDATE leases SET instances = :v WHERE lease_id = :id"), {"v": garbage, "id": bad.lease_id})
    with capture_logs() as logs:
        assert k.rec.run_pass().errors == 1 and k.errors == [("sync", "aws")]
    assert [e for e in logs if e["event"].endswith("_failed")] == [
        {"event": "sync_failed", "log_level": "warning", "provider": "aws", "lease": bad.lease_id,
         "error": f"lease {bad.lease_id}: its stored instance list cannot be read"}]
    k.clock.advance(GRACE_S)
    k.clouds["aws"].vanish(k.node(good))  # the good lease's node is gone: it must notice
    report = k.rec.run_pass()
    assert (report.errors, report.orphans_terminated, report.failed) == (1, 1, 1)
    assert orphan.instance_id not in k.clouds["gcp"].instances and k.node(bad) in k.clouds["aws"].instances
    assert k.lc.get(good.lease_id).state is S.RELEASED and k.errors == [("sync", "aws")] * 2
