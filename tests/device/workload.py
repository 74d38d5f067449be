"""A one-GPU NCCL job: torch.distributed (NCCL backend) with world size 1.

Waits for a gate file so the tracer can attach first, then runs N all_reduces of
COUNT float32 elements and writes what it did to a JSON file.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

gate, result, n, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
while not os.path.exists(gate):
    time.sleep(0.05)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29577")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.ones(count, device="cuda", dtype=torch.float32)
for _ in range(n):
    dist.all_reduce(x)
torch.cuda.synchronize()
maps = [l.split()[-1] for l in open("/proc/self/maps") if "nccl" in l and l.split()[-1].startswith("/")]
json.dump({"allreduces": n, "count": count, "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
           "libnccl": sorted(set(maps)), "pid": os.getpid()}, open(result, "w"))
dist.destroy_process_group()
