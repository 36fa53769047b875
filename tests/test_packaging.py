"""Reproducible builds: the lock the container installs from pins every dependency of the project,
each at a version pyproject.toml allows, with hashes; the base image is pinned by digest."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def locked() -> dict[str, str]:
    text = (ROOT / "deploy" / "requirements.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\]+) \\\n    --hash=sha256:[0-9a-f]{64}", text, re.M))
    assert len(pins) == len(re.findall(r"^[A-Za-z0-9_.-]+==", text, re.M)), "every pin carries a hash"
    return {canonicalize_name(k): v for k, v in pins.items()}


def test_the_lock_pins_every_dependency_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = locked()
    wanted = [*project["project"]["dependencies"], *project["project"]["optional-dependencies"]["postgres"],
              *project["build-system"]["requires"]]
    for spec in wanted:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in deploy/requirements.lock: regenerate it (see deploy/build.in)"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} is outside {req.specifier}"


def test_the_image_installs_from_the_lock_on_a_pinned_base():
    docker = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=\S+@sha256:[0-9a-f]{64}$", docker, re.M)
    assert "--require-hashes --no-deps -r requirements.lock" in docker
    assert "--no-build-isolation" in docker
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text()
    assert "!deploy/requirements.lock" in ignore and "!README.md" in ignore


def test_the_kubernetes_manifests_serve_with_tls_and_tokens_behind_a_network_policy():
    """The Deployment's own configuration passes the schema, and would not without its Secrets."""
    yaml = pytest.importorskip("yaml")
    from broker import config as cfgmod
    from broker.errors import ConfigError

    k8s = ROOT / "deploy" / "kubernetes"
    toml = yaml.safe_load((k8s / "20-configmap.yaml").read_text())["data"]["broker.toml"]
    deployment = yaml.safe_load((k8s / "30-deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    listen = args[args.index("--listen") + 1]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    secrets = {e["name"] for e in container["env"] if "valueFrom" in e}
    assert {"BROKER_AUTH__TOKENS", "BROKER_STORE__URL"} <= secrets
    env.update(BROKER_AUTH__TOKENS='{"0123456789abcdef" = "*"}', BROKER_STORE__URL="postgresql+psycopg://b@db/b")
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(toml)
        f.flush()
        cfg = cfgmod.load(f.name, environ=env, overrides={"server.listen": listen})
        assert cfg.server.tls and cfg.auth_tokens and not cfg.server.insecure
        assert cfg.telemetry.metrics_listen == "" or cfg.telemetry.metrics_listen.startswith("127.")
        del env["BROKER_AUTH__TOKENS"]
        with pytest.raises(ConfigError, match="beyond loopback"):
            cfgmod.load(f.name, environ=env, overrides={"server.listen": listen})
    policy = yaml.safe_load((k8s / "60-networkpolicy.yaml").read_text())
    assert policy["kind"] == "NetworkPolicy" and set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert [p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]] == [50051]
