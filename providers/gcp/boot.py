"""What a Compute Engine node does at boot on its own (:class:`providers.registration.BootHooks`):
it learns its name from the metadata server's instance name, and watches ``instance/preempted``,
which turns TRUE when the ~30 s soft-off of a preemption starts. A node of a multi-node A3 gang
points NCCL's GPUDirect plugin at its NICs: the first (by name) carries control traffic, the GPU
NICs the launch added carry the data (TCPX on A3 High, TCPXO "FasTrak" on A3 Mega)."""
from __future__ import annotations

from providers.registration import BootHooks

_NICS = ("nics=$(ls /sys/class/net | grep -v -e '^lo$' -e '^docker' | sort -V)\n"
         "ctrl=$(printf '%s\\n' $nics | head -n1)\n"
         "data=$(printf '%s\\n' $nics | tail -n +2 | paste -sd, -)\n")
_TCPX = (_NICS + "export NCCL_GPUDIRECTTCPX_CTRL_DEV=$ctrl NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=$data "
         "NCCL_SOCKET_IFNAME=$ctrl NCCL_CROSS_NIC=0 NCCL_NET_GDR_LEVEL=PIX NCCL_P2P_PXN_LEVEL=0\n"
         'broker_fabric_vars="NCCL_GPUDIRECTTCPX_CTRL_DEV NCCL_GPUDIRECTTCPX_SOCKET_IFNAME NCCL_SOCKET_IFNAME '
         'NCCL_CROSS_NIC NCCL_NET_GDR_LEVEL NCCL_P2P_PXN_LEVEL"')
_TCPXO = (_NICS + "export NCCL_FASTRAK_CTRL_DEV=$ctrl NCCL_FASTRAK_IFNAME=$data NCCL_SOCKET_IFNAME=$ctrl "
          "NCCL_CROSS_NIC=0 NCCL_NET_GDR_LEVEL=PIX\n"
          'broker_fabric_vars="NCCL_FASTRAK_CTRL_DEV NCCL_FASTRAK_IFNAME NCCL_SOCKET_IFNAME NCCL_CROSS_NIC '
          'NCCL_NET_GDR_LEVEL"')

BOOT = BootHooks(
    whoami=('BROKER_NODE_NAME=$(curl -sf -H "Metadata-Flavor: Google" '
            'http://metadata.google.internal/computeMetadata/v1/instance/name)'),
    metadata_url="http://metadata.google.internal",
    notice_watch=r"""broker_watch_notices() {
    local v
    while :; do
        v=$(curl -sf -H 'Metadata-Flavor: Google' "$notice_md/computeMetadata/v1/instance/preempted") \
            || { sleep 2; continue; }
        if [ "$v" = TRUE ]; then broker_notice preemption "gcp: metadata instance/preempted"; return; fi
        curl -sf -o /dev/null -H 'Metadata-Flavor: Google' \
            "$notice_md/computeMetadata/v1/instance/preempted?wait_for_change=true&timeout_sec=60" || sleep 1
    done
}""",
    fabric_env=(("tcpx", _TCPX), ("tcpxo", _TCPXO)),
)
