"""``google.cloud.compute_v1``, loaded by the parts the broker uses.

The package's ``__init__`` imports every one of Compute's ~110 service clients with their REST
transports: about 0.95 s of a quiet 2-core machine's CPU, under the GIL, of which the broker uses
eight clients (0.5 s with the message types they share). The package itself lists those imports
in ``__lazy_modules__``, for Python 3.15's lazy imports to defer; on older interpreters
:func:`load` does the same by hand: it makes the package's module without running its
``__init__``, imports the message types and the clients in :data:`CLIENTS` into it, and leaves
every other name to the module's ``__getattr__`` (PEP 562), which runs the package's own
``__init__`` on first use. Nothing is missing, only later. When the package is already imported
(another module, a test) that module is used as it is. The provider's modules import
:data:`compute_v1` from here instead of ``from google.cloud import compute_v1``.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

PACKAGE = "google.cloud.compute_v1"

#: The clients the provider and the market source build, by the service module that defines them.
CLIENTS = {"InstancesClient": "instances", "ZoneOperationsClient": "zone_operations",
           "RegionOperationsClient": "region_operations", "RegionInstancesClient": "region_instances",
           "RegionsClient": "regions", "ResourcePoliciesClient": "resource_policies",
           "ReservationsClient": "reservations", "MachineTypesClient": "machine_types",
           "AcceleratorTypesClient": "accelerator_types"}

_lock = threading.RLock()


def load() -> ModuleType:
    """The ``google.cloud.compute_v1`` module: the message types and :data:`CLIENTS` loaded, the
    rest on first use."""
    with _lock:
        module = sys.modules.get(PACKAGE)
        if module is None:
            module = _partial()
        return module


def _partial() -> ModuleType:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {PACKAGE!r}", name=PACKAGE)
    module = importlib.util.module_from_spec(spec)
    whole: list[bool] = []  # set once the package's own __init__ has run

    def __getattr__(name: str) -> Any:  # noqa: N807 - PEP 562's module hook
        if name.startswith("__") or whole:
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
        if name[:1].islower():  # a submodule (``gapic_version``, ``services``): only it
            try:
                return importlib.import_module(f"{PACKAGE}.{name}")
            except ModuleNotFoundError:
                raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}") from None
        with _lock:
            if not whole:
                whole.append(True)
                spec.loader.exec_module(module)  # type: ignore[union-attr]
        return getattr(module, name)

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[PACKAGE] = module
    try:
        types = importlib.import_module(f"{PACKAGE}.types")
        for name in types.__all__:
            setattr(module, name, getattr(types, name))
        for client, service in CLIENTS.items():
            setattr(module, client, getattr(importlib.import_module(f"{PACKAGE}.services.{service}"), client))
    except BaseException:
        sys.modules.pop(PACKAGE, None)
        raise
    sys.modules["google.cloud"].compute_v1 = module  # type: ignore[attr-defined]
    return module


if TYPE_CHECKING:
    from google.cloud import compute_v1
else:
    compute_v1 = load()
