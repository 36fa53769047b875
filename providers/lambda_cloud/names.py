"""Lambda Cloud's rule for a node's name: the name is the instance's hostname (how a node learns
its name at boot, Lambda having no metadata service): 1-63 lowercase letters, digits and
hyphens, starting with a letter or digit. No httpx here: the registration reads the rule."""
from __future__ import annotations

import re

HOSTNAME_RE = re.compile(r"^[a-z0-9][0-9a-z-]{0,62}$")


def node_name_problem(name: str) -> str:
    """Why Lambda would refuse ``name`` as a node's hostname ("" when it takes it)."""
    if not name:
        return "is empty"
    if not HOSTNAME_RE.match(name):
        return "is not a Lambda hostname (1-63 lowercase letters, digits and hyphens, not starting with a hyphen)"
    return ""
