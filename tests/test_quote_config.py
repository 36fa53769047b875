"""The settings an in-process `broker quote` reads (broker.quote_config): remembered between
processes, the same quote as from the whole configuration, and loaded in full again whenever the
file, the environment or the code changed; errors are never remembered."""
from __future__ import annotations

import marshal
import re

import pytest

import broker.config
from broker import market, quote_config
from broker.errors import ConfigError
from broker.views import quote_to_dict
from policies.demand import Demand

CONFIG = """
owner = "quote-config-test"
[catalog]
max_age_h = 12
[market]
spot_confidence = 0.8
[quote]
onprem_egress_usd_per_gb = 0.02
[limits]
max_nodes = 64
[providers.aws]
enabled = true
regions = ["us-east-1", "us-west-2"]
image_id = "ami-0abc12345def67890"
[[reservations]]
provider = "aws"
region = "us-east-1"
instance_type = "p5.48xlarge"
reservation_id = "cr-0123456789abcdef0"
nodes = 2
"""


class FullLoads:
    """broker.config.load, counting its calls."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = broker.config.load

        def load(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(broker.config, "load", load)


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """The environment the loads are given (not the process's)."""
    return {"BROKER_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}


@pytest.fixture
def config_file(tmp_path):
    p = tmp_path / "broker.toml"
    p.write_text(CONFIG)
    return p


def _quote(cfg) -> dict:
    engine = market.quote_engine(cfg, None, log_refused=False, bulk=False)
    demand = engine.validate(Demand(gpus=16, hours=24, gpu_model="H100", nodes=2, interruptible=True,
                                    checkpoint_minutes=30, data_out_gb=100))
    doc = quote_to_dict(engine.quote(demand, now=1_800_000_000.0, top=20))
    return {k: v for k, v in doc.items() if k not in ("quote_id", "created_at", "valid_until")}


def test_the_remembered_settings_give_the_quote_the_whole_configuration_gives(env, config_file, monkeypatch):
    loads = FullLoads(monkeypatch)
    first = quote_config.load(str(config_file), env)
    again = quote_config.load(str(config_file), env)
    assert loads.calls == 1  # the second from the copy
    assert isinstance(again, quote_config.QuoteConfig)
    whole = broker.config.load(str(config_file), env)
    assert quote_config.view_of(whole) == quote_config.view_of(again)
    assert _quote(again) == _quote(first) == _quote(whole)
    assert any(o["market"] == "reserved" for o in _quote(again)["offers"])


@pytest.mark.parametrize("change", ["file", "environment", "code"])
def test_a_change_loads_the_whole_configuration_again(env, config_file, monkeypatch, change):
    loads = FullLoads(monkeypatch)
    quote_config.load(str(config_file), env)
    if change == "file":
        config_file.write_text(CONFIG.replace("max_age_h = 12", "max_age_h = 13"))
    elif change == "environment":
        env = {**env, "BROKER_CATALOG__MAX_AGE_H": "13"}
    else:  # a module of the product is not the one the copy was made with
        copy = next((quote_config.catalog_cache.cache_dir(env)).glob("quote-config-*"))
        key, code, view = marshal.loads(copy.read_bytes())
        (f, size, mtime, ino), *rest = code
        copy.write_bytes(marshal.dumps((key, ((f, size, mtime + 1, ino), *rest), {**view, "db_url": "x"})))
    got = quote_config.load(str(config_file), env)
    assert loads.calls == 2
    assert got.catalog.max_age_h == (12 if change == "code" else 13)
    assert got.db_url != "x"


def test_the_copy_keeps_no_token_of_the_file_or_the_environment(env, config_file, tmp_path):
    config_file.write_text(CONFIG.replace('owner = "quote-config-test"',
                                          'owner = "quote-config-test"\n[auth]\ntokens = { "file-secret-4f1e" = "*" }'))
    env = {**env, "BROKER_TOKEN": "env-secret-9c2d", "BROKER_AUTH__STORE_CACHE_S": "3"}
    quote_config.load(str(config_file), env)
    (copy,) = quote_config.catalog_cache.cache_dir(env).glob("quote-config-*")
    body = copy.read_bytes()
    assert b"quote-config-test" not in body  # nothing of the file...
    assert b"file-secret-4f1e" not in body and b"env-secret-9c2d" not in body  # ...nor of the environment
    assert quote_config.load(str(config_file), env).catalog.max_age_h == 12  # and it is read back


def test_an_error_is_reported_every_time_and_never_remembered(env, config_file, monkeypatch):
    quote_config.load(str(config_file), env)
    config_file.write_text(CONFIG.replace("max_age_h = 12", "max_age_hours = 12"))
    for _ in range(2):
        with pytest.raises(ConfigError, match=re.escape("catalog.max_age_hours is not a setting")):
            quote_config.load(str(config_file), env)
    with pytest.raises(ConfigError, match="BROKER_CATALOG_MAX_AGE_H"):
        quote_config.load(str(config_file), {**env, "BROKER_CATALOG_MAX_AGE_H": "1"})
    with pytest.raises(ConfigError, match="does not exist"):
        quote_config.load(str(config_file) + ".missing", env)


def test_no_file_and_no_settings_is_the_defaults_remembered(env, monkeypatch):
    loads = FullLoads(monkeypatch)
    got = [quote_config.load(None, env) for _ in range(3)]
    assert loads.calls == 1
    assert quote_config.view_of(got[-1]) == quote_config.view_of(broker.config.load(None, env))
    assert got[-1].db_url.endswith("/broker.db") and got[-1].providers.enabled() == {}


def test_gcp_flex_start_is_loaded_whole_every_time(env, tmp_path, monkeypatch):
    p = tmp_path / "flex.toml"
    p.write_text('[providers.gcp]\nenabled = true\nproject = "p"\nregions = ["us-central1"]\nflex_start = true\n')
    loads = FullLoads(monkeypatch)
    for _ in range(2):
        assert isinstance(quote_config.load(str(p), env), broker.config.Config)
    assert loads.calls == 2


def test_an_unwritable_cache_loads_the_whole_configuration_every_time(env, config_file, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**env, "BROKER_HOME": str(blocker)}  # the cache directory would be inside a file
    loads = FullLoads(monkeypatch)
    for _ in range(2):
        assert quote_config.load(str(config_file), env).catalog.max_age_h == 12
    assert loads.calls == 2
