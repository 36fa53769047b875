"""ReportQueue and Diagnose pause the cyclic garbage collector while they read, diagnose and
decide a pushed snapshot, and leave it as they found it: on, off, after an error, and when
calls overlap on the server's threads."""
from __future__ import annotations

import gc
import threading

import pytest

from broker import queue_api
from broker.errors import InvalidArgument


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_back_on_after(collector_on):
    with queue_api.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_back_on_after_an_error(collector_on):
    with pytest.raises(RuntimeError):
        with queue_api.collector_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_left_off_when_it_was_off(collector_on):
    gc.disable()
    with queue_api.collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_calls_resume_it_only_when_the_last_leaves(collector_on):
    inside, release, seen = threading.Event(), threading.Event(), []

    def other():
        with queue_api.collector_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with queue_api.collector_paused():
        t.start()
        assert inside.wait(10)
    seen.append(gc.isenabled())  # the other call is still inside
    release.set()
    t.join(10)
    assert seen == [False] and gc.isenabled()


def test_a_report_queue_call_leaves_it_on(collector_on, tmp_path):
    from broker import config as cfgmod
    from broker.service import Service
    from broker.v1 import broker_pb2 as pb

    svc = Service(cfgmod.load(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path}/b.db"}))
    try:
        s = pb.QueueSnapshot(source="s", pending=[pb.PendingJob(job_id="j", gpus=1)],
                             nodes=[pb.ClusterNode(name="n", state="alloc", gpus_total=8, gpus_allocated=8)])
        queue_api.report_queue(svc, pb.ReportQueueRequest(snapshot=s))
        assert gc.isenabled()
        with pytest.raises(InvalidArgument, match="gpus"):
            queue_api.report_queue(svc, pb.ReportQueueRequest(snapshot=pb.QueueSnapshot(
                source="s", pending=[pb.PendingJob(job_id="j", gpus=0)])))
        assert gc.isenabled()
    finally:
        svc.stop()
