set -u
lib=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
python3 tests/device/diag_offsets.py $lib .devsnap
which readelf objdump nm 2>&1 | head -3
mkdir -p /tmp/bpft && tar -xJf .bpft/bpft.tar.xz -C /tmp/bpft
export LD_LIBRARY_PATH=/tmp/bpft/bpft/lib PATH=/tmp/bpft/bpft:$PATH
work=$(mktemp -d)
python3 tests/device/workload.py "$work/gate" "$work/result.json" 3 1024 &
wl=$!
sleep 8
grep libnccl /proc/$wl/maps
bpftrace -e "
uprobe:$lib:ncclCommInitRank, uprobe:$lib:ncclCommInitRankConfig, uprobe:$lib:ncclAllReduce, uprobe:$lib:ncclGetUniqueId
/pid == $wl/ { printf(\"%s ip=0x%lx sp=0x%lx a0=%lx a1=%ld a2=%ld\\n\", probe, reg(\"ip\"), reg(\"sp\"), arg0, arg1, arg2); printf(\"%s\\n\", ustack(6)); }" &
bt=$!
sleep 10
touch $work/gate
wait $wl
sleep 1
kill -INT $bt; wait $bt
