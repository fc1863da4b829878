"""Shared by the Python hook tests: PASS/FAIL lines in the format run.sh counts, shrreg-tool,
registry modules, and processes that hold memory in a region."""
import importlib
import os
import subprocess
import sys


class Checks:
    """`check(ok, msg)` prints one PASS or FAIL line tagged with the test's name; `finish()` prints
    the summary and exits 1 if any check failed."""

    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def check(self, ok, msg):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(("PASS" if ok else "FAIL") + " [%s] %s" % (self.name, msg), flush=True)

    def info(self, msg):
        print("INFO [%s] %s" % (self.name, msg), flush=True)

    def finish(self):
        print("%s: %d passed, %d failed" % (self.name, self.passed, self.failed))
        sys.exit(1 if self.failed else 0)


HERE = os.path.dirname(os.path.abspath(__file__))


def tool(*args):
    """Runs shrreg-tool (HK_TOOL) without LD_PRELOAD: (exit status, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    r = subprocess.run([os.environ.get("HK_TOOL", "shrreg-tool")] + list(args), env=env,
                       capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout, r.stderr


def ensure_module(package, module):
    """Imports `module`, installing the registry package `package` with pip first if it is
    missing (Debian's pip refuses system-wide installs without --break-system-packages)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        pass
    pip = [sys.executable, "-m", "pip", "install", "--quiet", package]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    for extra in ([], ["--break-system-packages"]):
        if subprocess.run(pip + extra, env=env).returncode == 0:
            break
    importlib.invalidate_caches()
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


class Holder:
    """A process of a container (w_hold.py, under this process's LD_PRELOAD) that holds a context
    and `nbytes` on device 0 of the region at `path` until `close()`."""

    def __init__(self, path, nbytes, launch=False):
        env = dict(os.environ, CUDA_DEVICE_MEMORY_SHARED_CACHE=path)
        cmd = [sys.executable, os.path.join(HERE, "w_hold.py"), str(nbytes)]
        self.proc = subprocess.Popen(cmd + (["launch"] if launch else []), env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("w_hold %d did not get ready: %r" % (nbytes, line))
        self.pid = self.proc.pid

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def region_in(tmp, dirname):
    """The path of a region file in directory `dirname` of `tmp` (created), named as on HAMi's
    nodes when `dirname` is `<pod-uid>_<container>`."""
    os.makedirs(os.path.join(tmp, dirname))
    return os.path.join(tmp, dirname, "region.cache")
