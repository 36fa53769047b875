"""Which jobs go out first, and which never should."""
from policies.queue import PendingJob
from policies.selection import Candidate, SelectionConfig, eligibility, rank, rank_key, select


def job(jid, gpus=1, runtime=3600, waited=0, **kw):
    return PendingJob(job_id=jid, gpus=gpus, est_runtime_s=runtime, waited_s=waited, **kw)


def test_short_predicted_wait_relative_to_runtime_stays_home():
    cfg = SelectionConfig(min_wait_share=0.25, startup_s=120)
    why = eligibility(Candidate(job("a", runtime=36000), predicted_wait_s=600), cfg)
    assert why and "predicted to wait 600 s" in why
    assert eligibility(Candidate(job("a", runtime=36000), predicted_wait_s=10000), cfg) is None
    # What it already waited counts even when the prediction is low.
    assert eligibility(Candidate(job("a", runtime=36000, waited=9500), predicted_wait_s=0), cfg) is None


def test_the_bar_scales_with_the_price_the_job_would_pay():
    cfg = SelectionConfig(min_wait_share=0.3, startup_s=60)
    c_od = Candidate(job("a", runtime=10000), predicted_wait_s=1500, price_ratio=1.0)
    c_spot = Candidate(job("a", runtime=10000), predicted_wait_s=1500, price_ratio=0.3)
    assert eligibility(c_od, cfg) is not None  # 1500 < 3000
    assert eligibility(c_spot, cfg) is None  # 1500 >= 900


def test_too_short_for_a_start_up_and_too_much_data_stay_home():
    cfg = SelectionConfig(startup_s=180, min_runtime_startups=4, max_data_gb=500)
    why = eligibility(Candidate(job("s", runtime=600), predicted_wait_s=1e6), cfg)
    assert why and "under 4 cloud start-up(s)" in why
    why = eligibility(Candidate(job("d", runtime=7200, data_gb=800), predicted_wait_s=1e6), cfg)
    assert why and "800 GB" in why
    assert "no runtime" in eligibility(Candidate(job("z", runtime=0), predicted_wait_s=1e6), cfg)


def test_a_job_too_short_for_a_start_up_goes_once_its_wait_passes_its_class_target():
    from policies.classes import JobClass

    cfg = SelectionConfig(startup_s=180, min_runtime_startups=1)
    prod = JobClass("production", 1800.0)
    short = job("s", gpus=8, runtime=120)
    why = eligibility(Candidate(short, predicted_wait_s=1799, job_class=prod), cfg)
    assert why and "under 1 cloud start-up(s) of 180 s" in why and "class's 1800 s target" in why
    assert eligibility(Candidate(short, predicted_wait_s=1800, job_class=prod), cfg) is None
    # what it already waited counts as well as the prediction
    assert eligibility(Candidate(job("s", runtime=120, waited=2000), predicted_wait_s=0, job_class=prod), cfg) is None
    # no class target (or none known): the start-up bar holds whatever the wait
    assert eligibility(Candidate(short, predicted_wait_s=1e9, job_class=JobClass("batch")), cfg) is not None
    assert eligibility(Candidate(short, predicted_wait_s=1e9), cfg) is not None
    # a class that never bursts stays home
    assert eligibility(Candidate(short, predicted_wait_s=1e9, job_class=JobClass("p", 60.0, burst=False)), cfg)


def test_rank_interruptible_then_kind_then_short_then_data_light():
    jobs = [
        job("train-long", runtime=90000),
        job("train-short", runtime=1000),
        job("eval", runtime=5000, kind="eval"),
        job("ckpt-long", runtime=90000, interruptible=True),
        job("ckpt-heavy", runtime=90000, interruptible=True, data_gb=100),
        job("infer", runtime=5000, kind="inference"),
    ]
    assert [j.job_id for j in rank(jobs)] == [
        "ckpt-long", "ckpt-heavy", "infer", "eval", "train-short", "train-long"]
    assert rank_key(job("x", waited=50)) < rank_key(job("x", waited=10))  # older first on ties


def test_select_respects_the_gpu_budget_and_lets_smaller_jobs_through():
    cfg = SelectionConfig(min_wait_share=0.0, startup_s=60)
    cands = [Candidate(job("big", gpus=16, interruptible=True), 1e5),
             Candidate(job("small", gpus=4), 1e5),
             Candidate(job("tiny", gpus=1, runtime=30), 1e5)]
    chosen, kept = select(cands, cfg, max_gpus=8)
    assert [c.job.job_id for c in chosen] == ["small"]
    reasons = {c.job.job_id: why for c, why in kept}
    assert "only 8 left" in reasons["big"]
    assert "start-up" in reasons["tiny"]
