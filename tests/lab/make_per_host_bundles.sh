#!/usr/bin/env bash
# Regenerate the shipped per-host bundle sets: tests/fixtures/bundles-per-host/<case>/ (root).
#   tests/lab/make_per_host_bundles.sh [case ...]      (default: all of them)
#
# Unlike make_bundles.sh (one capture that starts before the job and covers every rank),
# each case here is captured the way an on-call engineer captures a cluster: one
# `stallscope capture` per host, inside that rank's network and UTS namespaces (host name
# node<r>), the hosts' starts spread over 0-5 s, stopped while the job (or the hang) goes on,
# Linux's TCP defaults (tail-loss probes on). The launcher does the per-host loop
# (--capture per-host); kept per case: node<r>.tar.gz for every host and the lab's
# scenario.json (ground truth plus each capture's planned/started/stopped times).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PY=$REPO/.venv/bin/python; [ -x "$PY" ] || PY=python3
DEST=${DEST:-$REPO/tests/fixtures/bundles-per-host}
BUILD=$REPO/tests/lab/build
[ "$(id -u)" = 0 ] || { echo "make_per_host_bundles.sh: needs root (network namespaces, bpftrace, tcpdump)" >&2; exit 2; }
make -s -C tests/lab all BUILD="$BUILD"

SMALL=(--ranks 4 --buckets 65536,32768 --compute-ms 60 --capture per-host --capture-stagger-s 0-5 --seed 7)
CAP="--capture-args=--max-bytes 3M"
declare -A ARGS=(
  # a healthy job under CPU load, captured while it trains: no warning, no error
  [clean]="--scenario clean --stress 1 --capture-start onset+2 --capture-duration-s 10"
  # the on-call case: paged 10 s after the hang began, 15 s per host
  [mismatch-hang-late]="--scenario mismatch-hang --rank 1 --capture-start onset+10 --capture-duration-s 15 --hold-s 10"
  [gpu-hang-late]="--scenario gpu-hang --rank 2 --capture-start onset+10 --capture-duration-s 15 --hold-s 10"
  [link-down-hang-late]="--scenario link-down-hang --rank 3 --capture-start onset+10 --capture-duration-s 15 --hold-s 10"
)
ORDER=(clean mismatch-hang-late gpu-hang-late link-down-hang-late)
[ $# -gt 0 ] && ORDER=("$@")

WORK=$(mktemp -d /tmp/stallscope-per-host.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
for c in "${ORDER[@]}"; do
  [ -n "${ARGS[$c]+x}" ] || { echo "unknown case $c" >&2; exit 2; }
  out=$WORK/$c
  # shellcheck disable=SC2086
  "$PY" -m tests.lab.launcher --build "$BUILD" --out "$out" "${SMALL[@]}" ${ARGS[$c]} "$CAP" --require-captures \
    >"$WORK/$c.out" 2>"$WORK/$c.err" || { tail -20 "$WORK/$c.err" >&2; echo "$c: lab failed" >&2; exit 1; }
  rm -rf "${DEST:?}/$c"
  mkdir -p "$DEST/$c"
  for b in "$out"/bundles/node*/*.tar.gz; do
    cp "$b" "$DEST/$c/$(basename "$(dirname "$b")").tar.gz"
  done
  cp "$out/scenario.json" "$DEST/$c/scenario.json"
  echo "$c: $(ls "$DEST/$c" | tr '\n' ' ')($(du -sh "$DEST/$c" | cut -f1))"
done
