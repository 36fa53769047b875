"""What an AWS node does at boot on its own (:class:`providers.registration.BootHooks`): it
learns its name from its ``Name`` tag through instance metadata (tags in metadata are enabled at
launch; the tag is written just after launch, so it waits for it). Its interruption notices reach
the broker directly (EventBridge into SQS), so the node watches none. A node of a multi-node EFA
gang points libfabric (and NCCL's aws-ofi-nccl plugin) at its EFA devices with GPUDirect RDMA."""
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
), fabric_env=(
    ("efa", "export FI_PROVIDER=efa FI_EFA_USE_DEVICE_RDMA=1 FI_EFA_FORK_SAFE=1\n"
            'broker_fabric_vars="FI_PROVIDER FI_EFA_USE_DEVICE_RDMA FI_EFA_FORK_SAFE"'),
))
