#!/usr/bin/env bash
# Regenerate the committed lab fixtures: tests/fixtures/lab/<scenario>/ (root).
# Small tensors and few steps keep each scenario's folder well under 1.5 MB.
#   tests/lab/make_fixtures.sh [scenario ...]       (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PY=$REPO/.venv/bin/python; [ -x "$PY" ] || PY=python3
DEST=$REPO/tests/fixtures/lab
BUILD=$REPO/tests/lab/build
[ "$(id -u)" = 0 ] || { echo "make_fixtures.sh: needs root (network namespaces)" >&2; exit 2; }
make -s -C tests/lab all BUILD="$BUILD"

SMALL=(--buckets 32768,16384,8192 --compute-ms 20)
declare -A ARGS=(
  [clean]="--scenario clean --steps 6"
  [loss]="--scenario loss --rank 2 --loss-permille 40 --steps 8 --start-s 0.1"
  [slow-link]="--scenario slow-link --rank 1 --rate 20mbit --steps 6 --start-s 0.1"
  [straggler]="--scenario straggler --rank 3 --straggle-ms 150 --steps 7 --start-s 0.05"
  [mismatch-hang]="--scenario mismatch-hang --rank 1 --at-op 10 --hold-s 1.5"
  [link-down-hang]="--scenario link-down-hang --rank 2 --start-s 0.15 --hold-s 2 --buckets 131072,65536,32768 --compute-ms 5"
  [reset]="--scenario reset --rank 2 --start-s 0.15 --hold-s 2"
)
ORDER=(clean loss slow-link straggler mismatch-hang link-down-hang reset)
[ $# -gt 0 ] && ORDER=("$@")
for sc in "${ORDER[@]}"; do
  [ -n "${ARGS[$sc]+x}" ] || { echo "unknown scenario $sc" >&2; exit 2; }
  out=$DEST/$sc
  rm -rf "$out"
  # shellcheck disable=SC2086
  "$PY" -m tests.lab.launcher --build "$BUILD" --out "$out" "${SMALL[@]}" ${ARGS[$sc]}
  chown -R --reference="$REPO/tests" "$out"
  rm -rf "$out"/pcap/.wsconf-empty
  printf '%-16s %s\n' "$sc" "$(du -sh "$out" | cut -f1)"
done
