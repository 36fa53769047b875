"""``[server]``: where the gRPC API and the nodes' callback listen, the serving processes and
TLS, with the address rules they share, part of the configuration's schema
(:mod:`broker.config`, which re-exports these names).
"""
from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from msgspec import Meta

from providers.settings import Table, bad


def split_host_port(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) → (host, port); ValueError with a sentence when it is not."""
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})", listen.strip())
    if not m or int(m[2]) > 65535:
        raise ValueError(f"must be HOST:PORT (e.g. 127.0.0.1:50051), got {listen!r}")
    host = m[1].strip("[]")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"must be HOST:PORT (e.g. 127.0.0.1:50051), got {listen!r}") from None
    return host, int(m[2])


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


MAX_PROCESSES = 64  # serving processes per host: a 64-core machine, one each


class ServerSettings(Table):
    """``[server]``: where the gRPC API listens, its workers and TLS."""

    listen: str = "127.0.0.1:50051"
    workers: Annotated[int, Meta(ge=4, le=4096)] = 32  # streams and cloud calls each get a share
    #: Serving processes sharing ``listen`` (SO_REUSEPORT): each runs the API with its own
    #: ``workers`` threads; one of them also runs the leader's work (reconciler, autoscaler,
    #: market refresh) and /metrics. More than one needs a fixed port.
    processes: Annotated[int, Meta(ge=1, le=MAX_PROCESSES)] = 1
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    #: Serve beyond loopback without TLS and bearer tokens (a trusted network, or TLS ending in
    #: a proxy in front). Without it such a listen address is refused at start-up.
    insecure: bool = False
    #: The nodes' HTTP endpoint for job reports (broker.callback; port 0 = any free one, logged;
    #: "" = none), and the base URL nodes reach it at (default ``http://<its address>``).
    callback_listen: str = "127.0.0.1:0"
    callback_url: str = ""
    #: Before SERVING, how long to wait for the enabled clouds' providers to be built (their SDK
    #: imports), with the store's connections opened and a quote priced meanwhile: the first
    #: calls then cost what later ones do. 0 = SERVING at once, the providers built behind.
    warm_up_s: Annotated[float, Meta(ge=0, le=3600)] = 30.0

    def __post_init__(self) -> None:
        for key in ("listen", "callback_listen"):
            try:
                _ = split_host_port(getattr(self, key)) if key == "listen" or self.callback_listen else None
            except ValueError as e:
                raise bad(key, str(e)) from None
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            given, missing = (("tls_cert_file", "tls_key_file") if self.tls_cert_file
                              else ("tls_key_file", "tls_cert_file"))
            raise bad(missing, f"is required when server.{given} is set (TLS needs both)")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise bad("tls_client_ca_file", "needs server.tls_cert_file and server.tls_key_file")
        if self.callback_url and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", self.callback_url):
            raise bad("callback_url", f"must be an http(s) URL with no query, got {self.callback_url[:64]!r}")
        if self.processes > 1 and split_host_port(self.listen)[1] == 0:
            raise bad("processes", f"is {self.processes}, but serving processes share one fixed port "
                                   f"and server.listen {self.listen} asks for any free port")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)
