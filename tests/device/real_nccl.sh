#!/usr/bin/env bash
# Run stallscope's tracer against the real libnccl on a GPU machine (see README.md).
# Usage: tests/device/real_nccl.sh OUTDIR   (as root, from the repository root)
set -u
out=${1:?OUTDIR}
mkdir -p "$out"
src=${STALLSCOPE_SRC:-.}
echo "kernel: $(uname -r)"; ls -la /sys/kernel/btf/vmlinux 2>&1 | tail -1
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing 2>&1
mkdir -p /tmp/bpft && tar -xJf .bpft/bpft.tar.xz -C /tmp/bpft
export LD_LIBRARY_PATH=/tmp/bpft/bpft/lib PATH=/tmp/bpft/bpft:$PATH
bpftrace --version
nvidia-smi -L
work=$(mktemp -d)
python3 tests/device/workload.py "$work/gate" "$work/result.json" 200 4096 &
wl=$!
sleep 8   # torch imported, libnccl mapped
lib=$(grep -o '/[^ ]*libnccl[^ ]*' /proc/$wl/maps | sort -u | head -1)
echo "libnccl: $lib"
PYTHONPATH=$src python3 -m capture --pid $wl --no-pcap --duration 120s --progress lines -o "$out" \
    > >(tee "$work/capture.log") 2>&1 &
cap=$!
# bpftrace takes 15-20 s to attach to the real libnccl's probes: start the workload's
# collectives only once capture says it is capturing (it says so after the attach)
for _ in $(seq 120); do grep -q 'capture: capturing:' "$work/capture.log" 2>/dev/null && break; sleep 0.5; done
grep -q 'capture: capturing:' "$work/capture.log" || { echo "capture never started"; kill -INT $cap; }
touch "$work/gate"
wait $wl; echo "workload rc=$?"
sleep 3
kill -INT $cap; wait $cap; echo "capture rc=$?"
cp "$work/result.json" "$out/"
PYTHONPATH=$src python3 tests/device/verify.py "$out" "$lib"
