"""What an AWS node does at boot on its own (:class:`providers.registration.BootHooks`): it
learns its name from its ``Name`` tag through instance metadata (tags in metadata are enabled at
launch; the tag is written just after launch, so it waits for it). Its interruption notices reach
the broker directly (EventBridge into SQS), so the node watches none."""
from __future__ import annotations

from providers.registration import BootHooks

BOOT = BootHooks(whoami=(
    't=$(curl -sf -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 300" '
    'http://169.254.169.254/latest/api/token)\n'
    'for _ in $(seq 60); do\n'
    '    BROKER_NODE_NAME=$(curl -sf -H "X-aws-ec2-metadata-token: $t" '
    'http://169.254.169.254/latest/meta-data/tags/instance/Name) && break\n'
    '    sleep 5\n'
    'done'
))
