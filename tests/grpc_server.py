"""Start a real Broker gRPC server in-process on 127.0.0.1 for tests."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping


from broker import config as cfgmod
from broker.serving import build_server
from broker.service import Service


@contextlib.contextmanager
def running_server(tmp_path, *, providers: Mapping[str, Any] | None = None, config: Mapping | None = None,
                   env: Mapping[str, str] | None = None, background: bool = False) -> Iterator[tuple[str, Service]]:
    """Yield ("127.0.0.1:PORT", service). ``config`` keys are dotted ("catalog.path")."""
    overrides = {"store.url": f"sqlite:///{tmp_path / 'broker.db'}"}
    overrides.update(config or {})
    cfg = cfgmod.load(None, environ=dict(env or {}), overrides=overrides)
    service = Service(cfg, providers=providers)
    server, port = build_server(service, "127.0.0.1:0")
    server.start()
    if background:
        service.start_background()
    try:
        yield f"127.0.0.1:{port}", service
    finally:
        server.stop(grace=1).wait()
        service.stop()
