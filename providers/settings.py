"""The ``[providers.*]`` tables as typed settings, and the schema machinery the whole configuration
file is read with.

Built on msgspec (``Struct(forbid_unknown_fields=True)`` and ``msgspec.convert``): it checks
types, refuses unknown keys and costs ~15 ms of imports, against ~270 ms for pydantic-settings
(measured on the ``broker --help`` path; see the README). msgspec reports where a value is wrong
but not which key of a table it sat under, nor which key was meant; :func:`convert` adds both, so
every problem is one sentence naming the full dotted key::

    budgets.default.usd_per_hr is not a setting (did you mean usd_per_hour?)

No cloud SDK is imported here: the schema is checked before any provider is built.
"""
from __future__ import annotations

import difflib
import ipaddress
import math
import re
import uuid
from typing import Annotated, Any, Literal, Mapping, Union, get_args, get_origin
from urllib.parse import urlsplit

import msgspec

__all__ = ["AwsSettings", "AzureSettings", "GcpSettings", "LambdaSettings", "PROVIDER_SETTINGS", "ProvidersSettings",
           "SettingsError", "Table", "convert", "is_loopback_url"]

#: No number anywhere in the configuration may be larger than this in magnitude (nor NaN or inf).
NUMBER_LIMIT = 1_000_000_000


class SettingsError(ValueError):
    """A settings table is wrong; the message is one sentence naming the dotted key. The broker
    reports it as :class:`broker.errors.ConfigError` (exit 2)."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class Table(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A configuration table: typed keys with defaults, no unknown key accepted.

    ``__post_init__`` checks that reach beyond one value raise ``ValueError("KEY sentence")``
    with KEY a key of this table; :func:`convert` prefixes the table's path."""


def bad(key: str, sentence: str) -> ValueError:
    return ValueError(f"{key} {sentence}")


Seconds = Annotated[float, msgspec.Meta(gt=0, le=NUMBER_LIMIT)]
Count = Annotated[int, msgspec.Meta(ge=0, le=NUMBER_LIMIT)]


# ---------------------------------------------------------------------------------------------
# converting, with sentences that name the key


def convert(raw: Any, typ: Any, where: str = "", sources: Mapping[str, str] | None = None) -> Any:
    """``raw`` (plain TOML data) as ``typ``, or :class:`SettingsError` naming the dotted key.

    ``where`` prefixes every key (``providers.aws``); ``sources`` maps a dotted key to the
    environment variable that set it, so the sentence names the variable the user wrote."""
    _check_numbers(raw, where)
    try:
        return msgspec.convert(raw, typ, strict=True)
    except msgspec.ValidationError as e:
        raise _sentence(str(e), raw, typ, where, sources or {}) from None


def _check_numbers(value: Any, path: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or abs(value) > NUMBER_LIMIT:
            raise SettingsError(f"{path or 'value'} must be a finite number of at most {NUMBER_LIMIT:,} "
                                f"in magnitude, got {value!r}", path)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_numbers(v, f"{path}[{i}]")


_AT = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>.*)`$", re.S)
_TOKEN = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+|\.\.\.)\]")


def _unwrap(typ: Any) -> Any:
    """The one structured type inside Annotated / Optional / a union with str/scalars."""
    while True:
        origin = get_origin(typ)
        if origin is Annotated:
            typ = get_args(typ)[0]
        elif origin is Union or type(typ).__name__ == "UnionType":
            args = [a for a in get_args(typ) if a is not type(None)]
            structured = [a for a in args if _is_table(a) or get_origin(a) in (dict, list, tuple)]
            typ = structured[0] if structured else args[0]
        else:
            return typ


def _is_table(typ: Any) -> bool:
    return isinstance(typ, type) and issubclass(typ, msgspec.Struct)


def _field_types(typ: Any) -> dict[str, Any]:
    return {f.encode_name: f.type for f in msgspec.structs.fields(typ)}


def _locate(raw: Any, typ: Any, tokens: list[tuple[str, str]]) -> tuple[list[str], Any, Any]:
    """Walk ``tokens`` of a msgspec path through the data and the type: (keys, value, type)."""
    keys: list[str] = []
    for name, index in tokens:
        typ = _unwrap(typ)
        if name:
            keys.append(name)
            raw = raw.get(name) if isinstance(raw, Mapping) else None
            typ = _field_types(typ).get(name, Any) if _is_table(typ) else Any
        elif index == "...":  # a key of a table msgspec does not name: find the entry that fails
            value_type = get_args(typ)[1] if get_origin(typ) is dict else Any
            found = None
            for k, v in (raw.items() if isinstance(raw, Mapping) else ()):
                try:
                    msgspec.convert(v, value_type, strict=True)
                except msgspec.ValidationError:
                    found = (k, v)
                    break
            if found is None:
                return keys + ["?"], None, Any
            keys.append(str(found[0]))
            raw, typ = found[1], value_type
        else:
            if keys:
                keys[-1] += f"[{index}]"
            else:
                keys.append(f"[{index}]")
            raw = raw[int(index)] if isinstance(raw, (list, tuple)) and int(index) < len(raw) else None
            args = get_args(typ)
            typ = args[0] if args else Any
    return keys, raw, _unwrap(typ)


def _sentence(text: str, raw: Any, typ: Any, where: str, sources: Mapping[str, str]) -> SettingsError:
    m = _AT.match(text)
    msg, path = (m["msg"], m["path"]) if m else (text, "")
    keys, value, here = _locate(raw, typ, [(a or "", b or "") for a, b in _TOKEN.findall(path)])
    prefix = ".".join(p for p in (where, *keys) if p)

    def env_of(key: str) -> str:
        """The environment variable that set ``key`` or a key inside it, if one did."""
        return next((v for k, v in sources.items() if k == key or k.startswith(f"{key}.")), "")

    def name(key: str) -> str:
        env = env_of(key)
        return f"environment variable {env} (setting {key})" if env else key

    unknown = re.match(r"Object contains unknown field `(.+)`", msg)
    if unknown:
        key = f"{prefix}.{unknown[1]}" if prefix else unknown[1]
        known = sorted(_field_types(here)) if _is_table(here) else []
        close = difflib.get_close_matches(unknown[1], known, n=1, cutoff=0.6)
        env = env_of(key)
        if env:
            meant = f"{prefix}.{close[0]}" if close and prefix else (close[0] if close else "")
            wrong, right = (f"BROKER_{k.upper().replace('.', '__')}" for k in (key, meant))
            hint = f" (did you mean {env.replace(wrong, right, 1)}?)" if meant else ""
            return SettingsError(f"environment variable {env} names {key}, which is not a setting{hint}", key)
        hint = f" (did you mean {close[0]}?)" if close else (f"; known: {', '.join(known)}" if known else "")
        return SettingsError(f"{key} is not a setting{hint}", key)
    missing = re.match(r"Object missing required field `(.+)`", msg)
    if missing:
        key = f"{prefix}.{missing[1]}" if prefix else missing[1]
        return SettingsError(f"{name(key)} is required", key)
    if _is_table(here) and not re.match(r"Expected `", msg):
        first = msg.split(" ", 1)[0]
        if first.split(".")[0].split("[")[0] in _field_types(here):  # "KEY sentence" from __post_init__
            key = f"{prefix}.{first}" if prefix else first
            return SettingsError(f"{name(key)} {msg.split(' ', 1)[1]}", key)
        return SettingsError(f"{name(prefix)}: {msg}", prefix)
    expected = re.match(r"Expected `(.+?)`(?:, got `(.+)`)?(.*)", msg)
    if expected:
        want = expected[1].replace(" | null", "").replace("str", "a string").replace("bool", "true or false")
        want = want.replace("int", "a whole number").replace("float", "a number").replace("array", "a list")
        want = want.replace("object", "a table")
        bound = expected[3].strip()
        got = f", got {value!r}" if value is not None else ""
        return SettingsError(f"{name(prefix)} must be {want}{(' ' + bound) if bound else ''}{got}", prefix)
    invalid = re.match(r"Invalid enum value (.+)", msg)
    if invalid:
        choices = [a for a in get_args(here) if isinstance(a, str)] if get_origin(here) is Literal else []
        one_of = f"; one of {', '.join(choices)}" if choices else ""
        return SettingsError(f"{name(prefix)} cannot be {invalid[1]}{one_of}", prefix)
    return SettingsError(f"{name(prefix)}: {msg}", prefix)


# ---------------------------------------------------------------------------------------------
# small checks the providers share


def is_loopback_url(url: str) -> bool:
    """True when ``url`` points at this machine (127.0.0.0/8, ::1 or localhost)."""
    host = urlsplit(url if "//" in url else f"//{url}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_anonymous(credentials: str, endpoint: str, endpoint_key: str) -> None:
    """``credentials = "anonymous"`` is for emulators and tests on loopback only."""
    if credentials == "anonymous" and not (endpoint and is_loopback_url(endpoint)):
        raise bad("credentials", f"= \"anonymous\" is only accepted with {endpoint_key} on a loopback address")


# ---------------------------------------------------------------------------------------------
# AWS

_REGION_RE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+\Z")
_AMI_RE = re.compile(r"ami-[0-9a-f]{8,17}\Z")
_SUBNET_RE = re.compile(r"subnet-[0-9a-f]{8,17}\Z")
_SG_RE = re.compile(r"sg-[0-9a-f]{8,17}\Z")
_PROFILE_RE = re.compile(r"(arn:aws[a-z-]*:iam::\d{12}:instance-profile/)?[\w+=,.@/-]{1,128}\Z")
AwsTimeout = Annotated[float, msgspec.Meta(gt=0, le=3600)]


class AwsSettings(Table):
    """``[providers.aws]``: regions, one AMI per region (``"*"`` = every region) and networking."""

    enabled: bool = False
    regions: tuple[str, ...] = ()
    endpoint_url: str = ""
    credentials: Literal["default", "anonymous"] = "default"
    image_id: Union[str, dict[str, str]] = ""
    subnet_ids: dict[str, Union[str, dict[str, str]]] = {}
    zones: dict[str, tuple[str, ...]] = {}
    security_group_ids: Union[tuple[str, ...], dict[str, tuple[str, ...]]] = ()
    key_name: Annotated[str, msgspec.Meta(max_length=255)] = ""
    iam_instance_profile: str = ""
    root_volume_gb: Annotated[int, msgspec.Meta(ge=0, le=65536)] = 0
    connect_timeout_s: AwsTimeout = 5.0
    read_timeout_s: AwsTimeout = 30.0
    terminate_timeout_s: AwsTimeout = 600.0
    # SQS queue that EventBridge routes interruption notices into ("" = none; see deploy/aws).
    interruption_queue_url: str = ""
    interruption_wait_s: Annotated[float, msgspec.Meta(ge=0, le=20)] = 10.0  # SQS long poll

    def __post_init__(self) -> None:
        if self.interruption_queue_url and not re.match(r"https?://[^/\s]+/\d{12}/[\w-]{1,80}(\.fifo)?\Z",
                                                        self.interruption_queue_url):
            raise bad("interruption_queue_url", "must be an SQS queue URL like "
                      "\"https://sqs.us-east-1.amazonaws.com/123456789012/broker-interruptions\"")
        if not all(_REGION_RE.match(r) for r in self.regions):
            raise bad("regions", "must be a list of region names like \"us-east-1\"")
        if len(set(self.regions)) != len(self.regions):
            raise bad("regions", "lists a region twice")
        if self.endpoint_url and not re.match(r"https?://[^/\s]+", self.endpoint_url):
            raise bad("endpoint_url", "must be an http(s) URL")
        _check_anonymous(self.credentials, self.endpoint_url, "providers.aws.endpoint_url")
        for region, ami in self.image_ids.items():
            if not _AMI_RE.match(ami):
                where = "image_id" if region == "*" else f"image_id.{region}"
                raise bad(where, "must be an AMI id like \"ami-0abc12345def67890\"")
        for region, value in self.subnet_ids.items():
            key = f"subnet_ids.{region}"
            if not _REGION_RE.match(region):
                raise bad(key, "is not keyed by a region name")
            if isinstance(value, str) and not _SUBNET_RE.match(value):
                raise bad(key, "must be a subnet id like \"subnet-0abc1234\"")
            if isinstance(value, dict) and (not value or not all(
                    z.startswith(region) and _SUBNET_RE.match(s) for z, s in value.items())):
                raise bad(key, f"must map zones of {region} to subnet ids")
        for region, zs in self.zones.items():
            if not zs or not all(z.startswith(region) and len(z) > len(region) for z in zs):
                raise bad(f"zones.{region}", f"must be a non-empty list of zones of {region}")
        groups = self.security_group_ids
        for region, sgs in (groups.items() if isinstance(groups, dict) else [("", groups)]):
            if not all(_SG_RE.match(s) for s in sgs):
                raise bad("security_group_ids" + (f".{region}" if region else ""),
                          "must list security group ids like \"sg-0abc1234\"")
        if self.iam_instance_profile and not _PROFILE_RE.match(self.iam_instance_profile):
            raise bad("iam_instance_profile", "must be an instance profile name or ARN")
        if self.enabled:
            if not self.regions:
                raise bad("regions", "is required: a non-empty list of region names like \"us-east-1\"")
            if not self.image_ids:
                raise bad("image_id", "is required: an AMI id, or a table of region = AMI id")
            missing = [r for r in self.regions if r not in self.image_ids and "*" not in self.image_ids]
            if missing:
                raise bad("image_id", f"has no AMI for region {missing[0]}")

    @property
    def anonymous(self) -> bool:
        return self.credentials == "anonymous"

    @property
    def image_ids(self) -> dict[str, str]:
        """Region → AMI (key ``"*"`` applies to every region)."""
        if isinstance(self.image_id, str):
            return {"*": self.image_id} if self.image_id else {}
        return dict(self.image_id)

    def image_for(self, region: str) -> str:
        ids = self.image_ids
        return ids.get(region) or ids.get("*", "")

    def security_groups_for(self, region: str) -> tuple[str, ...]:
        groups = self.security_group_ids
        if isinstance(groups, dict):
            return groups.get(region, groups.get("*", ()))
        return groups


# ---------------------------------------------------------------------------------------------
# Google Cloud

GCP_DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"


class GcpSettings(Table):
    """``[providers.gcp]``: project, regions (zones optional) and the VM template."""

    enabled: bool = False
    project: str = ""
    regions: tuple[str, ...] = ()
    zones: dict[str, tuple[str, ...]] = {}
    api_endpoint: str = ""
    credentials: str = ""  # "" / "default" / "adc", a service-account key file, or "anonymous"
    network: str = "global/networks/default"
    subnetworks: dict[str, str] = msgspec.field(default_factory=dict, name="subnetwork")
    image: str = GCP_DEFAULT_IMAGE
    boot_disk_gb: Annotated[int, msgspec.Meta(ge=10, le=65536)] = 100
    boot_disk_type: str = "pd-balanced"
    service_account: str = ""
    external_ip: bool = False
    compact_placement: bool = False
    timeout_s: Seconds = 60.0
    operation_timeout_s: Seconds = 900.0
    billing_api_endpoint: str = ""  # Cloud Billing Catalog (live prices); empty = Google's
    # How often the leader lists compute.instances.preempted operations (0 = never).
    preemption_poll_s: Annotated[float, msgspec.Meta(ge=0, le=NUMBER_LIMIT)] = 10.0

    def __post_init__(self) -> None:
        self.project, self.api_endpoint = self.project.strip(), self.api_endpoint.strip()
        if self.billing_api_endpoint and not re.match(r"https?://[^/\s]+/?$", self.billing_api_endpoint):
            raise bad("billing_api_endpoint", "must be an http(s) URL with no path")
        self.credentials = self.credentials.strip()
        self.image = self.image.strip() or GCP_DEFAULT_IMAGE
        self.network = self.network.strip() or "global/networks/default"
        self.boot_disk_type = self.boot_disk_type.strip() or "pd-balanced"
        self.regions = tuple(r.strip() for r in self.regions)
        if not all(self.regions):
            raise bad("regions", "must list region names")
        for region, zs in self.zones.items():
            if not zs or not all(z.startswith(f"{region}-") for z in zs):
                raise bad(f"zones.{region}", f"must be a non-empty list of zones of {region}")
        if self.api_endpoint and not self.api_endpoint.startswith(("http://", "https://")):
            raise bad("api_endpoint", "must be an http(s) URL")
        _check_anonymous(self.credentials, self.api_endpoint, "providers.gcp.api_endpoint")
        if self.enabled:
            if not self.project:
                raise bad("project", "is required (the Google Cloud project id)")
            if not self.regions:
                raise bad("regions", "is required: a non-empty list of region names")


# ---------------------------------------------------------------------------------------------
# Azure

ARM_URL = "https://management.azure.com"
AZURE_RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
AZURE_DEFAULT_IMAGE = {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
_SUBNET_ID = re.compile(r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/"
                        r"virtualNetworks/[^/]+/subnets/[^/]+$", re.I)
_RG_NAME = re.compile(r"^[-\w._()]{1,90}$")
_RESERVED_USERS = {"administrator", "admin", "user", "user1", "test", "user2", "test1", "user3",
                   "admin1", "1", "123", "a", "actuser", "adm", "admin2", "aspnet", "backup",
                   "console", "david", "guest", "john", "owner", "root", "server", "sql",
                   "support", "support_388945a0", "sys", "test2", "test3", "user4", "user5"}
_DISK_TYPES = ("Premium_LRS", "StandardSSD_LRS", "Standard_LRS", "Premium_ZRS", "StandardSSD_ZRS",
               "PremiumV2_LRS")


class AzureSettings(Table):
    """``[providers.azure]``: subscription, resource group, subnet(s), image and SSH key."""

    enabled: bool = False
    subscription_id: str = ""
    resource_group: str = ""
    regions: tuple[str, ...] = ()
    base_url: str = ARM_URL
    credentials: Literal["default", "cli", "managed_identity", "environment", "anonymous"] = "default"
    subnet_ids: Union[str, dict[str, str]] = msgspec.field(default="", name="subnet_id")
    image: Union[str, dict[str, str]] = msgspec.field(default_factory=lambda: dict(AZURE_DEFAULT_IMAGE))
    admin_username: str = "azureuser"
    ssh_public_key: str = ""
    os_disk_gb: Annotated[int, msgspec.Meta(ge=30, le=65536)] = 256
    os_disk_type: Literal[_DISK_TYPES] = "Premium_LRS"  # type: ignore[valid-type]
    timeout_s: Seconds = 60.0
    operation_timeout_s: Seconds = 1800.0
    poll_interval_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 5.0
    retries: Annotated[int, msgspec.Meta(ge=0, le=100)] = 3
    accelerated_networking: bool = True
    retail_prices_url: str = AZURE_RETAIL_PRICES_URL  # the Retail Prices API (live prices)

    def __post_init__(self) -> None:
        self.base_url = (self.base_url or ARM_URL).rstrip("/")
        url = self.retail_prices_url = self.retail_prices_url or AZURE_RETAIL_PRICES_URL
        if not re.match(r"https?://[^/\s]+/\S*$", url) or (url.startswith("http://") and not is_loopback_url(url)):
            raise bad("retail_prices_url", "must be an https URL (plain http on loopback only)")
        self.regions = tuple(r.replace(" ", "").lower() for r in self.regions)
        self.ssh_public_key = self.ssh_public_key.strip()
        if not all(self.regions):
            raise bad("regions", "must be a list of location names")
        if self.subscription_id:
            try:
                uuid.UUID(self.subscription_id)
            except ValueError:
                raise bad("subscription_id", f"must be a subscription GUID, got {self.subscription_id!r}") from None
        if self.resource_group and (not _RG_NAME.match(self.resource_group) or self.resource_group.endswith(".")):
            raise bad("resource_group", f"is not a valid resource group name: {self.resource_group!r}")
        if not re.match(r"^https?://[^/\s]+$", self.base_url):
            raise bad("base_url", f"must be an http(s) URL with no path, got {self.base_url!r}")
        if self.base_url.lower().startswith("http://") and not is_loopback_url(self.base_url):
            raise bad("base_url", "may use plain http only on a loopback address")
        _check_anonymous(self.credentials, self.base_url, "providers.azure.base_url")
        subnets = self.subnet_ids
        for region, sid in (subnets.items() if isinstance(subnets, dict) else [("", subnets)]):
            if sid and not _SUBNET_ID.match(sid) or isinstance(subnets, dict) and not sid:
                raise bad("subnet_id" + (f".{region}" if region else ""),
                          "must be a subnet id /subscriptions/…/resourceGroups/…/providers/"
                          f"Microsoft.Network/virtualNetworks/…/subnets/…, got {sid!r}")
        if isinstance(subnets, dict):
            self.subnet_ids = {r.replace(" ", "").lower(): s for r, s in subnets.items()}
        self._check_image()
        if not re.match(r"^[a-z_][a-z0-9_-]{0,63}$", self.admin_username) or self.admin_username in _RESERVED_USERS:
            raise bad("admin_username", f"is not an allowed Linux admin name: {self.admin_username!r}")
        if self.ssh_public_key and not re.match(r"^(ssh-(rsa|ed25519)|ecdsa-sha2-\S+) \S+", self.ssh_public_key):
            raise bad("ssh_public_key", "must be an OpenSSH public key (ssh-rsa / ssh-ed25519 / ecdsa-sha2-… AAAA…)")
        if self.enabled:
            for key in ("subscription_id", "resource_group"):
                if not getattr(self, key):
                    raise bad(key, "is required")
            if not self.subnet_ids:
                raise bad("subnet_id", "is required: the ARM id of the subnet the VMs join, or a table "
                          "region = subnet id")
            if not self.ssh_public_key:
                raise bad("ssh_public_key", "is required: an OpenSSH public key "
                          "(ssh-rsa / ssh-ed25519 / ecdsa-sha2-… AAAA…)")

    def _check_image(self) -> None:
        v = self.image
        if isinstance(v, dict):
            missing = [f for f in ("publisher", "offer", "sku") if not v.get(f)]
            unknown = sorted(set(v) - {"publisher", "offer", "sku", "version"})
            if missing or unknown:
                raise bad("image", f"needs publisher, offer and sku{' (missing ' + ', '.join(missing) + ')' if missing else ''}"
                          f"{' and no other key (' + ', '.join(unknown) + ')' if unknown else ''}, "
                          "or is an image id, or a URN publisher:offer:sku:version")
        elif not (v.startswith("/") or (len(v.split(":")) == 4 and all(v.split(":")))):
            raise bad("image", "must be a table {publisher, offer, sku, version}, a URN "
                      f"publisher:offer:sku:version or an image id, got {v!r}")


LAMBDA_API_URL = "https://cloud.lambda.ai"


class LambdaSettings(Table):
    """``[providers.lambda]``: Lambda Cloud's API endpoint, where the API key is, the SSH key every
    instance gets (Lambda requires exactly one) and the image family.

    The API key is read from ``api_key_file`` or, when that is empty, from the ``LAMBDA_API_KEY``
    environment variable; it is never a setting itself, so it is never written to a config file
    or printed with the settings. ``endpoint`` empty = ``$LAMBDA_API_ENDPOINT`` or Lambda's own."""

    enabled: bool = False
    endpoint: str = ""
    api_key_file: str = ""
    regions: tuple[str, ...] = ()
    ssh_key_name: str = ""
    image_family: str = ""
    timeout_s: Seconds = 30.0
    retries: Annotated[int, msgspec.Meta(ge=0, le=100)] = 3
    backoff_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 1.0
    launch_interval_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 12.0  # Lambda: one launch per 12 s

    def __post_init__(self) -> None:
        self.endpoint = self.endpoint.strip().rstrip("/")
        if self.endpoint:
            if not re.match(r"^https?://[^/\s]+$", self.endpoint):
                raise bad("endpoint", f"must be an http(s) URL with no path, got {self.endpoint!r}")
            if self.endpoint.lower().startswith("http://") and not is_loopback_url(self.endpoint):
                raise bad("endpoint", "may use plain http only on a loopback address")
        self.regions = tuple(r.strip().lower() for r in self.regions)
        if not all(re.match(r"^[a-z]+(-[a-z]+)*-\d+$", r) for r in self.regions):
            raise bad("regions", "must be a list of Lambda region names such as us-east-1")
        if len(self.ssh_key_name) > 64:
            raise bad("ssh_key_name", "is longer than the 64 characters Lambda allows")
        if self.enabled and not self.ssh_key_name:
            raise bad("ssh_key_name", "is required: the name of an SSH key already added to the Lambda account "
                      "(Lambda launches every instance with exactly one)")


# ---------------------------------------------------------------------------------------------


class ProvidersSettings(Table):
    """``[providers]``: one table per cloud, each disabled unless it says ``enabled = true``."""

    aws: AwsSettings = msgspec.field(default_factory=AwsSettings)
    gcp: GcpSettings = msgspec.field(default_factory=GcpSettings)
    azure: AzureSettings = msgspec.field(default_factory=AzureSettings)
    lambda_: LambdaSettings = msgspec.field(default_factory=LambdaSettings, name="lambda")

    def table(self, name: str) -> Table:
        """The settings of provider ``name`` (``lambda`` lives in the attribute ``lambda_``)."""
        return getattr(self, _ATTR.get(name, name))

    def enabled(self) -> dict[str, Table]:
        """Name → settings of every enabled provider."""
        return {n: s for n in PROVIDER_SETTINGS if (s := self.table(n)).enabled}


PROVIDER_SETTINGS: dict[str, type[Table]] = {"aws": AwsSettings, "gcp": GcpSettings, "azure": AzureSettings,
                                              "lambda": LambdaSettings}
_ATTR = {"lambda": "lambda_"}  # "lambda" is a Python keyword: the attribute has a trailing underscore


def provider_settings(name: str, raw: Any) -> Table:
    """The typed settings of provider ``name`` from a raw table (``enabled`` defaults to true:
    a table handed to a provider is one it is built from)."""
    if isinstance(raw, PROVIDER_SETTINGS.get(name, ())):
        return raw
    if not isinstance(raw, Mapping):
        raise SettingsError(f"providers.{name} must be a table", f"providers.{name}")
    return convert({"enabled": True, **raw}, PROVIDER_SETTINGS[name], f"providers.{name}")
