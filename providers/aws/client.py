"""The EC2 plumbing every AWS operation goes through: one boto3 session per provider (service models
parsed once per process), one client per region, each call's errors mapped, paging and caching."""
from __future__ import annotations

import threading
from typing import Any, Iterator

import boto3
import botocore.loaders
import botocore.session
import structlog
from botocore.config import Config

from providers.aws.errors import AWS_ERRORS, PROVIDER, map_error, note_answer
from providers.base import TAG_LEASE, TAG_OWNER
from providers.aws.settings import AwsSettings

_log = structlog.get_logger("providers.aws")  # the one logger of every AWS module

_loader_lock = threading.Lock()
_loader: botocore.loaders.Loader | None = None


def _session(anonymous: bool) -> boto3.session.Session:
    """A boto3 session whose service models come from one process-wide loader (parsing EC2's
    model takes most of a second; every provider built in this process shares it)."""
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        core = botocore.session.get_session()
        core.register_component("data_loader", _loader)
        core.register("before-parse", note_answer)
    if anonymous:
        return boto3.session.Session(botocore_session=core, aws_access_key_id="anonymous",
                                     aws_secret_access_key="anonymous")
    return boto3.session.Session(botocore_session=core)


class Ec2Client:
    """The EC2 clients of one broker owner and the helpers that call them."""

    name = PROVIDER

    def __init__(self, settings: AwsSettings, owner: str, *, session: boto3.session.Session | None = None,
                 page_size: int = 500, poll_s: float = 5.0) -> None:
        if not owner or not isinstance(owner, str) or len(owner) > 256:
            raise ValueError("the broker owner id must be a non-empty string of at most 256 characters")
        self.settings = settings
        self.owner = owner
        self.page_size = max(5, min(1000, page_size))
        self.poll_s = poll_s
        self._session = session or _session(settings.anonymous)
        self._config = Config(
            connect_timeout=settings.connect_timeout_s,
            read_timeout=settings.read_timeout_s,
            retries={"mode": "standard", "total_max_attempts": 1},
            user_agent_extra="gpu-burst-broker",
            tcp_keepalive=True,
        )
        self._clients: dict[str, Any] = {}
        self._cache: dict[tuple, Any] = {}
        self._lock = threading.Lock()


    # -- plumbing -----------------------------------------------------------------------------

    def client(self, region: str) -> Any:
        """The EC2 client of ``region`` (created once; boto3 clients are thread-safe)."""
        with self._lock:
            c = self._clients.get(region)
            if c is None:
                c = self._session.client(
                    "ec2", region_name=region, config=self._config,
                    endpoint_url=self.settings.endpoint_url or None,
                )
                self._clients[region] = c
            return c

    def _call(self, region: str, zone: str, op: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return getattr(self.client(region), op)(**kwargs)
        except AWS_ERRORS as e:
            raise map_error(e, region=region, zone=zone) from e

    def _describe(self, region: str, filters: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Every instance matching ``filters`` in ``region``, through all result pages."""
        pages = self.client(region).get_paginator("describe_instances").paginate(
            Filters=filters, PaginationConfig={"PageSize": self.page_size})
        try:
            for page in pages:
                for reservation in page.get("Reservations", []):
                    yield from reservation.get("Instances", [])
        except AWS_ERRORS as e:
            raise map_error(e, region=region) from e

    def _mine(self, lease_id: str | None = None) -> list[dict[str, Any]]:
        """Filters selecting this broker's instances (of one lease)."""
        filters = [{"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]}]
        if lease_id is not None:
            filters.append({"Name": f"tag:{TAG_LEASE}", "Values": [lease_id]})
        return filters

    def _cached(self, key: tuple, compute: Any) -> Any:
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        value = compute()
        with self._lock:
            self._cache[key] = value
        return value
