"""The lease type: one table of transitions, enforced on every write; the diagram agrees with it."""
from __future__ import annotations

import pytest

import broker.lease as lease_mod
from broker.errors import FailedPrecondition
from broker.lease import (BILLED, ENDED, LIVE, SERVING, TRANSITIONS, InvalidTransition, Lease, LeaseState,
                          check_transition, cost_so_far, diagram)
from broker.store import Store
from broker.records import Job
from tests.stores import db_url  # noqa: F401  (fixture)

S = LeaseState


def make(state=S.REQUESTED, **kw) -> Lease:
    base = dict(lease_id="l-1", idempotency_key="k", state=state, provider="aws", region="us-east-1",
                instance_type="p5.48xlarge", market="on_demand", nodes=2, hourly_micros=10_000_000,
                client_token="l-1-1", created_at=1.0, updated_at=1.0, state_since=1.0)
    return Lease(**{**base, **kw})


def test_the_docstring_diagram_is_generated_from_the_table():
    body = "\n".join(line[4:] for line in lease_mod.__doc__.splitlines() if line.startswith("    "))
    assert diagram() in body
    for s in LeaseState:  # every state has one line, listing exactly its successors
        (line,) = [x for x in diagram().splitlines() if x.split()[0] == s.value]
        listed = line.removeprefix(s.value).replace("─▶", " ").replace("(end)", " ").replace("|", " ")
        assert set(listed.split()) == {t.value for t in TRANSITIONS[s]}


def test_the_sets_are_derived_from_the_table_and_agree():
    assert ENDED == {S.RELEASED, S.FAILED} and LIVE == set(LeaseState) - ENDED
    assert S.DRAINING in LIVE and S.DRAINING not in SERVING  # still costs, no longer serves
    assert BILLED <= LIVE and SERVING <= LIVE


@pytest.mark.parametrize("frm,to", [(S.RUNNING, S.REQUESTED), (S.RELEASED, S.RUNNING), (S.FAILED, S.DRAINING),
                                    (S.REQUESTED, S.RUNNING), (S.DRAINING, S.RUNNING), (S.RUNNING, S.FAILED)])
def test_a_transition_the_table_does_not_allow_raises(frm, to):
    with pytest.raises(InvalidTransition, match=f"a {frm.value} lease cannot become {to.value}"):
        check_transition(frm, to)


def test_every_allowed_transition_and_staying_put_pass():
    for frm, nxt in TRANSITIONS.items():
        assert check_transition(frm, frm) is frm
        for to in nxt:
            assert check_transition(frm.value, to.value) is to


def test_the_store_refuses_an_invalid_transition_and_writes_nothing(db_url):  # noqa: F811
    store = Store(db_url)
    try:
        lease, _ = store.create_lease(make(job=Job(job_id="7"), instances=[{"instance_id": "i-1"}]))
        running = store.update_lease(store.update_lease(lease, now=2.0, state=S.PROVISIONING), now=3.0,
                                     state=S.RUNNING)
        with pytest.raises(InvalidTransition) as e:
            store.update_lease(running, now=4.0, state=S.REQUESTED, message="no")
        assert isinstance(e.value, FailedPrecondition)  # one error family: FAILED_PRECONDITION / exit 6
        after = store.get_lease(lease.lease_id)
        assert after.state is S.RUNNING and after.version == running.version
        assert [ev.to_state for ev in store.events_of(lease.lease_id)] == ["requested", "provisioning", "running"]
        # JSON columns come back decoded, once, as Python values
        assert after.job == Job(job_id="7") and after.instance_ids == {"i-1"}
        assert store.list_leases(states=LIVE)[0].job == Job(job_id="7")
    finally:
        store.close()


def test_cost_so_far_counts_only_billed_time():
    running = make(S.RUNNING, accrued_micros=5, accrued_at=100.0)
    assert cost_so_far(running, 100.0 + 1800) == 5 + 2 * 10_000_000 // 2
    assert cost_so_far(make(S.RELEASED, accrued_micros=5, accrued_at=100.0), 10_000.0) == 5
    assert cost_so_far(make(S.PROVISIONING), 10_000.0) == 0
