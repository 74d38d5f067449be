#!/bin/sh
# Slurm Epilog: stop this job's watcher. SIGTERM lets it write an incident already triggered
# (the job may have been cancelled because it hung) and remove its rings; never SIGKILL first.
set -u
PIDFILE="/run/stallscope-job-${SLURM_JOB_ID}.pid"
[ -f "$PIDFILE" ] || exit 0
PID=$(cat "$PIDFILE")
if kill -TERM "$PID" 2>/dev/null; then
    i=0
    while kill -0 "$PID" 2>/dev/null && [ $i -lt 120 ]; do sleep 1; i=$((i + 1)); done
    kill -KILL "$PID" 2>/dev/null || true   # its guardian still stops its children
fi
rm -f "$PIDFILE"
exit 0
