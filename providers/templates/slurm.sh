#!/bin/bash
# Boot script (rendered by the broker): join the on-prem Slurm cluster as a cloud node.
# slurmd runs configless: it fetches slurm.conf from the controller named in --conf-server.
set -euo pipefail
umask 077

$broker_environment

# The cluster's munge key: every node of a Slurm cluster shares it.
key_file=$munge_key_path
install -d -m 0700 "$$(dirname "$$key_file")"
printf '%s' $munge_key | base64 -d > "$$key_file"
chown munge:munge "$$(dirname "$$key_file")" "$$key_file"
chmod 0400 "$$key_file"
if command -v systemctl >/dev/null 2>&1 && systemctl list-unit-files munge.service >/dev/null 2>&1; then
    systemctl restart munge
else
    runuser -u munge -- munged --force
fi

# -b: report this boot as new, so slurmctld accepts the node as resumed.
exec slurmd --conf-server $conf_server -N "$$BROKER_NODE_NAME" -b $slurmd_args
