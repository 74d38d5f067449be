"""Check a bundle captured by real_nccl.sh against the workload's own record."""
import glob
import json
import os
import sys
import tarfile

from capture.elf import exported_functions  # noqa: E402  (stdlib-only package)
from tests.lab.ids import comm_id_fold  # noqa: E402

out, lib = sys.argv[1], sys.argv[2]
result = json.load(open(os.path.join(out, "result.json")))
print("workload:", result)
ok = True

probed = ["ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclBcast", "ncclReduce",
          "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd", "ncclCommInitRank", "ncclCommInitRankConfig",
          "ncclCommInitAll", "ncclCommSplit", "ncclCommDestroy", "ncclCommAbort", "ncclGetUniqueId"]
syms = set(exported_functions(lib))
missing = [s for s in probed if s not in syms]
print("exported NCCL symbols probed:", len(probed) - len(missing), "of", len(probed), "missing:", missing)
ok &= not missing

bundles = sorted(glob.glob(os.path.join(out, "stallscope-*.tar.gz")))
print("bundles:", bundles)
with tarfile.open(bundles[-1]) as tf:
    names = tf.getnames()
    manifest = json.load(tf.extractfile([n for n in names if n.endswith("manifest.json")][0]))
    ev_name = [n for n in names if n.endswith("events.jsonl")][0]
    events = [json.loads(l) for l in tf.extractfile(ev_name).read().decode().splitlines() if l.startswith("{")]
print("collectors:", {k: v.get("status") for k, v in manifest.get("collectors", {}).items()})
kinds = {}
for e in events:
    kinds[e.get("ev")] = kinds.get(e.get("ev"), 0) + 1
print("events by kind:", kinds)
inits = [e for e in events if e.get("ev") == "comm_init"]
for e in inits:
    words = e.get("unique_id")
    folded = None
    if words:
        raw = b"".join(int(w, 16).to_bytes(8, "little") for w in words)
        folded = f"0x{comm_id_fold(raw):016x}"
    print("comm_init:", {k: e.get(k) for k in ("fn", "rank", "nranks", "comm_id_hash", "rc")}, "refold:", folded)
    ok &= folded is None or folded == e.get("comm_id_hash")
ok &= any(e.get("rank") == 0 and e.get("nranks") == 1 for e in inits)
# every init read the id that ncclGetUniqueId produced (not other bytes off the stack),
# and only the API's own entry points fired (no internal functions sharing a name prefix)
made = {tuple(e["unique_id"]) for e in events if e.get("ev") == "unique_id" and e.get("unique_id")}
read = [tuple(e["unique_id"]) for e in inits if e.get("unique_id")]
print("ids made by ncclGetUniqueId:", len(made), "ids read at init:", len(read),
      "all match:", bool(read) and all(r in made for r in read))
ok &= bool(read) and all(r in made for r in read)
ok &= len(inits) == 1
colls = [e for e in events if e.get("ev") == "coll" and e.get("op") == "ALL_REDUCE"]
big = [e for e in colls if e.get("count") == result["count"]]
print("ALL_REDUCE events:", len(colls), "with the workload's count:", len(big),
      "datatypes:", sorted({e.get("datatype") for e in big}), "ranks:", sorted({str(e.get("rank")) for e in big}))
ok &= len(big) == result["allreduces"] and {e.get("datatype") for e in big} == {7}
ok &= {e.get("rank") for e in big} == {0}
counts = sorted(e.get("op_count") for e in colls)
ok &= counts == list(range(counts[0], counts[0] + len(counts))) if counts else False
waits = [e for e in events if e.get("ev") == "host_wait"]
print("host waits:", len(waits), sorted({e.get("fn") for e in waits}))
print("RESULT:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
