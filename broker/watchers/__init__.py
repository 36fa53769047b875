"""Scheduler watchers: turn a scheduler's own output into a :class:`policies.queue.QueueSnapshot`.

- :mod:`broker.watchers.base` — the one interface every scheduler implements (a watcher and its
  optional capabilities, typed errors) and how to add a scheduler;
- :mod:`broker.watchers.registry` — the scheduler kinds, each with its ``[<kind>]`` settings
  table, and the watchers of the enabled ones;
- Slurm is one kind: its ``squeue``/``sinfo``/``scontrol`` parsers and watcher live in
  :mod:`broker.slurm` (:mod:`broker.slurm.parse`, :mod:`broker.slurm.watcher`).
- :mod:`broker.watchers.hints` — a job's ``broker:k=v,...`` hints (kind, checkpointing, gang…),
  read the same from a Slurm comment or a Kubernetes annotation.
- :mod:`broker.watchers.nvidia_smi` — ``nvidia-smi --query-gpu`` CSV → GPU utilisation samples.
- :mod:`broker.watchers.snapshot_json` — a QueueSnapshot as a JSON document and back.

Every parser accepts real-world output and rejects malformed input with :class:`ParseError`, whose
message names the line (1-based) it could not read.
"""
from __future__ import annotations


class ParseError(ValueError):
    """Input a watcher cannot read. ``line`` is 1-based (None when the input has no lines to
    point at); ``source`` names the file or command once a caller knows it."""

    def __init__(self, message: str, *, line: int | None = None, source: str = "") -> None:
        self.message = message.rstrip(".")
        self.line = line
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where = f"{where} line {self.line}" if where else f"line {self.line}"
        return f"{where}: {self.message}" if where else self.message

    def with_source(self, source: str) -> "ParseError":
        return ParseError(self.message, line=self.line, source=source)


__all__ = ["ParseError"]
