#!/usr/bin/env bash
# the watcher as deployed (no --pid, no --nccl-lib) before a real torch job; an on-demand bundle
set -u
out=${1:?OUT}; mkdir -p "$out/w"
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing 2>&1
mkdir -p /tmp/bpft && tar -xJf .bpft/bpft.tar.xz -C /tmp/bpft
export LD_LIBRARY_PATH=/tmp/bpft/bpft/lib PATH=/tmp/bpft/bpft:$PATH
python3 -m capture --watch -o "$out/w" --after 3s --progress lines > "$out/watch.log" 2>&1 &
wp=$!
for _ in $(seq 120); do grep -qiE "watching|capturing" "$out/watch.log" && break; sleep 0.5; done
sleep 20   # the ahead-of-time scan and the tracer on what it found
echo "--- watcher log so far"; tail -15 "$out/watch.log"
work=$(mktemp -d); touch "$work/gate"
t0=$(date +%s.%N)
python3 tests/device/workload.py "$work/gate" "$work/result.json" 200 4096 > "$out/workload.log" 2>&1 &
wl=$!
sleep 12
python3 -m capture --trigger "device check" 2>&1 | tail -2
for _ in $(seq 90); do ls "$out"/w/*.tar.gz >/dev/null 2>&1 && break; sleep 1; done
sleep 2
wait $wl; echo "workload rc=$?"
kill -TERM $wp; wait $wp; echo "watcher rc=$?"
tail -25 "$out/watch.log"
cp "$work/result.json" "$out/" 2>/dev/null
for b in "$out"/w/*.tar.gz; do
python3 - "$b" <<'PY'
import json, sys, tarfile, collections
t = tarfile.open(sys.argv[1])
names = t.getnames()
m = json.load(t.extractfile(next(n for n in names if n.endswith("manifest.json"))))
ev = [json.loads(l) for l in t.extractfile(next(n for n in names if n.endswith("bpf/events.jsonl"))).read().splitlines() if l.strip()]
kinds = collections.Counter(e.get("ev") for e in ev)
colls = [e for e in ev if e.get("ev") == "coll"]
tr = {k: v for k, v in m.get("collectors", {}).items() if k.startswith("tracer")}
print("bundle", sys.argv[1].rsplit("/", 1)[-1], "events", dict(kinds))
print("op_counts", min((c.get("op_count") for c in colls), default=None), max((c.get("op_count") for c in colls), default=None), "comm_init seen:", kinds.get("comm_init", 0))
for k, v in tr.items():
    print(k, {x: v.get(x) for x in ("status", "libraries", "libraries_ahead", "libraries_left_out", "restarts")})
PY
done
