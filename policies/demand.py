"""Demand: what a job needs from burst capacity, validated with sentences that name the field."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable


MAX_HOURS = 87_840  # ten years: a longer runtime is a typo (and would overflow the cost model)
MAX_GB = 1e9  # an exabyte of data in or out


class DemandError(ValueError):
    """A demand field is invalid. ``field`` names it; the message is one sentence."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True, slots=True)
class Demand:
    gpus: int
    hours: float
    gpu_model: str = ""  # "" = any model with min_gpu_memory_gb
    min_gpu_memory_gb: int = 0
    nodes: int = 0  # 0 = the fewest nodes that hold the GPUs
    data_in_gb: float = 0.0
    data_location: str = "onprem"  # or "PROVIDER:REGION" (a ":ZONE" after it is allowed and not priced)
    data_out_gb: float = 0.0
    interruptible: bool = False
    checkpoint_minutes: int = 0
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    residency: tuple[str, ...] = ()
    min_sla_pct: float = 0.0
    deadline: float | None = None  # epoch seconds
    tenant: str = "default"
    job_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def checkpoint_hours(self) -> float:
        """Checkpoint interval; an interruptible job that names none is assumed to save hourly."""
        return (self.checkpoint_minutes or 60) / 60.0

    def validate(self, known_gpus: tuple[str, ...] = (), clouds: tuple[str, ...] | None = None) -> "Demand":
        """Return a normalised copy, or raise :class:`DemandError` naming the bad field.

        ``clouds``: the registered clouds (:func:`providers.registry.names`) that ``providers`` and
        ``data_location`` may name; ``None`` leaves the names unchecked."""
        def bad(name: str, msg: str) -> DemandError:
            return DemandError(name, msg)

        if not isinstance(self.gpus, int) or self.gpus <= 0:
            raise bad("gpus", f"gpus must be a positive whole number, got {self.gpus!r}.")
        if not (isinstance(self.hours, (int, float)) and 0 < self.hours <= MAX_HOURS):
            raise bad("hours", f"hours must be a positive number of at most {MAX_HOURS} (ten years), got {self.hours!r}.")
        if self.nodes < 0:
            raise bad("nodes", f"nodes must be zero (choose) or positive, got {self.nodes}.")
        if self.nodes and self.gpus % self.nodes:
            raise bad("nodes", f"{self.gpus} GPUs do not split evenly over {self.nodes} nodes.")
        for name in ("data_in_gb", "data_out_gb", "min_sla_pct"):
            v = getattr(self, name)
            if not 0 <= v <= MAX_GB:  # NaN fails both comparisons
                raise bad(name, f"{name} must be zero or positive and at most {MAX_GB:.0e}, got {v}.")
        if self.min_sla_pct > 100:
            raise bad("min_sla_pct", f"min_sla_pct is a percentage, got {self.min_sla_pct}.")
        if self.min_gpu_memory_gb < 0:
            raise bad("min_gpu_memory_gb", f"min_gpu_memory_gb must be zero or positive, got {self.min_gpu_memory_gb}.")
        if self.checkpoint_minutes < 0:
            raise bad("checkpoint_minutes", f"checkpoint_minutes must be zero or positive, got {self.checkpoint_minutes}.")
        model = self.gpu_model.strip().upper()
        if not model and not self.min_gpu_memory_gb:
            raise bad("gpu_model", "name a GPU model (e.g. H100) or a minimum GPU memory.")
        if model and known_gpus and model not in known_gpus:
            raise bad("gpu_model", f"unknown GPU model {self.gpu_model!r}; known: {', '.join(known_gpus)}.")
        providers = _unique(p.strip().lower() for p in self.providers)
        for p in providers:
            if clouds is not None and p not in clouds:
                raise bad("providers", f"unknown provider {p!r}; known: {', '.join(clouds)}.")
        loc = self.data_location.strip() or "onprem"
        if loc != "onprem" and (":" not in loc or clouds is not None and loc.split(":", 1)[0] not in clouds):
            raise bad("data_location", f"data_location must be 'onprem' or PROVIDER:REGION, got {loc!r}.")
        return replace(
            self, gpu_model=model, providers=providers, data_location=loc,
            regions=_unique(r.strip() for r in self.regions),
            residency=_unique(r.strip().lower() for r in self.residency),
            tenant=self.tenant or "default",
        )


def _unique(names: Iterable[str]) -> tuple[str, ...]:
    """The non-empty names, each once, in the order first given (a filter repeated adds nothing,
    and neither does it lengthen what quotes echo of it)."""
    return tuple(dict.fromkeys(n for n in names if n))
