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


def test_eligibility_edges_and_full_reasons():
    from policies.classes import JobClass

    def why(job, wait=0.0, cfg=None, **kw):
        return eligibility(Candidate(job, wait, **kw), cfg or SelectionConfig())

    assert why(PendingJob("j", 1, est_runtime_s=1)) == "job j runs 1 s, under 1 cloud start-up(s) of 120 s"
    assert why(PendingJob("j", 1, est_runtime_s=120), 6) is None  # exactly one start-up; wait 5 % of it
    assert why(PendingJob("j", 1, est_runtime_s=60), 3, startup_s=30.0) is None  # the offer's own start-up
    cls = JobClass("batch", max_wait_s=600)
    assert why(PendingJob("j", 1), 600, job_class=cls) is None  # no runtime, at its class's target
    assert why(PendingJob("j", 1), 599, job_class=cls) == "job j has no runtime estimate"
    assert why(PendingJob("j", 1, est_runtime_s=60), 700, job_class=cls) is None  # short, but past its target
    assert why(PendingJob("j", 1, est_runtime_s=60), 100, job_class=cls) == (
        "job j runs 60 s, under 1 cloud start-up(s) of 120 s, and waits 100 s, under its class's 600 s target")
    assert why(PendingJob("j", 1, est_runtime_s=10_000), 0, job_class=cls) == (
        "job j is predicted to wait 0 s on-prem, under 0.05 of its 10000 s runtime")
    assert why(PendingJob("j", 1, est_runtime_s=1000), 50) is None  # exactly 5 % of its runtime
    assert why(PendingJob("j", 1, est_runtime_s=1000), 60, price_ratio=2.0) is None  # the share is capped at 5 %
    data = SelectionConfig(max_data_gb=10)
    assert why(PendingJob("j", 1, est_runtime_s=1000, data_gb=10), 60, data) is None
    assert why(PendingJob("j", 1, est_runtime_s=1000, data_gb=10.5), 60, data) == (
        "job j reads 10.5 GB, over the 10 GB limit")


def test_an_unknown_kind_ranks_with_training():
    render = PendingJob("u", 1, kind="render", est_runtime_s=60)
    train = PendingJob("t", 1, kind="training", est_runtime_s=600)
    assert rank([train, render]) == [render, train]
    assert rank([PendingJob("t", 1, kind="training", est_runtime_s=60),
                 PendingJob("u", 1, kind="render", est_runtime_s=600)])[0].job_id == "t"


def test_select_spends_the_gpu_limit_and_uses_the_config_given():
    def c(name, gpus, **kw):
        return Candidate(PendingJob(name, gpus, est_runtime_s=3600, **kw), 3600)

    chosen, kept = select([c("a", 4), c("b", 4), c("c", 4)], max_gpus=10)
    assert [x.job.job_id for x in chosen] == ["a", "b"]
    assert [(x.job.job_id, w) for x, w in kept] == [("c", "job c needs 4 GPUs, only 2 left under the burst limits")]
    chosen, kept = select([c("a", 8), c("b", 8)], max_gpus=8)
    assert [x.job.job_id for x in chosen] == ["a"] and kept[0][1] == "job b needs 8 GPUs, only 0 left under the burst limits"
    chosen, kept = select([c("a", 8, data_gb=50)], SelectionConfig(max_data_gb=10))
    assert chosen == [] and kept[0][1] == "job a reads 50 GB, over the 10 GB limit"
