#!/usr/bin/env python3
"""A port of HAMi's vGPU monitor's region reads, its feedback loop and its container metrics, for
tests. Written from HAMi's Go source at commit 4707fb02c91c545bc7343ce26dba4c32919f9a3e:

- pkg/monitor/nvidia/cudevshr.go  loadCache        -> load_cache
- pkg/monitor/nvidia/v1/spec.go   Spec (sharedRegionT and its methods) -> Spec
- cmd/vGPUmonitor/feedback.go     CheckBlocking, CheckPriority, Observe, watchAndFeedback
                                                   -> check_blocking, check_priority, observe, watch
- cmd/vGPUmonitor/metrics.go      collectContainerMetrics -> container_metrics

The offsets are those of spec.go's sharedRegionT as Go lays it out on amd64 (the same structs are
transcribed in C in c-tests/monitor_contract.c, which checks them against our header). Like the
Go code, this reads the file through a shared mapping and stores with plain 32-bit writes.

Run as a program it watches a HOOK_PATH-like directory of container directories
(`<pod-uid>_<container>/` holding one region file ending in `.cache`) and runs Observe() every
--interval seconds (HAMi: 5): `hami_monitor.py DIR [--interval S] [--seconds S] [--metrics]`.
"""
import mmap
import os
import struct
import sys
import time

SHARED_REGION_MAGIC_FLAG = 19920718
MAX_DEVICES = 16

# sharedRegionT (spec.go), amd64 offsets.
HEADER_SIZE = 12  # headerT: initializedFlag, majorVersion, minorVersion
OFF_NUM = 56
OFF_UUIDS = 64
UUID_SIZE = 96
OFF_LIMIT = 1600
OFF_SM_LIMIT = 1728
OFF_PROCS = 1856
SLOT_SIZE = 1960
MAX_PROCS = 1024
# shrregProcSlotT
SLOT_PID = 0
SLOT_USED = 8  # [16]deviceMemory, 64 bytes each: contextSize, moduleSize, bufferSize, offset, total
DEVMEM_SIZE = 64
SLOT_DEVICE_UTIL = 1160  # [16]deviceUtilization, 48 bytes each: decUtil, encUtil, smUtil
DEVUTIL_SIZE = 48
SLOT_STATUS = 1928
OFF_PROCNUM = 2008896
OFF_UTILIZATION_SWITCH = 2008900
OFF_RECENT_KERNEL = 2008904
OFF_PRIORITY = 2008908
OFF_LAST_KERNEL_TIME = 2008912
V1_MIN_SIZE = 2008952  # unsafe.Sizeof(sharedRegionT{})


class Spec:
    """spec.go's Spec over one mapped file."""

    def __init__(self, data):
        self.data = data

    def _i32(self, off):
        return struct.unpack_from("<i", self.data, off)[0]

    def _u64(self, off):
        return struct.unpack_from("<Q", self.data, off)[0]

    def _set_i32(self, off, v):
        struct.pack_into("<i", self.data, off, v)

    def device_max(self):
        return MAX_DEVICES

    def device_num(self):
        return min(self._u64(OFF_NUM), MAX_DEVICES)

    def active_procs(self):
        n = min(max(self._i32(OFF_PROCNUM), 0), MAX_PROCS)
        return [OFF_PROCS + i * SLOT_SIZE for i in range(n)]

    def _sum_used(self, idx, field):
        v = 0
        for p in self.active_procs():
            if self._i32(p + SLOT_STATUS) == 0:
                continue
            v += self._u64(p + SLOT_USED + idx * DEVMEM_SIZE + field * 8)
        return v

    def device_memory_context_size(self, idx):
        return self._sum_used(idx, 0)

    def device_memory_module_size(self, idx):
        return self._sum_used(idx, 1)

    def device_memory_buffer_size(self, idx):
        return self._sum_used(idx, 2)

    def device_memory_total(self, idx):
        return self._sum_used(idx, 4)

    def device_sm_util(self, idx):
        v = 0
        for p in self.active_procs():
            if self._i32(p + SLOT_STATUS) == 0:
                continue
            v += self._u64(p + SLOT_DEVICE_UTIL + idx * DEVUTIL_SIZE + 16)
        return v

    def is_valid_uuid(self, idx):
        return self.data[OFF_UUIDS + idx * UUID_SIZE] != 0

    def device_uuid(self, idx):
        """string(uuid[:]): all 96 bytes, NULs included. The monitor's key per GPU."""
        return bytes(self.data[OFF_UUIDS + idx * UUID_SIZE:OFF_UUIDS + (idx + 1) * UUID_SIZE])

    def device_memory_limit(self, idx):
        return self._u64(OFF_LIMIT + idx * 8)

    def last_kernel_time(self):
        return struct.unpack_from("<q", self.data, OFF_LAST_KERNEL_TIME)[0]

    def get_priority(self):
        return self._i32(OFF_PRIORITY)

    def get_recent_kernel(self):
        return self._i32(OFF_RECENT_KERNEL)

    def set_recent_kernel(self, v):
        self._set_i32(OFF_RECENT_KERNEL, v)

    def get_utilization_switch(self):
        return self._i32(OFF_UTILIZATION_SWITCH)

    def set_utilization_switch(self, v):
        self._set_i32(OFF_UTILIZATION_SWITCH, v)


class LoadError(Exception):
    pass


def load_cache(fpath):
    """loadCache: None when the directory has no region file yet; LoadError when refused."""
    files = sorted(os.listdir(fpath))
    matched = sum(1 for f in files if "libvgpu.so" in f or f.endswith(".cache"))
    if matched > 2:
        raise LoadError("cache num not matched")
    if not files:
        return None
    cache_file = next((f for f in files if "libvgpu.so" not in f and f.endswith(".cache")), None)
    if cache_file is None:
        return None
    path = os.path.join(fpath, cache_file)
    size = os.stat(path).st_size
    if size < HEADER_SIZE:
        raise LoadError("cache file size %d too small" % size)
    fd = os.open(path, os.O_RDWR)
    try:
        data = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    flag, major, minor = struct.unpack_from("<iii", data, 0)
    if flag != SHARED_REGION_MAGIC_FLAG:
        data.close()
        raise LoadError("cache file magic flag not matched")
    if major == 1 and size >= V1_MIN_SIZE:
        return Spec(data)
    data.close()
    raise LoadError("unknown cache file size %d version %d.%d" % (size, major, minor))


def _higher_active(row, p):
    """The loop both Go functions open with: a container of a priority above p is active."""
    return any(row[j] > 0 for j in range(min(p, len(row))))


def check_blocking(ut_switch_on, p, c):
    for i in range(c.device_max()):
        row = ut_switch_on.get(c.device_uuid(i))
        if row is not None and _higher_active(row, p):
            return True
    return False


def check_priority(ut_switch_on, p, c):
    for i in range(c.device_max()):
        row = ut_switch_on.get(c.device_uuid(i))
        if row is not None:
            if _higher_active(row, p):
                return True
            if 0 <= p < len(row) and row[p] > 1:
                return True
    return False


def observe(containers):
    """Observe(): containers is a list of Spec. Returns utSwitchOn, for tests to look at."""
    ut_switch_on = {}
    for c in containers:
        recent_kernel = c.get_recent_kernel()
        if recent_kernel > 0:
            recent_kernel -= 1
            if recent_kernel > 0:
                for i in range(c.device_max()):
                    if not c.is_valid_uuid(i):
                        continue
                    uuid = c.device_uuid(i)
                    p = c.get_priority()
                    if p < 0:
                        continue
                    row = ut_switch_on.setdefault(uuid, [])
                    while p >= len(row):
                        row.append(0)
                    row[p] += 1
            c.set_recent_kernel(recent_kernel)
    for c in containers:
        priority = c.get_priority()
        recent_kernel = c.get_recent_kernel()
        switch = c.get_utilization_switch()
        if check_blocking(ut_switch_on, priority, c):
            if recent_kernel >= 0:
                c.set_recent_kernel(-1)
        else:
            if recent_kernel < 0:
                c.set_recent_kernel(0)
        if check_priority(ut_switch_on, priority, c):
            if switch != 1:
                c.set_utilization_switch(1)
        else:
            if switch != 0:
                c.set_utilization_switch(0)
    return ut_switch_on


def container_metrics(c, now_sec=None):
    """collectContainerMetrics: {device index: {metric: value}} for the devices it reports."""
    now_sec = int(time.time()) if now_sec is None else now_sec
    out = {}
    for i in range(c.device_num()):
        if not c.is_valid_uuid(i):
            continue
        uuid = c.device_uuid(i)[0:40]
        try:
            label = uuid.decode("utf-8")
        except UnicodeDecodeError:
            continue
        m = {
            "uuid": label,
            "memory_total": c.device_memory_total(i),
            "memory_limit": c.device_memory_limit(i),
            "context": c.device_memory_context_size(i),
            "module": c.device_memory_module_size(i),
            "buffer": c.device_memory_buffer_size(i),
            "sm_util": c.device_sm_util(i),
        }
        lkt = c.last_kernel_time()
        if lkt > 0:
            m["last_kernel_elapsed"] = max(now_sec - lkt, 0)
        out[i] = m
    return out


class Lister:
    """ContainerLister.Update over a directory, without Kubernetes: every `<uid>_<name>` directory
    is a container of a live pod."""

    def __init__(self, path):
        self.path = path
        self.containers = {}

    def update(self):
        for entry in sorted(os.listdir(self.path)):
            d = os.path.join(self.path, entry)
            if not os.path.isdir(d) or entry in self.containers:
                continue
            parts = entry.split("_", 1)
            if len(parts) != 2 or not parts[0] or not parts[1]:
                continue
            try:
                usage = load_cache(d)
            except (LoadError, OSError):
                continue
            if usage is not None:
                self.containers[entry] = usage
        return self.containers


def watch(path, interval, seconds, metrics=False):
    """watchAndFeedback: Update, then Observe, every `interval` seconds, for `seconds`."""
    lister = Lister(path)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(interval)
        containers = lister.update()
        observe(list(containers.values()))
        if metrics:
            for name, c in sorted(containers.items()):
                print("%.1f %s switch=%d recent_kernel=%d %s" % (
                    time.monotonic(), name, c.get_utilization_switch(), c.get_recent_kernel(),
                    container_metrics(c)), flush=True)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=1e9)
    ap.add_argument("--metrics", action="store_true")
    a = ap.parse_args()
    watch(a.dir, a.interval, a.seconds, a.metrics)
