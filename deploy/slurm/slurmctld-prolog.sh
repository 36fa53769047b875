#!/bin/sh
# PrologSlurmctld (optional): hold the job's launch until every node of it responds.
#
# Without it, a batch job on a freshly resumed CLOUD node is launched by a periodic pass of
# slurmctld, up to ~30 s after the node registered; with it, slurmctld launches the job as soon
# as this script exits. It runs as SlurmUser for EVERY job (on-prem ones return at once), with
# SLURM_JOB_NODELIST set but no SLURM_CONF and no PATH: absolute paths only. It always exits 0
# (a failing PrologSlurmctld would requeue the job); after MAX_WAIT seconds it lets Slurm decide.
# Install: install -m 0755 deploy/slurm/slurmctld-prolog.sh /etc/slurm/broker-prolog.sh

SCONTROL=/usr/bin/scontrol
SLURM_CONF=/etc/slurm/slurm.conf
MAX_WAIT=1200                                  # at least ResumeTimeout

export SLURM_CONF
[ -n "$SLURM_JOB_NODELIST" ] || exit 0
i=0
while [ "$i" -lt "$MAX_WAIT" ]; do
    state=$("$SCONTROL" show node -o "$SLURM_JOB_NODELIST" </dev/null 2>&1)
    case "$state" in
        *POWERING_UP*|*NOT_RESPONDING*) ;;
        *) exit 0 ;;
    esac
    /bin/sleep 1
    i=$((i + 1))
done
exit 0
