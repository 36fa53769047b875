"""The Lambda Cloud provider, driven through httpx against the fake Lambda Cloud API on loopback."""
from __future__ import annotations

import logging

import httpx
import pytest
import structlog
import structlog.testing

from providers import registry
from providers.base import (
    LABEL_LEASE,
    LABEL_OWNER,
    AuthError,
    CapacityError,
    InstanceState,
    InstanceType,
    InvalidRequestError,
    LaunchSpec,
    Market,
    Provider,
    QuotaError,
    Scope,
    StopReason,
    ThrottledError,
    TransientError,
)
from providers.lambda_cloud import ApiKey, LambdaClient, LambdaProvider, classify
from providers.lambda_cloud.provider import TAG_NODE
from providers.registry import provider_settings
from providers.settings import SettingsError
from tests.clouds.lambda_cloud import API_KEY, FakeLambdaCloud, fake_lambda  # noqa: F401  (fixture)

OWNER = "broker-test"
REGION = "us-east-1"
H100X8 = InstanceType("lambda", "gpu_8x_h100_sxm5", "H100", 8, 80, 208, 1800, "ethernet", 100)
BOOT = "#!/bin/bash\nset -euo pipefail\necho 'join token: s3cr3t' > /etc/broker-token\n"


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMBDA_API_KEY", API_KEY)
    monkeypatch.delenv("LAMBDA_API_ENDPOINT", raising=False)


@pytest.fixture
def lam(fake_lambda: FakeLambdaCloud, key_env: None) -> LambdaProvider:
    return LambdaProvider.from_config(fake_lambda.provider_settings(), owner=OWNER)


def spec(lease: str = "lease-1", *, count: int = 1, region: str = REGION, market: Market = Market.ON_DEMAND,
         names: tuple[str, ...] | None = None) -> LaunchSpec:
    return LaunchSpec(lease_id=lease, provider="lambda", region=region, zone="", instance=H100X8, market=market,
                      count=count, client_token=f"tok-{lease}",
                      node_names=names or tuple(f"{lease}-n{i}" for i in range(count)), boot_script=BOOT)


def tags(inst: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in inst["tags"]}


# ---------------------------------------------------------------------------------------------
# launch, list, terminate


def test_is_a_provider_built_by_the_registry(fake_lambda: FakeLambdaCloud, key_env: None) -> None:
    p = registry.build("lambda", fake_lambda.provider_settings(), owner=OWNER)
    assert isinstance(p, LambdaProvider) and isinstance(p, Provider)
    assert p.name == "lambda"


def test_launch_two_nodes_tags_them_and_release_terminates_them(lam: LambdaProvider,
                                                                 fake_lambda: FakeLambdaCloud) -> None:
    got = lam.launch(spec(count=2))
    assert [i.node_name for i in got] == ["lease-1-n0", "lease-1-n1"]
    assert all(i.provider == "lambda" and i.region == REGION and i.market is Market.ON_DEMAND for i in got)
    assert all(i.instance_type == "gpu_8x_h100_sxm5" and i.lease_id == "lease-1" for i in got)
    launches = fake_lambda.launch_calls()
    assert len(launches) == 2  # one instance per launch call
    body = launches[0].body
    assert body["region_name"] == REGION and body["instance_type_name"] == "gpu_8x_h100_sxm5"
    assert body["ssh_key_names"] == ["broker"] and body["hostname"] == "lease-1-n0"
    assert body["user_data"] == BOOT
    alive = fake_lambda.instances()
    assert {tags(i)[LABEL_LEASE] for i in alive} == {"lease-1"}
    assert {tags(i)[LABEL_OWNER] for i in alive} == {OWNER}
    assert {tags(i)[TAG_NODE] for i in alive} == {"lease-1-n0", "lease-1-n1"}
    assert {i.instance_id for i in lam.describe("lease-1", REGION)} == {i.instance_id for i in got}
    assert lam.describe("lease-1", "us-west-1") == []
    lam.terminate(got)
    assert fake_lambda.instances() == []
    assert lam.describe("lease-1", REGION) == []


def test_booting_then_active(lam: LambdaProvider) -> None:
    got = lam.launch(spec())
    states = {i.state for i in got} | {i.state for i in lam.describe("lease-1", REGION)}
    assert InstanceState.RUNNING in states
    assert lam.describe("lease-1", REGION)[0].state is InstanceState.RUNNING


def test_list_managed_sees_only_this_owner(lam: LambdaProvider, fake_lambda: FakeLambdaCloud) -> None:
    lam.launch(spec("mine"))
    fake_lambda.seed_instance(REGION, "gpu_1x_a10", tags={LABEL_OWNER: "someone-else", LABEL_LEASE: "theirs"})
    fake_lambda.seed_instance(REGION, "gpu_1x_a10")  # untagged: made by hand in the dashboard
    assert [i.lease_id for i in lam.list_managed()] == ["mine"]
    assert lam.list_managed(["us-west-1"]) == []


@pytest.mark.parametrize("garble", [
    {"instance_type": 42},                       # a field of another type
    {"region": "us-east-1"},                     # an object become a string
    {"status": None, "ip": ["10.0.0.1"]},        # nulls and lists where strings were
])
def test_one_unreadable_instance_record_never_hides_the_others(lam: LambdaProvider, fake_lambda: FakeLambdaCloud,
                                                               garble: dict) -> None:
    lam.launch(spec("good"))
    (bad,) = lam.launch(spec("bad"))
    fake_lambda._instances[bad.instance_id].update(garble)  # the API's answer for this one changed shape
    with structlog.testing.capture_logs() as logs:
        listed = {i.lease_id: i for i in lam.list_managed()}
    assert set(listed) == {"good", "bad"}  # both still listed, the readable one unchanged
    assert listed["good"].problem == "" and listed["good"].state is InstanceState.RUNNING
    assert listed["bad"].instance_id == bad.instance_id and bad.instance_id in listed["bad"].problem
    assert any(e["event"] == "lambda.instance.unreadable" for e in logs)


def test_a_record_without_an_id_is_left_out_and_the_rest_listed(lam: LambdaProvider,
                                                               fake_lambda: FakeLambdaCloud) -> None:
    lam.launch(spec("good"))
    (bad,) = lam.launch(spec("bad"))
    fake_lambda._instances[bad.instance_id]["id"] = None
    assert [i.lease_id for i in lam.list_managed()] == ["good"]


def test_retry_after_a_crash_adopts_the_nodes_already_launched(lam: LambdaProvider,
                                                               fake_lambda: FakeLambdaCloud) -> None:
    first = lam.launch(spec(count=1, names=("lease-1-n0",)))
    again = lam.launch(spec(count=2))
    assert again[0].instance_id == first[0].instance_id
    assert len(fake_lambda.launch_calls()) == 2 and len(fake_lambda.instances()) == 2


def test_terminate_an_instance_already_gone_is_fine(lam: LambdaProvider, fake_lambda: FakeLambdaCloud) -> None:
    got = lam.launch(spec(count=2))
    fake_lambda.kill(got[0].instance_id)
    gone = got[0].__class__(**{**{f: getattr(got[0], f) for f in got[0].__slots__}, "instance_id": "0" * 32})
    lam.terminate([gone, got[1]])
    assert fake_lambda.instances() == []


def test_an_instance_terminated_outside_the_broker_is_reported_gone(lam: LambdaProvider,
                                                                   fake_lambda: FakeLambdaCloud) -> None:
    got = lam.launch(spec(count=2))
    fake_lambda.kill(got[1].instance_id)
    assert [i.instance_id for i in lam.describe("lease-1", REGION)] == [got[0].instance_id]


# ---------------------------------------------------------------------------------------------
# all or nothing, and the errors


def test_capacity_on_the_second_node_rolls_the_first_back(lam: LambdaProvider, fake_lambda: FakeLambdaCloud) -> None:
    fake_lambda.set_capacity("gpu_8x_h100_sxm5", REGION, 1)
    with pytest.raises(CapacityError) as e:
        lam.launch(spec(count=2))
    assert e.value.code == "instance-operations/launch/insufficient-capacity"
    assert e.value.scope is Scope.OFFER and not e.value.retryable
    assert fake_lambda.instances() == []
    assert fake_lambda.capacity("gpu_8x_h100_sxm5", REGION) == 1  # given back


def test_quota_exceeded_is_a_quota_error_for_the_whole_account(lam: LambdaProvider,
                                                                fake_lambda: FakeLambdaCloud) -> None:
    fake_lambda.quota = 1
    with pytest.raises(QuotaError) as e:
        lam.launch(spec(count=2))
    assert e.value.code == "global/quota-exceeded" and e.value.scope is Scope.CLOUD
    assert fake_lambda.instances() == []


@pytest.mark.parametrize("kind, error, code", [
    ("capacity", CapacityError, "instance-operations/launch/insufficient-capacity"),
    ("quota", QuotaError, "global/quota-exceeded"),
    ("auth", AuthError, "global/invalid-api-key"),
    ("forbidden", AuthError, "global/account-inactive"),
])
def test_launch_faults_map_to_typed_errors_and_leave_nothing(lam: LambdaProvider, fake_lambda: FakeLambdaCloud,
                                                            kind: str, error: type, code: str) -> None:
    fake_lambda.inject(kind, times=1, match="launch")
    with pytest.raises(error) as e:
        lam.launch(spec())
    assert e.value.code == code and e.value.provider == "lambda"
    assert fake_lambda.instances() == []


@pytest.mark.parametrize("kind", ["throttle", "ratelimit", "5xx", "html", "garbage"])
def test_a_transient_answer_to_a_read_is_retried(lam: LambdaProvider, fake_lambda: FakeLambdaCloud, kind: str) -> None:
    lam.launch(spec())
    fake_lambda.inject(kind, times=1, match="GET /api/v1/instances")
    assert len(lam.describe("lease-1", REGION)) == 1


@pytest.mark.parametrize("kind, error", [("throttle", ThrottledError), ("ratelimit", ThrottledError),
                                         ("5xx", TransientError), ("html", TransientError),
                                         ("garbage", TransientError)])
def test_transient_answers_beyond_the_retries_are_retryable_errors(lam: LambdaProvider,
                                                                   fake_lambda: FakeLambdaCloud,
                                                                   kind: str, error: type) -> None:
    fake_lambda.inject(kind, times=5, match="GET /api/v1/instances")
    with pytest.raises(error) as e:
        lam.list_managed()
    assert e.value.retryable


def test_a_429_launch_is_retried_but_a_5xx_launch_is_not(lam: LambdaProvider, fake_lambda: FakeLambdaCloud) -> None:
    fake_lambda.inject("throttle", times=1, match="launch")
    assert len(lam.launch(spec("a"))) == 1
    fake_lambda.inject("5xx", times=1, match="launch")
    with pytest.raises(TransientError):
        lam.launch(spec("b"))
    assert sum(1 for c in fake_lambda.launch_calls() if c.fault == "5xx") == 1
    assert [tags(i)[LABEL_LEASE] for i in fake_lambda.instances()] == ["a"]


@pytest.mark.parametrize("bad, code", [
    (dict(market=Market.SPOT), "MARKET_NOT_SOLD"),
    (dict(market=Market.RESERVED), "MARKET_NOT_SOLD"),
    (dict(names=("Not_A_Hostname",)), "INVALID_NAME"),
])
def test_bad_specs_are_refused_before_any_call(lam: LambdaProvider, fake_lambda: FakeLambdaCloud, bad: dict,
                                               code: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        lam.launch(spec(**bad))
    assert e.value.code == code
    assert fake_lambda.calls == []


def test_an_unknown_ssh_key_is_an_invalid_request(fake_lambda: FakeLambdaCloud, key_env: None) -> None:
    p = LambdaProvider.from_config(fake_lambda.provider_settings(ssh_key_name="nobody"), owner=OWNER)
    with pytest.raises(InvalidRequestError) as e:
        p.launch(spec())
    assert e.value.code == "global/object-does-not-exist"


@pytest.mark.parametrize("status, code, error, scope", [
    (400, "instance-operations/launch/insufficient-capacity", CapacityError, Scope.OFFER),
    (400, "global/quota-exceeded", QuotaError, Scope.CLOUD),
    (401, "global/invalid-api-key", AuthError, Scope.CLOUD),
    (403, "global/account-inactive", AuthError, Scope.CLOUD),
    (403, "global/invalid-address", AuthError, Scope.CLOUD),
    (400, "global/invalid-parameters", InvalidRequestError, Scope.OFFER),
    (404, "global/object-does-not-exist", InvalidRequestError, Scope.OFFER),
    (429, "", ThrottledError, Scope.CLOUD),
    (503, "provider/internal-unavailable", TransientError, Scope.REGION),
    (500, "global/unknown", TransientError, Scope.REGION),
])
def test_classify(status: int, code: str, error: type, scope: Scope) -> None:
    e = classify(status, code, "m", region=REGION)
    assert type(e) is error and e.scope is scope


# ---------------------------------------------------------------------------------------------
# the API key


def test_the_key_comes_from_the_file_or_the_environment(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    s = provider_settings("lambda", {"ssh_key_name": "k"})
    with pytest.raises(SettingsError, match="LAMBDA_API_KEY"):
        ApiKey.load(s)
    monkeypatch.setenv("LAMBDA_API_KEY", "from-env")
    assert ApiKey.load(s).reveal() == "from-env"
    f = tmp_path / "key"
    f.write_text("from-file\n")
    assert ApiKey.load(provider_settings("lambda", {"ssh_key_name": "k", "api_key_file": str(f)})).reveal() == "from-file"
    with pytest.raises(SettingsError, match="api_key_file"):
        ApiKey.load(provider_settings("lambda", {"ssh_key_name": "k", "api_key_file": str(tmp_path / "none")}))


@pytest.mark.timeout(30)  # a FIFO opened for reading would block for ever
def test_a_key_file_that_is_a_device_a_fifo_or_huge_is_refused_at_once(tmp_path) -> None:
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge"
    huge.write_bytes(b"k" * (16 * 1024 * 1024 + 1))
    for path, words in (("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
                        (str(huge), "larger than 16 MiB")):
        with pytest.raises(SettingsError, match=f"providers.lambda.api_key_file cannot be read .*{words}"):
            ApiKey.load(provider_settings("lambda", {"ssh_key_name": "k", "api_key_file": path}))


def test_a_wrong_key_is_an_auth_error(fake_lambda: FakeLambdaCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMBDA_API_KEY", "secret_wrong.key")
    p = LambdaProvider.from_config(fake_lambda.provider_settings(), owner=OWNER)
    with pytest.raises(AuthError) as e:
        p.list_managed()
    assert e.value.code == "global/invalid-api-key"


def test_basic_auth_as_documented_for_curl_is_accepted_by_the_fake(fake_lambda: FakeLambdaCloud) -> None:
    r = httpx.get(f"{fake_lambda.url}/api/v1/instances", auth=(API_KEY, ""))
    assert r.status_code == 200 and r.json() == {"data": []}
    assert httpx.get(f"{fake_lambda.url}/api/v1/instances").json()["error"]["code"] == "global/invalid-api-key"


def test_the_key_never_shows_in_repr_errors_or_logs(fake_lambda: FakeLambdaCloud, key_env: None,
                                                     caplog: pytest.LogCaptureFixture, capsys) -> None:
    caplog.set_level(logging.DEBUG)  # httpx and httpcore log each request at DEBUG
    with structlog.testing.capture_logs() as events:
        p = LambdaProvider.from_config(fake_lambda.provider_settings(), owner=OWNER)
        fake_lambda.inject("throttle", times=1, match="GET")
        p.list_managed()
        fake_lambda.inject("auth", times=1, match="launch")
        with pytest.raises(AuthError) as e:
            p.launch(spec())
    out, err = capsys.readouterr()
    texts = [repr(p), str(p), repr(p.client), repr(ApiKey(API_KEY)), str(ApiKey(API_KEY)), str(e.value),
             repr(e.value), caplog.text, repr(events), out, err]
    assert events and caplog.text, "nothing was logged: the check would prove nothing"
    for text in texts:
        assert API_KEY not in text
        assert API_KEY.split(".")[-1] not in text


# ---------------------------------------------------------------------------------------------
# settings


@pytest.mark.parametrize("table, key", [
    ({"enabled": True}, "ssh_key_name"),
    ({"endpoint": "http://api.example.com"}, "endpoint"),
    ({"endpoint": "https://cloud.lambda.ai/api/v1"}, "endpoint"),
    ({"regions": ["US East"]}, "regions"),
    ({"api_key": "x"}, "api_key"),
])
def test_bad_settings_name_the_key(table: dict, key: str) -> None:
    with pytest.raises(SettingsError) as e:
        provider_settings("lambda", {"ssh_key_name": "k", **table} if "enabled" not in table else table)
    assert f"providers.lambda.{key}" in str(e.value)


def test_the_endpoint_comes_from_the_environment_when_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    s = provider_settings("lambda", {"ssh_key_name": "k"})
    monkeypatch.setenv("LAMBDA_API_ENDPOINT", "http://127.0.0.1:9")
    assert LambdaClient(s, ApiKey("k")).endpoint == "http://127.0.0.1:9"
    monkeypatch.delenv("LAMBDA_API_ENDPOINT")
    assert LambdaClient(s, ApiKey("k")).endpoint == "https://cloud.lambda.ai"
    assert LambdaClient(provider_settings("lambda", {"ssh_key_name": "k", "endpoint": "http://127.0.0.1:8"}),
                        ApiKey("k")).endpoint == "http://127.0.0.1:8"


def test_an_unreachable_endpoint_is_a_transient_error(monkeypatch: pytest.MonkeyPatch) -> None:
    s = provider_settings("lambda", {"ssh_key_name": "k", "endpoint": "http://127.0.0.1:9", "retries": 0})
    p = LambdaProvider(s, OWNER, LambdaClient(s, ApiKey("k")))
    with pytest.raises(TransientError) as e:
        p.list_managed()
    assert e.value.code == "CONNECTION_ERROR"


def test_stop_reason_of_a_terminated_instance_is_user(lam: LambdaProvider, fake_lambda: FakeLambdaCloud) -> None:
    from providers.lambda_cloud.client import RemoteInstance
    from providers.lambda_cloud.provider import _to_instance

    i = _to_instance(RemoteInstance(id="x", status="terminated"))
    assert i.state is InstanceState.TERMINATED and i.stop_reason is StopReason.USER


def test_node_names_are_checked_as_lambda_hostnames_before_a_lease_is_made() -> None:
    from providers.registry import node_name_problem

    assert node_name_problem("lambda", "train-node-0") == ""
    for bad in ("Train_Node", "-leading-hyphen", "x" * 64, ""):
        assert node_name_problem("lambda", bad), bad


def test_a_node_not_listed_yet_after_its_launch_is_read_by_id(lam: LambdaProvider, fake_lambda: FakeLambdaCloud,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real = lam.client.instances
    calls = {"n": 0}

    def lagging():  # the listing right after the launch does not show the new instance yet
        calls["n"] += 1
        return [] if calls["n"] == 2 else real()

    monkeypatch.setattr(lam.client, "instances", lagging)
    got = lam.launch(spec())
    assert [i.node_name for i in got] == ["lease-1-n0"] and len(fake_lambda.instances()) == 1
    assert any(c.path.startswith("/api/v1/instances/") for c in fake_lambda.calls)


def test_launches_are_paced_by_launch_interval(fake_lambda: FakeLambdaCloud, key_env: None) -> None:
    import time

    p = LambdaProvider.from_config(fake_lambda.provider_settings(launch_interval_s=0.5), owner=OWNER)
    t0 = time.monotonic()
    p.launch(spec(count=3))
    assert time.monotonic() - t0 >= 1.0  # three calls, two gaps


def test_an_answer_past_the_bound_is_a_retryable_error_not_a_read_without_end(
        lam: LambdaProvider, fake_lambda: FakeLambdaCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body is read up to MAX_BODY_BYTES: past it (a runaway listing, a proxy streaming
    without end) the call fails as a transient error naming the call, and the next call that
    fits is read as before."""
    import providers.lambda_cloud.client as client

    lam.launch(spec(count=2))
    monkeypatch.setattr(client, "MAX_BODY_BYTES", 200)  # a listing of two instances is more
    with pytest.raises(TransientError) as e:
        lam.list_managed()
    assert e.value.retryable and e.value.code == "RESPONSE_TOO_LARGE" and "GET /api/v1/instances" in str(e.value)
    monkeypatch.setattr(client, "MAX_BODY_BYTES", 64 * 1024 * 1024)
    assert len(lam.list_managed()) == 2
