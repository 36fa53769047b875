#!/bin/bash
# Boot script (rendered by the broker): join the on-prem Kubernetes cluster as a worker node.
set -euo pipefail
umask 077

$broker_environment

# Label the node with its lease so the scheduler and the broker can find it.
kubelet_defaults=$kubelet_defaults_path
mkdir -p "$$(dirname "$$kubelet_defaults")"
printf 'KUBELET_EXTRA_ARGS=--node-labels=%s\n' $k8s_node_labels > "$$kubelet_defaults"

kubeadm join $api_server \
    --token $token \
    --discovery-token-ca-cert-hash $ca_cert_hash \
    --node-name "$$BROKER_NODE_NAME"
