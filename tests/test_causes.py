"""The diagnosis' reading of Slurm's pending reasons: which kind each reason is, and the node
names a ``ReqNodeNotAvail, UnavailableNodes:…`` reason lists (Slurm's hostlist syntax, as squeue
writes it; NOTES-slurm)."""
from __future__ import annotations

import pytest

from policies.causes import CauseKind, reason_head, reason_kind, unavailable_nodes
from policies.triggers import held_reason


@pytest.mark.parametrize("reason,names", [
    ("ReqNodeNotAvail, UnavailableNodes:gpu-[2-3]", {"gpu-2", "gpu-3"}),
    ("ReqNodeNotAvail, UnavailableNodes:gpu-[01-03,07]", {"gpu-01", "gpu-02", "gpu-03", "gpu-07"}),
    ("ReqNodeNotAvail, UnavailableNodes:gpu-[5]", {"gpu-5"}),  # one number, no range
    ("ReqNodeNotAvail, UnavailableNodes:a[1-2],b[8-9],c", {"a1", "a2", "b8", "b9", "c"}),
    ("ReqNodeNotAvail, UnavailableNodes:a[1,3],b7", {"a1", "a3", "b7"}),  # a comma inside brackets
    ("ReqNodeNotAvail, UnavailableNodes:rack[1-2]-gpu", {"rack1-gpu", "rack2-gpu"}),  # text after
    ("ReqNodeNotAvail, UnavailableNodes:r[1-2]g[7,9]", {"r1g7", "r1g9", "r2g7", "r2g9"}),  # two groups
    ("ReqNodeNotAvail, UnavailableNodes:r[1]-g[3-4]x,z[2]", {"r1-g3x", "r1-g4x", "z2"}),
    ("ReqNodeNotAvail, UnavailableNodes:g[x-3,4]", {"g4"}),  # what is no number is left out
    ("ReqNodeNotAvail, UnavailableNodes:g[2-x]", set()),
    ("ReqNodeNotAvail, UnavailableNodes: n1 ", {"n1"}),
    ("ReqNodeNotAvail, UnavailableNodes:", set()),
    ("ReqNodeNotAvail", set()), ("Resources", set()), ("", set()), (None, set()),
])
def test_the_unavailable_nodes_a_reason_names(reason, names):
    assert unavailable_nodes(reason) == names


@pytest.mark.parametrize("reason,kind", [
    ("Resources", CauseKind.CAPACITY), ("None", CauseKind.CAPACITY), ("", CauseKind.CAPACITY),
    (None, CauseKind.CAPACITY), ("SomethingNew", CauseKind.CAPACITY),
    ("ReqNodeNotAvail, UnavailableNodes:gpu-2", CauseKind.UNAVAILABLE_NODES),
    ("Dependency", CauseKind.DEPENDENCY), ("JobHeldUser", CauseKind.HELD),
    # Slurm's limit reasons by their prefixes, including ones no table lists
    ("QOSMaxGRESPerUser", CauseKind.LIMITS), ("AssocGrpGRES", CauseKind.LIMITS),
    ("MaxGRESPerAccount", CauseKind.LIMITS), ("MaxCpuPerAccount", CauseKind.LIMITS),
    ("MaxNodePerAccount", CauseKind.LIMITS), ("MaxMemPerLimit", CauseKind.LIMITS),
])
def test_each_pending_reason_reads_as_its_kind(reason, kind):
    assert reason_kind(reason) == kind


@pytest.mark.parametrize("reason,head,held", [
    ("Resources", "Resources", False), ("Priority", "Priority", True),
    ("ReqNodeNotAvail, UnavailableNodes:gpu-[1-2]", "ReqNodeNotAvail", True),
    ("Dependency,detail,more", "Dependency", True), (" Dependency ,x", "Dependency", True),
    ("Resources, ReqNodeNotAvail", "Resources", False), ("", "", False), (None, "", False),
])
def test_the_diagnosis_and_the_trigger_read_the_same_head_of_a_reason(reason, head, held):
    """The part before Slurm's comma names the reason, for the diagnosis' cause and for the
    trigger's "capacity cannot fix this" alike."""
    assert reason_head(reason) == head
    if reason is not None:
        assert held_reason(reason) is held
