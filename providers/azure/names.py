"""Azure's rule for a node's name, its VM and computer name: 1-64 of letters, digits, ``.`` and
``-``, not ending with ``.`` or ``-`` (Linux VMs)."""
from __future__ import annotations

import re

NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,62}[A-Za-z0-9])?$")


def node_name_problem(name: str) -> str:
    """Why Azure would refuse ``name`` as a VM name ("" when it takes it)."""
    if not name:
        return "is empty"
    if not NAME_RE.match(name):
        return "is not an Azure VM name (1-64 letters, digits, '.' and '-', not ending with '.' or '-')"
    return ""
