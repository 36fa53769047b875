"""``[providers.lambda]``: the Lambda Cloud settings schema (checked before httpx is imported)."""
from __future__ import annotations

import re
from typing import Annotated

import msgspec

from providers.settings import Seconds, Table, bad, is_loopback_url

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
