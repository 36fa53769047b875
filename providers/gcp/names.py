"""Names on Compute: the rule for a node's (instance's) name, the labels the broker gives (GCP's
label rules), metadata keys, placement policies and the ``requestId`` of each insert (the same in
every process for the same token). No SDK here: the registration reads the name rule."""
from __future__ import annotations

import re
import uuid

META_LEASE, META_OWNER, META_TYPE = "broker-lease", "broker-owner", "broker-instance-type"
# A fixed namespace: request ids must be the same in every process for the same token.
REQUEST_NS = uuid.UUID("4d1c3d47-1f55-4a8a-9a53-6b0b9a0e6c21")
NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


def label_value(text: str) -> str:
    """``text`` under GCP's label-value rules: [a-z0-9_-], at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", str(text).lower())[:63]


def label_key(text: str) -> str:
    """``text`` under GCP's label-key rules: a value that starts with a lowercase letter."""
    key = label_value(text)
    return key if key[:1].isalpha() else f"k-{key}"[:63]


def placement_name(lease_id: str) -> str:
    """The compact placement policy of a lease: a valid Compute resource name."""
    return f"broker-{label_value(lease_id).replace('_', '-')}"[:63].rstrip("-")


def request_id(client_token: str, zone: str, index: int, generation: int = 0) -> str:
    """The ``requestId`` of node ``index``'s insert: the same in every process for the same input."""
    return str(uuid.uuid5(REQUEST_NS, f"{client_token}|{zone}|{index}|{generation}"))


def node_name_problem(name: str) -> str:
    """Why Compute would refuse ``name`` as an instance name, RFC 1035 lowercase: a letter, then
    letters, digits and hyphens, not ending with a hyphen; at most 63 ("" when it takes it)."""
    if not name:
        return "is empty"
    if not NAME_RE.match(name):
        return ("is not a GCP instance name (a lowercase letter, then lowercase letters, digits "
                "and hyphens, not ending with a hyphen; at most 63)")
    return ""
