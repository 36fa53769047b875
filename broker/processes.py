"""`broker serve --processes N`: N serving processes on one port, and a parent that keeps them.

One grpcio server in one Python process holds one core (the GIL); N processes each bind the same
port with SO_REUSEPORT and the kernel spreads new connections over them. Process 0 is the one
that does the leader's work (it contends for leadership; the others never do) and serves
/metrics, adding up every process's samples (prometheus_client's multiprocess mode, in a
directory this parent makes and removes). Each process answers its own health checks.

Start-up: process 0 starts first and the others once it is SERVING, so the port answers as soon
as one process listens, the embedded store's schema is made by one process, and a start-up error
(a database that cannot be opened) is said once, by process 0, whose exit code the parent
returns.

A process that dies after start-up is not restarted: the parent stops the others and exits 1.
The supervisor above (systemd ``Restart=on-failure``, Kubernetes) restarts the whole broker with
its own backoff and records the crash; a parent that quietly restarted children would hide a
crash loop, and for a while leave the host without its leading process while every other process
still answered SERVING.

SIGTERM or SIGINT to the parent is passed to every process, which finishes its in-flight RPCs
and stops its loops; one still running after ``grace_s`` is killed (and the exit code is 1).
Each process also asks the kernel for SIGTERM should the parent itself die.

This module imports nothing beyond the standard library: it runs before any process listens.
"""
from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import structlog

log = structlog.get_logger("broker.processes")

GRACE_S = 30.0  # the server's 10 s grace, the loops' and the store's stop, with room to spare


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen
    ready_r: int
    ready: bool = False


def supervise(child_argv: list[str], processes: int, *, grace_s: float = GRACE_S) -> int:
    """Run ``processes`` children, each ``child_argv + ["--process", i, "--ready-fd", fd]``,
    until SIGTERM/SIGINT (then 0) or until one of them exits (then 1, or its own exit code if it
    never started: 2 for a start-up error)."""
    metrics_dir = tempfile.mkdtemp(prefix="broker-metrics-")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    stop_signal: list[int] = []
    old = {s: signal.signal(s, lambda signum, _f: stop_signal.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    old[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector
    old_wakeup = signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(wake_r, selectors.EVENT_READ, None)
    children: list[_Child] = []

    def start(i: int) -> None:
        r, w = os.pipe()
        proc = subprocess.Popen([*child_argv, "--process", str(i), "--ready-fd", str(w)], env=env,
                                pass_fds=(w,), stdin=subprocess.DEVNULL,
                                start_new_session=True)  # a terminal's ^C reaches the parent only
        os.close(w)
        children.append(_Child(i, proc, r))
        sel.register(r, selectors.EVENT_READ, children[-1])

    try:
        start(0)
        code = _watch(sel, wake_r, children, stop_signal, lambda: [start(i) for i in range(1, processes)])
        if not _stop_all(children, grace_s):
            code = code or 1
        return code
    finally:
        for c in children:
            if c.ready_r >= 0:
                os.close(c.ready_r)
        sel.close()
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old.items():
            signal.signal(s, h)
        os.close(wake_r)
        os.close(wake_w)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _watch(sel, wake_r: int, children: list[_Child], stop_signal: list[int], start_rest) -> int:
    """Wait for readiness lines, signals and exits; start the rest once process 0 serves. Returns
    the exit code to give once every child is stopped."""
    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.data is None:  # a signal arrived (its handler has run)
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                continue
            child = key.data
            chunk = os.read(child.ready_r, 64)
            if chunk.startswith(b"serving") and not child.ready:
                child.ready = True
                log.info("process_serving", process=child.index, pid=child.proc.pid)
                if child.index == 0:
                    start_rest()
            if not chunk:
                sel.unregister(child.ready_r)
                os.close(child.ready_r)
                child.ready_r = -1
        if stop_signal:
            log.info("stopping_processes", signal=signal.Signals(stop_signal[0]).name,
                     pids=[c.proc.pid for c in children])
            return 0
        dead = next((c for c in children if c.proc.poll() is not None), None)
        if dead is not None:
            rc = dead.proc.returncode
            if not dead.ready:  # its start-up error (2, said by itself) or a crash
                return rc if rc > 0 else 1
            log.error("process_died", process=dead.index, pid=dead.proc.pid, returncode=rc,
                      note="stopping every process; the service manager restarts the broker")
            return 1


def _stop_all(children: list[_Child], grace_s: float) -> bool:
    """SIGTERM every live child, wait up to ``grace_s``, then kill what is left; True if every
    child stopped within the grace."""
    for c in children:
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    clean = True
    for c in children:
        try:
            c.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("process_killed", process=c.index, pid=c.proc.pid, grace_s=grace_s)
            c.proc.kill()
            c.proc.wait()
            clean = False
    return clean


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux; elsewhere nothing),
    so a serving process never outlives a parent that was killed outright."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass
