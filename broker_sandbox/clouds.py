"""All the mocked clouds at once, and the ``[providers.*]`` tables that point a broker at them:
one :class:`broker_sandbox.SandboxCloud` per registered cloud (:mod:`providers.registry`), from
its registration's ``sandbox`` function."""
from __future__ import annotations

from typing import Any

import msgspec

from broker_sandbox.azure import AZ_SUB, AZ_SUBNET, SSH_KEY  # noqa: F401  (re-exported to the tests)
from providers.registry import REGISTRY


class Clouds:
    """Every registered cloud's fakes, each one an attribute (``clouds.aws``, ``clouds.azure_retail``,
    as its :class:`SandboxCloud` names them), and the ``[providers.*]`` tables that point a broker
    at them (every API a broker calls, the market refresh's included; ``market`` also starts the
    fakes of market APIs only ``broker sandbox`` calls, such as GCP's Cloud Billing Catalog)."""

    def __init__(self, market: bool = False) -> None:
        self.clouds: dict[str, Any] = {}
        try:
            for reg in REGISTRY:
                cloud = self.clouds[reg.name] = reg.load("sandbox")(market=market)
                for attr, fake in cloud.fakes.items():
                    setattr(self, attr, fake)
        except BaseException:
            self.stop()
            raise

    def _fakes(self) -> list[Any]:
        return [fake for cloud in self.clouds.values() for fake in cloud.fakes.values()]

    def stop(self) -> None:
        for fake in self._fakes():
            fake.stop()

    def reset(self) -> None:
        for fake in self._fakes():
            fake.reset()

    @property
    def env(self) -> dict[str, str]:
        """The environment a broker process needs to talk to the fakes (fake credentials only)."""
        return {k: v for cloud in self.clouds.values() for k, v in cloud.env.items()}

    def provider_tables(self, **extra: Any) -> dict[str, dict[str, Any]]:
        """Each cloud's ``[providers.NAME]`` table; ``extra`` keys (``read_timeout_s=1``) go into the
        tables whose schema has them."""
        out = {}
        for reg in REGISTRY:
            table = self.clouds[reg.name].table()
            keys = {f.encode_name for f in msgspec.structs.fields(reg.settings)}
            table.update({k: v for k, v in extra.items() if k in keys})
            out[reg.name] = table
        return out

    def alive_instances(self) -> dict[str, list]:
        """What exists server-side and is not terminated, per cloud."""
        return {name: cloud.alive() for name, cloud in self.clouds.items()}
