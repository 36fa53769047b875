"""The Kubernetes watcher's list-then-watch against a fake API server that speaks the wire
(broker_sandbox/kubernetes.py): list, then watch from the list's resourceVersion with bookmarks;
changes applied as they stream; 410 Gone (as an ERROR event and as HTTP 410) relists; the
namespaced paths; an API server it cannot read is one sentence; the client loads only when used."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.kubernetes.settings import KubernetesSettings
from broker.kubernetes.watcher import KubernetesUnavailable, KubernetesWatcher
from broker_sandbox.kubernetes import FakeKubeApi, local_queue, node, pod, workload

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def kube():
    api = FakeKubeApi(bookmark_interval_s=0.1).start()
    yield api
    api.stop()


def watcher(api, tmp_path, **kw) -> KubernetesWatcher:
    kw.setdefault("watch_timeout_s", 1)
    kw.setdefault("sync_timeout_s", 10)
    s = KubernetesSettings(enabled=True, kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")), **kw)
    return KubernetesWatcher(s)


def until(pred, what: str, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_it_lists_then_watches_from_the_lists_resource_version_and_follows_changes(kube, tmp_path):
    kube.put("nodes", node("gpu-1", gpus=8))
    kube.put("pods", pod("train-a", "ml", gpus=4))
    rv_at_list = kube.resource_version
    w = watcher(kube, tmp_path)
    try:
        snap = w.snapshot()
        assert [j.job_id for j in snap.pending] == ["ml/train-a"]
        watches = until(lambda: kube.watch_requests("pods"), "a pod watch")
        assert watches[0]["resourceVersion"] == str(rv_at_list)
        assert watches[0]["allowWatchBookmarks"] in ("true", "True", "1")
        lists = [q for p, q in kube.requests if p == "/api/v1/pods" and "watch" not in q]
        assert len(lists) == 1 and lists[0]["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed"

        kube.put("pods", pod("train-b", "ml", gpus=2))  # ADDED
        kube.put("pods", pod("train-a", "ml", gpus=4, phase="Running", node="gpu-1"))  # MODIFIED: bound
        kube.put("pods", pod("gone", "ml", gpus=1))
        kube.delete("pods", "gone", "ml")  # DELETED
        snap = until(lambda: (s := w.snapshot()).running and len(s.pending) == 1 and s, "the changes")
        assert [j.job_id for j in snap.pending] == ["ml/train-b"]
        assert snap.running[0].job_id == "ml/train-a" and snap.nodes[0].gpus_allocated == 4
        assert snap.nodes[0].state == "mix"
        # the pod finishes: it leaves the field selector's view, and its GPUs are free again
        kube.put("pods", pod("train-a", "ml", gpus=4, phase="Succeeded", node="gpu-1"))
        snap = until(lambda: (lambda s: None if s.running else s)(w.snapshot()), "the finished pod to go")
        assert (snap.nodes[0].state, snap.nodes[0].gpus_allocated) == ("idle", 0)
        assert "train-a" not in {o["metadata"]["name"] for i in w.informers["pods"] for o in i.items()}
        assert sum(i.lists for i in w.informers["pods"]) == 1  # no relist: the watch carried it all
    finally:
        w.stop()


def test_bookmarks_keep_a_quiet_watch_current_so_a_compaction_costs_no_relist(kube, tmp_path):
    kube.put("nodes", node("gpu-1"))
    w = watcher(kube, tmp_path)
    try:
        w.snapshot()
        for i in range(5):  # changes the nodes watch never sees an event for
            kube.put("pods", pod(f"p{i}", "ml"))
        nodes_informer = w.informers["nodes"][0]
        until(lambda: nodes_informer.resource_version == str(kube.resource_version), "a bookmark to move it on")
        assert nodes_informer.bookmarks > 0
        kube.compact()
        kube.put("nodes", node("gpu-2"))
        until(lambda: len(w.snapshot().nodes) == 2, "the new node")
        assert nodes_informer.relists == 0
    finally:
        w.stop()


@pytest.mark.parametrize("gone_as", ["event", "http"])
def test_410_gone_relists_and_the_cache_is_the_servers_again(tmp_path, gone_as):
    api = FakeKubeApi(gone_as=gone_as).start()
    try:
        api.put("pods", pod("stays", "ml", gpus=1))
        api.put("pods", pod("deleted-in-the-gap", "ml", gpus=1))
        inf = watcher(api, tmp_path).build_informers()["pods"][0]
        inf.relist()
        old_rv = inf.resource_version
        # while the informer is not watching: changes, then the history is compacted away
        api.delete("pods", "deleted-in-the-gap", "ml")
        api.put("pods", pod("added-in-the-gap", "ml", gpus=2))
        api.compact()
        inf.watch_once()  # the watch from old_rv is answered 410 Gone
        assert inf.resource_version is None
        assert api.watch_requests("pods")[-1]["resourceVersion"] == old_rv
        inf.watch_once()  # relists, then watches from the new list (1 s)
        assert inf.relists == 1 and inf.lists == 2
        assert sorted(o["metadata"]["name"] for o in inf.items()) == ["added-in-the-gap", "stays"]
        assert inf.resource_version == str(api.resource_version)
    finally:
        api.stop()


def test_an_error_event_other_than_410_is_an_error_not_a_relist(kube, tmp_path):
    inf = watcher(kube, tmp_path).build_informers()["pods"][0]
    inf.relist()
    inf.resource_version = "not-a-number"  # the fake answers 400 BadRequest to a bad resourceVersion
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as e:
        inf.watch_once()
    assert e.value.status == 400 and inf.relists == 0


def test_namespaces_are_watched_through_the_namespaced_paths(kube, tmp_path):
    kube.put("nodes", node("gpu-1"))
    kube.put("pods", pod("mine", "ml", gpus=1))
    kube.put("pods", pod("theirs", "other", gpus=1))
    kube.put("localqueues", local_queue("team-a", "ml", "cq-gpu"))
    kube.put("workloads", workload("job-a", "ml", queue="team-a", gpus_per_pod=2))
    kube.put("workloads", workload("job-b", "other", queue="team-a", gpus_per_pod=2))
    w = watcher(kube, tmp_path, namespaces=["ml"])
    try:
        snap = w.snapshot()
        assert sorted(j.job_id for j in snap.pending) == ["ml/job-a", "ml/mine"]
        assert next(j for j in snap.pending if j.job_id == "ml/job-a").queue == "cq-gpu"
        paths = {p for p, _ in kube.requests}
        assert "/api/v1/namespaces/ml/pods" in paths and "/api/v1/pods" not in paths
        assert "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads" in paths
        assert "/apis/kueue.x-k8s.io/v1beta1/workloads" not in paths
    finally:
        w.stop()


def test_without_kueue_no_kueue_path_is_asked(kube, tmp_path):
    kube.put("workloads", workload("job-a", "ml"))
    w = watcher(kube, tmp_path, kueue=False)
    try:
        assert w.snapshot().pending == ()
        assert not any("kueue" in p for p, _ in kube.requests)
    finally:
        w.stop()


def test_an_api_server_that_refuses_the_token_is_one_sentence_within_the_sync_timeout(kube, tmp_path):
    path = kube.kubeconfig(tmp_path / "bad", token="wrong")
    w = KubernetesWatcher(KubernetesSettings(enabled=True, kubeconfig=str(path), sync_timeout_s=2))
    t0 = time.monotonic()
    try:
        with pytest.raises(KubernetesUnavailable, match=r"kubernetes:default: \w+ not listed within 2 s .*401"):
            w.snapshot()
        assert time.monotonic() - t0 < 6
    finally:
        w.stop()


def test_a_missing_kubeconfig_is_named(tmp_path):
    w = KubernetesWatcher(KubernetesSettings(enabled=True, kubeconfig=str(tmp_path / "nope")))
    with pytest.raises(KubernetesUnavailable, match="kubeconfig .*nope"):
        w.snapshot()


def test_the_client_is_not_loaded_by_a_server_without_kubernetes():
    code = ("import sys, broker.config, broker.service, broker.autoscaler, broker.kubernetes.watcher; "
            "from broker import config; config.load(None, environ={}); "
            "print('kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_optional_rbac_grants_exactly_what_the_watcher_reads(kube, tmp_path):
    import yaml

    from broker.kubernetes.watcher import KUEUE_GROUP

    docs = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/optional/watcher-rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    granted = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"]}
    kinds = watcher(kube, tmp_path).build_informers()
    wanted = {("" if k in ("pods", "nodes") else KUEUE_GROUP, k) for k in kinds}
    assert set(granted) == wanted and all(v == {"list", "watch"} for v in granted.values())


def test_enabled_without_bootstrap_settings_is_a_config_error_naming_the_key(tmp_path):
    from broker import config as cfgmod
    from broker.errors import ConfigError

    with pytest.raises(ConfigError, match=r"kubernetes\.bootstrap names the boot template 'kubernetes'.*\[bootstrap\]"):
        cfgmod.load(None, environ={}, overrides={"kubernetes": {"enabled": True}})
    # no template: nothing to render, nothing needed
    assert cfgmod.load(None, environ={}, overrides={"kubernetes": {"enabled": True, "bootstrap": ""}}).kubernetes.enabled
