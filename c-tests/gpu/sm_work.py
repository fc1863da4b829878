#!/usr/bin/env python3
"""PyTorch workloads for the SM-limit measurement (c-tests/gpu/sm_limit.sh, monitor.sh).

    sm_work.py START WARMUP MEASURE [N] [--work matmul|small|graph|mix] [--bins]

START is the wall-clock time (seconds since the epoch) at which to begin, so that several
processes measure the same interval; or a directory, for a handshake with sm_limit.sh: the
process imports torch, waits for DIR/init, sets up its work on the GPU, creates DIR/ready.<pid>,
then waits for DIR/start (a file holding the start time) and for that time. Then it works for
WARMUP seconds (the limiter's controller settles) and counts the work completed in the next
MEASURE seconds, synchronising before every clock read, so the counts are exact.

Workloads (--work, default matmul):
  matmul  N x N bf16 matrix products (N default 8192), 4 between synchronisations; TFLOP/s
  small   launch-bound: 20 elementwise kernels on 1 M floats per step (x.mul_(0.9999) and
          x.add_(1e-4), alternating), synchronised every step; kernels/s
  graph   replays of a CUDA graph of twenty 4096^3 bf16 products (torch.cuda.graph), one
          replay between synchronisations; TFLOP/s
  mix     per step one replay of a graph of ten 4096^3 bf16 products, then 20 small kernels
          as in small, then a synchronisation; steps/s
  bursts  a server between requests: per step 0.6 s of products as in matmul, then 1.2 s
          idle; TFLOP/s over whole steps (so the share of the unlimited rate is the share the
          limit left the bursts)

Prints `rate=X unit=U iters=K seconds=S work=W` (matmul: `tflops=X ` first, as monitor.sh reads
it). With --bins also `bins=r0,r1,...`: the rate (in U) in consecutive 1-second bins from START
over the whole run (warm-up included), each completed batch spread over the time since the
previous one; the last bin is shorter if WARMUP + MEASURE is not whole.
"""
import argparse
import math
import os
import sys
import time

import torch

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("start")
p.add_argument("warmup", type=float)
p.add_argument("measure", type=float)
p.add_argument("n", type=int, nargs="?", default=8192)
p.add_argument("--work", choices=("matmul", "small", "graph", "mix", "bursts"), default="matmul")
p.add_argument("--bins", action="store_true")
args = p.parse_args()

try:
    start = float(args.start)
    sync_dir = None
except ValueError:
    start = None
    sync_dir = args.start


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.005)


if sync_dir is not None:
    wait_for(os.path.join(sync_dir, "init"))

GRAPH_N = 4096
SMALL_ELEMS = 1 << 20
SMALL_PAIRS = 10  # 20 kernels a burst
sync = torch.cuda.synchronize


def small_setup():
    x = torch.ones(SMALL_ELEMS, device="cuda", dtype=torch.float32)

    def burst():
        for _ in range(SMALL_PAIRS):
            x.mul_(0.9999)  # x -> 0.9999 x + 1e-4 stays near 1
            x.add_(1e-4)

    return burst


def graph_of(products):
    """A CUDA graph of `products` GRAPH_N^3 bf16 products; returns its replay."""
    a = torch.randn(GRAPH_N, GRAPH_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(GRAPH_N, GRAPH_N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(GRAPH_N, GRAPH_N, device="cuda", dtype=torch.bfloat16)

    def body():
        for _ in range(products):
            torch.matmul(a, b, out=c)

    s = torch.cuda.Stream()  # warm-up on a side stream before capture, as torch's docs do
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(s)
    sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    g.replay()
    sync()
    return g.replay


# Each workload: step() queues one batch and synchronises; `per` is its work in `unit`, `count`
# the iterations it holds (products for matmul, kernels for small, replays for graph, steps for
# mix and bursts). A step() that returns a number did that many times `per` (bursts).
count = 1
if args.work in ("matmul", "bursts"):
    n = args.n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = a @ b
    BATCH = 4  # products between synchronisations: the queue stays short, counts stay exact

    def products():
        for _ in range(BATCH):
            torch.matmul(a, b, out=c)
        sync()

    unit, per, count = "TFLOP/s", BATCH * 2.0 * n**3 / 1e12, BATCH
    step = products
    if args.work == "bursts":
        BUSY_S, IDLE_S = 0.6, 1.2

        def step():
            k, t_end = 0, time.time() + BUSY_S
            while time.time() < t_end:
                products()
                k += 1
            time.sleep(IDLE_S)
            return k
elif args.work == "small":
    burst = small_setup()

    def step():
        burst()
        sync()

    unit, per, count = "kernels/s", 2.0 * SMALL_PAIRS, 2 * SMALL_PAIRS
elif args.work == "graph":
    replay = graph_of(20)

    def step():
        replay()
        sync()

    unit, per = "TFLOP/s", 20 * 2.0 * GRAPH_N**3 / 1e12
else:  # mix
    replay = graph_of(10)
    burst = small_setup()

    def step():
        replay()
        burst()
        sync()

    unit, per = "steps/s", 1.0
# first use: kernels loaded, library handles made (one batch of a burst)
products() if args.work == "bursts" else step()

if sync_dir is not None:
    open(os.path.join(sync_dir, "ready.%d" % os.getpid()), "w").close()
    path = os.path.join(sync_dir, "start")
    wait_for(path)
    with open(path) as f:
        start = float(f.read())
late = time.time() - start
while time.time() < start:
    time.sleep(0.002)

total = args.warmup + args.measure
nbins = max(1, math.ceil(total - 1e-9))
acc = [0.0] * nbins  # work completed in each 1-second bin from START


def credit(t_from, t_to, w):
    """Spreads work w, done between t_from and t_to, over the bins it overlaps."""
    if t_to <= t_from:
        i = int(t_to - start)
        if 0 <= i < nbins:
            acc[i] += w
        return
    i = max(0, int(t_from - start))
    while i < nbins and start + i < t_to:
        lo = max(t_from, start + i)
        hi = min(t_to, start + i + 1, start + total)
        if hi > lo:
            acc[i] += w * (hi - lo) / (t_to - t_from)
        i += 1


def run_until(t_end, prev):
    """Steps until t_end: how many times `per` they did, and the clock after the last."""
    k = 0
    while time.time() < t_end:
        done = step()
        done = 1 if done is None else done
        now = time.time()
        credit(prev, now, per * done)
        prev = now
        k += done
    return k, prev


_, prev = run_until(start + args.warmup, max(start, time.time()))
t0 = prev  # the clock read right after the warm-up's last synchronisation
iters, t1 = run_until(start + total, prev)
dt = t1 - t0
rate = per * iters / dt if dt > 0 else 0.0
line = "rate=%.3f unit=%s iters=%d seconds=%.3f work=%s" % (rate, unit, count * iters, dt, args.work)
if args.work == "matmul":
    line = "tflops=%.1f %s" % (rate, line)
if late > 0:
    line += " late=%.3f" % late
print(line)
if args.bins:
    lens = [min(1.0, total - i) for i in range(nbins)]
    print("bins=" + ",".join("%.3f" % (w / l) for w, l in zip(acc, lens)))
sys.stdout.flush()
