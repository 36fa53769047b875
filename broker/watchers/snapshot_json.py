"""QueueSnapshot ⇄ JSON (a dict, a string or a file).

The document (``"schema": "broker.queue-snapshot/v1"``)::

    {"schema": "broker.queue-snapshot/v1", "source": "slurm:a", "taken_at": 1767225600.0,
     "pending": [{"job_id": "17", "gpus": 4, "queue": "gpu", "pending_reason": "Resources",
                  "kind": "eval", ...}],
     "running": [{"job_id": "12", "gpus": 2, "nodes": ["gpu-1"], "runtime_s": 3600,
                  "time_limit_s": 14400, "est_runtime_s": 7200}],
     "nodes": [{"name": "gpu-1", "state": "mix", "gpus_total": 4, "gpus_allocated": 2}],
     "gpu_samples": [{"node": "gpu-1", "index": 0, "utilization_pct": 12.0}],
     "extra": {}}

Field names are those of :mod:`policies.queue`; a running job's ``runtime_s`` is how long it has
run, its ``time_limit_s`` / ``est_runtime_s`` (0 or left out: not reported) say when it is
expected to end, for the wait predictor (:mod:`policies.waits`); fields left out take their defaults; unknown
fields are errors (a typo must not pass silently). ``taken_at`` is epoch seconds or an ISO-8601
time with a zone. Errors raise :class:`broker.watchers.ParseError` naming the line and field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from broker.fields import FIELDS, TS_MAX, TS_MIN, Rule, bad_character
from broker.watchers import ParseError
from policies.queue import (JOB_KINDS, NODE_STATES, ClusterNode, GpuSample, PendingJob,
                            QueueSnapshot, RunningJob)

SCHEMA = "broker.queue-snapshot/v1"
_LISTS = {"pending": PendingJob, "running": RunningJob, "nodes": ClusterNode,
          "gpu_samples": GpuSample}
_REQUIRED = {PendingJob: ("job_id", "gpus"), RunningJob: ("job_id", "gpus"),
             ClusterNode: ("name", "state", "gpus_total"), GpuSample: ("node", "index",
                                                                         "utilization_pct")}


def snapshot_to_dict(snapshot: QueueSnapshot) -> dict:
    doc: dict[str, Any] = {"schema": SCHEMA, "source": snapshot.source,
                           "taken_at": snapshot.taken_at}
    for key in ("pending", "running", "nodes", "gpu_samples"):
        doc[key] = [_record_to_dict(r) for r in getattr(snapshot, key)]
    doc["extra"] = dict(snapshot.extra)
    return doc


def _record_to_dict(record: Any) -> dict:
    out = {}
    for f in dataclasses.fields(record):
        v = getattr(record, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def encode(snapshot: QueueSnapshot) -> str:
    """The document as compact JSON, as the store keeps it: msgspec encodes the records'
    dataclasses directly (100,000 jobs in ~0.1 s, against ~1.2 s through dicts and ``json``)."""
    import msgspec

    doc = {"schema": SCHEMA, "source": snapshot.source, "taken_at": snapshot.taken_at,
           "pending": snapshot.pending, "running": snapshot.running, "nodes": snapshot.nodes,
           "gpu_samples": snapshot.gpu_samples, "extra": snapshot.extra}
    try:
        return msgspec.json.encode(doc).decode()
    except (TypeError, msgspec.EncodeError):  # an ``extra`` only ``json`` takes (tuple keys, ...)
        return json.dumps(snapshot_to_dict(snapshot))


def dumps(snapshot: QueueSnapshot, indent: int | None = 2) -> str:
    return json.dumps(snapshot_to_dict(snapshot), indent=indent, sort_keys=False) + "\n"


def save_snapshot(snapshot: QueueSnapshot, path: str | Path) -> None:
    Path(path).write_text(dumps(snapshot))


# ---------------------------------------------------------------------------------------------
class _FieldError(ValueError):
    def __init__(self, path: tuple, message: str) -> None:
        super().__init__(message)
        self.path = path


def _name(path: tuple) -> str:
    """A field's dotted name (``pending[2].gpus``), built only when an error needs it."""
    return ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path).replace(".[", "[")


def _check(value: Any, typ: str, path: tuple) -> Any:
    if typ == "str":
        if not isinstance(value, str):
            raise _FieldError(path, f"{_name(path)} must be a string, got {json.dumps(value)}")
        return value
    if typ == "int":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not value.is_integer()):
            raise _FieldError(path, f"{_name(path)} must be a whole number, got {json.dumps(value)}")
        if value < 0:
            raise _FieldError(path, f"{_name(path)} must not be negative, got {value}")
        return int(value)
    if typ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value):
            raise _FieldError(path, f"{_name(path)} must be a number, got {json.dumps(value)}")
        if value < 0:
            raise _FieldError(path, f"{_name(path)} must not be negative, got {value}")
        return float(value)
    if typ == "bool":
        if not isinstance(value, bool):
            raise _FieldError(path, f"{_name(path)} must be true or false, got {json.dumps(value)}")
        return value
    if typ.startswith("tuple[str"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _FieldError(path, f"{_name(path)} must be a list of strings")
        return tuple(value)
    raise _FieldError(path, f"{_name(path)} has an unsupported type {typ}")


MAX_STRING_CHARS = 4096  # as the edge's default [limits] max_string_chars
MAX_NUMBER = 2 ** 53  # a count, priority or duration past this is no scheduler's


_NO_RULE = Rule()
_RULES = {cls: {f.name: FIELDS.get(f"{cls.__name__}.{f.name}", _NO_RULE) for f in dataclasses.fields(cls)}
          for cls in _LISTS.values()}


def _within_edge(cls: type, kwargs: dict, path: tuple) -> None:
    """The gRPC edge's bounds (:data:`broker.fields.FIELDS`) on a record read from a file:
    what a pushed snapshot could not carry, a file given to ``diagnose`` cannot either."""
    rules = _RULES[cls]
    for k, v in kwargs.items():
        rule = rules[k]
        if isinstance(v, str):
            _edge_string(v, rule, path, k)
        elif isinstance(v, tuple):
            if rule.items is not None and len(v) > rule.items:
                raise _FieldError(path + (k,), f"{_name(path + (k,))} holds {len(v)} entries; at most {rule.items}")
            for s in v:
                _edge_string(s, rule, path, k)
        elif not isinstance(v, bool) and v > (hi := MAX_NUMBER if rule.hi is None else rule.hi):
            raise _FieldError(path + (k,), f"{_name(path + (k,))} must be at most {_num(hi)}, got {_num(v)}")


def _edge_ids(lists: dict[str, tuple]) -> None:
    """A job is pending or running once; a node is listed once: a repeated id would be counted
    twice (its GPUs asked twice, its node's GPUs free twice)."""
    seen: dict[str, tuple] = {}
    for key in ("pending", "running"):
        for i, job in enumerate(lists[key]):
            if not job.job_id:
                raise _FieldError((key, i, "job_id"), f"{key}[{i}].job_id is empty")
            if job.job_id in seen:
                first = seen[job.job_id]
                raise _FieldError((key, i, "job_id"), f"{key}[{i}].job_id {job.job_id[:64]!r} is also "
                                                      f"{first[0]}[{first[1]}]'s: a job is listed once")
            seen[job.job_id] = (key, i)
    names: set[str] = set()
    for i, node in enumerate(lists["nodes"]):
        if node.name in names:
            raise _FieldError(("nodes", i, "name"), f"nodes[{i}].name {node.name[:64]!r} is listed twice")
        names.add(node.name)


def _edge_extra(extra: dict) -> None:
    """The two ``extra`` entries the diagnosis reads, in the shapes the Slurm watcher writes."""
    warnings, gangs = extra.get("warnings", []), extra.get("gangs", {})
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise _FieldError(("extra", "warnings"), "extra.warnings must be a list of strings")
    if not isinstance(gangs, dict) or not all(isinstance(m, list) and all(isinstance(j, str) for j in m)
                                              for m in gangs.values()):
        raise _FieldError(("extra", "gangs"), "extra.gangs must map each gang to a list of job ids")


def _num(x: float) -> str:
    return f"{x:,.0f}" if x < 1e16 and float(x).is_integer() else f"{float(x):g}"


def _edge_string(v: str, rule: Rule, path: tuple, k: str) -> None:
    chars = rule.chars or MAX_STRING_CHARS
    if len(v) > chars:
        raise _FieldError(path + (k,), f"{_name(path + (k,))} is {len(v):,} characters long; at most {chars:,}")
    bad = bad_character(v, rule.text)
    if bad:
        raise _FieldError(path + (k,), f"{_name(path + (k,))} contains {bad.split(', ', 1)[1]} "
                                       f"({bad.split(',', 1)[0]})")


def _record(cls: type, data: Any, path: tuple, edge: bool = False) -> Any:
    if not isinstance(data, dict):
        raise _FieldError(path, f"{path[0]}[{path[1]}] must be an object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise _FieldError(path + (unknown[0],), f"{path[0]}[{path[1]}] has an unknown field "
                          f"{unknown[0]!r} (known: {', '.join(fields)})")
    for req in _REQUIRED[cls]:
        if req not in data:
            raise _FieldError(path, f"{path[0]}[{path[1]}] lacks the required field {req!r}")
    kwargs = {k: _check(v, fields[k].type, path + (k,)) for k, v in data.items()}
    if edge:
        _within_edge(cls, kwargs, path)
    if cls is PendingJob and kwargs.get("kind", "training") not in JOB_KINDS:
        raise _FieldError(path + ("kind",), f"{path[0]}[{path[1]}].kind must be one of "
                          f"{', '.join(JOB_KINDS)}, got {kwargs['kind']!r}")
    if cls is ClusterNode and kwargs["state"] not in NODE_STATES:
        raise _FieldError(path + ("state",), f"{path[0]}[{path[1]}].state must be one of "
                          f"{', '.join(NODE_STATES)}, got {kwargs['state']!r}")
    if cls is GpuSample and kwargs["utilization_pct"] > 100:
        raise _FieldError(path + ("utilization_pct",),
                          f"{path[0]}[{path[1]}].utilization_pct must be at most 100")
    return cls(**kwargs)


def _taken_at(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            dt = None
        if dt is not None and dt.tzinfo is not None:
            return dt.timestamp()
    raise _FieldError(("taken_at",), "taken_at must be epoch seconds or an ISO-8601 time with a "
                      f"zone, got {json.dumps(value)}")


def taken_at_value(value: Any) -> float:
    """``taken_at`` as epoch seconds (a number, or ISO-8601 with a zone); ValueError otherwise."""
    return _taken_at(value)


def snapshot_from_dict(doc: Any) -> QueueSnapshot:
    """Build a QueueSnapshot from a parsed document; raises ValueError naming the field."""
    try:
        return _from_dict(doc)
    except _FieldError as exc:
        raise ValueError(str(exc)) from None


def _from_dict(doc: Any, edge: bool = False) -> QueueSnapshot:
    """``edge``: also the gRPC edge's bounds on every field (a document from a file; a
    stored one passed them, or came from the scheduler's own commands)."""
    if not isinstance(doc, dict):
        raise _FieldError((), "a snapshot must be a JSON object")
    schema = doc.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise _FieldError(("schema",), f"unsupported schema {schema!r} (expected {SCHEMA!r})")
    known = {"schema", "source", "taken_at", "extra", *_LISTS}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise _FieldError((unknown[0],), f"unknown top-level field {unknown[0]!r}")
    if "taken_at" not in doc:
        raise _FieldError((), "the snapshot lacks 'taken_at'")
    source = doc.get("source", "")
    if not isinstance(source, str):
        raise _FieldError(("source",), "source must be a string")
    lists: dict[str, tuple] = {}
    for key, cls in _LISTS.items():
        items = doc.get(key, [])
        if not isinstance(items, list):
            raise _FieldError((key,), f"{key} must be a list")
        lists[key] = tuple(_record(cls, item, (key, i), edge) for i, item in enumerate(items))
    extra = doc.get("extra", {})
    if not isinstance(extra, dict):
        raise _FieldError(("extra",), "extra must be an object")
    taken_at = _taken_at(doc["taken_at"])
    if edge:
        _edge_string(source, FIELDS["QueueSnapshot.source"], (), "source")
        _edge_extra(extra)
        _edge_ids(lists)
        if not TS_MIN <= taken_at <= TS_MAX:
            raise _FieldError(("taken_at",), f"taken_at must be a time of the years 1 to 9999, got {taken_at:g}")
    return QueueSnapshot(source=source, taken_at=taken_at, extra=extra, **lists)


def _line_of_path(text: str, path: tuple) -> int | None:
    """Best-effort line of ``path`` (e.g. ("pending", 3, "gpus")) in the JSON ``text``."""
    if not path:
        return None
    pos = _top_level_key(text, str(path[0]))
    if pos is None:
        return None
    if len(path) >= 2 and isinstance(path[1], int):
        start = text.find("[", pos)
        if start < 0:
            return None
        depth, i, count, in_str, esc = 0, start, -1, False, False
        elem_pos = None
        while i < len(text):
            ch = text[i]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "[{":
                depth += 1
                if depth == 2:
                    count += 1
                    if count == path[1]:
                        elem_pos = i
                        break
            elif ch in "]}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        if elem_pos is None:
            return None
        pos = elem_pos + 1
        while pos < len(text) and text[pos].isspace():
            pos += 1  # the element's first field
        if len(path) >= 3:
            end = _matching(text, elem_pos)
            fm = re.compile(r'"%s"\s*:' % re.escape(str(path[2]))).search(text, elem_pos, end)
            if fm:
                pos = fm.start()
    return text.count("\n", 0, pos) + 1


def _top_level_key(text: str, key: str) -> int | None:
    """Position just after ``"key":`` of the top-level object."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            j, esc = i + 1, False
            while j < n:
                if esc:
                    esc = False
                elif text[j] == "\\":
                    esc = True
                elif text[j] == '"':
                    break
                j += 1
            if depth == 1 and text[i + 1:j] == key:
                m = re.compile(r"\s*:").match(text, j + 1)
                if m:
                    return m.end()
            i = j + 1
            continue
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        i += 1
    return None


def _matching(text: str, start: int) -> int:
    depth, in_str, esc = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def loads(text: str) -> QueueSnapshot:
    """Parse a snapshot document; raises ParseError naming the line (and field)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"not valid JSON: {exc.msg} (column {exc.colno})",
                         line=exc.lineno) from None
    try:
        return _from_dict(doc, edge=True)
    except _FieldError as exc:
        raise ParseError(str(exc), line=_line_of_path(text, exc.path)) from None


def load_snapshot(path: str | Path) -> QueueSnapshot:
    """Read a snapshot file; ParseError names the file and line; OSError passes through."""
    from providers.files import read_text

    text = read_text(path)
    try:
        return loads(text)
    except ParseError as exc:
        raise exc.with_source(str(path)) from None


__all__ = ["SCHEMA", "dumps", "encode", "load_snapshot", "loads", "save_snapshot", "snapshot_from_dict",
           "snapshot_to_dict"]
