#!/usr/bin/env python3
"""t_tool_metrics: `shrreg-tool --metrics` over a region that real processes use (w_hold.py under
LD_PRELOAD, over the stand-in driver). Its output is parsed by prometheus_client's text parser
(installed with pip if missing) and must carry HAMi's vGPUmonitor container metrics (HAMi
4707fb02, cmd/vGPUmonitor/metrics.go: names, help texts, gauge, labels namespace, pod, container,
vdevice_index, device_uuid and the collector's zone="vGPU") with the values the monitor's reads
give on the same file (the port in c-tests/monitor/hami_monitor.py) and the usage the processes
hold. A copy of the region with one value changed must fail the same comparison.
Environment: HK_TOOL (shrreg-tool), CUDA_DEVICE_MEMORY_LIMIT (1g), FAKE_CTX_BYTES."""
import os
import shutil
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "monitor"))
import hami_monitor as hm  # noqa: E402
from hk import Checks, Holder, ensure_module, region_in, tool  # noqa: E402

MIB = 1 << 20
checks = Checks("tool-metrics")
check, info = checks.check, checks.info

parser = ensure_module("prometheus_client", "prometheus_client.parser")
if parser is None:
    check(False, "prometheus_client could not be installed with pip")
    checks.finish()

# The container descriptors of cmd/vGPUmonitor/metrics.go at HAMi 4707fb02: name -> help.
HAMI = {
    "hami_vgpu_memory_used_bytes": "vGPU device memory usage in bytes",
    "hami_vgpu_memory_limit_bytes": "vGPU device memory limit in bytes",
    "hami_container_device_memory_bytes": "Container device memory usage in bytes",
    "hami_container_device_utilization_ratio": "Container device SM utilization ratio",
    "hami_container_last_kernel_elapsed_seconds": "Seconds since last kernel execution in container",
    "hami_vgpu_memory_context_bytes": "Container device memory context size in bytes",
    "hami_vgpu_memory_module_bytes": "Container device memory module size in bytes",
    "hami_vgpu_memory_buffer_bytes": "Container device memory buffer size in bytes",
}
# What each metric is in hami_monitor.container_metrics (collectContainerMetrics' reads).
FROM_MONITOR = {
    "hami_vgpu_memory_used_bytes": "memory_total",
    "hami_vgpu_memory_limit_bytes": "memory_limit",
    "hami_container_device_memory_bytes": "memory_total",
    "hami_container_device_utilization_ratio": "sm_util",
    "hami_container_last_kernel_elapsed_seconds": "last_kernel_elapsed",
    "hami_vgpu_memory_context_bytes": "context",
    "hami_vgpu_memory_module_bytes": "module",
    "hami_vgpu_memory_buffer_bytes": "buffer",
}
LABELS = {"namespace", "pod", "container", "vdevice_index", "device_uuid", "zone"}


def scrape(path):
    """{name: (type, help, [(labels, value)])} of the tool's output, and the time it ran."""
    now = int(time.time())
    rc, out, err = tool("--file", path, "--metrics")
    check(rc == 0 and not err, "--metrics on %s exits 0 quietly (rc %d %s)" % (path, rc, err.strip()))
    fams = {}
    for f in parser.text_string_to_metric_families(out):
        fams[f.name] = (f.type, f.documentation, [(s.labels, s.value) for s in f.samples])
    return fams, now


def expected(path, now):
    """What HAMi's monitor would publish for device 0 of the file, read by the port."""
    with open(path, "rb") as f:
        return hm.container_metrics(hm.Spec(f.read()), now).get(0, {})


def mismatches(fams, want, container):
    """Every way the scraped families differ from `want` (the monitor's reads) and the labels."""
    bad = []
    uuid = want.get("uuid", "").rstrip("\0")
    labels = {"namespace": "", "pod": "", "container": container, "vdevice_index": "0",
              "device_uuid": uuid, "zone": "vGPU"}
    for name, key in FROM_MONITOR.items():
        if name not in fams:
            bad.append("%s missing" % name)
            continue
        _, _, samples = fams[name]
        if len(samples) != 1:
            bad.append("%s has %d samples" % (name, len(samples)))
            continue
        got_labels, value = samples[0]
        if got_labels != labels:
            bad.append("%s labels %s" % (name, got_labels))
        slack = 1 if key == "last_kernel_elapsed" else 0  # a second may tick between the reads
        if abs(value - want[key]) > slack:
            bad.append("%s = %r, the monitor reads %r" % (name, value, want[key]))
    return bad


tmp = tempfile.mkdtemp(prefix="t_tool_metrics.")
region = region_in(tmp, "4f3c9a1e-uid_trainer")
a = Holder(region, 100 * MIB, launch=True)
b = Holder(region, 200 * MIB)

fams, now = scrape(region)
want = expected(region, now)
check(set(fams) == set(HAMI), "exactly HAMi's 8 container families: %s" % sorted(fams))
for name, (typ, help_text, samples) in sorted(fams.items()):
    check(typ == "gauge" and help_text == HAMI.get(name),
          "%s: gauge with HAMi's help text (%s, %r)" % (name, typ, help_text))
    check(all(set(lb) == LABELS for lb, _ in samples), "%s: labels are HAMi's (+ zone)" % name)
bad = mismatches(fams, want, "trainer")
check(not bad, "every value is what the monitor's reads give, labels as derived: %s" % bad)
ctx = want["context"]
values = {n: s[2][0][1] for n, s in fams.items() if s[2]}
check(values.get("hami_vgpu_memory_buffer_bytes") == 300 * MIB,
      "buffer = the 100 + 200 MiB the two processes hold")
check(values.get("hami_vgpu_memory_limit_bytes") == 1 << 30, "limit = CUDA_DEVICE_MEMORY_LIMIT 1g")
check(ctx > 0 and values.get("hami_vgpu_memory_used_bytes") == 300 * MIB + ctx,
      "used = buffer + contexts (%d MiB)" % (ctx // MIB))
check(0 <= values.get("hami_container_last_kernel_elapsed_seconds", -1) <= 30,
      "a kernel was launched seconds ago")

# The values are the region's now: b lets go of its 200 MiB.
b.close()
fams2, now2 = scrape(region)
want2 = expected(region, now2)
check(not mismatches(fams2, want2, "trainer"), "after one process exits the values follow the region")
check(fams2["hami_vgpu_memory_buffer_bytes"][2][0][1] == 100 * MIB, "buffer is 100 MiB after it exits")

# The comparison catches a wrong value: a copy whose limit says 2 GiB.
other = region_in(tmp, "77aa-uid_other")
shutil.copyfile(region, other)
with open(other, "r+b") as f:
    f.seek(hm.OFF_LIMIT)
    f.write(struct.pack("<Q", 2 << 30))
fams3, now3 = scrape(other)
bad = mismatches(fams3, want2, "other")
check(len(bad) == 1 and bad[0].startswith("hami_vgpu_memory_limit_bytes = ")
      and fams3["hami_vgpu_memory_limit_bytes"][2][0][1] == 2 << 30,
      "a copy with another limit fails the comparison on that value alone: %s" % bad)
check(not mismatches(fams3, expected(other, now3), "other"), "and passes against its own reads")
check(fams3["hami_container_device_memory_bytes"][2][0][0]["container"] == "other",
      "the container label follows the directory")

# SM utilisation: the stand-in's processes publish 0 here (no SM limit), so a copy carries 37 in
# the live slot and 5 in the slot the exited process left: the metric is 37, what the monitor
# reads (it sums the slots whose status is not 0).
busy = region_in(tmp, "5e5e-uid_busy")
shutil.copyfile(region, busy)
with open(busy, "r+b") as f:
    for slot, util in ((0, 37), (1, 5)):
        f.seek(hm.OFF_PROCS + slot * hm.SLOT_SIZE + hm.SLOT_DEVICE_UTIL + 16)
        f.write(struct.pack("<Q", util))
fams5, now5 = scrape(busy)
want5 = expected(busy, now5)
check(want5.get("sm_util") == 37 and not mismatches(fams5, want5, "busy")
      and fams5["hami_container_device_utilization_ratio"][2][0][1] == 37,
      "sm_util 37 in the live slot, 5 in an exited one: the metric is 37, as the monitor reads it "
      "(%r)" % want5.get("sm_util"))

# A directory not named <pod-uid>_<container>: the container label is empty.
plain = region_in(tmp, "vgpu")
shutil.copyfile(region, plain)
fams4, now4 = scrape(plain)
check(not mismatches(fams4, expected(plain, now4), ""), "a plain directory gives container=\"\"")

a.close()
# No file: an error line, exit status 2, nothing on stdout.
rc, out, err = tool("--file", os.path.join(tmp, "none.cache"), "--metrics")
check(rc == 2 and not out and "no such file" in err, "a missing file: exit 2, one line (rc %d)" % rc)
shutil.rmtree(tmp, ignore_errors=True)
checks.finish()
