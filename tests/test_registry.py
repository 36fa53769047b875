"""The cloud registry: every registered cloud has every part, a registration that lacks one is
refused, a name no registration carries is an error wherever it is dispatched, and a cloud added
by one registry line (Zed, :mod:`tests.throwaway_cloud`) is picked up by the settings, the
dispatch, the CLI, the catalog, quotes and the sandbox."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib

import msgspec
import pytest

from providers import registry
from providers.base import Provider
from providers.catalog import DATA_DIR, CatalogError, bundled, load
from providers.market import SOURCES, MarketSource
from providers.registration import BootHooks, CloudRegistration, RegistrationError
from providers.settings import Table
from tests.conftest import ROOT
from tests.throwaway_cloud import REGISTRATION as ZED, ZedSettings

CLOUDS = [r.name for r in registry.REGISTRY]


def test_the_registry_lists_aws_gcp_and_azure_first_and_says_its_names_as_a_sentence():
    assert registry.names()[:3] == ("aws", "gcp", "azure")
    assert registry.choices() == ", ".join(registry.names()[:-1]) + " or " + registry.names()[-1]
    assert registry.choices().startswith("aws, gcp")


@pytest.mark.parametrize("name", CLOUDS)
def test_every_registered_cloud_has_every_part(name):
    reg = registry.get(name)
    cls = reg.load("provider")
    assert callable(getattr(cls, "from_config", None))
    assert all(callable(getattr(cls, m, None)) for m in ("launch", "describe", "list_managed", "terminate"))
    assert issubclass(reg.settings, Table) and reg.settings().enabled is False
    source = registry.market_source(name)
    assert isinstance(source, MarketSource), f"{name}: its market is not a MarketSource"
    assert "price_list" in source.sources and set(source.sources) <= set(SOURCES), source.sources
    terms = bundled().terms.get(name)
    assert terms is not None, f"{name}: no network and SLA terms in providers/data/network.toml"
    assert terms.sla_pct > 0 and terms.egress_tiers and terms.as_of and terms.source
    assert any(o.provider == name for o in bundled().offerings), f"{name}: no rows in prices.csv"
    assert reg.node_name_problem("") and reg.node_name_problem("node-1") == ""
    assert all(importlib.util.find_spec(m) for m in reg.sdk_modules), f"{name}: an SDK module is not installed"
    assert callable(reg.load("sandbox"))
    # Boot hooks are optional: without whoami a multi-node lease on the cloud is refused at launch.
    assert isinstance(reg.boot, BootHooks)
    with open(ROOT / "deploy" / "broker.example.toml", "rb") as f:
        assert name in tomllib.load(f)["providers"], f"{name}: no [providers.{name}] in the example config"


def test_reading_the_registry_loads_no_sdk():
    code = ("import sys, providers.registry as r\n"
            "sdks = [m for reg in r.REGISTRY for m in reg.sdk_modules]\n"
            "print([m for m in sys.modules if any(m == s or m.startswith(s + '.') for s in sdks)])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _zed(**changes) -> CloudRegistration:
    fields = {f: getattr(ZED, f) for f in ZED.__dataclass_fields__}
    return CloudRegistration(**{**fields, **changes})


class _NoEnabled(Table):
    regions: tuple[str, ...] = ()


class _NoRegions(Table):
    enabled: bool = False


@pytest.mark.parametrize("changes,says", [
    ({"market": ""}, "zed: market must be an import path"),
    ({"provider": "ZedProvider"}, "zed: provider must be an import path"),
    ({"sandbox": ""}, "zed: sandbox must be an import path"),
    ({"settings": dict}, "zed: settings must be a providers.settings.Table"),
    ({"settings": _NoEnabled}, "zed: its settings need an `enabled` key"),
    ({"settings": _NoRegions}, "zed: its settings need .* a `regions` list"),
    ({"node_name_problem": None}, "zed: node_name_problem must be a function"),
    ({"name": "Zed Cloud"}, "a cloud's name must be"),
    ({"title": ""}, "zed: title and each SDK module name"),
    ({"boot": "hostname"}, "zed: boot must be a BootHooks"),
])
def test_a_registration_that_lacks_a_part_is_refused(changes, says):
    with pytest.raises(RegistrationError, match=says):
        _zed(**changes)


def test_a_notice_watch_needs_the_metadata_url_it_polls():
    with pytest.raises(RegistrationError, match="needs the metadata service's URL"):
        BootHooks(whoami="x", notice_watch="broker_watch_notices() { :; }")


def _catalog_copy(tmp_path, network_extra: str = "", with_zed_rows: bool = False):
    d = tmp_path / "catalog"
    shutil.copytree(DATA_DIR, d)
    from tests import throwaway_cloud as z

    with open(d / "network.toml", "a") as f:
        f.write(network_extra)
    if with_zed_rows:
        for name, rows in (("instances.csv", z.INSTANCES), ("regions.csv", z.REGIONS), ("prices.csv", z.PRICES)):
            with open(d / name, "a") as f:
                f.write(rows)
    return d


def test_network_terms_of_a_cloud_no_registration_carries_are_an_error(tmp_path):
    from tests.throwaway_cloud import NETWORK

    with pytest.raises(CatalogError, match="network.toml has terms for zed, which no cloud registration carries"):
        load(_catalog_copy(tmp_path, NETWORK))


def test_a_registered_cloud_with_prices_and_no_terms_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", registry.REGISTRY + (ZED,))
    with pytest.raises(CatalogError, match="cloud zed has no network and SLA terms in network.toml"):
        load(_catalog_copy(tmp_path, with_zed_rows=True))


def test_an_unknown_cloud_is_an_error_wherever_it_is_dispatched(tmp_path):
    from broker import market
    from broker.config import load as load_config
    from providers.market import fetch

    cfg = load_config(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path / 'b.db'}"})
    with pytest.raises(registry.UnknownCloud, match="'oracle' is not a known cloud .known: aws, gcp, azure"):
        market.refresh_quotas(cfg, None, "oracle", "us-east-1", 0.0)
    with pytest.raises(registry.UnknownCloud):
        fetch("oracle", {}, bundled(), 0.0)
    with pytest.raises(registry.UnknownCloud):
        registry.node_name_problem("oracle", "node-1")
    with pytest.raises(registry.UnknownCloud):
        registry.provider_settings("oracle", {})
    with pytest.raises(ValueError, match="providers.oracle is not a known provider"):
        registry.build("oracle", {}, "owner")


def test_the_providers_table_has_one_key_per_registered_cloud():
    fields = [f.encode_name for f in msgspec.structs.fields(registry.ProvidersSettings)]
    assert fields == CLOUDS
    assert all(issubclass(f.type, Table) for f in msgspec.structs.fields(registry.ProvidersSettings))


def test_a_cloud_added_by_one_registry_line_is_picked_up_everywhere(tmp_path):
    """The registry's source with Zed's line added, run in a fresh interpreter: nothing else
    changes, and the settings, dispatch, CLI, catalog, quotes and sandbox all know Zed."""
    from tests import throwaway_cloud as z

    source = (ROOT / "providers" / "registry.py").read_text()
    start = source.index("REGISTRY: tuple[CloudRegistration, ...] = (\n")
    end = source.index("\n)\n", start) + 1  # the list's closing parenthesis, on a line of its own
    line = "    __import__('tests.throwaway_cloud', fromlist=['x']).REGISTRATION,\n"
    patched = source[:end] + line + source[end:]
    known = registry.names() + ("zed",)
    catalog = _catalog_copy(tmp_path, z.NETWORK, with_zed_rows=True)
    (tmp_path / "broker.toml").write_text(textwrap.dedent(f"""\
        owner = "t"
        [store]
        url = "sqlite:///{tmp_path / 'b.db'}"
        [catalog]
        path = "{catalog}"
        refresh_interval_s = 0
        [providers.zed]
        enabled = true
        regions = ["zed-1"]
        token = "t"
        [[reservations]]
        provider = "zed"
        region = "zed-1"
        instance_type = "z1.h100x8"
        reservation_id = "zr-1"
        """))
    script = textwrap.dedent(f"""\
        import json, sys, types
        source = {patched!r}
        mod = types.ModuleType("providers.registry")
        mod.__file__ = "providers/registry.py"
        sys.modules["providers.registry"] = mod
        exec(compile(source, mod.__file__, "exec"), mod.__dict__)
        import providers
        providers.registry = mod
        from typer.testing import CliRunner
        from broker import market
        from broker.cli.app import app
        from broker.config import load
        from broker.store import Store
        from broker_sandbox.clouds import Clouds
        from providers.market import fetch
        from providers.catalog import load as load_catalog
        out = {{}}
        cfg = load({str(tmp_path / 'broker.toml')!r}, environ={{}})
        out["enabled"] = sorted(cfg.providers.enabled())
        out["token"] = cfg.providers.zed.token
        out["reservation"] = cfg.reservations[0].provider
        try:
            load(None, environ={{"BROKER_PROVIDERS__ZED__TOKN": "x"}})
        except Exception as e:
            out["typo"] = str(e)
        out["built"] = type(mod.build_enabled(cfg.providers, "t")["zed"]).__name__
        catalog = load_catalog({str(catalog)!r})
        out["terms"] = catalog.terms["zed"].sla_pct
        out["fetched"] = [p.instance_type for p in fetch("zed", cfg.providers.zed, catalog, 0.0).prices]
        store = Store(cfg.db_url)
        out["quotas"] = [q.label for q in market.refresh_quotas(cfg, store.engine, "zed", "zed-1", 1.0)]
        from broker import market_store
        out["needs"] = [n.key for n in market_store.load(store.engine)["zed"].snapshot.needs]
        out["name_rule"] = mod.node_name_problem("zed", "node-1")
        r = CliRunner().invoke(app, ["quote", "--gpu", "H100:8", "--hours", "1", "--providers", "zed",
                                     "--config", {str(tmp_path / 'broker.toml')!r}, "-o", "json"])
        out["quote"] = (r.exit_code, sorted({{o["provider"] for o in json.loads(r.stdout)["offers"]}}) if r.exit_code == 0 else r.output)
        r = CliRunner().invoke(app, ["catalog", "show", "--provider", "mars", "--config", {str(tmp_path / 'broker.toml')!r}])
        out["choices"] = (r.exit_code, r.output.strip())
        r = CliRunner().invoke(app, ["quote", "--gpu", "H100:8", "--hours", "1", "--providers", "mars",
                                     "--config", {str(tmp_path / 'broker.toml')!r}])
        out["quote_choices"] = (r.exit_code, r.output.strip())
        from providers.bootstrap import BootContext, render
        out["boot"] = render("container", BootContext("l-1", "zed-a", "zed", "zed-1", node_names=("zed-a", "zed-b"),
                                                      settings={{"image": "x", "command": "y"}}))
        clouds = Clouds()
        try:
            out["sandbox"] = clouds.provider_tables()["zed"]
        finally:
            clouds.stop()
        print(json.dumps(out))
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["enabled"] == ["zed"] and out["token"] == "t" and out["reservation"] == "zed"
    assert "names providers.zed.tokn, which is not a setting (did you mean BROKER_PROVIDERS__ZED__TOKEN?)" in out["typo"]
    assert out["built"] == "ZedProvider"
    assert out["terms"] == 99.0
    assert out["fetched"] == ["z1.h100x8"]
    assert out["quotas"] == ["Zed GPUs"] and out["needs"] == ["gpus"]
    assert out["name_rule"] == "does not start with zed-"
    assert out["quote"] == [0, ["zed"]], out["quote"]
    assert out["choices"][0] == 2
    assert f"--provider must be {', '.join(known[:-1])} or zed, got 'mars'" in out["choices"][1]
    assert out["quote_choices"][0] == 2
    assert f"unknown provider 'mars'; known: {', '.join(known)}." in out["quote_choices"][1]
    assert "BROKER_NODE_NAME=$(hostname)" in out["boot"]
    assert out["sandbox"] == {"enabled": True, "regions": ["zed-1"], "token": "t"}


def test_zed_is_not_registered_outside_that_test():
    assert "zed" not in registry.names()
    assert not isinstance(ZedSettings(), registry.ProvidersSettings)
    assert isinstance(registry.build("aws", {"regions": ["us-east-1"], "image_id": "ami-0abc12345def67890",
                                             "endpoint_url": "http://127.0.0.1:1", "credentials": "anonymous"},
                                     "t"), Provider)


def test_a_quota_refresh_asks_each_cloud_what_it_asked_before_the_registry(tmp_path, monkeypatch):
    """AWS and GCP read a region's quotas alone and name the quota each instance type draws on
    from the catalog; Azure asks for the usages its last full fetch found, and low-priority cores."""
    import providers.market.aws as aws_market
    import providers.market.azure as azure_market
    import providers.market.gcp as gcp_market
    from broker import market, market_store
    from broker.config import load as load_config
    from broker.store import Store
    from providers.market import Quota, QuotaNeed, Snapshot

    asked: dict[str, tuple] = {}

    def fake(cloud):
        def fetch_quotas(raw, catalog, region, *names):
            asked[cloud] = (region, *names)
            return [Quota(region, f"{cloud}-key", "GPUs", 8.0, 0.0)]
        return fetch_quotas

    for cloud, module in (("aws", aws_market), ("gcp", gcp_market), ("azure", azure_market)):
        monkeypatch.setattr(module, "fetch_quotas", fake(cloud))
    cfg = load_config(None, environ={}, overrides={"store.url": f"sqlite:///{tmp_path / 'b.db'}"})
    store = Store(cfg.db_url)
    stored = Snapshot("azure", 1.0, needs=[QuotaNeed("Standard_ND96isr_H100_v5", "on_demand", "standardNDSH100v5Family", 96.0)])
    market_store.save(store.engine, stored, 1.0, "")

    for cloud, region in (("aws", "us-east-1"), ("gcp", "us-central1"), ("azure", "eastus")):
        got = market.refresh_quotas(cfg, store.engine, cloud, region, 2.0)
        assert [q.key for q in got] == [f"{cloud}-key"]
    assert asked["aws"] == ("us-east-1",) and asked["gcp"] == ("us-central1",)
    assert asked["azure"] == ("eastus", {"standardNDSH100v5Family", "lowPriorityCores"})
    rows = market_store.load(store.engine)
    assert rows["aws"].snapshot.needs == aws_market.needs_of(bundled()) != []
    assert rows["gcp"].snapshot.needs == gcp_market.needs_of(bundled()) != []
    assert [n.key for n in rows["azure"].snapshot.needs] == ["standardNDSH100v5Family"]
    assert [q.key for q in rows["azure"].snapshot.quotas] == ["azure-key"]
