#!/usr/bin/env python3
"""torch_alloc.py MODE ...: PyTorch under libvgpu.so, for run.sh.

  oom [CHUNK_MIB]     allocate CHUNK_MIB tensors until torch.OutOfMemoryError; print the numbers
  hold MIB FILE       allocate MIB, write FILE when done, then sleep until killed
Prints 'RESULT key=value ...' lines and PASS/FAIL lines."""
import os
import subprocess
import sys
import time

import torch

MIB = 1 << 20
passed = failed = 0


def check(ok, msg):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print(("PASS" if ok else "FAIL") + " [torch] " + msg, flush=True)


def real_usage_mib():
    """This process's (else the GPU's) real usage as NVML reports it, without the preload."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            env=env, capture_output=True, text=True, timeout=30).stdout
    except Exception:
        return None, None
    rows = [l.split(",") for l in out.strip().splitlines() if "," in l]
    mine = [int(u) for p, u in rows if p.strip() == str(os.getpid())]
    total = sum(int(u) for _, u in rows if u.strip().isdigit())
    return (mine[0] if mine else None), total


mode = sys.argv[1]
torch.cuda.init()
free, total = torch.cuda.mem_get_info()
limit = int(os.environ.get("HK_LIMIT_BYTES", "0"))
if mode == "oom":
    chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    check(limit == 0 or total == limit, "torch.cuda.mem_get_info total %d == limit %d" % (total, limit))
    held = []
    err = None
    t0 = time.time()
    while True:
        try:
            held.append(torch.empty(chunk * MIB, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as e:
            err = e
            break
        if len(held) * chunk > 4 << 20:
            break
    got = len(held) * chunk
    torch.cuda.synchronize()
    mine, gpu = real_usage_mib()
    free2, _ = torch.cuda.mem_get_info()
    print("RESULT got_mib=%d reserved_mib=%d used_seen_mib=%d nvml_process_mib=%s nvml_gpu_mib=%s secs=%.1f"
          % (got, torch.cuda.memory_reserved() // MIB, (total - free2) // MIB, mine, gpu, time.time() - t0),
          flush=True)
    check(err is not None, "torch.OutOfMemoryError raised")
    if limit:
        check(got * MIB <= limit, "allocated %d MiB <= limit %d MiB" % (got, limit // MIB))
        if mine is not None:
            check(mine * MIB <= limit, "NVML's real usage of this process %d MiB <= limit" % mine)
    print("torch: %d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)
if mode == "hold":
    mib, path = int(sys.argv[2]), sys.argv[3]
    x = torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with open(path + ".tmp", "w") as f:
        f.write("%d\n" % os.getpid())
    os.rename(path + ".tmp", path)
    while True:
        time.sleep(1)
