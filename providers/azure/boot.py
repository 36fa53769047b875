"""What an Azure node does at boot on its own (:class:`providers.registration.BootHooks`): it
learns its name from the instance metadata's VM name, and watches the Scheduled Events for a
``Preempt`` (or a ``Terminate``/``Redeploy``) naming this VM. A node of a multi-node ND gang
points NCCL at its InfiniBand HCAs (``mlx5_ib*`` on Azure's HPC images; Ethernet stays on eth0)."""
from __future__ import annotations

from providers.registration import BootHooks

BOOT = BootHooks(
    whoami=('BROKER_NODE_NAME=$(curl -sf -H "Metadata: true" '
            '"http://169.254.169.254/metadata/instance/compute/name?api-version=2021-02-01&format=text")'),
    metadata_url="http://169.254.169.254",
    notice_watch=r"""broker_watch_notices() {
    local doc
    while :; do
        doc=$(curl -sf -H 'Metadata: true' "$notice_md/metadata/scheduledevents?api-version=2020-07-01") \
            || { sleep 5; continue; }
        case "$doc" in *"\"$BROKER_NODE_NAME\""*)
            case "$doc" in
                *'"Preempt"'*) broker_notice preemption "azure: scheduled event Preempt"; return ;;
                *'"Terminate"'*|*'"Redeploy"'*) broker_notice maintenance "azure: scheduled event"; return ;;
            esac ;;
        esac
        sleep 1
    done
}""",
    fabric_env=(("infiniband", "export NCCL_IB_HCA=mlx5_ib NCCL_IB_PCI_RELAXED_ORDERING=1 NCCL_SOCKET_IFNAME=eth0\n"
                                'broker_fabric_vars="NCCL_IB_HCA NCCL_IB_PCI_RELAXED_ORDERING NCCL_SOCKET_IFNAME"'),),
)
