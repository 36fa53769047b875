"""What every fake cloud API shares: an HTTP server on 127.0.0.1, on a port the system picks,
served from a daemon thread until :meth:`LoopbackServer.stop`.

A fake subclasses :class:`LoopbackServer`, names its request handler class in :meth:`handler`
(and its thread in ``thread_name``; a fixed port in ``_port``), or makes a server of its own in
:meth:`make_server` (a WSGI app's), and gets ``start``/``stop``/``with``/``address``/``url``;
:class:`JsonGetHandler` is the handler of a read-only JSON API whose fake answers
``handle(path) -> (status, body)``.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Any, Self


class LoopbackServer:
    """An HTTP fake on loopback. ``start()`` binds and serves; ``stop()`` shuts it down (safe to
    call twice); ``with fake:`` does both."""

    thread_name = "fake-http"
    _host = "127.0.0.1"
    _port = 0  # 0: a port the system picks
    poll_interval_s = 0.05  # how soon ``stop()`` ends the serving thread
    _server: HTTPServer | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class bound to this fake."""
        raise NotImplementedError

    def make_server(self, host: str, port: int) -> HTTPServer:
        """The server ``start()`` runs: threaded, one thread a request, on :meth:`handler`."""
        server = ThreadingHTTPServer((host, port), self.handler())
        server.daemon_threads = True
        return server

    def start(self) -> Self:
        server = self.make_server(self._host, self._port)
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": self.poll_interval_s},
                         daemon=True, name=self.thread_name).start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        """The same as :attr:`address`: the base URL a client of the fake is given."""
        return self.address


class JsonGetHandler(BaseHTTPRequestHandler):
    """GET → ``fake.handle(path)`` → a JSON body with its status (HTTP/1.1, kept alive)."""

    protocol_version = "HTTP/1.1"
    fake: Any
    content_type = "application/json; charset=utf-8"

    def do_GET(self) -> None:  # noqa: N802
        status, body = self.fake.handle(self.path)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass
