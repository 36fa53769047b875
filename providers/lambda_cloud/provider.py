"""Launching, reading and tearing down a lease on Lambda Cloud (:class:`LambdaProvider`)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from providers.base import (
    LABEL_LEASE,
    LABEL_OWNER,
    Instance,
    InstanceState,
    InvalidRequestError,
    LaunchSpec,
    Market,
    ProviderError,
    StopReason,
    TransientError,
)
from providers.lambda_cloud.client import ApiKey, LambdaClient, RemoteInstance, TypeAvailability, log
from providers.lambda_cloud.errors import NAME, NOT_FOUND
from providers.lambda_cloud.names import HOSTNAME_RE
from providers.lambda_cloud.settings import LambdaSettings
from providers.settings import provider_table

TAG_NODE = "broker-node"
MAX_NAME = 64  # the instance ``name``
USER_DATA_MAX = 1 << 20  # cloud-init user data: plain text, at most 1 MB

_STATES = {"booting": InstanceState.PENDING, "active": InstanceState.RUNNING,
           "unhealthy": InstanceState.RUNNING, "terminating": InstanceState.STOPPING,
           "terminated": InstanceState.TERMINATED}
_ALIVE = {"booting", "active", "unhealthy"}


class LambdaProvider:
    """The :class:`providers.base.Provider` for Lambda Cloud (on-demand instances only: Lambda
    sells no spot capacity, and its reserved capacity is not launched through this API)."""

    name = NAME

    def __init__(self, settings: LambdaSettings, owner: str, client: LambdaClient) -> None:
        if not owner:
            raise ValueError("the broker's owner name (used in the broker-owner tag) must not be empty")
        self.settings, self.owner, self.client = settings, owner, client

    @classmethod
    def from_config(cls, settings: LambdaSettings | Mapping[str, Any], owner: str) -> "LambdaProvider":
        """From the typed ``[providers.lambda]`` settings (or a raw table, checked by the schema);
        the API key from ``api_key_file`` or ``$LAMBDA_API_KEY``."""
        parsed = provider_table(LambdaSettings, NAME, settings)
        return cls(parsed, owner, LambdaClient(parsed, ApiKey.load(parsed)))

    def __repr__(self) -> str:
        return f"LambdaProvider(owner={self.owner!r}, {self.client!r})"

    def notice_source(self) -> Any:
        return None  # no spot market, so no interruption notices

    # -- reading -------------------------------------------------------------------------------

    def instance_types(self) -> dict[str, TypeAvailability]:
        """Every instance type with its price and the regions that have capacity for it now."""
        return self.client.instance_types()

    def _ours(self) -> list[RemoteInstance]:
        return [r for r in self.client.instances() if r.tag(LABEL_OWNER) == self.owner]

    def _lease(self, lease_id: str) -> list[RemoteInstance]:
        return [r for r in self._ours() if r.tag(LABEL_LEASE) == lease_id]

    def describe(self, lease_id: str, region: str) -> list[Instance]:
        return [_to_instance(r) for r in self._lease(lease_id) if _region(r) == region]

    def list_managed(self, regions: Sequence[str] | None = None) -> list[Instance]:
        wanted = set(regions) if regions else None
        return [_to_instance(r) for r in self._ours() if wanted is None or _region(r) in wanted]

    # -- launch --------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> list[Instance]:
        """All or nothing: one launch call per missing node (the API launches one instance per call),
        adopting the lease's nodes a crashed earlier call made, terminating everything on failure."""
        lg = log.bind(provider=NAME, lease_id=spec.lease_id, region=spec.region,
                      instance_type=spec.instance.name, count=spec.count)
        self._check(spec)
        existing = self._lease(spec.lease_id)
        names = list(spec.node_names)
        keep = {r.tag(TAG_NODE): r for r in existing
                if r.status in _ALIVE and _region(r) == spec.region and r.tag(TAG_NODE) in names}
        stale = [r for r in existing if r.status in _ALIVE and keep.get(r.tag(TAG_NODE)) is not r]
        if keep:
            lg.info("lambda.launch.adopt", nodes=sorted(keep))
        if stale:
            lg.warning("lambda.launch.stale", instances=[r.id for r in stale])
            self.client.terminate([r.id for r in stale])
        launched: dict[str, str] = {}
        for name in names:
            if name in keep:
                continue
            try:
                ids = self.client.launch(self._body(spec, name), spec.region)
            except ProviderError as e:
                lg.warning("lambda.launch.failed", node=name, code=e.code, error=type(e).__name__)
                self._abort(spec, e, lg)
            if len(ids) != 1:
                self._abort(spec, TransientError(f"launch of {name} answered {len(ids)} instance ids, not 1",
                                                 provider=NAME, code="LAUNCH_ANSWER", region=spec.region), lg)
            launched[name] = ids[0]
            lg.info("lambda.launch", node=name, instance=ids[0])
        by_node = self._listed(spec, launched, lg)
        vanished = [n for n in names if n not in by_node]
        if vanished:
            self._abort(spec, TransientError(f"instances {vanished} are not listed after their launch",
                                             provider=NAME, code="INSTANCE_VANISHED", region=spec.region), lg)
        lg.info("lambda.launch.ok", nodes=names)
        return [_to_instance(by_node[n]) for n in names]

    def _check(self, spec: LaunchSpec) -> None:
        def bad(why: str, code: str = "INVALID_SPEC") -> InvalidRequestError:
            return InvalidRequestError(why, provider=NAME, code=code, region=spec.region)

        if spec.provider != NAME:
            raise bad(f"launch spec is for provider {spec.provider!r}, not lambda")
        if spec.market is not Market.ON_DEMAND:
            raise bad(f"Lambda Cloud sells on-demand instances only, not {spec.market}", "MARKET_NOT_SOLD")
        if spec.count < 1 or len(spec.node_names) != spec.count or len(set(spec.node_names)) != spec.count:
            raise bad(f"launch spec asks for {spec.count} nodes with {len(spec.node_names)} distinct names")
        wrong = [n for n in spec.node_names if not HOSTNAME_RE.match(n)]
        if wrong:
            raise bad(f"node names {wrong} are not Lambda hostnames (1-63 lowercase letters, digits and hyphens)",
                      "INVALID_NAME")
        if len(spec.boot_script.encode()) > USER_DATA_MAX:
            raise bad("the boot script is larger than the 1 MB of user data Lambda takes", "USER_DATA_TOO_LARGE")

    def _body(self, spec: LaunchSpec, node: str) -> dict[str, Any]:
        tags = [{"key": LABEL_LEASE, "value": spec.lease_id}, {"key": LABEL_OWNER, "value": self.owner},
                {"key": TAG_NODE, "value": node}]
        body: dict[str, Any] = {"region_name": spec.region, "instance_type_name": spec.instance.name,
                                "ssh_key_names": [self.settings.ssh_key_name], "name": node[:MAX_NAME],
                                "hostname": node, "tags": tags}
        if spec.boot_script:
            body["user_data"] = spec.boot_script
        if self.settings.image_family:
            body["image"] = {"family": self.settings.image_family}
        return body

    def _listed(self, spec: LaunchSpec, launched: Mapping[str, str], lg: Any) -> dict[str, RemoteInstance]:
        """The lease's live nodes by name; a node just launched but not listed yet is asked for by id."""
        try:
            by_node = {r.tag(TAG_NODE): r for r in self._lease(spec.lease_id)
                       if r.status in _ALIVE and _region(r) == spec.region}
            for name, iid in launched.items():
                if name not in by_node and (r := self.client.instance(iid)) is not None and r.status in _ALIVE:
                    by_node[name] = r
            return by_node
        except ProviderError as e:
            self._abort(spec, e, lg)
            raise  # unreachable: _abort raises

    def _abort(self, spec: LaunchSpec, error: ProviderError, lg: Any) -> Any:
        """All or nothing: terminate every instance of the lease, then raise ``error``."""
        try:
            victims = [r.id for r in self._lease(spec.lease_id) if r.status in _ALIVE]
            if victims:
                lg.warning("lambda.launch.cleanup", instances=victims)
                self.client.terminate(victims)
        except ProviderError as e:  # the reconciler finds them by tag
            lg.error("lambda.launch.cleanup_failed", error=str(e))
        raise error

    # -- terminate -----------------------------------------------------------------------------

    def terminate(self, instances: Sequence[Instance]) -> None:
        """Terminate ``instances``; one already gone is fine."""
        ids = [i.instance_id for i in instances if i.provider == NAME]
        if not ids:
            return
        try:
            self.client.terminate(ids)
        except ProviderError as e:
            if e.code != NOT_FOUND:
                raise
            for one in ids:  # one of them is gone already: the others one by one
                try:
                    self.client.terminate([one])
                except ProviderError as e1:
                    if e1.code != NOT_FOUND:
                        raise
        log.info("lambda.terminate.ok", provider=NAME, instances=ids)


def _region(r: RemoteInstance) -> str:
    return r.region.name if r.region else ""


def _to_instance(r: RemoteInstance) -> Instance:
    state = _STATES.get(r.status, InstanceState.PENDING)
    reason, detail = StopReason.NONE, ""
    if state is InstanceState.TERMINATED:
        reason, detail = StopReason.USER, r.status
    elif r.status == "unhealthy":
        detail = "unhealthy"
    return Instance(provider=NAME, instance_id=r.id, region=_region(r), zone="",
                    instance_type=r.instance_type.name if r.instance_type else "", market=Market.ON_DEMAND,
                    state=state, lease_id=r.tag(LABEL_LEASE), node_name=r.tag(TAG_NODE) or (r.name or ""),
                    private_ip=r.private_ip or r.ip or "", stop_reason=reason, stop_detail=detail,
                    problem=r.problem)
