"""GPUDirect networking for a multi-node gang on Compute Engine, from the catalog row.

An A3 High node (``tcpx``) gets gVNIC on its host NIC plus 4 GPU NICs for GPUDirect-TCPX; an A3
Mega node (``tcpxo``) gets 8 for GPUDirect-TCPXO (the catalog's ``fabric_nics``). Compute wants
every NIC of a VM in its own VPC network, so GPU NIC ``i`` (1-based) goes on network
``global/networks/<gpu_network_prefix>-<i>`` and subnetwork
``regions/<region>/subnetworks/<gpu_network_prefix>-<i>`` (``[providers.gcp] gpu_network_prefix``,
default ``broker-gpu``): the operator creates those networks once, as Google's A3 guide does.
A single node or an Ethernet type keeps the one default NIC."""
from __future__ import annotations

from providers.gcp.sdk import compute_v1

from providers.base import Fabric, LaunchSpec

GPU_FABRICS = (Fabric.TCPX, Fabric.TCPXO)


def gpu_nics(spec: LaunchSpec, prefix: str) -> list[compute_v1.NetworkInterface]:
    """The extra GPU NICs of one node of ``spec`` (none unless the gang needs a GPU fabric)."""
    if spec.instance.fabric_for(spec.count) not in GPU_FABRICS:
        return []
    return [compute_v1.NetworkInterface(
        network=f"global/networks/{prefix}-{i}",
        subnetwork=f"regions/{spec.region}/subnetworks/{prefix}-{i}",
        nic_type="GVNIC") for i in range(1, spec.instance.fabric_nics + 1)]
