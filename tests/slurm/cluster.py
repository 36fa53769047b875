"""A real Slurm (munged + slurmctld + slurmd) on loopback, in one private directory.

Used by the tests (and reusable by anyone who needs a real scheduler): it installs or finds the
Debian packages, writes its own config (ports, state, spool, logs, munge key and socket all under
``root``), starts the daemons, and stops them again by their PID files. Nothing under /etc is
touched and no systemd is involved. Facts this relies on are in shared/NOTES-slurm.md.

Topology: one or more on-prem nodes with fake GPUs (gres ``File=`` entries are character devices
cloned from /dev/null, which slurmd accepts) plus ``cloud_nodes`` nodes with ``State=CLOUD`` whose
Resume/Suspend/ResumeFail programs are paths the caller provides. Every node is a separate
``slurmd -N NAME`` on its own port (``MULTIPLE_SLURMD``); cloud nodes are started on demand with
``start_cloud_node`` (``slurmd -b``, so the node registers with a fresh boot time).

Example::

    cluster = SlurmCluster(tmp_path, onprem=[NodeSpec("gpu-1", gpus=4)], cloud_nodes=2)
    cluster.start()
    job = cluster.sbatch("sleep 60", gres="gpu:1")
    ...
    cluster.stop()
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")
SBIN = {
    "munged": "/usr/sbin/munged",
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
}
BIN = {
    name: f"/usr/bin/{name}"
    for name in ("squeue", "sinfo", "scontrol", "sbatch", "scancel", "srun")
}


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be installed or found on this machine (the reason is the message)."""


class SlurmError(RuntimeError):
    """A Slurm daemon or command failed; the message carries the command and its output/log tail."""


def _missing_binaries() -> list[str]:
    return [p for p in (*SBIN.values(), *BIN.values()) if not os.access(p, os.X_OK)]


def ensure_slurm_installed(*, install: bool = True, timeout: float = 600.0) -> None:
    """Find the Slurm/munge binaries, installing the Debian packages with apt-get if needed.

    Raises :class:`SlurmUnavailable` with the reason when they can be neither found nor installed.
    """
    missing = _missing_binaries()
    if not missing:
        return
    if not install:
        raise SlurmUnavailable(f"Slurm binaries missing: {', '.join(missing)}")
    if os.geteuid() != 0:
        raise SlurmUnavailable(
            f"Slurm binaries missing ({', '.join(missing)}) and not root, so apt-get cannot install "
            f"{' '.join(PACKAGES)}"
        )
    apt = shutil.which("apt-get")
    if apt is None:
        raise SlurmUnavailable(f"Slurm binaries missing ({', '.join(missing)}) and no apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", *PACKAGES]):
        try:
            r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmUnavailable(f"`{' '.join(argv)}` failed: {exc}") from exc
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise SlurmUnavailable(f"`{' '.join(argv)}` exited {r.returncode}: {' | '.join(tail)}")
    missing = _missing_binaries()
    if missing:
        raise SlurmUnavailable(f"installed {' '.join(PACKAGES)} but still missing: {missing}")


def free_port() -> int:
    """A TCP port free on loopback right now (slurm daemons bind it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class NodeSpec:
    """One node: name, CPUs, GPU count and GPU type (the gres ``Type=``)."""

    name: str
    gpus: int = 4
    gpu_type: str = "a100"
    cpus: int = 8
    memory_mb: int = 4000


@dataclass
class SlurmCluster:
    root: Path
    onprem: list[NodeSpec] = field(default_factory=lambda: [NodeSpec("gpu-1")])
    cloud_nodes: int = 0
    cloud_spec: NodeSpec = field(default_factory=lambda: NodeSpec("burst", gpus=8, gpu_type="h100"))
    resume_program: str | None = None
    suspend_program: str | None = None
    resume_fail_program: str | None = None
    suspend_time: int = 300
    suspend_timeout: int = 30
    resume_timeout: int = 120
    cluster_name: str = "brokertest"
    partition: str = "gpu"
    cloud_partition: str = "burst"
    extra_conf: str = ""

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.etc = self.root / "etc"
        self.conf = self.etc / "slurm.conf"
        self.run = self.root / "run"
        self.log = self.root / "log"
        self.state = self.root / "state"
        self.spool = self.root / "spool"
        self.dev = self.root / "dev"
        self.munge_dir = self.root / "munge"
        self.munge_socket = self.munge_dir / "sock" / "munge.socket.2"
        self.ctld_port = 0
        self.node_ports: dict[str, int] = {}
        self._started = False

    # ------------------------------------------------------------------ layout
    @property
    def cloud_names(self) -> list[str]:
        return [f"{self.cloud_spec.name}-{i}" for i in range(1, self.cloud_nodes + 1)]

    @property
    def env(self) -> dict[str, str]:
        """Environment for the Slurm client commands (squeue, sbatch, ...) of this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def pid_files(self) -> dict[str, Path]:
        files = {"munged": self.munge_dir / "munged.pid", "slurmctld": self.run / "slurmctld.pid"}
        for name in [n.name for n in self.onprem] + self.cloud_names:
            files[f"slurmd:{name}"] = self.run / f"slurmd-{name}.pid"
        return files

    def _make_dirs(self) -> None:
        for d in (self.etc, self.run, self.log, self.state, self.spool, self.dev, self.munge_dir):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        sockdir = self.munge_socket.parent
        sockdir.mkdir(parents=True, exist_ok=True)
        os.chmod(sockdir, 0o755)  # munged insists on it
        os.chmod(self.munge_dir, 0o700)
        key = self.munge_dir / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)

    def _make_gpu_devices(self, spec: NodeSpec) -> str:
        """Character devices cloned from /dev/null, one per fake GPU; returns the File= hostlist."""
        d = self.dev / spec.name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(spec.gpus):
            p = d / f"nvidia{i}"
            if not p.exists():
                os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return f"{d}/nvidia[0-{spec.gpus - 1}]" if spec.gpus > 1 else f"{d}/nvidia0"

    def write_config(self) -> None:
        self._make_dirs()
        self.ctld_port = self.ctld_port or free_port()
        for name in [n.name for n in self.onprem] + self.cloud_names:
            self.node_ports.setdefault(name, free_port())
        host = socket.gethostname().split(".")[0]
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.state}",
            f"SlurmdSpoolDir={self.spool}/%n",
            f"SlurmctldPidFile={self.run}/slurmctld.pid",
            f"SlurmdPidFile={self.run}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log}/slurmctld.log",
            f"SlurmdLogFile={self.log}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=2,sched_min_interval=0",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MinJobAge=300",
            "InactiveLimit=0",
            "KillWait=2",
            "GresTypes=gpu",
            "PrivateData=cloud",
            "TreeWidth=65533",
            f"SuspendTime={self.suspend_time}",
            f"SuspendTimeout={self.suspend_timeout}",
            f"ResumeTimeout={self.resume_timeout}",
        ]
        for key, value in (("ResumeProgram", self.resume_program),
                           ("SuspendProgram", self.suspend_program),
                           ("ResumeFailProgram", self.resume_fail_program)):
            if value:
                lines.append(f"{key}={value}")
        gres = []
        for spec in self.onprem:
            lines.append(self._node_line(spec, "State=UNKNOWN"))
            if spec.gpus:
                gres.append(f"NodeName={spec.name} Name=gpu Type={spec.gpu_type} "
                            f"File={self._make_gpu_devices(spec)}")
        for name in self.cloud_names:
            spec = NodeSpec(name, self.cloud_spec.gpus, self.cloud_spec.gpu_type,
                            self.cloud_spec.cpus, self.cloud_spec.memory_mb)
            lines.append(self._node_line(spec, "State=CLOUD"))
            if spec.gpus:
                gres.append(f"NodeName={name} Name=gpu Type={spec.gpu_type} "
                            f"File={self._make_gpu_devices(spec)}")
        onprem = ",".join(n.name for n in self.onprem)
        lines.append(f"PartitionName={self.partition} Nodes={onprem} Default=YES "
                     "MaxTime=INFINITE State=UP OverSubscribe=NO")
        if self.cloud_nodes:
            lines.append(f"PartitionName={self.cloud_partition} Nodes={','.join(self.cloud_names)} "
                         "MaxTime=INFINITE State=UP")
        if self.extra_conf:
            lines.append(self.extra_conf)
        self.conf.write_text("\n".join(lines) + "\n")
        (self.etc / "gres.conf").write_text("\n".join(gres) + "\n")

    def _node_line(self, spec: NodeSpec, state: str) -> str:
        gres = f" Gres=gpu:{spec.gpu_type}:{spec.gpus}" if spec.gpus else ""
        return (f"NodeName={spec.name} NodeAddr=127.0.0.1 NodeHostname={spec.name} "
                f"Port={self.node_ports[spec.name]} CPUs={spec.cpus} "
                f"RealMemory={spec.memory_mb}{gres} {state}")

    # ------------------------------------------------------------------ daemons
    def _log_tail(self, name: str, lines: int = 8) -> str:
        path = self.log / name
        try:
            return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return f"(no log at {path})"

    def _spawn(self, argv: list[str], log: str) -> None:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(self.conf)}
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL,
                           preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, []))
        if r.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` exited {r.returncode}: "
                             f"{(r.stderr or r.stdout).strip()} | log: {self._log_tail(log)}")

    def _wait_pid_file(self, path: Path, what: str, log: str, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = _read_pid(path)
            if pid and _alive(pid):
                return pid
            time.sleep(0.05)
        raise SlurmError(f"{what} did not start within {timeout:.0f} s: {self._log_tail(log)}")

    def start(self, *, timeout: float = 30.0) -> None:
        """Start munged, slurmctld and the on-prem slurmds; wait until the nodes are up."""
        ensure_slurm_installed()
        self.write_config()
        self._started = True
        self._spawn([SBIN["munged"], "--force", f"--key-file={self.munge_dir / 'munge.key'}",
                     f"--socket={self.munge_socket}", f"--pid-file={self.munge_dir / 'munged.pid'}",
                     f"--log-file={self.log / 'munged.log'}",
                     f"--seed-file={self.munge_dir / 'munged.seed'}"], "munged.log")
        self._wait_pid_file(self.munge_dir / "munged.pid", "munged", "munged.log")
        self._spawn([SBIN["slurmctld"], "-f", str(self.conf)], "slurmctld.log")
        self._wait_pid_file(self.run / "slurmctld.pid", "slurmctld", "slurmctld.log")
        for spec in self.onprem:
            self.start_slurmd(spec.name)
        self.wait_nodes([n.name for n in self.onprem], {"IDLE"}, timeout=timeout)

    def start_slurmd(self, name: str, *, boot: bool = False) -> int:
        argv = [SBIN["slurmd"], "-f", str(self.conf), "-N", name]
        if boot:
            argv.insert(1, "-b")
        (self.spool / name).mkdir(parents=True, exist_ok=True)
        self._spawn(argv, f"slurmd-{name}.log")
        return self._wait_pid_file(self.run / f"slurmd-{name}.pid", f"slurmd {name}",
                                   f"slurmd-{name}.log")

    def start_cloud_node(self, name: str, *, settle: float = 2.0) -> int:
        """Start the slurmd of a CLOUD node (as a ResumeProgram's boot would), with ``-b``.

        slurmctld accepts the node only if its boot time (whole seconds, and slurmd reports
        it a second early) is newer than the resume request, so a node started in the same
        second as the request would wait for ResumeTimeout: ``settle`` seconds pass first.
        """
        if name not in self.cloud_names:
            raise ValueError(f"{name} is not a cloud node of this cluster ({self.cloud_names})")
        time.sleep(settle)
        return self.start_slurmd(name, boot=True)

    def stop_slurmd(self, name: str, timeout: float = 10.0) -> None:
        _stop_pid_file(self.run / f"slurmd-{name}.pid", timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every job, then stop slurmds, slurmctld and munged by their PID files."""
        if not self._started:
            return
        if _alive(_read_pid(self.run / "slurmctld.pid")):
            self.cancel_all(wait=5.0)
        files = self.pid_files()
        order = [k for k in files if k.startswith("slurmd:")] + ["slurmctld", "munged"]
        for key in order:
            _stop_pid_file(files[key], timeout)
        self._kill_strays()
        self._started = False

    def _kill_strays(self) -> None:
        """Kill what this cluster left behind (a job step whose slurmd died before the job ended).

        Identified by ``SLURM_CONF=<this cluster's slurm.conf>`` in the process environment, which
        every daemon we started, its slurmstepds and their job processes inherit.
        """
        marker = f"SLURM_CONF={self.conf}".encode()
        me = os.getpid()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in env:
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> "SlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ commands
    def cmd(self, name: str, *args: str, check: bool = True, timeout: float = 30.0
            ) -> subprocess.CompletedProcess[str]:
        argv = [BIN.get(name, name), *args]
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` exited {r.returncode}: "
                             f"{(r.stderr or r.stdout).strip()}")
        return r

    def sbatch(self, wrap: str = "sleep 300", *, gres: str | None = None,
               partition: str | None = None, nodes: int | None = None,
               exclusive: bool = False, name: str | None = None, comment: str | None = None,
               time_limit: str | None = None, extra: tuple[str, ...] = ()) -> str:
        """Submit ``sbatch --wrap`` and return the job id."""
        args = ["--parsable", "--output=/dev/null", "--error=/dev/null", f"--chdir={self.root}"]
        if gres:
            args.append(f"--gres={gres}")
        if partition:
            args.append(f"--partition={partition}")
        if nodes:
            args.append(f"--nodes={nodes}")
        if exclusive:
            args.append("--exclusive")
        if name:
            args.append(f"--job-name={name}")
        if comment:
            args.append(f"--comment={comment}")
        if time_limit:
            args.append(f"--time={time_limit}")
        args.extend(extra)
        args.append(f"--wrap={wrap}")
        out = self.cmd("sbatch", *args).stdout.strip()
        return out.split(";")[0]

    def scontrol(self, *args: str) -> str:
        return self.cmd("scontrol", *args).stdout

    def drain(self, node: str, reason: str = "broker test") -> None:
        self.scontrol("update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        self.scontrol("update", f"nodename={node}", "state=resume")

    def cancel_all(self, wait: float = 10.0) -> None:
        self.cmd("scancel", "--user=root", check=False)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not self.active_jobs():
                return
            time.sleep(0.2)

    def jobs(self) -> list[dict]:
        """All jobs slurmctld knows (``squeue --json`` ignores filters, so this includes done ones)."""
        return json.loads(self.cmd("squeue", "--json").stdout).get("jobs", [])

    def active_jobs(self) -> list[dict]:
        return [j for j in self.jobs()
                if j.get("job_state") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING",
                                          "SUSPENDED")]

    def job_state(self, job_id: str) -> tuple[str, str]:
        for j in self.jobs():
            if str(j.get("job_id")) == str(job_id):
                return j.get("job_state", ""), j.get("state_reason", "")
        return "", ""

    def wait_job(self, job_id: str, states: set[str], timeout: float = 30.0,
                 reasons: set[str] | None = None) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        state = reason = ""
        while time.monotonic() < deadline:
            state, reason = self.job_state(job_id)
            if state in states and (reasons is None or reason.split(",")[0] in reasons):
                return state, reason
            time.sleep(0.25)
        raise SlurmError(f"job {job_id} is {state}/{reason}, not {states}/{reasons} after "
                         f"{timeout:.0f} s; {self._log_tail('slurmctld.log', 5)}")

    def node_states(self) -> dict[str, str]:
        out = self.cmd("sinfo", "--noheader", "--Node", "--format=%N %T").stdout
        states = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1].upper()
        return states

    def wait_nodes(self, names: list[str], states: set[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        current: dict[str, str] = {}
        while time.monotonic() < deadline:
            current = self.node_states()
            if all(current.get(n, "").rstrip("*~#%!") in states for n in names):
                return
            time.sleep(0.25)
        raise SlurmError(f"nodes {names} not in {states} after {timeout:.0f} s: {current}; "
                         f"{self._log_tail('slurmctld.log', 5)}")


def _read_pid(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def _stop_pid_file(path: Path, timeout: float) -> None:
    pid = _read_pid(path)
    if not _alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
