"""The nodes' HTTP endpoint (``[server] callback_listen``): job reports and interruption notices,
each authenticated by the lease's own callback credential (:mod:`broker.jobs`).

- ``POST /v1/leases/{lease_id}/job``: ``{job_id, state, exit_code, checkpoint_uri, progress}``,
  handled as ``ReportJob``; the answer is ``{lease_id, job_id, state, action}`` with ``action``
  continue | checkpoint | stop.
- ``POST /v1/leases/{lease_id}/notice``: ``{node_name, kind, source, not_before}``
  (:mod:`broker.interruption`); answered 202 with the replacement's lease id.

Every request carries ``Authorization: Bearer <lease credential>``. The credential is checked
before anything else is looked up or read (401, the same for every unknown, revoked or missing
credential); a credential of another lease is 403 and its lease is never looked up. The path is
parsed, never used to name anything on the server; bodies are bounded (``MAX_BODY``) and need a
``Content-Length``; connections are bounded (``MAX_CONNECTIONS``) and time out.
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from broker.errors import BrokerError, InvalidArgument, PermissionDenied, Unauthenticated, outcome

log = structlog.get_logger("broker.callback")

MAX_BODY = 16 * 1024
MAX_CONNECTIONS = 64
TIMEOUT_S = 10.0
_ROUTE = re.compile(r"/v1/leases/([A-Za-z0-9][A-Za-z0-9._-]{0,127})/(job|notice)\Z")
_HTTP = {"INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
         "FAILED_PRECONDITION": 409, "ALREADY_EXISTS": 409, "ABORTED": 409, "RESOURCE_EXHAUSTED": 429,
         "UNAVAILABLE": 503}


class _Status(Exception):
    """An HTTP-level refusal (411, 413) with its sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def handle(service, lease_id: str, what: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One authenticated request about ``lease_id``: (HTTP status, JSON answer)."""
    from broker.jobs import JobReport

    if what == "job":
        report = JobReport(lease_id, body.get("job_id", ""), body.get("state", ""), body.get("exit_code"),
                           body.get("checkpoint_uri") or "", body.get("progress"))
        lease, action = service.report_job(report)
        return 200, {"lease_id": lease.lease_id, "job_id": report.job_id, "state": report.state,
                     "action": action.value}
    from broker.interruption import notice_from, on_notice

    notice = notice_from(lease_id, body)
    lease, replacement = on_notice(service.lifecycle, service.lifecycle.get(lease_id), notice, service.clock())
    if replacement is not None:
        service.provision_soon(replacement)
    return 202, {"lease_id": lease.lease_id, "replacement": replacement.lease_id if replacement else "",
                 "action": "checkpoint"}


class _Handler(BaseHTTPRequestHandler):
    server_version = "broker-callback"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = TIMEOUT_S

    def do_POST(self) -> None:  # noqa: N802
        try:
            status, answer = self._answer()
        except _Status as e:
            status, answer = e.status, {"error": str(e)}
        except BrokerError as e:
            status, answer = _HTTP.get(outcome(e).status.name, 500), {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - the node gets a reference, the log the details
            import uuid

            from sqlalchemy import exc as db

            if isinstance(e, (db.OperationalError, db.InterfaceError, db.TimeoutError)):
                status, answer = 503, {"error": "the database is unavailable; retry shortly."}
            else:
                ref = uuid.uuid4().hex[:12]
                log.error("callback_internal_error", ref=ref, exc_info=e)
                status, answer = 500, {"error": f"internal error (the server logged it as ref {ref})."}
        self._send(status, answer)

    def _answer(self) -> tuple[int, dict[str, Any]]:
        m = _ROUTE.match(self.path)
        if m is None:
            return 404, {"error": "no such endpoint: POST /v1/leases/{lease_id}/job or /notice."}
        lease_id, what = m.groups()
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        owner = self.server.service.credentials.lease_of(token.strip()) if scheme.lower() == "bearer" else None
        if owner is None:
            raise Unauthenticated("a valid lease callback credential is required (Authorization: Bearer).")
        if owner != lease_id:
            raise PermissionDenied("this credential reports for its own lease only.")
        return handle(self.server.service, lease_id, what, self._body())

    def _body(self) -> dict[str, Any]:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit() or len(length) > 12:
            self.close_connection = True
            raise _Status(411, "a Content-Length header is required.")
        if int(length) > MAX_BODY:
            self.close_connection = True  # the body is not read
            raise _Status(413, f"the body is larger than {MAX_BODY} bytes.")
        raw = self.rfile.read(int(length))
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise InvalidArgument("the body must be a JSON object.") from None
        if not isinstance(body, dict):
            raise InvalidArgument("the body must be a JSON object.")
        return body

    def _send(self, status: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="broker-callback"')
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _refuse_method(self) -> None:
        self.close_connection = True
        self._send(405, {"error": "only POST is served here."})

    do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = _refuse_method  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - structlog instead
        log.debug("callback_request", client=self.client_address[0], request=(format % args)[:200])


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, service) -> None:
        import socket

        if ":" in address[0]:  # an IPv6 literal ([::1]:port)
            self.address_family = socket.AF_INET6
        self.service = service
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):  # too many at once: refused, nothing read
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            finally:
                self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class CallbackServer:
    """The endpoint bound to ``listen`` (host:port) and served on a thread."""

    def __init__(self, service, listen: str) -> None:
        from broker.config import split_host_port

        host, port = split_host_port(listen)
        self._server = _Server((host.strip("[]"), port), service)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="callback", daemon=True)

    def start(self) -> "CallbackServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
