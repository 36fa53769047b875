"""Build providers from their typed settings, importing each cloud's SDK only when it is enabled."""
from __future__ import annotations

import importlib
from typing import Any, Mapping

from providers.base import Provider
from providers.settings import PROVIDER_SETTINGS, ProvidersSettings, Table, provider_settings

_CLASSES = {"aws": "providers.aws:AwsProvider", "gcp": "providers.gcp:GcpProvider",
            "azure": "providers.azure:AzureProvider", "lambda": "providers.lambda_cloud:LambdaProvider"}


def build(name: str, settings: Table | Mapping[str, Any], owner: str) -> Provider:
    """The provider ``name`` from its settings (typed, or a raw ``[providers.NAME]`` table).

    Raises ValueError (a :class:`providers.settings.SettingsError` for the schema's findings)
    when the settings or the credentials they name are unusable."""
    if name not in PROVIDER_SETTINGS:
        raise ValueError(f"providers.{name} is not a known provider ({', '.join(PROVIDER_SETTINGS)})")
    module, cls = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls).from_config(provider_settings(name, settings),
                                                                      owner=owner)


def build_enabled(tables: ProvidersSettings | Mapping[str, Mapping[str, Any]], owner: str) -> dict[str, Provider]:
    """Every provider whose settings say ``enabled = true``."""
    if isinstance(tables, ProvidersSettings):
        return {n: build(n, s, owner) for n, s in tables.enabled().items()}
    return {n: build(n, t, owner) for n, t in tables.items() if t.get("enabled", False)}
