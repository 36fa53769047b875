#!/bin/sh
# ResumeProgram: slurmctld runs this with the host list of the CLOUD nodes to power up
# (and SLURM_RESUME_FILE naming the jobs they are for). It launches their cloud instances.
#
# slurmctld gives it no PATH and no HOME, closes every file descriptor and discards its output:
# absolute paths only, stdin from /dev/null, and the broker logs to a file (BROKER_LOG).
# Install: install -m 0755 deploy/slurm/resume.sh /etc/slurm/broker-resume.sh
# slurm.conf: see slurm.conf.snippet.

BROKER=/opt/broker/bin/broker                 # the broker's console script (a venv's bin/broker)
BROKER_CONFIG=/etc/broker/broker.toml         # its [slurm] section: shapes, server, scontrol path
BROKER_LOG=/var/log/broker/slurm.log          # must be writable by SlurmUser

exec "$BROKER" slurm resume --config "$BROKER_CONFIG" --log "$BROKER_LOG" "$1" </dev/null
