#!/usr/bin/env python3
"""t_monitor: the library under HAMi's monitor, over the stand-in driver. The monitor is the port
in c-tests/monitor/hami_monitor.py (HAMi commit 4707fb02, its Go source), run every 0.5 s instead of
5 s so that the test is short. Each scenario is one node: a directory of containers (one region
file each, `<uid>_<name>/region.cache`) over one stand-in GPU (one FAKE_GPU_STATE), its own monitor.
Workers are c-tests/hooks/w_work (launches, or allocations) writing their progress over time.

- alone-then-pair: container A (CUDA_DEVICE_SM_LIMIT=25, default policy) runs alone, then B joins:
  A alone is not throttled (the monitor turns its switch off); together each gets about a
  quarter of the unlimited rate, as a forced limit would give (the monitor turns both switches on,
  which needs A to keep marking itself active while its switch was off);
- priority: a CUDA_TASK_PRIORITY=0 container blocks a priority-1 container's launches while it
  runs (the region's recent_kernel stays -1 all along, sampled for 10 s, while the blocked launch
  waits past the gate's 10 s slice),
  and the low one runs again after;
- the metrics the monitor reads move with the work: usage, sm_util, last_kernel_time;
- the bytes: both containers' UUID entries are identical, the UUID text and zeros, and the SM
  buckets of devices that do not exist were never touched;
- suspend: `shrreg-tool --suspend` from another process stops a container's launches and
  allocations, `--resume` lets them go on.

Environment: HK_BUILD (directory of w_work), HK_TOOL (shrreg-tool), LD_PRELOAD (libvgpu.so),
LD_LIBRARY_PATH (the stand-in driver)."""
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "monitor"))
import hami_monitor as hm  # noqa: E402
import hk  # noqa: E402
from hk import Checks  # noqa: E402

TICK = 0.5
EXT_OFFSET = 2011136  # hami_ext_t in the file (c-tests/layout.c checks the header's value)
BUCKET_SIZE = 40
checks = Checks("monitor")
check, info = checks.check, checks.info


BUILD = os.environ.get("HK_BUILD", ".")
TMP = tempfile.mkdtemp(prefix="t_monitor.")


class Node:
    """One stand-in GPU, its containers' directory, and a monitor thread."""

    def __init__(self, name):
        self.name = name
        self.dir = os.path.join(TMP, name)
        os.makedirs(self.dir)
        self.state = os.path.join(TMP, name + ".state")
        self.lister = hm.Lister(self.dir)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.wait(TICK):
            hm.observe(list(self.lister.update().values()))

    def region(self, ctr):
        return os.path.join(self.dir, "pod%s_%s" % (self.name, ctr), "region.cache")

    def spec(self, ctr):
        return self.lister.containers.get("pod%s_%s" % (self.name, ctr))

    def start(self, ctr, seconds, env, mode="launch"):
        path = self.region(ctr)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        e = dict(os.environ)
        for k in ("CUDA_DEVICE_SM_LIMIT", "GPU_CORE_UTILIZATION_POLICY", "CUDA_TASK_PRIORITY"):
            e.pop(k, None)
        e.update(env)
        e["FAKE_GPU_STATE"] = self.state
        e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = path
        out = os.path.join(TMP, "%s.%s.%s.out" % (self.name, ctr, mode))
        err = open(out + ".log", "w")
        p = subprocess.Popen([os.path.join(BUILD, "w_work"), mode, str(seconds), out],
                             env=e, stdout=err, stderr=err)
        return Work(p, out)

    def close(self):
        self.stop.set()
        self.thread.join()


class Work:
    def __init__(self, proc, out):
        self.proc, self.out = proc, out

    def points(self):
        pts = []
        try:
            with open(self.out) as f:
                for line in f:
                    t, n = line.split()
                    pts.append((float(t), int(n)))
        except (OSError, ValueError):
            pass
        return pts

    def count_at(self, t):
        """Work reported by monotonic time t (a stall shows as no report, so no interpolation)."""
        done = 0
        for t0, n0 in self.points():
            if t0 > t:
                break
            done = n0
        return float(done)

    def rate(self, a, b):
        return (self.count_at(b) - self.count_at(a)) / (b - a)

    def wait(self):
        rc = self.proc.wait()
        log = open(self.out + ".log").read()
        if rc != 0:
            info("%s exited %d: %s" % (self.out, rc, log[-2000:]))
        return rc, log


def sleep_until(t):
    time.sleep(max(0.0, t - time.monotonic()))


def ext_bucket(path, dev):
    with open(path, "rb") as f:
        f.seek(EXT_OFFSET + 16 + dev * BUCKET_SIZE)
        return struct.unpack("<5Q", f.read(BUCKET_SIZE))


def uuid_entry(path, dev):
    with open(path, "rb") as f:
        f.seek(hm.OFF_UUIDS + dev * hm.UUID_SIZE)
        return f.read(hm.UUID_SIZE)


def tool(path, action):
    rc, out, err = hk.tool("--file", path, action)
    return rc, out + err


SM25 = {"CUDA_DEVICE_SM_LIMIT": "25"}
T0 = time.monotonic()
base, pair, prio, susp = Node("base"), Node("pair"), Node("prio"), Node("susp")

# Start everything; times are relative to T0.
w_base = base.start("solo", 8, {})
w_a = pair.start("a", 34, SM25)
w_low = prio.start("low", 19, {"CUDA_DEVICE_SM_LIMIT": "50", "CUDA_TASK_PRIORITY": "1"})
w_launch = susp.start("c", 9, {})
w_alloc = None

# Suspension, in its own node: launches and allocations in one container.
sleep_until(T0 + 0.2)
w_alloc = susp.start("c", 9, {}, mode="alloc")

# Container A alone: its switch goes off.
sleep_until(T0 + 2.0)
w_high = prio.start("high", 13, {"CUDA_DEVICE_SM_LIMIT": "50", "CUDA_TASK_PRIORITY": "0"})
sleep_until(T0 + 3.0)
rc, out = tool(susp.region("c"), "--suspend")
check(rc == 0 and "status 1 -> 2" in out,
      "shrreg-tool --suspend sets this library's processes' status to 2 (rc %d)" % rc)
if "status 1 -> 2" not in out:
    info(out)
a_alone_switch = pair.spec("a").get_utilization_switch() if pair.spec("a") else None
sleep_until(T0 + 5.5)
rc, out = tool(susp.region("c"), "--resume")
check(rc == 0 and "status 2 -> 1" in out, "shrreg-tool --resume sets it back to 1 (rc %d)" % rc)

# B joins A.
sleep_until(T0 + 6.0)
w_b = pair.start("b", 28, SM25)

# While the high-priority container runs: the low one's gate stays closed; sample the metrics
# over the last 3 s, keeping each container's sample with the highest sm_util (a container's
# SM controller pauses its launches for about a second now and then to read the other's share of
# the GPU; sm_util reads 0 meanwhile). From 8 s the pair's switches, through those pauses.
blocked_seen = []
metrics = {}
pair_switches = []
while time.monotonic() < T0 + 15.0:
    spec = prio.spec("low")
    if spec is not None and time.monotonic() > T0 + 5.0:
        blocked_seen.append(spec.get_recent_kernel())
    if time.monotonic() > T0 + 8.0:
        pair_switches += [s.get_utilization_switch() for s in map(pair.spec, "ab") if s]
    if time.monotonic() > T0 + 12.0:
        for ctr in ("a", "b"):
            s = pair.spec(ctr)
            m = hm.container_metrics(s).get(0, {}) if s else {}
            if m.get("sm_util", 0) >= metrics.get(ctr, {}).get("sm_util", -1):
                metrics[ctr] = m
    time.sleep(0.02)

for w in (w_base, w_launch, w_alloc, w_a, w_b, w_high, w_low):
    w.wait()
time.sleep(2 * TICK)
after = {ctr: hm.container_metrics(pair.spec(ctr)).get(0, {}) for ctr in ("a", "b")}
for n in (base, pair, prio, susp):
    n.close()

# ---- verdicts ----
B = w_base.rate(T0 + 2, T0 + 8)
check(B > 0, "the unlimited container keeps the stand-in GPU busy (%.0f blocks/s)" % B)
B = max(B, 1.0)
share = lambda w, a, b: 100.0 * w.rate(T0 + a, T0 + b) / B  # noqa: E731

check(a_alone_switch == 0, "container A alone: the monitor turned its utilization_switch off "
      "(it is %s)" % a_alone_switch)
check(share(w_a, 3, 6) >= 85, "container A alone, limit 25, default policy: %.1f%% of the "
      "unlimited rate, not throttled (HAMi: one task alone runs free)" % share(w_a, 3, 6))
for name, w in (("A", w_a), ("B", w_b)):
    info("%s, %% of the unlimited rate per 2 s: %s" % (name, " ".join(
        "%.0f" % share(w, t, t + 2) for t in range(0, 34, 2))))
# Each container's controller first measures its unthrottled rate while the other one runs (half
# the GPU), then pauses its own launches to read the other's share of the device from NVML's
# device samples and measures again, scaled up by that share (hami_shm::sm_controller). A pause
# launches nothing for 0.6 s or more, which at this port's 0.5 s tick looked idle to the monitor:
# it turned both limits off, the re-measurement counted no launch, and in one run in four a
# container kept its halved first measurement (13.6%). The controller thread now marks the
# container active while its launches wait on the limit, so the switches stay on.
check(pair_switches and all(v == 1 for v in pair_switches),
      "together from 8 s to 15 s, through the controllers' pauses, the monitor keeps both "
      "utilization_switches on (%d samples, values %s)"
      % (len(pair_switches), sorted(set(pair_switches))))
pair_shares = [share(w, 20, 34) for w in (w_a, w_b)]
for name, s in zip("AB", pair_shares):
    check(22 <= s <= 28, "two containers with limit 25 on one GPU, default policy: %s gets %.1f%% "
          "of the unlimited rate over the last 14 s together (want 25 +- 3, as under "
          "GPU_CORE_UTILIZATION_POLICY=force; unthrottled it would get 50)" % (name, s))
info("shares over the last 14 s together: A %.1f%%, B %.1f%%" % tuple(pair_shares))
last = [share(w, 31, 34) for w in (w_a, w_b)]
info("the last 3 s: A %.1f%%, B %.1f%%" % tuple(last))

lo_before, lo_during, lo_after = (w_low.rate(T0 + 0.5, T0 + 2), w_low.rate(T0 + 5, T0 + 15),
                                  w_low.rate(T0 + 17, T0 + 19))
check(lo_before > 0 and lo_during < 0.1 * lo_before,
      "priority 0 running: the priority-1 container's launches wait (%.0f blocks/s, before %.0f)"
      % (lo_during, lo_before))
check(blocked_seen and all(v == -1 for v in blocked_seen),
      "its recent_kernel stays -1 (the monitor's) for all of the 10 s: never overwritten (%d "
      "samples, values %s)" % (len(blocked_seen), sorted(set(blocked_seen))))
check(lo_after > 0.5 * lo_before, "after the priority-0 container ends the low one runs again "
      "(%.0f blocks/s)" % lo_after)

l_s1, l_s2 = w_launch.rate(T0 + 4, T0 + 5.4), w_launch.rate(T0 + 6.5, T0 + 9)
a_s1, a_s2 = w_alloc.rate(T0 + 4, T0 + 5.4), w_alloc.rate(T0 + 6.5, T0 + 9)
check(l_s1 == 0 and a_s1 == 0, "suspended: no launch (%.0f/s) and no allocation (%.0f/s)"
      % (l_s1, a_s1))
check(l_s2 > 0 and a_s2 > 0, "resumed: launches (%.0f/s) and allocations (%.0f/s) go on"
      % (l_s2, a_s2))

for ctr in ("a", "b"):
    m = metrics.get(ctr, {})
    check(m.get("memory_total", 0) > 0 and m.get("context", 0) > 0,
          "container %s running: the monitor reads its usage (%s bytes)" % (ctr, m.get("memory_total")))
    check(m.get("sm_util", 0) > 0, "container %s running: sm_util %s" % (ctr, m.get("sm_util")))
    check(m.get("last_kernel_elapsed", 99) <= 2,
          "container %s running: last kernel %s s ago" % (ctr, m.get("last_kernel_elapsed")))
    a = after.get(ctr, {})
    check(a.get("memory_total", 1) == 0 and a.get("sm_util", 1) == 0,
          "container %s exited: usage %s, sm_util %s" % (ctr, a.get("memory_total"), a.get("sm_util")))

ua, ub = uuid_entry(pair.region("a"), 0), uuid_entry(pair.region("b"), 0)
text = ua.split(b"\0", 1)[0]
check(ua == ub and text.startswith(b"GPU-") and ua == text.ljust(96, b"\0"),
      "both containers' UUID entries are the same 96 bytes, the UUID text and zeros (%r)" % text)
check(ext_bucket(pair.region("a"), 0)[3] != 0, "device 0's SM bucket (in our tail) was leased")
untouched = all(ext_bucket(pair.region(c), d) == (0,) * 5 for c in ("a", "b") for d in range(1, 16))
check(untouched, "CUDA_DEVICE_SM_LIMIT=25 for all devices: no bucket of devices 1..15 (absent) "
      "was touched")
logs = "".join(open(w.out + ".log").read() for w in (w_a, w_b))
check("NVML reports no utilisation" not in logs, "and no warning about them")

subprocess.run(["rm", "-rf", TMP])
checks.finish()
