"""A newcomer's first hour against a real `broker serve` with no provider enabled: the quote says
its offers are prices only, and a launch that cannot work names each distinct reason once, in
`launch`, `leases`, `lease` and `watch` alike."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tomli_w

from tests.clouds.three import ServeProcess, cli
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def bare_broker(tmp_path):
    """`broker serve` as first started: a store, no [providers.*] table."""
    cfg = tmp_path / "broker.toml"
    cfg.write_bytes(tomli_w.dumps({"owner": "broker-test", "store": {"url": f"sqlite:///{tmp_path / 'b.db'}"},
                                   "catalog": {"refresh_interval_s": 0}}).encode())
    serve = ServeProcess(cfg, tmp_path).start()
    try:
        yield serve.address
    finally:
        serve.stop()


def test_a_launch_with_no_provider_enabled_says_why_once(bare_broker):
    server = bare_broker
    r = cli("quote", "--server", server, "--gpu", "H100:8", "--hours", "1", server=server)
    assert r.returncode == 0 and r.stdout.startswith("prices only: no provider is enabled"), r.stdout[:300]
    q = json.loads(cli("quote", "--server", server, "--gpu", "H100:8", "--hours", "1", "-o", "json",
                       server=server).stdout)
    assert q["prices_only"] is True and len(q["offers"]) > 3

    r = cli("launch", "--quote-id", q["quote_id"], "--offer", "1", server=server)
    assert r.returncode == 6 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for provider in {o["provider"] for o in q["offers"][:5]}:
        assert r.stderr.count(f"provider {provider} is not enabled") == 1, r.stderr
    assert len(r.stderr) < 600, len(r.stderr)

    [lease] = json.loads(cli("leases", "-o", "json", server=server).stdout)
    first = q["offers"][0]["provider"]  # the cheapest cloud of the bundled catalog (lambda, then aws)
    assert lease["state"] == "failed" and lease["state_reason"].count(f"provider {first} is not enabled") == 1
    for out in (cli("leases", server=server).stdout, cli("lease", lease["lease_id"], server=server).stdout):
        assert out.count(f"provider {first} is not enabled") == 1, out

    watch = subprocess.Popen([sys.executable, "-m", "broker", "watch", "--lease", lease["lease_id"], "--after", "0"],
                             cwd=ROOT, env={**os.environ, "BROKER_SERVER": server}, stdout=subprocess.PIPE, text=True)
    try:
        events = []
        while not events or events[-1]["lease"]["state"] != "failed":
            events.append(json.loads(watch.stdout.readline()))
    finally:
        watch.terminate()
        watch.wait(10)
    assert all(e["message"].count(f"provider {first} is not enabled") <= 1 for e in events), events[-1]["message"]
    assert events[-1]["message"].count(f"provider {first} is not enabled") == 1
