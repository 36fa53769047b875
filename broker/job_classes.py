"""``[autoscaler.classes.NAME]``: the settings table of one job class (policies.classes)."""
from __future__ import annotations

import dataclasses
from typing import Annotated

from msgspec import Meta

from providers.settings import NUMBER_LIMIT, Table

ClassName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
Label = Annotated[str, Meta(min_length=1, max_length=64)]


class JobClassTable(Table):
    """``[autoscaler.classes.NAME]`` (:class:`policies.classes.JobClass`). A key left out keeps
    the built-in class's value (a new class: no wait target, its own name as its label)."""

    max_wait_s: Annotated[float, Meta(ge=0, le=NUMBER_LIMIT)] | None = None
    spot: bool | None = None
    burst: bool | None = None
    priority: Annotated[int, Meta(ge=-1000, le=1000)] | None = None
    match: Annotated[list[Label], Meta(max_length=64)] | None = None
    min_priority: Annotated[int, Meta(ge=0, le=NUMBER_LIMIT)] | None = None

    def job_class(self, name: str):
        from policies.classes import DEFAULT_CLASSES, JobClass

        base = next((c for c in DEFAULT_CLASSES if c.name.lower() == name.lower()), JobClass(name))
        kw = {k: getattr(self, k) for k in self.__struct_fields__ if getattr(self, k) is not None}
        if "match" in kw:
            kw["match"] = tuple(kw["match"])
        return dataclasses.replace(base, **kw)
