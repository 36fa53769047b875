"""Boot scripts for cloud nodes: render a template into the user data a new instance runs once.

Three templates are built in (``providers/templates/*.sh``):

- ``slurm``: join the on-prem Slurm cluster as a cloud node in configless mode
  (``slurmd --conf-server HOST[:PORT] -N NODE -b``) after writing the munge key from settings.
- ``kubernetes``: ``kubeadm join`` the on-prem cluster with a bootstrap token, the API server
  address and the CA certificate hash, labelling the node with its lease.
- ``container``: run one container command with the job's environment, write its exit code to
  ``marker_path`` and, when ``callback_url`` is set, POST it there as JSON
  (``{"lease_id", "node_name", "job_id", "exit_code"}``).

An operator adds templates by name in ``[bootstrap.templates]`` (``name = "/path/to/file.sh"`` or
a built-in's name); :func:`resolve` turns the name a client sends into what :func:`render` reads.
A client names templates only: a name that is neither built in nor configured is refused, so
no request ever makes the server read a file of its choosing. Templates use
:class:`string.Template` syntax: ``$name`` or ``${name}``, and ``$$`` for a literal dollar sign.
Substitution is strict: a variable without a value is an error naming it. Every value is
substituted already shell-quoted (a value holding spaces, quotes or ``$(...)`` arrives as one
inert word), so a template never quotes a variable itself. The variables are:

- the context: ``lease_id``, ``node_name``, ``provider``, ``region``, ``job_id``,
  ``checkpoint_uri``, ``dataset_uri``;
- ``env_exports``: one ``export KEY=VALUE`` line per entry of ``env`` (sorted, quoted);
  ``env_names``: the keys, space-separated; ``env_docker_args``: ``-e KEY`` for each key;
- ``node_names``: every node of the lease; ``resolve_node_name``: shell that sets
  ``BROKER_NODE_NAME`` to this node's own name from the cloud's metadata service (a no-op for a
  one-node lease, whose name is known);
- ``broker_environment``: the block every built-in template starts with — ``export`` of
  ``BROKER_LEASE_ID``, ``BROKER_NODE_NAME``, ``BROKER_PROVIDER``, ``BROKER_REGION``,
  ``BROKER_JOB_ID``, ``BROKER_CHECKPOINT_URI``, ``BROKER_DATASET_URI``, then ``env_exports``
  and ``resolve_node_name``;
- every key of ``settings`` (flat keys, plus the keys of a nested table named like the built-in
  template, which win), and the derived values ``command_args`` (container command as argv
  words), ``callback_body_prefix`` (JSON body up to the exit code) and ``k8s_node_labels``.

Secrets (``munge_key``, ``token`` and anything listed in ``settings["secret_keys"]``) come from
settings; the rendered script therefore holds them and must never be logged. Use
:func:`redact` to show a script safely.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
import shlex
import string
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

from providers import registry
from providers.base import Fabric
from providers.files import SMALL_BYTES, read_text
from providers.registration import BootHooks

BUILTINS = ("slurm", "kubernetes", "container")

# Settings each built-in template cannot do without, and defaults for the optional ones.
REQUIRED: dict[str, tuple[str, ...]] = {
    "slurm": ("conf_server", "munge_key"),
    "kubernetes": ("api_server", "token", "ca_cert_hash"),
    "container": ("image", "command"),
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "slurm": {"munge_key_path": "/etc/munge/munge.key", "slurmd_args": []},
    "kubernetes": {"node_labels": {}, "kubelet_defaults_path": "/etc/default/kubelet"},
    "container": {"callback_url": "", "callback_token": "", "marker_path": "/var/lib/broker/job-done",
                  "workdir": ""},
}
SECRET_KEYS = ("munge_key", "token", "callback_token")
_CONTEXT_FIELDS = ("lease_id", "node_name", "provider", "region", "job_id", "checkpoint_uri", "dataset_uri")

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?\Z")
_K8S_TOKEN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}\Z")
_CA_HASH = re.compile(r"sha256:[0-9a-f]{64}\Z")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")


class BootstrapError(ValueError):
    """A template cannot be rendered: unknown template, missing or malformed setting."""


@dataclass(frozen=True, slots=True)
class BootContext:
    """What a node needs to know about itself and its job to boot into the cluster."""

    lease_id: str
    node_name: str
    provider: str
    region: str
    job_id: str = ""
    checkpoint_uri: str = ""
    dataset_uri: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    # Every node of the lease. Clouds launch a gang with one script for all its nodes, so when
    # there are several, the script asks the cloud's metadata service which one it is.
    node_names: tuple[str, ...] = ()
    # The fabric the lease's launch wired (multi-node gangs of EFA / GPUDirect / InfiniBand types):
    # the node exports its cloud's NCCL environment for it (:attr:`BootHooks.fabric_env`).
    fabric: Fabric = Fabric.ETHERNET

    def secrets(self) -> list[str]:
        """The secret values this context carries (for :func:`redact`)."""
        keys = set(SECRET_KEYS) | set(self.settings.get("secret_keys", ()))
        found: list[str] = []
        for table in (self.settings, *[v for v in self.settings.values() if isinstance(v, Mapping)]):
            for k in keys:
                v = table.get(k)
                if isinstance(v, str) and v:
                    found.append(v)
        return found


class _ShellTemplate(string.Template):
    """``$name`` / ``${name}`` with identifiers only; ``$$`` is a literal dollar."""

    idpattern = r"[a-z_][a-z0-9_]*"
    flags = re.IGNORECASE | re.ASCII


def resolve(name: str, templates: Mapping[str, Any] | None = None) -> str:
    """What :func:`render` reads for the template a client named: a built-in, or the file the
    operator configured under that name. Never a path from the client."""
    configured = dict(templates or {})
    if name in configured and isinstance(configured[name], str) and configured[name]:
        return configured[name]
    if name in BUILTINS:
        return name
    known = ", ".join(sorted(set(BUILTINS) | {k for k, v in configured.items() if isinstance(v, str) and v}))
    shown = name if len(name) <= 64 else name[:61] + "..."
    raise BootstrapError(f"boot template {shown!r} is not configured; use one of: {known}")


def template_source(template: str) -> tuple[str, str]:
    """``(label, text)`` of a built-in template name or an operator template path (from the
    configuration only: see :func:`resolve`)."""
    if template in BUILTINS:
        text = resources.files("providers").joinpath("templates", f"{template}.sh").read_text("utf-8")
        return template, text
    path = Path(template)
    if not path.is_file():
        raise BootstrapError(
            f"boot template {template!r} is neither a built-in ({', '.join(BUILTINS)}) nor a readable file"
        )
    try:
        return str(path), read_text(path, SMALL_BYTES)
    except (OSError, UnicodeDecodeError) as e:
        raise BootstrapError(f"boot template {template!r} cannot be read: {e}") from None


def render(template: str, context: BootContext) -> str:
    """The boot script for ``context`` from a built-in template name or a template file path."""
    label, text = template_source(template)
    builtin = template if template in BUILTINS else ""
    settings = _settings(context.settings, builtin)
    for key in REQUIRED.get(builtin, ()):
        if _blank(settings.get(key)):
            raise BootstrapError(f"boot template {label!r} needs setting {key!r}, which is missing or empty")
    if builtin:
        _validate(builtin, settings)
    values = _variables(context, settings, builtin)
    try:
        return _ShellTemplate(text).substitute(values)
    except KeyError as e:
        raise BootstrapError(f"boot template {label!r} uses ${e.args[0]}, which has no value") from None
    except ValueError as e:  # a stray "$" not followed by a name
        raise BootstrapError(f"boot template {label!r} is malformed: {e} (write $$ for a literal $)") from None


def redact(script: str, secrets: Iterable[str], mask: str = "***") -> str:
    """``script`` with every secret (as given, and shell-quoted) replaced by ``mask``."""
    forms: set[str] = set()
    for s in secrets:
        if s:
            forms.update((s, shlex.quote(s)))
    for s in sorted(forms, key=len, reverse=True):
        script = script.replace(s, mask)
    return script


# ---------------------------------------------------------------------------------------------


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, (str, list, tuple, dict)) and len(v) == 0)


def _settings(raw: Mapping[str, Any], builtin: str) -> dict[str, Any]:
    merged: dict[str, Any] = dict(DEFAULTS.get(builtin, {}))
    merged.update({k: v for k, v in raw.items() if not (k in BUILTINS and isinstance(v, Mapping))})
    nested = raw.get(builtin) if builtin else None
    if isinstance(nested, Mapping):
        merged.update(nested)
    return merged


def _validate(builtin: str, s: Mapping[str, Any]) -> None:
    if builtin == "slurm":
        server = str(s["conf_server"])
        if not all(_HOST_PORT.match(part) for part in server.split(",")):
            raise BootstrapError(f"setting 'conf_server' must be HOST[:PORT][,HOST[:PORT]], not {server!r}")
        try:
            key = base64.b64decode(str(s["munge_key"]), validate=True)
        except (binascii.Error, ValueError):
            raise BootstrapError("setting 'munge_key' must be the munge key encoded in base64") from None
        if len(key) < 32:
            raise BootstrapError("setting 'munge_key' decodes to fewer than 32 bytes; munge needs at least 32")
        extra = s.get("slurmd_args") or []
        if not isinstance(extra, (list, tuple)) or not all(isinstance(a, str) for a in extra):
            raise BootstrapError("setting 'slurmd_args' must be a list of strings (extra slurmd arguments)")
    elif builtin == "kubernetes":
        if not _HOST_PORT.match(str(s["api_server"])):
            raise BootstrapError(f"setting 'api_server' must be HOST:PORT, not {s['api_server']!r}")
        if not _K8S_TOKEN.match(str(s["token"])):
            raise BootstrapError("setting 'token' must be a kubeadm bootstrap token ([a-z0-9]{6}.[a-z0-9]{16})")
        if not _CA_HASH.match(str(s["ca_cert_hash"])):
            raise BootstrapError("setting 'ca_cert_hash' must be 'sha256:' followed by 64 hex digits")
    elif builtin == "container":
        cmd = s["command"]
        if not isinstance(cmd, str) and not (
            isinstance(cmd, (list, tuple)) and all(isinstance(c, str) for c in cmd)
        ):
            raise BootstrapError("setting 'command' must be a shell command string or a list of argv strings")
        url = str(s.get("callback_url") or "")
        if url and not url.startswith(("http://", "https://")):
            raise BootstrapError(f"setting 'callback_url' must be an http(s) URL, not {url!r}")


def _quote(v: Any) -> str:
    if isinstance(v, bool):
        v = "true" if v else "false"
    elif isinstance(v, (list, tuple)):
        return shlex.join(str(x) for x in v)
    elif v is None:
        v = ""
    return shlex.quote(str(v))


def _variables(ctx: BootContext, settings: Mapping[str, Any], builtin: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for k, v in ctx.env.items():
        if not _ENV_KEY.match(str(k)):
            raise BootstrapError(f"environment variable name {k!r} is not a valid shell identifier")
        env[str(k)] = "" if v is None else str(v)
    names = sorted(env)
    values: dict[str, str] = {
        k: _quote(v) for k, v in settings.items() if isinstance(k, str) and not isinstance(v, Mapping)
    }
    for name in _CONTEXT_FIELDS:
        values[name] = _quote(getattr(ctx, name))
    values["node_names"] = " ".join(shlex.quote(n) for n in (tuple(ctx.node_names) or (ctx.node_name,)))
    values["resolve_node_name"] = _resolve_node_name(ctx)
    values["env_exports"] = "\n".join(f"export {k}={shlex.quote(env[k])}" for k in names) or ":"
    values["fabric_environment"] = _fabric_environment(ctx)
    values["broker_environment"] = "\n".join(
        [f"export BROKER_{name.upper()}={values[name]}" for name in _CONTEXT_FIELDS]
        + [values["env_exports"], values["resolve_node_name"], values["fabric_environment"]])
    values["env_names"] = " ".join(names)
    values["env_docker_args"] = " ".join(f"-e {k}" for k in names)
    if builtin == "container" or "command" in settings:
        cmd = settings.get("command", "")
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        values["command_args"] = shlex.join(argv)
    head = json.dumps({"lease_id": ctx.lease_id, "node_name": ctx.node_name, "job_id": ctx.job_id})
    values["callback_body_prefix"] = shlex.quote(head[:-1] + ', "exit_code": ')
    values["callback_job_json"] = shlex.quote(json.dumps(ctx.job_id))
    values["notice_watch"] = _notice_watch(ctx.provider, settings)
    if builtin == "kubernetes" or "node_labels" in settings:
        values["k8s_node_labels"] = _quote(_node_labels(ctx, settings.get("node_labels") or {}))
    return values


# What a node does at boot on its own (learn its name, watch its interruption notices) is its
# cloud's: each registration's ``boot`` (:class:`providers.registration.BootHooks`). Notices the
# node hears are reported through the lease's callback (the ``notice`` endpoint beside ``job``).


def _fabric_environment(ctx: BootContext) -> str:
    """Shell exporting the NCCL environment for the fabric the node got (``broker_fabric_vars`` =
    the names exported; empty for Ethernet or a cloud with no environment for the fabric)."""
    fabric = Fabric(ctx.fabric)
    snippet = dict(_boot(ctx.provider).fabric_env).get(fabric.value, "") if fabric is not Fabric.ETHERNET else ""
    if not snippet:
        return 'broker_fabric_vars=""'
    return f"# {fabric.value}: the NCCL environment for the fabric this node's launch wired\n{snippet}"


def _boot(provider: str) -> BootHooks:
    """The boot hooks of ``provider`` (none for a name no registration carries: a test's fake)."""
    try:
        return registry.get(provider).boot
    except registry.UnknownCloud:
        return BootHooks()


_NOTICE_REPORT = r"""broker_notice() {  # broker_notice KIND SOURCE: tell the broker; its answer is "checkpoint"
    [ -n "${BROKER_CALLBACK_URL:-}" ] || return 0
    local node body
    node=$(printf '%s' "$BROKER_NODE_NAME" | sed 's/[\\"]/\\&/g')
    body="{\"node_name\": \"$node\", \"kind\": \"$1\", \"source\": \"$2\", \"not_before\": 0}"
    printf 'header = "Authorization: Bearer %s"\n' "$BROKER_CALLBACK_TOKEN" |
        curl -fsS --retry 5 --retry-connrefused --max-time 30 --config - \
            -H 'Content-Type: application/json' --data "$body" "${BROKER_CALLBACK_URL%/job}/notice" >/dev/null \
        && echo "broker: $1 notice ($2) reported: checkpoint now" >&2
}"""
def _notice_watch(provider: str, settings: Mapping[str, Any]) -> str:
    """Shell that watches the node's own interruption notices in the background (``notice_pid``
    its process; ``:`` work for a cloud whose notices the broker reads itself)."""
    boot = _boot(provider)
    watch = boot.notice_watch
    if not watch:
        return 'notice_pid=""  # this cloud\'s notices reach the broker directly'
    md = str(settings.get("notice_metadata_url") or boot.metadata_url)
    if not re.match(r"https?://[^\s/]+/?\Z", md):
        raise BootstrapError(f"setting 'notice_metadata_url' must be an http(s) URL with no path, not {md!r}")
    return "\n".join([f"notice_md={shlex.quote(md.rstrip('/'))}", _NOTICE_REPORT, watch,
                      "broker_watch_notices &", "notice_pid=$!"])


def _resolve_node_name(ctx: BootContext) -> str:
    """Shell that sets BROKER_NODE_NAME to this node's own name (a no-op for a one-node lease)."""
    names = tuple(ctx.node_names)
    if len(names) <= 1:
        return ":"
    whoami = _boot(ctx.provider).whoami
    if not whoami:
        raise BootstrapError(f"a {len(names)}-node lease on {ctx.provider!r} cannot tell its nodes apart at boot")
    listed = " ".join(shlex.quote(n) for n in names)
    return (
        "# The lease's nodes share this script: each asks the cloud which one it is.\n"
        f"{whoami}\n"
        f'case " {listed} " in\n'
        '    *" $BROKER_NODE_NAME "*) export BROKER_NODE_NAME ;;\n'
        '    *) echo "broker: this node (${BROKER_NODE_NAME:-unknown}) is not one of the lease\'s nodes" >&2; exit 1 ;;\n'
        "esac"
    )


def _node_labels(ctx: BootContext, extra: Mapping[str, Any]) -> str:
    labels = {"broker.io/lease": ctx.lease_id, "broker.io/provider": ctx.provider,
              "broker.io/region": ctx.region}
    labels.update({str(k): str(v) for k, v in extra.items()})
    for k, v in labels.items():
        if not _LABEL_KEY.match(k) or not _LABEL_VALUE.match(v):
            raise BootstrapError(f"node label {k}={v!r} is not a valid Kubernetes label")
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
