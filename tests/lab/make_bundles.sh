#!/usr/bin/env bash
# Regenerate the shipped sample bundles: tests/fixtures/bundles/<scenario>/ (root).
#   tests/lab/make_bundles.sh [scenario ...]       (default: all seven)
#
# For each scenario the lab (4 ranks, small tensors, few steps) starts behind a
# gate, `stallscope capture --pid <gate>` attaches first (so it follows exactly
# this lab's ranks and captures packets inside their namespaces), the gate
# opens, and when the lab has ended the capture is stopped with SIGINT, as a
# user's Ctrl-C. Kept per scenario: the host bundle (*.tar.gz, < ~1 MB through
# --max-bytes) and the lab's ground truth scenario.json. The lab's "hosts" are
# namespaces on this one machine, so one bundle covers every rank.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PY=$REPO/.venv/bin/python; [ -x "$PY" ] || PY=python3
DEST=${DEST:-$REPO/tests/fixtures/bundles}   # DEST=/tmp/x: try without touching the shipped ones
BUILD=$REPO/tests/lab/build
LIB=$BUILD/libnccl.so.2
# CAPTURE overrides the capture command, e.g. a known-good copy of capture/ while
# capture/ is being changed: CAPTURE="env PYTHONPATH=/tmp/old $REPO/.venv/bin/python -P -m capture"
CAPTURE=${CAPTURE:-"$PY -m forensics capture"}
MAX_BYTES=${MAX_BYTES:-4M}   # uncompressed budget; the tar.gz comes out well under 1 MB
[ "$(id -u)" = 0 ] || { echo "make_bundles.sh: needs root (network namespaces, bpftrace, tcpdump)" >&2; exit 2; }
for tool in bpftrace tcpdump nft ip nsenter; do
  command -v "$tool" >/dev/null || { echo "make_bundles.sh: $tool is missing" >&2; exit 2; }
done
make -s -C tests/lab all BUILD="$BUILD"

# Small tensors and few steps, as make_fixtures.sh, but slow steps (--compute-ms)
# and faults from ~1.2 s into training: capture discovers the ranks by polling and
# starts tcpdump in their namespaces about half a second after they appear, so
# the interesting part must come later. Long compute adds time, not packets (the
# pcap share of --max-bytes keeps the *first* packets). The lab's own tcpdump is
# off (--no-pcap): the capture's tcpdump is the one under test.
SMALL=(--ranks 4 --buckets 32768,16384,8192 --no-pcap --no-stacks)
declare -A ARGS=(
  [clean]="--scenario clean --steps 14 --compute-ms 150"
  [loss]="--scenario loss --rank 2 --loss-permille 40 --steps 16 --compute-ms 150 --start-s 1.2"
  [slow-link]="--scenario slow-link --rank 1 --rate 20mbit --steps 14 --compute-ms 150 --start-s 1.2"
  [straggler]="--scenario straggler --rank 3 --straggle-ms 150 --steps 14 --compute-ms 150 --start-s 1.2"
  [mismatch-hang]="--scenario mismatch-hang --rank 1 --at-op 42 --compute-ms 150 --hold-s 1.5"
  [link-down-hang]="--scenario link-down-hang --rank 2 --start-s 1.2 --hold-s 2 --buckets 131072,65536,32768 --compute-ms 60"
  [reset]="--scenario reset --rank 2 --start-s 1.2 --hold-s 2 --compute-ms 100"
)
ORDER=(clean loss slow-link straggler mismatch-hang link-down-hang reset)
[ $# -gt 0 ] && ORDER=("$@")

WORK=$(mktemp -d /tmp/stallscope-bundles.XXXXXX)
LAB_PID=; CAP_PID=
cleanup() {
  touch "$WORK/GO" 2>/dev/null || true
  for p in $CAP_PID $LAB_PID; do kill -TERM "$p" 2>/dev/null || true; done
  for p in $CAP_PID $LAB_PID; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

for sc in "${ORDER[@]}"; do
  [ -n "${ARGS[$sc]+x}" ] || { echo "unknown scenario $sc" >&2; exit 2; }
  run=$WORK/$sc
  mkdir -p "$run/bundles"
  gate="while [ ! -e '$run/GO' ]; do sleep 0.05; done; exec \"\$@\""
  # shellcheck disable=SC2086
  sh -c "$gate" sh "$PY" -m tests.lab.launcher --build "$BUILD" --out "$run/lab" "${SMALL[@]}" ${ARGS[$sc]} \
    >"$run/launcher.out" 2>"$run/launcher.err" &
  LAB_PID=$!
  # shellcheck disable=SC2086
  $CAPTURE --pid "$LAB_PID" --nccl-lib "$LIB" -o "$run/bundles" --progress lines \
    --duration 3m --max-bytes "$MAX_BYTES" >"$run/capture.out" 2>"$run/capture.err" &
  CAP_PID=$!
  for _ in $(seq 900); do   # up to 90 s for the tracer and tcpdump to attach
    grep -q "capturing:" "$run/capture.err" && break
    kill -0 "$CAP_PID" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "capturing:" "$run/capture.err" || { cat "$run/capture.err" >&2; echo "$sc: capture did not start" >&2; exit 1; }
  touch "$run/GO"
  lab_rc=0; wait "$LAB_PID" || lab_rc=$?; LAB_PID=
  [ "$lab_rc" = 0 ] || { tail -20 "$run/launcher.err" >&2; echo "$sc: lab failed (rc $lab_rc)" >&2; exit 1; }
  sleep 1   # the tracer's last off-CPU dump, lingering segments
  kill -INT "$CAP_PID"
  cap_rc=0; wait "$CAP_PID" || cap_rc=$?; CAP_PID=
  bundle=$(grep '\.tar\.gz$' "$run/capture.out" | head -1 || true)
  [ -n "$bundle" ] && [ -f "$bundle" ] || { tail -20 "$run/capture.err" >&2; echo "$sc: no bundle" >&2; exit 1; }
  [ "$cap_rc" = 0 ] || echo "$sc: capture exit $cap_rc (partial: see the bundle's manifest)" >&2
  out=$DEST/$sc
  rm -rf "$out"; mkdir -p "$out"
  cp "$bundle" "$out/"
  cp "$run/lab/scenario.json" "$out/scenario.json"
  chown -R --reference="$REPO/tests" "$out"
  printf '%-16s %s %s\n' "$sc" "$(du -sh "$out" | cut -f1)" "$(basename "$bundle")"
  rm -rf "$run"
done
