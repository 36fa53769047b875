"""Shared test set-up: loopback only, a small hand-written catalog, the shared data path."""
from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BROKER_SHARED_DATA", ROOT.parent / "shared" / "data"))


# Every attempt to reach past loopback, from any thread (a background refresher's too): the
# test that was running fails with it at teardown (see ``no_network_attempts``).
OFF_LOOPBACK: list[str] = []


def _is_loopback_host(host) -> bool:
    if host in (None, "", "localhost", b"localhost"):
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _is_ip_literal(host) -> bool:
    try:
        ipaddress.ip_address((host.decode("ascii", "replace") if isinstance(host, bytes) else str(host)).split("%")[0])
        return True
    except ValueError:
        return False


def _refuse(what: str) -> None:
    OFF_LOOPBACK.append(what)


def _loopback_only(addr) -> None:
    if not isinstance(addr, tuple) or not addr:
        return  # unix sockets
    host = addr[0]
    if _is_loopback_host(host):
        return
    _refuse(f"connect to {host}")
    raise ConnectionRefusedError(f"tests may only talk to loopback, not {host}")


def _lookup_allowed(host) -> bool:
    """Names that resolve without asking a DNS server: loopback, IP literals (the connect guard
    judges those) and this machine's own name."""
    return _is_loopback_host(host) or _is_ip_literal(host) or host in (_HOSTNAME, _HOSTNAME.encode())


_HOSTNAME = socket.gethostname()


@pytest.fixture(scope="session", autouse=True)
def loopback_only():
    """Any connect to a non-loopback address, and any name lookup that would ask a DNS server,
    is refused (the suite also passes under unshare -n) and fails the test it happened in."""
    real = (socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo, socket.gethostbyname,
            socket.gethostbyname_ex)
    real_connect, real_connect_ex, real_getaddrinfo, real_gethostbyname, real_gethostbyname_ex = real

    def connect(self, addr):
        _loopback_only(addr)
        return real_connect(self, addr)

    def connect_ex(self, addr):
        _loopback_only(addr)
        return real_connect_ex(self, addr)

    def lookup(real_fn):
        def guarded(host, *args, **kwargs):
            if not _lookup_allowed(host):
                _refuse(f"name lookup of {host}")
                raise socket.gaierror(socket.EAI_NONAME, f"tests may only talk to loopback, not look up {host}")
            return real_fn(host, *args, **kwargs)
        return guarded

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    socket.getaddrinfo = lookup(real_getaddrinfo)
    socket.gethostbyname, socket.gethostbyname_ex = lookup(real_gethostbyname), lookup(real_gethostbyname_ex)
    yield
    (socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo, socket.gethostbyname,
     socket.gethostbyname_ex) = real


@pytest.fixture(autouse=True)
def no_network_attempts(loopback_only):
    """Fails a test during which anything (its own code or a background thread it started) tried
    to reach past loopback: refused, such an attempt would otherwise pass as a network error."""
    del OFF_LOOPBACK[:]
    yield
    seen, OFF_LOOPBACK[:] = sorted(set(OFF_LOOPBACK)), []
    if seen:
        pytest.fail("tried to reach past loopback: " + "; ".join(seen), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def broker_home(tmp_path_factory) -> Path:
    """The suite's own state directory: no test (nor a `broker` process it starts, which inherits
    the environment) reads or writes the user's ``~/.local/state/broker`` or ``~/.cache/broker``.
    ``XDG_STATE_HOME`` and ``XDG_CACHE_HOME`` too, for a test that starts a process without the
    ``BROKER_*`` variables."""
    home = tmp_path_factory.mktemp("broker-home")
    saved = {k: os.environ.get(k) for k in ("BROKER_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")}
    os.environ["BROKER_HOME"] = str(home / "broker")
    os.environ["XDG_STATE_HOME"] = str(home)
    os.environ["XDG_CACHE_HOME"] = str(home / "cache")
    yield home
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set BROKER_SHARED_DATA)")
    return SHARED_DATA


MINI_INSTANCES = """provider,instance_type,machine_type,accelerator_type,gpu,gpus,gpu_memory_gb,vcpus,ram_gb,interconnect,interconnect_gbps,fabric_nics,source
aws,p5.48xlarge,,,H100,8,80,192,2048,efa,3200,32,test
aws,g5.xlarge,,,A10G,1,24,4,16,ethernet,10,0,test
gcp,a3-highgpu-8g,,,H100,8,80,208,1872,tcpx,1000,4,test
gcp,a2-highgpu-1g,,,A100,1,40,12,85,ethernet,24,0,test
azure,Standard_ND96isr_H100_v5,,,H100,8,80,96,1900,infiniband,3200,8,test
"""
MINI_REGIONS = """provider,region,geo,location,zones
aws,us-east-1,us,Virginia,us-east-1a us-east-1b
aws,eu-west-1,eu,Dublin,eu-west-1a
gcp,us-central1,us,Iowa,us-central1-a us-central1-b
gcp,europe-west4,eu,Eemshaven,europe-west4-a
azure,eastus,us,Virginia,1 2 3
"""
MINI_PRICES = """provider,region,instance_type,on_demand_usd,spot_usd,committed_1y_usd,as_of,source,note
aws,us-east-1,p5.48xlarge,98.32,40.00,,2026-11-01,test,
aws,eu-west-1,p5.48xlarge,100.00,,,2026-11-01,test,
aws,us-east-1,g5.xlarge,1.006,0.40,,2026-11-01,test,
gcp,us-central1,a3-highgpu-8g,88.25,30.00,,2026-11-01,test,
gcp,europe-west4,a3-highgpu-8g,90.00,32.00,,2026-11-01,test,
gcp,us-central1,a2-highgpu-1g,3.67,1.10,,2026-11-01,test,
azure,eastus,Standard_ND96isr_H100_v5,98.00,,,2026-11-01,test,
"""
MINI_NETWORK = """
[gpus]
H100 = 2.0
A100 = 1.0
A10G = 0.4

[aws]
sla_pct = 99.5
startup_s = 180
spot_interruptions_per_hour = 0.05
storage_usd_per_gb_month = 0.08
inter_zone_usd_per_gb = 0.01
inter_region_usd_per_gb = 0.02
inter_continent_usd_per_gb = 0.02
ingress_usd_per_gb = 0.0
[[aws.egress]]
up_to_gb = 10240
usd_per_gb = 0.09
[[aws.egress]]
up_to_gb = 0
usd_per_gb = 0.05

[gcp]
sla_pct = 99.5
startup_s = 120
spot_interruptions_per_hour = 0.1
storage_usd_per_gb_month = 0.04
inter_zone_usd_per_gb = 0.01
inter_region_usd_per_gb = 0.02
inter_continent_usd_per_gb = 0.08
[[gcp.egress]]
up_to_gb = 0
usd_per_gb = 0.12

[azure]
sla_pct = 99.9
startup_s = 240
spot_interruptions_per_hour = 0.08
storage_usd_per_gb_month = 0.05
inter_zone_usd_per_gb = 0.01
inter_region_usd_per_gb = 0.02
inter_continent_usd_per_gb = 0.05
[[azure.egress]]
up_to_gb = 0
usd_per_gb = 0.087
"""


@pytest.fixture(scope="session")
def mini_catalog_dir(tmp_path_factory) -> Path:
    """A tiny catalog with round numbers, so cost arithmetic can be checked by hand."""
    d = tmp_path_factory.mktemp("catalog")
    (d / "instances.csv").write_text(MINI_INSTANCES)
    (d / "regions.csv").write_text(MINI_REGIONS)
    (d / "prices.csv").write_text(MINI_PRICES)
    (d / "network.toml").write_text(MINI_NETWORK)
    return d


@pytest.fixture(scope="session")
def mini_catalog(mini_catalog_dir):
    from providers.catalog import load

    return load(mini_catalog_dir)
