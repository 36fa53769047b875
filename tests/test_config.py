"""The one settings schema: every unknown key, unknown BROKER_* variable, wrong type and
non-finite number is refused with one sentence naming the dotted key (and the key meant)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker import config as cfgmod
from broker.errors import ConfigError, outcome

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "deploy" / "broker.example.toml"


def load(toml: str = "", tmp_path: Path | None = None, env: dict | None = None, **overrides):
    path = None
    if toml:
        path = tmp_path / "broker.toml"
        path.write_text(toml)
    return cfgmod.load(path, environ=env or {}, overrides=overrides or None)


def test_the_example_file_is_valid_and_documents_the_defaults():
    cfg = cfgmod.load(EXAMPLE, environ={})
    assert cfg.owner == "broker-prod" and cfg.listen == "127.0.0.1:50051"
    assert cfg.budget("anyone").usd_per_hour == 500
    assert cfg.lifecycle == cfgmod.LifecycleSettings()  # the file states the defaults
    assert cfg.reconciler == cfgmod.ReconcilerSettings()
    assert cfg.limits == cfgmod.LimitsSettings()
    assert cfg.autoscaler.trigger_config().burst_verdicts == ("resource-bound", "mixed")
    assert cfg.providers.enabled() == {}  # listed, not enabled
    assert cfg.auth is None  # the file ships with auth commented out, so nothing half-configured
    assert cfg.bootstrap.template_settings()["slurm"]["conf_server"] == "slurmctld.example.internal:6817"
    assert cfg.budget_policy == cfgmod.BudgetPolicy() and "on_exhausted" not in cfg.budgets


@pytest.mark.parametrize("toml, words", [
    ("[budgets]\non_exhausted = \"kill\"\n", "config: budgets.on_exhausted must be finish_running or "
                                               "checkpoint_and_stop, got 'kill'"),
    ("[budgets]\non_exhausted = 3\n", "config: budgets.on_exhausted must be finish_running or"),
    ("[lifecycle]\nlifetime_with_job = \"kill\"\n", "lifecycle.lifetime_with_job"),
    ("[lifecycle]\nmax_restarts = -1\n", "lifecycle.max_restarts"),
    ("[server]\ncallback_listen = \"nowhere\"\n", "server.callback_listen must be HOST:PORT"),
    ("[server]\ncallback_listen = \"0.0.0.0:8081\"\n", "server.callback_listen 0.0.0.0:8081 is beyond loopback, and "
     "the nodes' reports carry their lease's credential in plain HTTP"),
    ("owner = \"a\\u0007b\"\n", "owner must be at most 128 characters with no U+0007, a control character"),
    ("owner = \" team \"\n", "owner must be at most 128 characters with no spaces around it"),
    ("[lifecycle]\nmax_lifetime_s = 60\nlifetime_warning_s = 3600\n",
     "lifecycle.lifetime_warning_s (3600) must be shorter than lifecycle.max_lifetime_s (60)"),
    ("[store]\nconnect_timeout_s = 2.5\n", "store.connect_timeout_s is whole seconds, at least 2"),
    ("[store]\nconnect_timeout_s = 1\n", "store.connect_timeout_s is whole seconds, at least 2"),
    ("[budgets.\"team a\"]\nusd_per_month = 5\n", "budgets has a table for 'team a', which is no tenant's name"),
    ("[[reservations]]\nprovider = \"aws\"\nregion = \"us-east-1\"\ninstance_type = \"p5.48xlarge\"\n"
     "reservation_id = \"cr-1\"\n[[reservations]]\nprovider = \"aws\"\nregion = \"us-east-1\"\n"
     "instance_type = \"p5.48xlarge\"\nreservation_id = \"cr-1\"\n", "reservations list aws reservation 'cr-1' twice"),
    ("[server]\ncallback_url = \"ftp://x\"\n", "server.callback_url must be an http(s) URL"),
])
def test_job_settings_are_checked_naming_the_key(tmp_path, toml, words):
    with pytest.raises(ConfigError) as e:
        load(toml, tmp_path)
    assert words in str(e.value)


def test_budgets_hold_the_policy_beside_the_tenants(tmp_path):
    cfg = load("[budgets]\non_exhausted = \"checkpoint_and_stop\"\n[budgets.team-a]\nusd_per_hour = 5\n", tmp_path)
    assert cfg.budget_policy.on_exhausted == "checkpoint_and_stop" and list(cfg.budgets) == ["team-a"]


@pytest.mark.parametrize("toml, key, meant", [
    ("[budgets.default]\nusd_per_hr = 100\n", "budgets.default.usd_per_hr", "usd_per_hour"),
    ("[budgets.team-a]\nusd_per_hour = 1\nusd_per_mnth = 2\n", "budgets.team-a.usd_per_mnth", "usd_per_month"),
    ("[server]\nlistn = \"127.0.0.1:1\"\n", "server.listn", "listen"),
    ("[lifecycle]\nidle_timeout = 60\n", "lifecycle.idle_timeout", "idle_timeout_s"),
    ("[reconciler]\ninterval = 5\n", "reconciler.interval", "interval_s"),
    ("[autoscaler.trigger]\nstabilisation_s = 5\n", "autoscaler.trigger.stabilisation_s", "stabilization_s"),
    ("[providers.aws]\nregion = [\"us-east-1\"]\n", "providers.aws.region", "regions"),
    ("[providers.gcp]\nprojet = \"p\"\n", "providers.gcp.projet", "project"),
    ("[bootstrap.slurm]\nmunge_kye = \"x\"\n", "bootstrap.slurm.munge_kye", "munge_key"),
    ("[[reservations]]\nprovider = \"aws\"\nregion = \"r\"\ninstance_type = \"t\"\nreservation_id = \"cr-1\"\nnode = 2\n",
     "reservations[0].node", "nodes"),
    ("[telemtry]\nmetrics_listen = \"\"\n", "telemtry", "telemetry"),
])
def test_unknown_keys_are_refused_naming_the_key_and_the_key_meant(tmp_path, toml, key, meant):
    with pytest.raises(ConfigError) as e:
        load(toml, tmp_path)
    assert str(e.value) == f"config: {key} is not a setting (did you mean {meant}?)"
    assert outcome(e.value).exit_code == 2


@pytest.mark.parametrize("name, value, words", [
    ("BROKER_SERVER__LISTN", "127.0.0.1:1", "BROKER_SERVER__LISTN names server.listn, which is not a setting "
                                           "(did you mean BROKER_SERVER__LISTEN?)"),
    ("BROKER_SERVR__LISTEN", "127.0.0.1:1", "did you mean BROKER_SERVER__LISTEN?"),
    ("BROKER_CONIFG", "/etc/broker.toml", "BROKER_CONIFG is not a broker setting (did you mean BROKER_CONFIG?)"),
    ("BROKER_LISTEN", "x", "settings are BROKER_<SECTION>__<KEY>"),
    ("BROKER_RECONCILER__INTERVAL_S", "soon", "reconciler.interval_s) must be a number, got 'soon'"),
    ("BROKER_RECONCILER__INTERVAL_S", "inf", "BROKER_RECONCILER__INTERVAL_S (setting reconciler.interval_s) must be a finite number"),
    ("BROKER_STORE__URL__X", "1", "BROKER_STORE__URL__X (setting store.url) must be a string"),
])
def test_environment_variables_are_checked_too(name, value, words):
    with pytest.raises(ConfigError, match="^config: ") as e:
        cfgmod.load(None, environ={name: value})
    assert words in str(e.value)


def test_environment_overrides_the_file_and_process_variables_pass(tmp_path):
    cfg = load("[reconciler]\ninterval_s = 30\n", tmp_path,
               env={"BROKER_RECONCILER__INTERVAL_S": "10", "BROKER_OWNER": "broker-x", "BROKER_TOKEN": "t",
                    "BROKER_SERVER": "10.0.0.1:50051", "BROKER_HOME": str(tmp_path), "OTHER": "1"})
    assert cfg.reconciler.interval_s == 10 and cfg.owner == "broker-x"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "-1e300"])
@pytest.mark.parametrize("key", ["reconciler.interval_s", "budgets.default.usd_per_hour", "lifecycle.block_s",
                                 "quote.onprem_egress_usd_per_gb", "autoscaler.trigger.cooldown_s",
                                 "providers.aws.read_timeout_s"])
def test_non_finite_and_huge_numbers_are_refused_in_every_numeric_key(tmp_path, key, value):
    section, _, name = key.rpartition(".")
    with pytest.raises(ConfigError) as e:
        load(f"[{section}]\n{name} = {value}\n", tmp_path)
    assert key in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("toml, words", [
    ("[server]\nworkers = \"many\"\n", "server.workers must be a whole number"),
    ("[server]\nworkers = 0\n", "server.workers must be a whole number >= 4"),
    ("[server]\nworkers = 3\n", "server.workers must be a whole number >= 4"),
    ("[server]\nworkers = true\n", "server.workers must be a whole number, got true"),
    ("[limits]\nmax_message_bytes = 2147483647\n", "limits.max_message_bytes must be a finite number of at most 1,000,000,000"),
    ("[server]\nlisten = \"nowhere\"\n", "server.listen must be HOST:PORT"),
    ("[server]\nlisten = \"127.0.0.1:99999\"\n", "server.listen must be HOST:PORT"),
    ("[server]\ntls_key_file = \"/k.pem\"\n", "server.tls_cert_file is required when server.tls_key_file is set"),
    ("[server]\ntls_cert_file = \"/c.pem\"\n", "server.tls_key_file is required when server.tls_cert_file is set"),
    ("[store]\nurl = \"mysql://db/broker\"\n", "store.url must be sqlite:///PATH or postgresql"),
    ("[budgets.default]\nusd_per_hour = -5\n", "budgets.default.usd_per_hour must be a number >= 0"),
    ("[budgets]\ndefault = 5\n", "budgets.default must be a table"),
    ("[lifecycle]\nmax_failover = 1.5\n", "lifecycle.max_failover must be a whole number"),
    ("[autoscaler.trigger]\norder = \"random\"\n", "autoscaler.trigger.order must be 'ranked' or 'fifo'"),
    ("[autoscaler.diagnose]\nlow_allocation = 2\n", "autoscaler.diagnose.low_allocation must be between 0 and 1"),
    ("[[reservations]]\nprovider = \"mars\"\nregion = \"r\"\ninstance_type = \"t\"\nreservation_id = \"x\"\n",
     "reservations[0].provider cannot be 'mars'; one of aws, gcp, azure"),
    ("[[reservations]]\nprovider = \"aws\"\n", "reservations[0].region is required"),
    ("[providers.aws]\nenabled = true\n", "providers.aws.regions is required"),
    ("[providers.oracle]\nenabled = true\n", "providers.oracle is not a setting; known: aws, azure, gcp"),
    ("[telemetry]\nmetrics_listen = \"0.0.0.0:9464\"\n", "telemetry.metrics_listen binds 0.0.0.0, beyond loopback"),
    ("owner = \"\"\n", "owner must be"),
    ("[server]\nlisten = \"0.0.0.0:50051\"\n", "server.listen 0.0.0.0:50051 is beyond loopback without TLS and "
                                              "[auth] tokens"),
])
def test_wrong_values_are_one_sentence_naming_the_key(tmp_path, toml, words):
    with pytest.raises(ConfigError) as e:
        load(toml, tmp_path)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_serving_beyond_loopback_needs_tls_and_tokens_or_says_insecure(tmp_path):
    tls = "tls_cert_file = \"/c.pem\"\ntls_key_file = \"/k.pem\"\n"
    with pytest.raises(ConfigError, match="without \\[auth\\] tokens"):
        load(f"[server]\nlisten = \"0.0.0.0:50051\"\n{tls}", tmp_path)
    cfg = load(f"[server]\nlisten = \"0.0.0.0:50051\"\n{tls}[auth]\ntokens = {{ \"abc\" = \"team-a\" }}\n", tmp_path)
    assert cfg.server.tls and cfg.auth_tokens == {"abc": "team-a"}
    assert load("[server]\nlisten = \"0.0.0.0:50051\"\ninsecure = true\n", tmp_path).listen == "0.0.0.0:50051"
    assert load("[server]\nlisten = \"[::1]:50051\"\n", tmp_path).listen == "[::1]:50051"


@pytest.mark.parametrize("toml, env, words", [
    ("[auth]\n", {}, "auth.tokens is empty"),
    ("[auth]\ntokens = {}\n", {}, "auth.tokens is empty"),
    ("[auth]\ntoken = { \"abc\" = \"team-a\" }\n", {}, "auth.token is not a setting (did you mean tokens?)"),
    ("[auth]\ntokens = { \"\" = \"team-a\" }\n", {}, "auth.tokens holds an empty token"),
    ("[auth]\ntokens = { \"abc\" = \"\" }\n", {}, "auth.tokens maps a token to an empty tenant"),
    ("[auth]\ntokens = [\"abc\"]\n", {}, "auth.tokens must be a table"),
    ("", {"BROKER_AUTH__TOKENS": ""}, "BROKER_AUTH__TOKENS (setting auth.tokens) must be a table"),
    ("", {"BROKER_AUTH__TOKENS": "{}"}, "BROKER_AUTH__TOKENS (setting auth.tokens) is empty"),
    ("[auth]\ntokens = { \"abc\" = \"team-a\" }\n", {"BROKER_AUTH__TOKENS": ""}, "must be a table"),
])
def test_auth_never_fails_open(tmp_path, toml, env, words):
    """Any [auth] section turns auth on; a table that would leave it off is a start-up error."""
    with pytest.raises(ConfigError) as e:
        load(toml, tmp_path, env=env)
    assert words in str(e.value)


def test_a_callback_beyond_loopback_needs_https_in_front_or_insecure(tmp_path):
    for extra in ('callback_url = "https://broker.example.com:8443"\n', "insecure = true\n"):
        cfg = load(f'[server]\ncallback_listen = "0.0.0.0:8081"\n{extra}', tmp_path)
        assert cfg.server.callback_listen == "0.0.0.0:8081"


def test_tokens_from_the_environment(tmp_path):
    cfg = load("", tmp_path, env={"BROKER_AUTH__TOKENS": '{"9f2c" = "team-a", "77ab" = "*"}'})
    assert cfg.auth_tokens == {"9f2c": "team-a", "77ab": "*"}
    assert load("", tmp_path).auth is None


def test_a_digest_key_is_a_digest_in_either_case_or_refused(tmp_path):
    """ "sha256:<hex>" as sha256sum prints it (lower case) or as other tools do (upper case)
    stands for its token; a key that starts so but holds no digest is refused, not taken as
    the literal token (which nobody would ever send)."""
    from broker.auth import Auth

    upper = "sha256:" + "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"  # "abc"
    cfg = load(f'[auth]\ntokens = {{ "{upper}" = "team-a" }}\n', tmp_path)
    assert Auth(cfg.auth_tokens).authenticate([("authorization", "Bearer abc")]).tenants == frozenset({"team-a"})
    for key in ("sha256:xyz", "SHA256:" + "ba78" * 15, "sha256:" + "g" * 64):
        with pytest.raises(ConfigError, match='auth.tokens holds a "sha256:" key that is not a SHA-256 digest'):
            load(f'[auth]\ntokens = {{ "{key}" = "team-a" }}\n', tmp_path)


def test_a_refused_setting_never_echoes_a_table_or_a_secret(tmp_path):
    """A bad name inside a table is named, and the sentence holds neither the table around it
    (it would print the whole configuration, tokens and database password included) nor any
    value of [auth] or the store's URL."""
    text = ('[store]\nurl = "postgresql+psycopg://broker:hunter2@127.0.0.1/broker"\n'
            '[auth]\ntokens = { "s3cr3t-token" = "team-a" }\n[autoscaler.classes."a b"]\nmax_wait_s = 10\n')
    with pytest.raises(ConfigError) as e:
        load(text, tmp_path)
    assert 'autoscaler.classes: the name "a b" cannot be used' in str(e.value), e.value
    assert "hunter2" not in str(e.value) and "s3cr3t" not in str(e.value) and "{" not in str(e.value)
    for value in ("5", "nan", "1e300"):
        with pytest.raises(ConfigError) as e:
            load(f'[auth]\ntokens = {{ "s3cr3t-token" = {value} }}\n', tmp_path)
        assert "auth.tokens" in str(e.value) and "s3cr3t" not in str(e.value), e.value
    with pytest.raises(ConfigError) as e:
        load("", tmp_path, env={"BROKER_STORE__URL": "mysql://u:hunter2@127.0.0.1/db"})
    assert "hunter2" not in str(e.value), e.value


def test_an_in_memory_store_and_a_catalog_path_that_is_no_catalog_are_refused(tmp_path):
    for url in ("sqlite://", "sqlite:///", "sqlite:///:memory:", "sqlite:///:memory:?cache=shared"):
        with pytest.raises(ConfigError, match=r"store.url\) names an in-memory SQLite database"):
            load("", tmp_path, env={"BROKER_STORE__URL": url})
    assert load("", tmp_path, env={"BROKER_STORE__URL": "sqlite:///memory.db"}).db_url.endswith("memory.db")
    for path in (tmp_path / "absent", tmp_path):
        with pytest.raises(ConfigError, match="is not a catalog directory: it holds no instances.csv"):
            load(f'[catalog]\npath = "{path}"\n', tmp_path)


@pytest.mark.parametrize("env, words", [
    ({"BROKER_AUTOSCALER__DATA_LOCATION": "mars"}, "autoscaler.data_location: data_location must be 'onprem' or PROVIDER:REGION"),
    ({"BROKER_AUTOSCALER__DATA_LOCATION": "aws:"}, "autoscaler.data_location: data_location 'aws:' is not a region of aws"),
    ({"BROKER_AUTOSCALER__DEFAULT_GPU_MODEL": "Z999"}, "autoscaler.default_gpu_model: unknown GPU model 'Z999'"),
])
def test_what_every_burst_would_ask_the_catalog_is_checked_at_start_up(tmp_path, env, words):
    """A default GPU model or data location the quote refuses would fail every burst, each
    logged and none said at start-up."""
    from broker.service import Service

    cfg = cfgmod.load(None, environ={"BROKER_STORE__URL": f"sqlite:///{tmp_path / 'b.db'}", **env})
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Service(cfg)


def test_typed_settings_flow_to_their_users(tmp_path):
    cfg = load("[lifecycle]\nmax_failover = 2\n[autoscaler]\ninterval_s = 5\n[autoscaler.selection]\n"
               "startup_s = 60\n[providers.aws]\nregions = [\"us-east-1\"]\nimage_id = \"ami-0abc12345def67890\"\n"
               "[budgets.team-a]\nusd_per_month = 12.5\n", tmp_path)
    assert cfg.lifecycle.max_failover == 2 and cfg.lifecycle.retries == 3
    assert cfg.autoscaler.interval_s == 5 and cfg.autoscaler.trigger_config().selection.startup_s == 60
    assert cfg.providers.aws.image_for("us-east-1") == "ami-0abc12345def67890"
    assert str(cfg.budget("team-a").usd_per_month) == "12.5" and cfg.budget("team-b") is None


def test_a_configuration_saved_with_a_byte_order_mark_and_crlf_is_read(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_bytes(b'\xef\xbb\xbfowner = "team-x"\r\n[server]\r\nworkers = 8\r\n')
    cfg = cfgmod.load(path, environ={})
    assert cfg.owner == "team-x" and cfg.server.workers == 8


def test_file_problems_are_sentences(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        cfgmod.load(tmp_path / "absent.toml", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        cfgmod.load(bad, environ={})
    with pytest.raises(ConfigError, match="cannot be read"):
        cfgmod.load(tmp_path, environ={})


# ---------------------------------------------------------------------------------------------
# through the real command line


def broker(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    full.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True,
                          env=full, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("toml, env, words", [
    ("[budgets.default]\nusd_per_hr = 100\n", {},
     "budgets.default.usd_per_hr is not a setting (did you mean usd_per_hour?)"),
    ("", {"BROKER_SERVER__LISTN": "127.0.0.1:1"}, "BROKER_SERVER__LISTN names server.listn"),
    ("[reconciler]\ninterval_s = inf\n", {}, "reconciler.interval_s must be a finite number"),
    ("", {"BROKER_AUTH__TOKENS": ""}, "auth.tokens"),
])
def test_serve_refuses_a_bad_configuration_with_exit_2(tmp_path, toml, env, words):
    path = tmp_path / "broker.toml"
    path.write_text(toml)
    r = broker("serve", "--config", str(path), "--db", f"sqlite:///{tmp_path / 'b.db'}", env=env)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.fixture
def busy_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("args, words", [
    (["--listen", "BUSY"], "cannot serve on 127.0.0.1:{port}: the port is already in use"),
    (["--listen", "nowhere"], "config: server.listen must be HOST:PORT"),
    (["--listen", "127.0.0.1:70000"], "config: server.listen must be HOST:PORT"),
    (["--listen", "0.0.0.0:0"], "is beyond loopback without TLS and [auth] tokens"),
    (["--db", "mysql://db/broker"], "config: store.url must be sqlite:///PATH or postgresql"),
    (["--db", "postgresql+psycopg://broker@127.0.0.1:1/broker"], "cannot open the store at 127.0.0.1:1/broker: "
                                                                 "connection failed"),
    (["--db", "sqlite:////proc/no/such/broker.db"], "cannot open the store at sqlite:////proc/no/such/broker.db"),
    (["--db", "sqlite:////dev/null/broker.db"], "cannot open the store at sqlite:////dev/null/broker.db"),
    (["--log-level", "loud"], "--log-level must be debug, info, warning or error"),
])
def test_start_up_failures_exit_2_with_one_sentence(tmp_path, busy_port, args, words):
    """A supervisor must not restart-loop on these: exit 2 (systemd: RestartPreventExitStatus=2)."""
    args = [a.replace("BUSY", f"127.0.0.1:{busy_port}") for a in args]
    if "--db" not in args:
        args += ["--db", f"sqlite:///{tmp_path / 'broker.db'}"]
    if "--listen" not in args:
        args += ["--listen", "127.0.0.1:0"]
    r = broker("serve", *args)
    assert r.returncode == 2, r.stderr
    assert words.format(port=busy_port) in r.stderr and "Traceback" not in r.stderr
    # one sentence; besides it only log events (one JSON object per line: "listening" comes
    # before the store is opened)
    said = [line for line in r.stderr.strip().splitlines() if not line.startswith("{")]
    assert len(said) == 1 and said[0].startswith("broker: "), r.stderr


def test_the_systemd_unit_does_not_restart_on_a_start_up_error():
    unit = (ROOT / "deploy" / "systemd" / "broker.service").read_text().splitlines()
    assert "Restart=on-failure" in unit and "RestartPreventExitStatus=2" in unit


# -- the example file documents every key of the schema ----------------------------------------
def _schema_keys(typ, prefix: tuple = ()) -> set[tuple]:
    """Every key of the settings schema as a path; ``*`` for a table's free name
    (``budgets.*.usd_per_hour``, ``slurm.shapes.*.gpu``)."""
    import msgspec

    out = set()
    for f in msgspec.structs.fields(typ):
        path = prefix + (f.encode_name,)
        sub = _struct_in(f.type)
        out |= _schema_keys(sub[0], path + sub[1]) if sub else {path}
    return out


def _struct_in(t):
    """(Struct, path suffix) when ``t`` is a table, a list of tables or a map of them."""
    import types
    import typing

    import msgspec

    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Annotated:
        return _struct_in(args[0])
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return t, ()
    if origin in (typing.Union, types.UnionType, list, tuple):
        return next((s for s in map(_struct_in, args) if s), None)
    if origin is dict:
        s = _struct_in(args[1])
        return (s[0], ("*",) + s[1]) if s else None
    return None


def _documented(text: str) -> set[tuple]:
    """The keys the example file shows, set or commented out (``# key = ...``, ``# key: ...``),
    under the table header (also commented out) above them; a header documents its own path."""
    import re

    keys, table = set(), ()
    for line in text.splitlines():
        head = re.match(r"^#?\s*\[\[?\s*([A-Za-z0-9_.\-]+)\s*\]\]?\s*(#.*)?$", line)
        if head:
            table = tuple(head[1].split("."))
            keys.add(table)
            continue
        m = re.match(r"^#?\s*([a-z_][a-z0-9_]*)\s*[=:]", line)
        if m:
            keys.add(table + (m[1],))
    return keys


def test_every_setting_of_the_schema_is_in_the_example_file():
    """A key added to the schema without a line in deploy/broker.example.toml fails here. A
    flat [bootstrap] key is documented by the template table that shows it (the file says flat
    keys apply to every template)."""
    docs = _documented(EXAMPLE.read_text())

    def shown(path: tuple) -> bool:
        if any(len(d) == len(path) and all(a in ("*", b) for a, b in zip(path, d)) for d in docs):
            return True
        return len(path) == 2 and path[0] == "bootstrap" and any(
            len(d) == 3 and d[0] == "bootstrap" and d[2] == path[1] for d in docs)

    written = {("budget_policy", "on_exhausted"): ("budgets", "on_exhausted")}  # [budgets] on_exhausted
    missing = sorted(".".join(p) for p in _schema_keys(cfgmod.Config) if not shown(written.get(p, p)))
    assert not missing, f"settings missing from {EXAMPLE.name}: {', '.join(missing)}"
    assert ("autoscaler", "selection", "startup_s") in _schema_keys(cfgmod.Config)  # the walk reaches nested tables
