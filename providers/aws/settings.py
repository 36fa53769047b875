"""``[providers.aws]``: the AWS settings schema (checked before any SDK is imported)."""
from __future__ import annotations

import re
from typing import Annotated, Literal, Union

import msgspec

from providers.settings import Table, _check_anonymous, bad

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
