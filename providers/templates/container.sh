#!/bin/bash
# Boot script (rendered by the broker): run one container command, then report its exit code.
set -uo pipefail
umask 077

$broker_environment

broker_env="-e BROKER_LEASE_ID -e BROKER_NODE_NAME -e BROKER_PROVIDER -e BROKER_REGION"
broker_env="$$broker_env -e BROKER_JOB_ID -e BROKER_CHECKPOINT_URI -e BROKER_DATASET_URI"
for v in $$broker_fabric_vars; do broker_env="$$broker_env -e $$v"; done

# The job's reports go to the broker's callback endpoint with this lease's own credential (good
# for this lease's job reports only). The job may report too (a checkpoint: state "running" with
# "checkpoint_uri"), with the same URL and token, which it gets as environment variables.
export BROKER_CALLBACK_URL=$callback_url
export BROKER_CALLBACK_TOKEN=$callback_token
broker_env="$$broker_env -e BROKER_CALLBACK_URL -e BROKER_CALLBACK_TOKEN"
job_json=$callback_job_json

report() {  # report STATE [EXIT_CODE]: best effort; the marker file is the record of last resort
    [ -n "$$BROKER_CALLBACK_URL" ] || return 0
    local node body
    node=$$(printf '%s' "$$BROKER_NODE_NAME" | sed 's/[\\"]/\\&/g')
    body="{\"job_id\": $$job_json, \"node_name\": \"$$node\", \"state\": \"$$1\"$${2:+, \"exit_code\": $$2}}"
    # The credential goes through stdin (curl --config -), never on a command line others can read.
    printf 'header = "Authorization: Bearer %s"\n' "$$BROKER_CALLBACK_TOKEN" |
        curl -fsS --retry 5 --retry-connrefused --max-time 30 --config - \
            -H 'Content-Type: application/json' --data "$$body" "$$BROKER_CALLBACK_URL" >/dev/null \
        || echo "broker: the $$1 report to the broker failed; the marker $$marker holds the exit code" >&2
}
marker=$marker_path
report running

# Interruption notices this node hears from its cloud (GCP: the metadata server's preempted
# flag; Azure: Scheduled Events) go to the broker at once: it launches the replacement while
# this node still runs, and the job should checkpoint.
$notice_watch

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

# The marker is always written; the report, when a callback is configured, tells the broker at
# once (the lease is released within one reconciler pass).
mkdir -p "$$(dirname "$$marker")"
printf '%s\n' "$$rc" > "$$marker"
[ -z "$$notice_pid" ] || kill "$$notice_pid" 2>/dev/null
if [ "$$rc" -eq 0 ]; then report succeeded 0; else report failed "$$rc"; fi
exit "$$rc"
