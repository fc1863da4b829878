#!/usr/bin/env python3
"""t_tool_top: `shrreg-tool top` over a region that real processes use (w_hold.py under LD_PRELOAD,
over the stand-in driver), run under a pseudo-terminal: frames redrawn in place, every device's
limit and usage and every process's pid and usage as `--json` gives them, no line over 80
characters, the terminal's settings restored after `q` and after Ctrl-C, `--iterations`, a file
truncated under it (a frame says so, the next ones recover), and plain frames without escape
codes where stdout is no terminal. The frame check must fail on a frame of another state.
Environment: HK_TOOL (shrreg-tool), CUDA_DEVICE_MEMORY_LIMIT (1g), FAKE_CTX_BYTES."""
import fcntl
import json
import os
import re
import select
import shutil
import signal
import struct
import tempfile
import termios
import time

from hk import Checks, Holder, region_in, tool

MIB = 1 << 20
checks = Checks("tool-top")
check, info = checks.check, checks.info
TOOL = os.environ.get("HK_TOOL", "shrreg-tool")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def human(n):
    """inspect::human: binary units with two decimals."""
    if n < 1024:
        return "%d B" % n
    v, units = n / 1024.0, ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    u = 0
    while v >= 1024.0 and u + 1 < len(units):
        v, u = v / 1024.0, u + 1
    return "%.2f %s" % (v, units[u])


class Pty:
    """The tool on a new pseudo-terminal of 24 x 80 as its controlling terminal (so that Ctrl-C
    there is SIGINT to it); the parent keeps the terminal's end to read its settings."""

    def __init__(self, *args):
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.before = termios.tcgetattr(self.slave)
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env["TERM"] = "xterm"
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.setsid()
                fcntl.ioctl(self.slave, termios.TIOCSCTTY, 0)
                for fd in (0, 1, 2):
                    os.dup2(self.slave, fd)
                os.execve(TOOL, [TOOL] + list(args), env)
            finally:
                os._exit(127)
        self.out = b""
        self.status = None

    def read(self, seconds):
        """Reads what the tool writes for `seconds` (less if it exits)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r, _, _ = select.select([self.master], [], [], max(0.0, end - time.monotonic()))
            if not r:
                break
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the tool exited and closed the terminal
                break
            if not data:
                break
            self.out += data
        return self.out.decode("utf-8", "replace")

    def send(self, data):
        os.write(self.master, data)

    def wait(self, seconds):
        """The exit status within `seconds`, or None (then it is killed)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.read(0.1)
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
                return self.status
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return None

    def restored(self):
        return termios.tcgetattr(self.slave) == self.before

    def close(self):
        os.close(self.master)
        os.close(self.slave)


def frames(text):
    """The frames of a terminal session (each starts at home), without escape codes."""
    return [ANSI.sub("", f).replace("\r", "") for f in text.split("\x1b[H")[1:]]


def expect_of(path):
    """What a frame must show, from `--json` of the same file: device 0's limit and usage, each
    process's pid and usage."""
    rc, out, _ = tool("--file", path, "--json")
    j = json.loads(out)
    dev = j["devices"][0]
    procs = {s["pid"]: sum(u["total"] for u in s["usage"]) for s in j["slots"] if s["pid"]}
    return dev["limit"], dev["used"], procs


def frame_misses(frame, want):
    """How `frame` disagrees with `want` (device row and process rows)."""
    limit, used, procs = want
    lines = frame.splitlines()
    bad = []
    dev = [l for l in lines if re.match(r"\s+0\s", l)]
    if not dev or human(limit) not in dev[0] or human(used) not in dev[0]:
        bad.append("device 0 row %r lacks %s / %s" % (dev[:1], human(limit), human(used)))
    for pid, total in procs.items():
        row = [l for l in lines if l.split()[:1] == [str(pid)]]
        if not row or human(total) not in row[0] or "running" not in row[0]:
            bad.append("no row for pid %d with %s running" % (pid, human(total)))
    rows = [l for l in lines if re.match(r"\s+\d+\s+\d+\s+(running|suspended|exited)", l)]
    if len(rows) != len(procs):
        bad.append("%d process rows for %d processes" % (len(rows), len(procs)))
    return bad


tmp = tempfile.mkdtemp(prefix="t_tool_top.")
region = region_in(tmp, "4f3c9a1e-uid_trainer")
a = Holder(region, 100 * MIB, launch=True)
b = Holder(region, 200 * MIB)
want = expect_of(region)
check(len(want[2]) == 2 and want[1] > 300 * MIB, "two processes hold %s" % human(want[1]))

# Live, on a terminal: frames in place, then b exits and the frames follow; q quits.
t = Pty("top", "--file", region, "--interval", "0.2")
fs = frames(t.read(1.5))
check(not t.restored(), "while it runs, keys are read as typed (the terminal's settings changed)")
check(len(fs) >= 3, "frames redrawn in place at home, every 0.2 s (%d in 1.5 s)" % len(fs))
check("\x1b[H" in t.out.decode() and "\x1b[?25l" in t.out.decode(), "ANSI home and hidden cursor")
last = fs[-1] if fs else ""
bad = frame_misses(last, want)
check(not bad, "the frame shows device 0's limit and usage and both processes: %s" % bad)
check("last kernel" in last and "none per process" in last,
      "the last kernel time, and that the region has no per-process one")
width = max((len(l) for f in fs for l in f.splitlines()), default=0)
check(0 < width <= 80, "no line over 80 characters (widest %d)" % width)
b.close()
want_after = expect_of(region)
t.out = b""
fs = frames(t.read(1.0))
after = fs[-1] if fs else ""
check(not frame_misses(after, want_after), "after one process exits the frame follows")
check(frame_misses(after, want) != [], "and the check fails on it against the earlier state")
t.send(b"q")
rc = t.wait(5)
check(rc == 0, "q quits with exit status 0 (%s)" % rc)
check(t.restored(), "the terminal's settings are restored after q")
check(t.out.decode().endswith("\x1b[?25h"), "the cursor is shown again")
t.close()

# A file cut under it, then restored: a frame says so, the tool lives, and recovers.
copy = os.path.join(tmp, "copy.cache")
shutil.copyfile(region, copy)
saved = open(copy, "rb").read()
t = Pty("top", "--file", copy, "--interval", "0.2")
t.read(0.6)
with open(copy, "r+b") as f:
    f.truncate(4096)
t.out = b""
cut = frames(t.read(0.8))
check(any("cannot read the region" in f for f in cut), "a truncated file: the frame says so")
with open(copy, "wb") as f:
    f.write(saved)
t.out = b""
back = frames(t.read(0.8))
check(back and not frame_misses(back[-1], expect_of(copy)), "restored: the frames recover")
# Ctrl-C through the terminal: SIGINT to the tool, which restores the terminal and exits 0.
t.send(b"\x03")
rc = t.wait(5)
check(rc == 0 and t.restored(), "Ctrl-C quits with exit status 0 and restores the terminal (%s)" % rc)
t.close()

# --iterations on a terminal: it stops by itself.
t = Pty("top", "--file", region, "--interval", "0.1", "--iterations", "3")
rc = t.wait(5)
check(rc == 0 and len(frames(t.out.decode())) == 3 and t.restored(),
      "--iterations 3 draws 3 frames and exits 0 (%s)" % rc)
t.close()

# Not a terminal: frames after a blank line, no escape codes; --watch is the same command.
rc, out, err = tool("--file", region, "--watch", "--interval", "0.1", "--iterations", "2")
check(rc == 0 and "\x1b" not in out and out.count("\ntop ") == 1 and out.startswith("top "),
      "on a pipe: 2 plain frames, the second after a blank line (rc %d)" % rc)
check("\n\ntop " in out, "a blank line between the frames")
rc, _, err = tool("--file", os.path.join(tmp, "none.cache"), "top", "--iterations", "1")
check(rc == 2 and "no such file" in err, "a missing file at the start: exit 2 (rc %d)" % rc)
rc, _, err = tool("--file", region, "--print", "--interval", "1")
check(rc == 2 and "only apply to top" in err, "--interval outside top is refused")

a.close()
shutil.rmtree(tmp, ignore_errors=True)
checks.finish()
