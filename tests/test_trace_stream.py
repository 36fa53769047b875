"""The one-pass trace reader (broker.simulate.trace) against the reader it replaced
(tests/trace_reference.py, which kept every row before resolving any): the same jobs in the
same order, the same skipped counts, rounded and censored jobs, and the same refusal (the same
line) in strict mode, on generated traces and on the real Philly trace."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.simulate import trace as new
from tests import trace_reference as ref

cell = st.sampled_from(["", "0", "1", "2", "0.5", "3600", "-1", "nan", "x", "2026-01-01T00:00:00Z", "none"])
rows = st.lists(st.tuples(st.integers(0, 30), cell, cell, cell, cell, cell,
                          st.sampled_from(["", "vc1", "vc2"]), st.sampled_from(["", "eval", "bad"])),
                max_size=25)
HEADER = "job_id,submit_time_s,num_gpus,duration_s,start_time,end_time,vc,kind\n"


def outcome(mod, path, **kw):
    try:
        t = mod.read_trace(path, 0.5, 0, "A100", **kw)
    except mod.TraceError as e:
        return ("error", str(e))
    return ("ok", [tuple(getattr(j, f) for f in new.TraceJob.__slots__) for j in t.jobs],
            t.skipped, t.rounded_up, t.censored)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows, strict=st.booleans(), fractional=st.sampled_from(["round-up", "skip"]))
def test_same_trace_or_same_refusal_as_before(tmp_path, rows, strict, fractional):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "".join(",".join([str(i), *rest]) + "\n" for i, *rest in rows))
    kw = {"strict": strict, "fractional": fractional}
    assert outcome(new, path, **kw) == outcome(ref, path, **kw)


def test_same_jobs_as_before_on_philly(shared_data):
    path = shared_data / "traces" / "philly_2017_jobs.csv"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert outcome(new, path) == outcome(ref, path)
