"""Build providers from configuration, importing each cloud's SDK only when it is enabled."""
from __future__ import annotations

import importlib
from typing import Any, Mapping

from providers.base import PROVIDERS, ConfigError, Provider

_CLASSES = {"aws": "providers.aws:AwsProvider", "gcp": "providers.gcp:GcpProvider",
            "azure": "providers.azure:AzureProvider"}


def build(name: str, settings: Mapping[str, Any], owner: str) -> Provider:
    """The provider ``name`` configured from its ``[providers.NAME]`` table."""
    if name not in PROVIDERS:
        raise ConfigError(f"unknown provider {name!r}; known: {', '.join(PROVIDERS)}")
    module, cls = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls).from_config(dict(settings), owner=owner)


def build_enabled(tables: Mapping[str, Mapping[str, Any]], owner: str) -> dict[str, Provider]:
    """Every provider whose table says ``enabled = true``."""
    return {n: build(n, t, owner) for n, t in tables.items() if t.get("enabled", False)}
