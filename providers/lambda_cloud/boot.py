"""What a Lambda Cloud node does at boot on its own (:class:`providers.registration.BootHooks`):
Lambda has no metadata service, so the provider launches each node with its name as hostname
and the node reads it back. No interruption notices: Lambda sells no spot capacity."""
from __future__ import annotations

from providers.registration import BootHooks

BOOT = BootHooks(whoami="BROKER_NODE_NAME=$(hostname)")
