#!/bin/bash
# Boot script (rendered by the broker): join the on-prem Kubernetes cluster as a worker node.
set -euo pipefail
umask 077

export BROKER_LEASE_ID=$lease_id
export BROKER_NODE_NAME=$node_name
export BROKER_PROVIDER=$provider
export BROKER_REGION=$region
export BROKER_JOB_ID=$job_id
export BROKER_CHECKPOINT_URI=$checkpoint_uri
export BROKER_DATASET_URI=$dataset_uri
$env_exports
$resolve_node_name

# Label the node with its lease so the scheduler and the broker can find it.
kubelet_defaults=$kubelet_defaults_path
mkdir -p "$$(dirname "$$kubelet_defaults")"
printf 'KUBELET_EXTRA_ARGS=--node-labels=%s\n' $k8s_node_labels > "$$kubelet_defaults"

kubeadm join $api_server \
    --token $token \
    --discovery-token-ca-cert-hash $ca_cert_hash \
    --node-name "$$BROKER_NODE_NAME"
