"""The suite's guard (tests/conftest.py): nothing under test reaches past loopback, neither a
connect nor a DNS lookup, and an attempt from any thread fails the test it happened in."""
from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request

import pytest

from tests import conftest


def test_a_name_lookup_off_loopback_is_refused_and_recorded():
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("prices.azure.com", 443)
    with pytest.raises(OSError):
        urllib.request.urlopen("https://prices.azure.com/api/retail/prices", timeout=2)
    assert conftest.OFF_LOOPBACK and all("prices.azure.com" in s for s in conftest.OFF_LOOPBACK)
    del conftest.OFF_LOOPBACK[:]  # seen: this test is about the guard itself


def test_a_connect_off_loopback_is_refused_and_recorded_from_any_thread():
    errors = []

    def reach():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect(("192.0.2.1", 443))  # TEST-NET-1: refused before a packet leaves
        except OSError as e:
            errors.append(e)
        finally:
            s.close()

    t = threading.Thread(target=reach)
    t.start()
    t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], ConnectionRefusedError)
    assert conftest.OFF_LOOPBACK == ["connect to 192.0.2.1"]
    del conftest.OFF_LOOPBACK[:]


def test_loopback_is_allowed():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert socket.getaddrinfo("localhost", port)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    assert conftest.OFF_LOOPBACK == []
