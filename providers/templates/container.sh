#!/bin/bash
# Boot script (rendered by the broker): run one container command, then report its exit code.
set -uo pipefail
umask 077

$broker_environment

broker_env="-e BROKER_LEASE_ID -e BROKER_NODE_NAME -e BROKER_PROVIDER -e BROKER_REGION"
broker_env="$$broker_env -e BROKER_JOB_ID -e BROKER_CHECKPOINT_URI -e BROKER_DATASET_URI"

if runtime=$$(command -v docker); then
    gpu_args="--gpus all"
elif runtime=$$(command -v podman); then
    gpu_args="--device nvidia.com/gpu=all"
else
    echo "broker: neither docker nor podman is installed" >&2
    runtime=""
fi

rc=127
if [ -n "$$runtime" ]; then
    workdir=$workdir
    # $$gpu_args, $$broker_env and the job's -e flags are lists of words: split on purpose.
    # shellcheck disable=SC2086
    "$$runtime" run --rm --network host $$gpu_args $$broker_env $env_docker_args \
        $${workdir:+--workdir "$$workdir"} \
        $image $command_args
    rc=$$?
fi

# The marker is always written; the callback, when configured, tells the broker at once.
marker=$marker_path
mkdir -p "$$(dirname "$$marker")"
printf '%s\n' "$$rc" > "$$marker"
callback_url=$callback_url
if [ -n "$$callback_url" ]; then
    body=$callback_body_prefix
    curl -fsS --retry 5 --retry-connrefused --max-time 30 \
        -H 'Content-Type: application/json' --data "$${body}$${rc}}" "$$callback_url" \
        || echo "broker: completion callback failed; the marker $$marker holds the exit code" >&2
fi
exit "$$rc"
