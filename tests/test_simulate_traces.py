"""Real cluster traces (CPU-only, fractional, never-started and unfinished rows), pool-size
sweeps and `broker advise --simulation`."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli import app
from broker.simulate import TraceError, parse_columns, read_trace
from tests.test_simulate import write_catalog

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]

# A public-cluster-style pod list (Kubernetes-like names, ISO timestamps): two GPU jobs that
# ran, a CPU-only pod, a half-GPU share, a pod that never started, one still running at the end
# of the trace, and one with no start/end at all but a status.
PODS = """name,cpu_milli,num_gpu,gpu_milli,creation_time,scheduled_time,deletion_time,pod_phase
p-ok1,8000,2,1000,2023-05-01T00:00:00Z,2023-05-01T00:00:10Z,2023-05-01T01:00:10Z,Succeeded
p-ok2,8000,1,1000,2023-05-01T00:05:00Z,2023-05-01T00:05:00Z,2023-05-01T00:35:00Z,Succeeded
p-cpu,4000,0,0,2023-05-01T00:06:00Z,2023-05-01T00:06:01Z,2023-05-01T00:10:00Z,Succeeded
p-half,2000,1,500,2023-05-01T00:07:00Z,2023-05-01T00:07:00Z,2023-05-01T00:17:00Z,Succeeded
p-never,8000,4,1000,2023-05-01T00:08:00Z,,,Pending
p-running,8000,8,1000,2023-05-01T00:09:00Z,2023-05-01T00:20:00Z,,Running
"""


def pods(tmp_path, text=PODS):
    p = tmp_path / "data" / "traces" / "pods.csv"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_a_public_cluster_trace_replays_with_its_skip_counts(tmp_path):
    tr = read_trace(pods(tmp_path), 0.0, 0, "V100")
    by_id = {j.job_id: j for j in tr.jobs}
    assert set(by_id) == {"p-ok1", "p-ok2", "p-half", "p-running"}
    assert tr.skipped == {"no_gpus": 1, "never_ran": 1}
    assert (by_id["p-ok1"].gpus, by_id["p-ok1"].duration_s) == (2, 3600.0)
    assert by_id["p-half"].gpus == 1 and tr.rounded_up == 1
    # Still running: replayed up to the trace's last timestamp (p-ok1's end, 01:00:10), flagged.
    run = by_id["p-running"]
    assert run.censored and run.duration_s == pytest.approx(40 * 60 + 10) and tr.censored == 1
    assert [j.job_id for j in tr.jobs] == ["p-ok1", "p-ok2", "p-half", "p-running"]  # by submit time
    d = tr.to_dict()
    assert d["skipped"] == {"no_gpus": 1, "never_ran": 1} and d["skipped_rows"] == 2 and d["censored_jobs"] == 1
    assert "skipped 2 rows (1 no gpus, 1 never ran)" in tr.warning()


def test_fractional_shares_can_be_skipped_and_strict_refuses_naming_the_line(tmp_path):
    p = pods(tmp_path)
    tr = read_trace(p, fractional="skip")
    assert tr.skipped["fractional"] == 1 and "p-half" not in {j.job_id for j in tr.jobs}
    with pytest.raises(TraceError, match="pods.csv line 4: num_gpus must be a whole number of at least 1, got 0"):
        read_trace(p, strict=True)
    ok = pods(tmp_path, "\n".join(PODS.splitlines()[:3]) + "\n")
    assert len(read_trace(ok, strict=True).jobs) == 2


def test_rows_without_a_duration_are_skipped_and_columns_can_be_mapped(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("id,t_sub,g,secs\na,0,1,60\nb,5,1,\nc,9,2,30\n")
    with pytest.raises(TraceError, match="lacks column.*submit_time_s.*num_gpus.*duration_s.*--columns"):
        read_trace(p)
    cols = parse_columns("submit=t_sub, gpus=g,duration=secs")
    tr = read_trace(p, columns=cols)
    assert [j.job_id for j in tr.jobs] == ["a", "c"] and tr.skipped == {"no_duration": 1}
    with pytest.raises(TraceError, match="no column 'nope'"):
        read_trace(p, columns={"submit": "nope", "gpus": "g", "duration": "secs"})
    with pytest.raises(TraceError, match="unknown field 'wait'"):
        parse_columns("wait=x")
    with pytest.raises(TraceError, match="field=header"):
        parse_columns("submit")


def test_aliases_find_helios_style_columns(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text("job_id,vc,gpu_num,submit_time,start_time,end_time,duration\n"
                 "1,vcA,8,100,110,710,600\n2,vcB,1,200,,,\n")
    tr = read_trace(p)
    assert [(j.job_id, j.gpus, j.duration_s, j.queue) for j in tr.jobs] == [("1", 8, 600.0, "vcA")]
    assert tr.skipped == {"never_ran": 1}


def test_a_trace_saved_by_excel_reads_as_any_other(tmp_path):
    """A byte-order mark before the header and CRLF line ends (Excel's "CSV UTF-8")."""
    p = tmp_path / "excel.csv"
    p.write_bytes(b"\xef\xbb\xbfjob_id,submit_time_s,num_gpus,duration_s\r\nj1,0,1,3600\r\nj2,10,8,60\r\n")
    assert [(j.job_id, j.gpus, j.duration_s) for j in read_trace(p).jobs] == [("j1", 1, 3600.0), ("j2", 8, 60.0)]


# Helios' job log (HeliosData README, cluster_log.csv): `queue` is the seconds the job waited,
# the original scheduler's outcome; times are naive "YYYY-MM-DD HH:MM:SS".
HELIOS_LOG = """job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue
1425511,uXBbc,vcJkd,1,1,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,2020-06-10 04:55:09,36848,0
1425512,uVMrF,vchbv,4,16,1,FAILED,2020-06-09 18:41:27,2020-06-09 19:41:27,2020-06-09 19:45:36,249,3600
1425513,uzqls,vcpDC,8,32,1,CANCELLED,2020-06-09 18:41:28,2020-06-09 20:41:28,2020-06-09 21:41:28,3600,7200
"""


def test_a_helios_job_log_gives_the_vc_and_never_the_wait_it_recorded(tmp_path):
    """The trace's `queue` column is how long each job waited under the original scheduler: it
    is neither the job's queue nor its class label, and never reaches the policy as a priority
    (a class with `min_priority` would otherwise take every job that waited long enough)."""
    from policies.classes import DEFAULT_CLASSES, JobClass, classify

    p = tmp_path / "cluster_log.csv"
    p.write_text(HELIOS_LOG)
    tr = read_trace(p)
    assert [(j.job_id, j.queue, j.job_class) for j in tr.jobs] == [
        ("1425511", "vcJkd", ""), ("1425512", "vchbv", ""), ("1425513", "vcpDC", "")]
    assert [j.duration_s for j in tr.jobs] == [36848.0, 249.0, 3600.0]
    assert tr.jobs[1].submit_s - tr.jobs[0].submit_s == 26.0  # naive times, read as UTC
    urgent = (*DEFAULT_CLASSES, JobClass("urgent", 600.0, min_priority=1000))
    assert {classify(urgent, j.job_class, "", j.queue).name for j in tr.jobs} == {"default"}
    # a `queue` column of names (a Kueue export) is still the queue and the class label
    p.write_text("job_id,queue,gpus,submit_time_s,duration_s\nj1,prod,8,0,600\nj2,team-a,1,5,60\n")
    tr = read_trace(p)
    assert [(j.queue, j.job_class) for j in tr.jobs] == [("prod", "prod"), ("team-a", "team-a")]
    assert [classify(urgent, j.job_class, "", j.queue).name for j in tr.jobs] == ["production", "default"]


def cli(*args):
    return runner.invoke(app, ["simulate", *map(str, args)])


def test_cli_counts_skips_in_json_warns_once_and_uses_the_lifetimes_beside_the_trace(tmp_path):
    cat = write_catalog(tmp_path / "catalog")
    trace = pods(tmp_path)
    spot = tmp_path / "data" / "spot"
    spot.mkdir()
    (spot / "spot_instance_lifetimes_aws_gcp_2020.csv").write_text(
        "cloud,observed_lifetime_s,ended_by\naws,900,preempted\ngcp,600,preempted\n")
    r = cli("--trace", trace, "--onprem-gpus", 8, "--catalog", cat, "--gpu-model", "V100", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["trace"]["skipped"] == {"no_gpus": 1, "never_ran": 1} and doc["trace"]["censored_jobs"] == 1
    assert doc["policies"]["onprem-only"]["jobs"] == 4
    assert doc["spot_lifetimes"].endswith("spot_instance_lifetimes_aws_gcp_2020.csv")
    warn = [ln for ln in r.stderr.splitlines() if "skipped" in ln]
    assert len(warn) == 1 and "pods.csv" in warn[0]
    assert "spot lifetimes: observed" in r.stderr
    r = cli("--trace", trace, "--onprem-gpus", 8, "--catalog", cat, "--gpu-model", "V100", "--format", "json",
            "--spot-lifetimes", "catalog")
    assert json.loads(r.stdout)["spot_lifetimes"] == "catalog" and "the catalog rates" in r.stderr
    r = cli("--trace", trace, "--onprem-gpus", 8, "--catalog", cat, "--gpu-model", "V100")
    assert r.exit_code == 0 and "spot preemptions: observed lifetimes (spot_instance_lifetimes" in r.stdout
    r = cli("--trace", trace, "--onprem-gpus", 8, "--catalog", cat, "--gpu-model", "V100", "--strict")
    assert r.exit_code == 2 and "line 4" in r.stderr and "Traceback" not in r.output
    r = cli("--trace", trace, "--onprem-gpus", 8, "--catalog", cat, "--gpu-model", "V100", "--fractional-gpus", "x")
    assert r.exit_code == 2 and "--fractional-gpus must be round-up or skip" in r.stderr


def test_the_observed_lifetimes_are_found_through_broker_shared_data_and_said(tmp_path, monkeypatch):
    cat = write_catalog(tmp_path / "catalog")
    trace = flood(tmp_path)  # no spot/ beside this one
    spot = tmp_path / "elsewhere" / "spot"
    spot.mkdir(parents=True)
    (spot / "spot_instance_lifetimes_aws_gcp_2020.csv").write_text(
        "cloud,observed_lifetime_s,ended_by\naws,900,preempted\ngcp,600,preempted\n")
    monkeypatch.setenv("BROKER_SHARED_DATA", str(tmp_path / "elsewhere"))
    r = cli("--trace", trace, "--onprem-gpus", "8,16", "--catalog", cat, "--gpu-model", "V100", "--jobs", 1,
            "--policy", "broker")
    assert r.exit_code == 0, r.output
    assert f"spot lifetimes: observed ({spot / 'spot_instance_lifetimes_aws_gcp_2020.csv'})" in r.stderr
    assert "spot preemptions: observed lifetimes (spot_instance_lifetimes_aws_gcp_2020.csv)" in r.stdout


def flood(tmp_path):
    p = tmp_path / "flood.csv"
    p.write_text("job_id,submit_time_s,num_gpus,duration_s\n"
                 + "".join(f"j{k},{k * 20},{1 + k % 4},{3600 + (k % 5) * 900}\n" for k in range(200)))
    return p


def test_a_sweep_replays_every_size_in_workers_with_one_table_one_plot_and_advise_reads_it(tmp_path):
    cat = write_catalog(tmp_path / "catalog")
    trace = flood(tmp_path)
    png = tmp_path / "sweep.png"
    base = ["--trace", trace, "--onprem-gpus", "8,16,32", "--catalog", cat, "--gpu-model", "V100",
            "--policy", "onprem-only", "--policy", "broker", "--jobs", 2, "--spot-lifetimes", "catalog"]
    r = cli(*base, "--format", "json", "--plot", png)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [s["onprem_gpus"] for s in doc["sizes"]] == [8, 16, 32]
    p95 = [s["policies"]["onprem-only"]["wait_p95_s"] for s in doc["sizes"]]
    assert p95[0] > p95[1] > p95[2]  # more GPUs, shorter waits
    cost = [s["policies"]["broker"]["cloud_cost_usd"] for s in doc["sizes"]]
    assert cost[0] > cost[2]
    assert png.read_bytes()[:4] == b"\x89PNG"
    # the same figures from one process
    one = json.loads(cli(*base[:-4], "--jobs", 1, "--spot-lifetimes", "catalog", "--format", "json").stdout)
    def figures(d):
        return [{n: {k: v for k, v in r.items() if not k.startswith("replay_jobs_per")}
                 for n, r in s["policies"].items()} for s in d["sizes"]]
    assert figures(one) == figures(doc)
    table = cli(*base)
    assert table.exit_code == 0 and "3 pool sizes" in table.stdout
    assert all(len(line) <= 80 for line in table.stdout.splitlines())
    path = tmp_path / "sweep.json"
    path.write_text(r.stdout)
    a = runner.invoke(app, ["advise", "--simulation", str(path), "--catalog", str(cat), "--gpu-model", "V100",
                            "--format", "json"])
    assert a.exit_code == 0, a.output
    adv = json.loads(a.stdout)
    assert [s["onprem_gpus"] for s in adv["sizes"]] == [8, 16, 32] and adv["policy"] == "broker"
    for s in adv["sizes"]:
        assert s["total_per_year_usd"] == pytest.approx(s["own_per_year_usd"] + s["cloud_per_year_usd"], abs=0.05)
    best = min(adv["sizes"], key=lambda s: s["total_per_year_usd"])
    assert adv["recommendation"] in ("build", "rent")
    if adv["recommendation"] == "build":
        assert adv["reason"].startswith(f"build {best['onprem_gpus']} GPUs")
    t = runner.invoke(app, ["advise", "--simulation", str(path), "--catalog", str(cat), "--gpu-model", "V100"])
    assert t.exit_code == 0 and "recommendation:" in t.stdout and "break-even" in t.stdout
    bad = runner.invoke(app, ["advise", "--simulation", str(path), "--catalog", str(cat), "--gpu-model", "V100",
                              "--sim-policy", "spot-greedy"])
    assert bad.exit_code == 2 and "has no policy 'spot-greedy'" in bad.stderr


@pytest.mark.parametrize("sizes,needle", [("8,abc", "whole numbers separated by commas"),
                                          ("8,12", "multiple of --gpus-per-node")])
def test_bad_sweep_sizes_exit_2(tmp_path, sizes, needle):
    cat = write_catalog(tmp_path / "catalog")
    r = cli("--trace", flood(tmp_path), "--onprem-gpus", sizes, "--catalog", cat, "--gpu-model", "V100")
    assert r.exit_code == 2 and needle in r.stderr


def broker(*args) -> subprocess.CompletedProcess:
    """The real command line, as a person runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "broker", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300, stdin=subprocess.DEVNULL)


def one_sentence(r: subprocess.CompletedProcess, words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr)
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("broker: "), r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("args,words", [
    (["--onprem-gpus", "256,,x"], "--onprem-gpus takes whole numbers separated by commas"),
    (["--onprem-gpus", "8,16", "--jobs", "0"], "--jobs must be positive, got 0"),
    (["--onprem-gpus", "80000000000"], "--onprem-gpus must be at most 1,000,000"),
    (["--onprem-gpus", "0", "--gpus-per-node", "99999"], "--gpus-per-node must be between 1 and 128"),
])
def test_careless_sweeps_through_the_command_line_are_one_sentence_and_exit_2(tmp_path, args, words):
    cat = write_catalog(tmp_path / "catalog")
    one_sentence(broker("simulate", "--trace", flood(tmp_path), "--catalog", cat, "--gpu-model", "V100", *args),
                 words)


SIM = {"trace": {"span_s": 86400.0, "gpu_hours": 500.0}, "onprem_gpus": 16,
       "policies": {"broker": {"onprem_utilization": 0.5, "cloud_cost_usd": 10.0, "wait_p95_s": 60.0}}}


@pytest.mark.parametrize("doc,words", [
    ({**SIM, "onprem_gpus": "x"}, "onprem_gpus must be a whole number at least 0"),
    ({**SIM, "onprem_gpus": 1e300}, "at most 1,000,000"),
    ({"trace": SIM["trace"], "sizes": [5]}, "every entry of \"sizes\" must be an object"),
    ({**SIM, "policies": {"broker": {"onprem_utilization": 0.5, "cloud_cost_usd": "abc"}}},
     "cloud_cost_usd must be a number at least 0, got 'abc'"),
    ({**SIM, "policies": {"broker": {"onprem_utilization": 0.5, "wait_p95_s": None}}},
     "wait_p95_s must be a number at least 0, got None"),
    ({**SIM, "trace": {"span_s": 1e-300, "gpu_hours": 1.0}}, "span_s must be at least 1 second"),
    ({**SIM, "trace": {"span_s": 86400.0, "gpu_hours": float("nan")}}, "gpu_hours must be a number"),
    ({"sizes": []}, "lacks the trace's span_s and gpu_hours"),
    ({**SIM, "trace": {"span_s": 1e308, "gpu_hours": 1.0}}, "span_s must be a number above 0 and at most 315,360,000"),
    ({**SIM, "policies": {"broker": {"onprem_utilization": True}}}, "has no valid onprem_utilization"),
])
def test_advise_reads_a_careless_simulation_file_as_one_sentence_and_exit_2(tmp_path, doc, words):
    cat = write_catalog(tmp_path / "catalog")
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    one_sentence(broker("advise", "--simulation", path, "--catalog", cat, "--gpu-model", "V100"), words)


def test_advise_from_simulate_names_the_file_when_its_pool_size_is_unusable(tmp_path):
    cat = write_catalog(tmp_path / "catalog")
    path = tmp_path / "sim.json"
    path.write_text(json.dumps({**SIM, "onprem_gpus": "16",
                                "policies": {"onprem-only": SIM["policies"]["broker"]}}))
    one_sentence(broker("advise", "--from-simulate", path, "--catalog", cat, "--gpu-model", "V100"),
                 "gives no positive whole onprem_gpus (got '16'); pass --gpus")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_piped_sweep_says_each_replay_on_stderr_as_it_finishes(tmp_path, workers):
    """Not on a terminal (a pipe, a log file): one progress line per (size, policy) replay on
    stderr, and stdout stays the JSON alone."""
    cat = write_catalog(tmp_path / "catalog")
    r = broker("simulate", "--trace", flood(tmp_path), "--onprem-gpus", "8,16", "--catalog", cat, "--gpu-model",
               "V100", "--jobs", workers, "--policy", "onprem-only", "--policy", "broker", "--spot-lifetimes",
               "catalog", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert [s["onprem_gpus"] for s in json.loads(r.stdout)["sizes"]] == [8, 16]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("broker: replayed ")]
    assert len(lines) == 4, r.stderr
    assert sorted(ln.split(" (")[0] for ln in lines) == sorted(
        f"broker: replayed {p} on {s} GPUs" for p in ("onprem-only", "broker") for s in (8, 16))
    assert [ln.split(" (")[1].split(",")[0] for ln in lines] == ["1/4", "2/4", "3/4", "4/4"]
    r = broker("simulate", "--trace", flood(tmp_path), "--onprem-gpus", "8", "--catalog", cat, "--gpu-model",
               "V100", "--policy", "onprem-only", "--policy", "broker", "--spot-lifetimes", "catalog")
    assert r.returncode == 0 and [ln.split(" (")[0] for ln in r.stderr.splitlines() if "replayed" in ln] == [
        "broker: replayed onprem-only on 8 GPUs", "broker: replayed broker on 8 GPUs"], r.stderr
