#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/prolog.d/stallscope.sh, runs as root on every node
# of a job before it starts): one watcher per job and node. On nodes given whole to a job
# (exclusive), the node's NCCL processes are the job's; the watcher follows them as they start.
# Bundles go to a shared folder per job, so the bundles of one incident from every node sit
# together: stallscope analyze /shared/stallscope/$SLURM_JOB_ID/*.tar.gz
set -eu
OUT="${STALLSCOPE_OUT:-/shared/stallscope}/${SLURM_JOB_ID}"
STALLSCOPE="${STALLSCOPE_HOME:-/opt/stallscope}"
mkdir -p "$OUT"
# the watcher outlives this script (setsid); the epilog stops it by its pid file
cd "$STALLSCOPE"
setsid python3 -m capture --watch -o "$OUT" --ring-bytes "${STALLSCOPE_RING:-1G}" \
    --before 2m --after 30s --progress lines \
    </dev/null >>"$OUT/watch-$(hostname -s).log" 2>&1 &
echo $! > "/run/stallscope-job-${SLURM_JOB_ID}.pid"
exit 0
