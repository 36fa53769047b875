"""A least-recently-used cache bounded by entries AND by (estimated) bytes, safe across threads.

The quote engine's result cache and the derived caches above it hold whatever clients asked for;
a count alone does not bound them (one demand's exclusion sentences can be a thousand times
another's), so every entry is weighed when it goes in and the oldest leave until both bounds
hold. An entry heavier than the whole budget is simply not kept.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


def rough_bytes(value: Any) -> int:
    """A cheap over-estimate of what ``value`` holds: protobufs by their encoded size, strings by
    length, tuples and lists by their items (one level deep)."""
    if hasattr(value, "ByteSize"):
        return 2 * value.ByteSize() + 256
    if isinstance(value, (str, bytes)):
        return len(value) + 64
    if isinstance(value, (tuple, list)):
        return 64 + sum(8 + (len(x) + 64 if isinstance(x, (str, bytes)) else 200) for x in value)
    return 256


class SizedLRU:
    def __init__(self, max_items: int, max_bytes: int, weigh: Callable[[Any], int] = rough_bytes) -> None:
        self.max_items, self.max_bytes, self.weigh = max_items, max_bytes, weigh
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def keys(self) -> list[Hashable]:
        """The keys, most recently used first."""
        with self._lock:
            return list(reversed(self._items))

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return default
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: Any) -> None:
        size = self.weigh(value)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.max_bytes:
                return
            self._items[key] = (value, size)
            self.bytes += size
            while len(self._items) > self.max_items or self.bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped
