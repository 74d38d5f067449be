#!/usr/bin/env bash
# The watcher as deployed (no --pid, no --nccl-lib) started before a real torch job on a GPU host:
# the job's libnccl must be traced ahead of time, so the on-demand bundle holds its communicator
# init and every all_reduce from its first (see README.md). Usage: tests/device/watch_check.sh OUTDIR
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
lib=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['libnccl'][0])" "$out/result.json" 2>/dev/null)
python3 - "$lib" "$out"/w/*.tar.gz <<'PY'
import json, sys, tarfile, collections
lib, bundles, ok = sys.argv[1], sys.argv[2:], False
for path in bundles:
    t = tarfile.open(path)
    names = t.getnames()
    m = json.load(t.extractfile(next(n for n in names if n.endswith("manifest.json"))))
    ev = [json.loads(l) for l in t.extractfile(next(n for n in names if n.endswith("bpf/events.jsonl"))).read().splitlines()
          if l.strip()]
    kinds = collections.Counter(e.get("ev") for e in ev)
    ops = sorted(e.get("op_count") for e in ev if e.get("ev") == "coll" and e.get("op_count") is not None)
    tr = m.get("collectors", {}).get("tracer", {})
    print("bundle", path.rsplit("/", 1)[-1], "events", dict(kinds))
    print("tracer", tr.get("status"), "libraries ahead:", tr.get("libraries_ahead"), "restarts:", tr.get("restarts"))
    print("op counts", ops[:1], "...", ops[-1:], "of", len(ops), "; comm_init:", kinds.get("comm_init", 0))
    ok = ok or (lib in (tr.get("libraries_ahead") or []) and kinds.get("comm_init", 0) >= 1
                and ops == list(range(200)))
print("RESULT:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
