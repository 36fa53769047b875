"""Each cloud's own rules for the node names a client may give (they become the AWS ``Name``
tag, the GCP instance name, the Azure VM and computer name), checked before a lease is made so
a name a cloud would refuse, or answer garbage to, is the caller's error at once.

- AWS tag values: at most 256 characters; letters, digits, spaces and ``_ . : / = + - @``; no
  ``aws:`` prefix (reserved).
- GCP instance names: RFC 1035, lowercase: a letter, then letters, digits and hyphens, not
  ending with a hyphen; at most 63.
- Azure Linux VM names: 1-64 of letters, digits, ``.`` and ``-``, not ending with ``.`` or ``-``
  (the computer name is the same).
- Lambda Cloud: the node name is the instance's hostname (how a node learns its name at boot):
  1-63 lowercase letters, digits and hyphens, starting with a letter or digit.
"""
from __future__ import annotations

import re

_AWS_PUNCT = set(" _.:/=+-@")
GCP_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")  # providers.gcp.names.NAME_RE, without the SDK
LAMBDA_NAME = re.compile(r"^[a-z0-9][0-9a-z-]{0,62}$")  # providers.lambda_cloud.provider.HOSTNAME_RE
AZURE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,62}[A-Za-z0-9])?$")


def node_name_problem(provider: str, name: str) -> str:
    """Why ``provider`` would refuse ``name`` as a node's name ("" when it takes it)."""
    if not name:
        return "is empty"
    if provider == "aws":
        if len(name) > 256:
            return f"is {len(name)} characters long; an AWS tag value holds at most 256"
        if name.lower().startswith("aws:"):
            return "starts with aws:, which AWS reserves"
        bad = next((c for c in name if not (c.isalnum() or c in _AWS_PUNCT)), "")
        if bad:
            return (f"contains {bad!r}: an AWS tag value takes letters, digits, spaces and "
                    "_ . : / = + - @")
        return ""
    if provider == "gcp":
        if not GCP_NAME.match(name):
            return ("is not a GCP instance name (a lowercase letter, then lowercase letters, digits "
                    "and hyphens, not ending with a hyphen; at most 63)")
        return ""
    if provider == "azure":
        if not AZURE_NAME.match(name):
            return ("is not an Azure VM name (1-64 letters, digits, '.' and '-', not ending with "
                    "'.' or '-')")
        return ""
    if provider == "lambda":
        if not LAMBDA_NAME.match(name):
            return "is not a Lambda hostname (1-63 lowercase letters, digits and hyphens, not starting with a hyphen)"
        return ""
    return ""
