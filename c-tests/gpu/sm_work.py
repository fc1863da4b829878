#!/usr/bin/env python3
"""Compute-bound PyTorch loop for the SM-limit measurement (c-tests/gpu/sm_limit.sh).

    sm_work.py START WARMUP MEASURE [N]

Waits until the wall-clock time START (seconds since the epoch, so that several processes
measure the same interval), multiplies N x N bf16 matrices for WARMUP seconds (the limiter's
controller settles), then counts completed multiplications for MEASURE seconds and prints
`tflops=X iters=K seconds=S`.
"""
import sys
import time

import torch

start, warmup, measure = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
n = int(sys.argv[4]) if len(sys.argv) > 4 else 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = a @ b
torch.cuda.synchronize()
while time.time() < start:
    time.sleep(0.01)
BATCH = 4  # multiplications between synchronisations: the queue stays short, counts stay exact


def run_until(t_end):
    k = 0
    while time.time() < t_end:
        for _ in range(BATCH):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        k += BATCH
    return k


run_until(start + warmup)
t0 = time.time()
iters = run_until(start + warmup + measure)
dt = time.time() - t0
print("tflops=%.1f iters=%d seconds=%.2f" % (2.0 * n**3 * iters / dt / 1e12, iters, dt))
