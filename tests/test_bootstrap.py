"""Boot-script templates: rendering, quoting, and running the scripts with bash against stand-in tools."""
from __future__ import annotations

import base64
import json
import shlex
import stat
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from providers.bootstrap import BUILTINS, BootContext, BootstrapError, redact, render

MUNGE_KEY_BYTES = bytes(range(256)) * 4
MUNGE_KEY = base64.b64encode(MUNGE_KEY_BYTES).decode()
TOKEN = "abcdef.0123456789abcdef"
CA_HASH = "sha256:" + "ab" * 32
SETTINGS = {
    "conf_server": "slurmctl.example.org:6817",
    "munge_key": MUNGE_KEY,
    "api_server": "10.0.0.1:6443",
    "token": TOKEN,
    "ca_cert_hash": CA_HASH,
    "image": "nvcr.io/nvidia/pytorch:24.01-py3",
    "command": ["torchrun", "--nproc-per-node=8", "train.py"],
}
HOSTILE = {
    "QUOTE": "it's \"quoted\"",
    "SUBST": "$(touch pwned-subst)",
    "BACKTICK": "`touch pwned-backtick`",
    "SEMI": "x'; touch pwned-semi; echo '",
    "NEWLINE": "line1\nline2\n",
    "GLOB": "* ? [a-z]",
    "BACKSLASH": "\\n \\\\ \\",
    "DOLLAR": "$HOME ${PATH} $$",
    "UNICODE": "héllo ☃",
    "EMPTY": "",
}


def ctx(**kw) -> BootContext:
    base = dict(lease_id="lease-7", node_name="burst-1", provider="aws", region="us-east-1", job_id="1234",
                checkpoint_uri="s3://ckpt/run 1/", dataset_uri="s3://data/set", env={}, settings=SETTINGS)
    base.update(kw)
    return BootContext(**base)


def tool(bindir: Path, name: str, body: str) -> None:
    """A stand-in executable on PATH that records how it was called."""
    path = bindir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


RECORD = 'out="$TOOL_LOG/$(basename "$0")"; printf "%s\\0" "$@" > "$out.args"; env -0 > "$out.env"\n'


def run(script: str, tmp: Path, tools: dict[str, str]) -> subprocess.CompletedProcess:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    for name, body in tools.items():
        tool(bindir, name, body)
    path = tmp / "boot.sh"
    path.write_text(script)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "TOOL_LOG": str(tmp), "HOME": str(tmp)}
    return subprocess.run(["bash", str(path)], cwd=tmp, env=env, capture_output=True, text=True, timeout=30)


def recorded(tmp: Path, name: str) -> tuple[list[str], dict[str, str]]:
    args = (tmp / f"{name}.args").read_bytes().split(b"\0")[:-1]
    env = dict(e.split("=", 1) for e in (tmp / f"{name}.env").read_bytes().decode().split("\0") if "=" in e)
    return [a.decode() for a in args], env


@pytest.mark.parametrize("template", BUILTINS)
def test_each_builtin_renders_valid_bash(template, tmp_path):
    script = render(template, ctx(env={"A": "1"}))
    assert script.startswith("#!/bin/bash\n")
    assert "$lease_id" not in script and "burst-1" in script
    path = tmp_path / "s.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_container_runs_the_command_with_the_jobs_env_and_writes_the_marker(tmp_path):
    marker = tmp_path / "state" / "done"
    script = render("container", ctx(env=HOSTILE, settings={**SETTINGS, "marker_path": str(marker)}))
    result = run(script, tmp_path, {"docker": RECORD + "exit 3\n"})

    assert result.returncode == 3, result.stderr
    assert marker.read_text() == "3\n"
    args, env = recorded(tmp_path, "docker")
    for key, value in HOSTILE.items():
        assert env[key] == value, key
        assert ["-e", key] == args[args.index(key) - 1: args.index(key) + 1]
    assert env["BROKER_LEASE_ID"] == "lease-7" and env["BROKER_CHECKPOINT_URI"] == "s3://ckpt/run 1/"
    assert args[:2] == ["run", "--rm"] and "--gpus" in args
    assert args[-4:] == ["nvcr.io/nvidia/pytorch:24.01-py3", "torchrun", "--nproc-per-node=8", "train.py"]
    assert not list(tmp_path.glob("pwned*"))


def test_container_shell_command_string_is_one_sh_c_argument(tmp_path):
    command = "python train.py --name 'a b' && echo $HOME; touch pwned-cmd"
    script = render("container", ctx(settings={**SETTINGS, "command": command,
                                              "marker_path": str(tmp_path / "done")}))
    assert run(script, tmp_path, {"docker": RECORD}).returncode == 0
    args, _ = recorded(tmp_path, "docker")
    assert args[-3:] == ["sh", "-c", command]  # handed over verbatim, run inside the container only
    assert not list(tmp_path.glob("pwned*"))


def test_container_reports_completion_to_the_callback(tmp_path):
    bodies: list[dict] = []
    headers: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            headers.append(self.headers.get("Authorization", ""))
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1/leases/lease-7/done"
        job = 'j "7" \\ $(touch pwned-job)'
        script = render("container", ctx(lease_id='lease-"7"', job_id=job, settings={
            **SETTINGS, "callback_url": url, "callback_token": "brl_secret-of-lease-7",
            "marker_path": str(tmp_path / "done")}))
        result = run(script, tmp_path, {"docker": RECORD + "exit 0\n"})
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    # "running" before the container starts, then its end; the lease's credential on each
    assert bodies == [{"job_id": job, "node_name": "burst-1", "state": "running"},
                      {"job_id": job, "node_name": "burst-1", "state": "succeeded", "exit_code": 0}]
    assert headers == ["Bearer brl_secret-of-lease-7"] * 2
    assert (tmp_path / "done").read_text() == "0\n"
    assert not list(tmp_path.glob("pwned*"))
    # the credential is a secret: redacted with the others, and handed to the job to report with
    assert "brl_secret-of-lease-7" not in redact(script, ctx(settings={"callback_token": "brl_secret-of-lease-7"}).secrets())
    _, env = recorded(tmp_path, "docker")
    assert env["BROKER_CALLBACK_TOKEN"] == "brl_secret-of-lease-7" and env["BROKER_CALLBACK_URL"] == url


def test_slurm_writes_the_munge_key_and_starts_slurmd_configless(tmp_path):
    key_path = tmp_path / "munge" / "munge.key"
    script = render("slurm", ctx(env=HOSTILE, settings={**SETTINGS, "munge_key_path": str(key_path)}))
    result = run(script, tmp_path, {
        "slurmd": RECORD, "chown": RECORD, "runuser": RECORD,
        "systemctl": 'if [ "$1" = list-unit-files ]; then exit 0; fi\n' + RECORD,
    })

    assert result.returncode == 0, result.stderr
    assert key_path.read_bytes() == MUNGE_KEY_BYTES
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o400
    args, env = recorded(tmp_path, "slurmd")
    assert args == ["--conf-server", "slurmctl.example.org:6817", "-N", "burst-1", "-b"]
    assert env["SUBST"] == HOSTILE["SUBST"] and env["BROKER_NODE_NAME"] == "burst-1"
    assert recorded(tmp_path, "chown")[0][0] == "munge:munge"
    assert recorded(tmp_path, "systemctl")[0] == ["restart", "munge"]
    assert not list(tmp_path.glob("pwned*"))


def test_kubernetes_joins_with_token_and_ca_hash(tmp_path):
    defaults = tmp_path / "default" / "kubelet"
    script = render("kubernetes", ctx(settings={**SETTINGS, "kubelet_defaults_path": str(defaults),
                                                 "kubernetes": {"node_labels": {"gpu": "a100"}}}))
    result = run(script, tmp_path, {"kubeadm": RECORD})

    assert result.returncode == 0, result.stderr
    args, _ = recorded(tmp_path, "kubeadm")
    assert args == ["join", "10.0.0.1:6443", "--token", TOKEN, "--discovery-token-ca-cert-hash", CA_HASH,
                    "--node-name", "burst-1"]
    assert defaults.read_text() == ("KUBELET_EXTRA_ARGS=--node-labels=broker.io/lease=lease-7,"
                                    "broker.io/provider=aws,broker.io/region=us-east-1,gpu=a100\n")


def test_nested_settings_table_wins_over_flat_keys():
    script = render("slurm", ctx(settings={**SETTINGS, "slurm": {"conf_server": "other:7000",
                                                                    "slurmd_args": ["--extra", "a b"]}}))
    assert "--conf-server other:7000 -N \"$BROKER_NODE_NAME\" -b --extra 'a b'" in script
    assert "export BROKER_NODE_NAME=burst-1" in script


@pytest.mark.parametrize("template,missing", [(t, k) for t, keys in
                                              [("slurm", ("conf_server", "munge_key")),
                                               ("kubernetes", ("api_server", "token", "ca_cert_hash")),
                                               ("container", ("image", "command"))] for k in keys])
def test_missing_setting_is_named(template, missing):
    settings = {k: v for k, v in SETTINGS.items() if k != missing}
    with pytest.raises(BootstrapError) as e:
        render(template, ctx(settings=settings))
    assert repr(missing) in str(e.value)


@pytest.mark.parametrize("template,key,value", [
    ("slurm", "conf_server", "ctl; reboot"),
    ("slurm", "munge_key", "not base64!"),
    ("slurm", "munge_key", base64.b64encode(b"short").decode()),
    ("slurm", "slurmd_args", "--a --b"),
    ("kubernetes", "token", "not-a-token"),
    ("kubernetes", "ca_cert_hash", "md5:abc"),
    ("kubernetes", "api_server", "https://x:6443/"),
    ("container", "command", 42),
    ("container", "callback_url", "file:///etc/passwd"),
])
def test_malformed_setting_is_named(template, key, value):
    with pytest.raises(BootstrapError) as e:
        render(template, ctx(settings={**SETTINGS, key: value}))
    assert repr(key) in str(e.value)


def test_bad_env_names_and_labels_are_refused():
    with pytest.raises(BootstrapError, match="not a valid shell identifier"):
        render("container", ctx(env={"BAD-NAME": "x"}))
    with pytest.raises(BootstrapError, match="not a valid Kubernetes label"):
        render("kubernetes", ctx(lease_id="lease with spaces"))


def test_operator_template_file(tmp_path):
    path = tmp_path / "custom.sh"
    path.write_text("#!/bin/sh\necho $node_name ${region} $job_id costs $$5\n$env_exports\n")
    script = render(str(path), ctx(env={"K": "v w"}))
    assert script == "#!/bin/sh\necho burst-1 us-east-1 1234 costs $5\nexport K='v w'\n"


def test_operator_template_errors_name_the_problem(tmp_path):
    path = tmp_path / "custom.sh"
    path.write_text("echo $no_such_value\n")
    with pytest.raises(BootstrapError, match=r"\$no_such_value"):
        render(str(path), ctx())
    path.write_text("echo $ 5\n")
    with pytest.raises(BootstrapError, match=r"\$\$"):
        render(str(path), ctx())
    with pytest.raises(BootstrapError, match="neither a built-in"):
        render(str(tmp_path / "absent.sh"), ctx())
    with pytest.raises(BootstrapError, match="neither a built-in"):
        render("ansible", ctx())


def test_redact_hides_secrets_in_every_form():
    c = ctx(settings={**SETTINGS, "munge_key": MUNGE_KEY, "secret_keys": ["image"]})
    script = render("slurm", c) + render("kubernetes", c) + render("container", c)
    assert MUNGE_KEY in script and TOKEN in script
    secrets = c.secrets()
    assert set(secrets) == {MUNGE_KEY, TOKEN, SETTINGS["image"]}
    shown = redact(script, secrets)
    assert MUNGE_KEY not in shown and TOKEN not in shown and SETTINGS["image"] not in shown
    assert "***" in shown and "burst-1" in shown
    quoted = redact("x " + shlex.quote("se cret") + " y", ["se cret"])
    assert quoted == "x *** y"


def test_env_exports_are_sorted_and_empty_env_is_a_no_op():
    c = ctx(env={"B": "2", "A": "1"})
    assert "export A=1\nexport B=2\n" in render("container", c)
    assert "\n:\n" in render("container", ctx(env={}))


@pytest.mark.parametrize("provider, probe", [
    ("aws", "meta-data/tags/instance/Name"),
    ("gcp", "computeMetadata/v1/instance/name"),
    ("azure", "metadata/instance/compute/name"),
])
@pytest.mark.parametrize("template", ["slurm", "kubernetes", "container"])
def test_a_gang_shares_one_script_and_each_node_finds_its_name(template, provider, probe, tmp_path):
    import subprocess

    settings = {"conf_server": "ctl:6817", "munge_key": base64.b64encode(b"k" * 32).decode(), "api_server": "10.0.0.1:6443",
                "token": "abcdef.0123456789abcdef", "ca_cert_hash": "sha256:" + "0" * 64,
                "image": "ghcr.io/acme/train:1", "command": "python train.py"}
    one = render(template, BootContext("l-1", "burst-1", provider, "r", settings=settings, node_names=("burst-1",)))
    two = render(template, BootContext("l-1", "burst-1", provider, "r", settings=settings,
                                       node_names=("burst-1", "burst-2")))
    assert probe not in one  # one node: its name is fixed in the script
    assert probe in two and "burst-2" in two
    for script in (one, two):
        path = tmp_path / "boot.sh"
        path.write_text(script)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0  # valid bash
    if template == "slurm":
        assert '-N "$BROKER_NODE_NAME"' in two


def test_a_gang_on_an_unknown_cloud_is_refused():
    with pytest.raises(BootstrapError, match="cannot tell its nodes apart"):
        render("container", BootContext("l-1", "n-1", "oracle", "r", settings={"image": "x", "command": "y"},
                                        node_names=("n-1", "n-2")))
