"""List-then-watch: one resource kind of one Kubernetes API server kept in memory.

The pattern of the API's "efficient detection of changes": list the collection, remember the
list's ``metadata.resourceVersion``, watch from it (``watch=1&resourceVersion=N&
allowWatchBookmarks=true``) and apply each ``ADDED``/``MODIFIED``/``DELETED`` event; a
``BOOKMARK`` only moves the resourceVersion on, so a watch restarted after a quiet spell does not
replay what it saw. When the server no longer has the history the watch starts from, it says
"410 Gone": as an ``ERROR`` event whose object is a ``Status`` with ``code: 410``, or (some
servers and proxies) as HTTP 410 on the watch request. Either way the cache is relisted and the
watch starts again from the new list.

Calls go through the official ``kubernetes`` client (``kubernetes.watch.Watch`` with
``timeout_seconds``, so each call ends and the loop, not the client, decides how to go on).
Objects stay plain JSON dicts: the mapping reads a handful of fields, and decoding every pod
into the client's models would cost more than the whole diagnosis.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("broker.kubernetes")


class Informer:
    """The objects of one collection (``list_call``: a client list method with its arguments
    bound, e.g. ``functools.partial(core.list_pod_for_all_namespaces, field_selector=...)``)."""

    def __init__(self, kind: str, list_call: Callable[..., Any], *, watch_timeout_s: int = 60,
                 request_timeout_s: float = 30.0) -> None:
        self.kind = kind
        self.list_call = list_call
        self.watch_timeout_s = max(1, int(watch_timeout_s))
        self.request_timeout_s = request_timeout_s
        self.resource_version: str | None = None
        self.relists = 0  # lists after the first (410 Gone)
        self.lists = 0
        self.events = 0
        self.bookmarks = 0
        self.last_error = ""
        self.synced = threading.Event()
        self._items: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Any = None

    # -- reading ---------------------------------------------------------------------------------
    def items(self) -> list[dict]:
        with self._lock:
            return list(self._items.values())

    # -- list and watch --------------------------------------------------------------------------
    def relist(self) -> None:
        """List the collection and replace the cache with it."""
        resp = self.list_call(_preload_content=False, _request_timeout=self.request_timeout_s)
        try:
            doc = json.loads(resp.data)
        finally:
            resp.release_conn()
        items = {_key(o): o for o in doc.get("items") or ()}
        with self._lock:
            self._items = items
            self.resource_version = (doc.get("metadata") or {}).get("resourceVersion") or None
        self.lists += 1
        self.synced.set()

    def watch_once(self) -> None:
        """List if there is no resourceVersion to start from, then one watch call (until the
        server ends it after ``watch_timeout_s``, or :meth:`stop`). 410 Gone → forget the
        resourceVersion: the next call relists."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch import Watch

        if self.resource_version is None:
            if self.lists:
                self.relists += 1
            self.relist()
        w = self._watch = Watch(return_type="object")  # "object": events keep the server's JSON
        try:
            for ev in w.stream(self.list_call, resource_version=self.resource_version,
                               allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout_s,
                               _request_timeout=self.watch_timeout_s + self.request_timeout_s):
                self._apply(ev)
                if w.resource_version:
                    self.resource_version = str(w.resource_version)
                if self._stop.is_set():
                    w.stop()
        except ApiException as e:
            if e.status != 410:
                raise
            log.info("watch_expired", kind=self.kind, resource_version=self.resource_version,
                     reason=str(e.reason)[:200])
            self.resource_version = None
        finally:
            self._watch = None

    def _apply(self, ev: dict) -> None:
        kind, obj = ev.get("type"), ev.get("object")
        if kind == "BOOKMARK":
            self.bookmarks += 1
            return
        if not isinstance(obj, dict):
            return
        self.events += 1
        with self._lock:
            if kind == "DELETED":
                self._items.pop(_key(obj), None)
            elif kind in ("ADDED", "MODIFIED"):
                self._items[_key(obj)] = obj

    # -- the background loop ---------------------------------------------------------------------
    def run(self, backoff_s: float = 1.0) -> None:
        """Watch until :meth:`stop`; an error is logged and retried after ``backoff_s``
        (doubling to 30 s while it lasts)."""
        wait = backoff_s
        while not self._stop.is_set():
            try:
                self.watch_once()
                wait, self.last_error = backoff_s, ""
            except Exception as e:  # the API server unreachable, refused, or answering garbage
                if self._stop.is_set():
                    return  # stop() cut the stream
                self.last_error = f"{type(e).__name__}: {str(e)[:300]}"
                log.warning("watch_failed", kind=self.kind, error=self.last_error)
                self._stop.wait(wait)
                wait = min(30.0, wait * 2)

    def stop(self) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()


def _key(obj: dict) -> str:
    m = obj.get("metadata") or {}
    return f"{m.get('namespace', '')}/{m.get('name', '')}"
