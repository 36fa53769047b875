"""Which cloud's market fetcher answers for a provider. Apart from the package's shared types, so
the package does not import the fetchers that import it; a fetcher (and its SDK) is imported only
for the cloud asked."""
from __future__ import annotations

from typing import Any, Mapping

from providers.market import Snapshot


def fetch(provider: str, settings: Mapping[str, Any], catalog: Any, now: float) -> Snapshot:
    """Ask ``provider``'s APIs about every offering of ``catalog`` in its configured regions.

    A failing part (one API, one region) is recorded in :attr:`Snapshot.errors` and the rest is
    still returned; an error that leaves nothing to return raises :class:`ProviderError`.
    """
    if provider == "aws":
        from providers.market.aws import fetch as f
    elif provider == "gcp":
        from providers.market.gcp import fetch as f
    elif provider == "azure":
        from providers.market.azure import fetch as f
    else:
        raise ValueError(f"unknown provider {provider!r}")
    return f(settings, catalog, now)
