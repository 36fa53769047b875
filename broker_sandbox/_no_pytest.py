"""Stands in for pytest where it is not installed: the fakes' fixtures become plain functions
(``broker sandbox`` runs the fakes themselves, never their fixtures)."""
from __future__ import annotations


def fixture(fn=None, **_kw):
    return fn if fn is not None else (lambda f: f)


class MonkeyPatch:  # only named in annotations
    pass
