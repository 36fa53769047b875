"""`broker advise`: build vs rent from a number, a simulation or Slurm accounting."""
import json

import pytest
from typer.testing import CliRunner

from broker.cli import app
from tests.test_simulate import write_catalog, write_trace
from tests.test_tco import SACCT

runner = CliRunner()


@pytest.fixture
def cat(tmp_path):
    return write_catalog(tmp_path / "catalog")


def adv(cat, *args):
    return runner.invoke(app, ["advise", "--catalog", str(cat), "--gpu-model", "A100", *map(str, args)])


def test_given_utilisation_json(cat):
    r = adv(cat, "--gpus", 64, "--utilization", "85%", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["utilization"] == 0.85 and d["recommendation"] == "build"
    # The cheapest A100 offers of the fixture catalog, per GPU-hour.
    assert d["cloud"]["on_demand"]["usd_per_gpu_hour"] == pytest.approx(27.20 / 8)
    assert d["cloud"]["on_demand"]["provider"] == "azure"
    assert d["cloud"]["committed_1y"]["usd_per_gpu_hour"] == pytest.approx(17.34 / 8)
    assert set(d["cost_usd"]) == {"build", "rent_on_demand", "rent_committed_1y", "hybrid"}
    assert d["utilization_source"] == "given"
    # "70%" and "0.7" mean the same
    a = json.loads(adv(cat, "--gpus", 64, "--utilization", "70%", "--format", "json").stdout)
    b = json.loads(adv(cat, "--gpus", 64, "--utilization", "0.7", "--format", "json").stdout)
    assert a["utilization"] == b["utilization"] == 0.7


def test_low_utilisation_rents_and_the_table_gives_the_numbers(cat):
    r = adv(cat, "--gpus", 64, "--utilization", "0.2")
    assert r.exit_code == 0, r.output
    assert "recommendation: rent" in r.stdout and "Rule of thumb" in r.stdout
    assert "break-even" in r.stdout and "capex amortised" in r.stdout and "3 years" in r.stdout


def test_from_simulate_reads_the_onprem_utilisation(cat, tmp_path):
    trace = write_trace(tmp_path / "t.csv", [(f"j{k}", k * 600, 8, 3000) for k in range(40)])
    sim = runner.invoke(app, ["simulate", "--trace", str(trace), "--onprem-gpus", "16", "--catalog", str(cat),
                              "--gpu-model", "A100", "--policy", "onprem-only", "--format", "json"])
    assert sim.exit_code == 0, sim.output
    path = tmp_path / "sim.json"
    path.write_text(sim.stdout)
    want = json.loads(sim.stdout)["policies"]["onprem-only"]["onprem_utilization"]
    r = adv(cat, "--from-simulate", path, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["utilization"] == pytest.approx(want, abs=1e-4) and d["gpus"] == 16
    assert "simulated" in d["utilization_source"]
    r = adv(cat, "--from-simulate", path, "--sim-policy", "broker")
    assert r.exit_code == 2 and "has no policy 'broker'" in r.output


def test_from_sacct(cat, tmp_path):
    p = tmp_path / "acct.txt"
    p.write_text(SACCT)
    r = adv(cat, "--sacct", p, "--gpus", 16, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    gpu_s = 8 * 12 * 3600 + 2 * 24 * 3600 + 4 * 2 * 3600
    assert d["utilization"] == pytest.approx(gpu_s / (16 * 48 * 3600), abs=1e-4)
    assert "4 jobs" in d["utilization_source"]


def test_plot_is_a_png(cat, tmp_path):
    png = tmp_path / "tco.png"
    r = adv(cat, "--gpus", 64, "--utilization", "0.55", "--plot", png)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000


@pytest.mark.parametrize("args,needle", [
    ([], "exactly one way"),
    (["--gpus", 8, "--utilization", "0.5", "--sacct", "x.txt"], "exactly one way"),
    (["--gpus", 8, "--utilization", "lots"], "must be a number"),
    (["--gpus", 8, "--utilization", "150%"], "between 0 and 1"),
    (["--gpus", 8, "--utilization", "2"], "between 0 and 1, or 0% and 100% with the % sign"),
    (["--gpus", 8, "--utilization", "1.5"], "between 0 and 1, or 0% and 100% with the % sign"),
    (["--gpus", 8, "--utilization", "70"], "between 0 and 1, or 0% and 100% with the % sign"),
    (["--gpus", 0, "--utilization", "0.5"], "--gpus must be a positive"),
    (["--utilization", "0.5"], "--gpus must be a positive"),
    (["--gpus", 8, "--utilization", "0.5", "--format", "yaml"], "--format"),
    (["--gpus", 8, "--utilization", "0.5", "--pue", "0.5"], "PUE"),
    (["--gpus", 8, "--utilization", "0.5", "--plot", "x.svg"], "PNG"),
])
def test_bad_input_exits_2(cat, args, needle):
    r = adv(cat, *args)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_bad_files_exit_2_naming_the_problem(cat, tmp_path):
    r = runner.invoke(app, ["advise", "--catalog", str(cat), "--gpu-model", "H100", "--gpus", "8",
                            "--utilization", "0.5"])
    assert r.exit_code == 2 and "sells no H100" in r.output
    p = tmp_path / "acct.txt"
    p.write_text(SACCT.replace("12:00:00|2026-03-01T00:00:00", "12h|2026-03-01T00:00:00", 1))
    r = adv(cat, "--sacct", p, "--gpus", 16)
    assert r.exit_code == 2 and "line 2" in r.output
    r = adv(cat, "--sacct", p)
    assert r.exit_code == 2 and "--sacct needs --gpus" in r.output
    j = tmp_path / "sim.json"
    j.write_text("not json")
    r = adv(cat, "--from-simulate", j)
    assert r.exit_code == 2 and "is not JSON" in r.output
    r = adv(cat, "--from-simulate", tmp_path / "missing.json")
    assert r.exit_code == 2 and "cannot read" in r.output


def _sweep(cat, tmp_path, model="A100"):
    trace = write_trace(tmp_path / "t.csv", [(f"j{k}", k * 300, 8, 6000) for k in range(60)])
    sim = runner.invoke(app, ["simulate", "--trace", str(trace), "--onprem-gpus", "8,16", "--catalog", str(cat),
                              "--gpu-model", model, "--jobs", "1", "--spot-lifetimes", "catalog", "--format", "json"])
    assert sim.exit_code == 0, sim.output
    path = tmp_path / "sweep.json"
    path.write_text(sim.stdout)
    return path


def test_advise_simulation_prices_the_simulated_model_and_refuses_another(cat, tmp_path):
    path = _sweep(cat, tmp_path)
    doc = json.loads(path.read_text())
    assert doc["gpu_model"] == "A100" and doc["gpu_prices"]["on_demand"]["usd_per_gpu_hour"] > 0
    assert doc["catalog_as_of"].endswith("T00:00:00Z")
    base = ["advise", "--simulation", str(path), "--catalog", str(cat), "--format", "json"]
    plain = runner.invoke(app, base)
    same = runner.invoke(app, [*base, "--gpu-model", "a100"])
    assert plain.exit_code == 0 and same.exit_code == 0, (plain.output, same.output)
    a, b = json.loads(plain.stdout), json.loads(same.stdout)
    assert a == b and a["gpu_model"] == "A100" and a["owning"]["server_capex_usd"] == 199000
    assert a["cloud_prices"]["on_demand"]["usd_per_gpu_hour"] == doc["gpu_prices"]["on_demand"]["usd_per_gpu_hour"]
    other = runner.invoke(app, [*base, "--gpu-model", "V100"])
    assert other.exit_code == 2 and "contradicts sweep.json" in other.stderr and "A100" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1


def test_owning_costs_what_the_model_costs(cat):
    a = json.loads(runner.invoke(app, ["advise", "--catalog", str(cat), "--gpu-model", "A100", "--gpus", "64",
                                       "--utilization", "0.5", "--format", "json"]).stdout)
    v = json.loads(runner.invoke(app, ["advise", "--catalog", str(cat), "--gpu-model", "V100", "--gpus", "64",
                                       "--utilization", "0.5", "--format", "json"]).stdout)
    assert a["owning"]["server_capex_usd"] == 199000 and v["owning"]["server_capex_usd"] == 149000
    assert a["owning"]["source"].startswith("NVIDIA DGX A100") and a["owning"]["as_of"] == "2020-05-14T00:00:00Z"
    assert a["onprem_per_year_usd"] > v["onprem_per_year_usd"]


def test_a_model_with_no_server_price_needs_one(cat):
    (cat / "capex.csv").write_text("gpu_model,gpus_per_server,server_capex_usd,kw_per_server,as_of,source\n"
                                   "V100,8,149000,3.5,2017-05-10,test\n")
    r = runner.invoke(app, ["advise", "--catalog", str(cat), "--gpu-model", "A100", "--gpus", "64",
                            "--utilization", "0.5"])
    assert r.exit_code == 2 and "no server price for A100" in r.stderr and "--server-capex" in r.stderr
    r = runner.invoke(app, ["advise", "--catalog", str(cat), "--gpu-model", "A100", "--gpus", "64",
                            "--utilization", "0.5", "--server-capex", "150000", "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["owning"]["source"] == "--server-capex"


def test_advise_simulation_plot_is_written(cat, tmp_path):
    path = _sweep(cat, tmp_path)
    png = tmp_path / "sizes.png"
    r = runner.invoke(app, ["advise", "--simulation", str(path), "--catalog", str(cat), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:4] == b"\x89PNG"
