"""What scripts/bench-read and scripts/bench-write share: the run's settings, running and
timing commands, medians and ratios, /proc lookups, FUSE mounts (ptefs or squashfuse) that
can be remounted fresh, dropping the page cache, the result table, and the frame of a run
(build, temporary directory, cleanup). Python standard library only.
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTEFS = os.path.join(ROOT, "target", "release", "ptefs")
MAKE_MODEL = os.path.join(ROOT, "target", "release", "examples", "make_model")
REPS = int(os.environ.get("BENCH_REPS", "3"))
TOTAL = os.environ.get("BENCH_TOTAL", "1G")
VALUES = int(os.environ.get("BENCH_VALUES", "12000"))
ENV = dict(os.environ, LC_ALL="C")
IS_ROOT = os.geteuid() == 0
TIMEOUT = 900
NAME = os.path.basename(sys.argv[0])


def log(msg):
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


def run(cmd, check=True, timeout=TIMEOUT, **kw):
    r = subprocess.run(cmd, env=ENV, timeout=timeout, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def now_ns():
    return time.perf_counter_ns()


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio_of(a, b):
    return None if a is None or b in (None, 0) else a / b


def check_ratio(ratio, lo=None, hi=None):
    """Whether `ratio` is within [lo, hi] (None when there is no ratio)."""
    if ratio is None:
        return None
    if lo is not None and ratio < lo:
        return False
    if hi is not None and ratio > hi:
        return False
    return True


def drop_caches():
    """Writes back dirty pages and drops clean caches; False when not root."""
    os.sync()
    if not IS_ROOT:
        return False
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    return True


# ---------------------------------------------------------------- processes and mounts


def pids_of(prog, mountpoint):
    """Processes whose command line runs `prog` with `mountpoint` among the arguments."""
    mp = os.path.realpath(mountpoint)
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if not argv or os.path.basename(argv[0]) != prog or "umount" in argv:
            continue
        if any(os.path.realpath(a) == mp for a in argv[1:] if a.startswith("/") or a == mountpoint):
            out.append(int(d))
    return out


def proc_status(pid, keys):
    """The fields `keys` of /proc/PID/status, in kB (missing ones left out); {} when gone."""
    vals = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in keys:
                    vals[k] = int(v.split()[0])
    except OSError:
        return {}
    return vals


def wait_gone(pids, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        if not any(os.path.exists(f"/proc/{p}") for p in pids):
            return True
        time.sleep(0.01)
    return False


def is_mounted(mp):
    mp = os.path.realpath(mp)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == mp for line in f)


def xattr_offset(path):
    """user.ptefs.offset of a mounted file, read with getfattr as a user would (else
    os.getxattr)."""
    if shutil.which("getfattr"):
        r = run(["getfattr", "--only-values", "-n", "user.ptefs.offset", path], check=False)
        if r.returncode == 0:
            return int(r.stdout.strip())
    return int(os.getxattr(path, "user.ptefs.offset"))


class Mount:
    """A FUSE mount (ptefs or squashfuse) that can be remounted fresh."""

    def __init__(self, kind, source, mountpoint, args=()):
        self.kind, self.source, self.mp = kind, source, mountpoint
        self.args = list(args)
        self.prog = "ptefs" if kind == "ptefs" else "squashfuse"
        os.makedirs(mountpoint, exist_ok=True)

    def mount(self):
        """Mounts; returns ms from exec until `probe` lists, and the mount command's ms."""
        cmd = [PTEFS, "mount", self.source, self.mp] + self.args if self.kind == "ptefs" else \
            ["squashfuse", self.source, self.mp]
        probe = os.path.join(self.mp, "plans/forward" if self.kind == "ptefs" else "values")
        t0 = now_ns()
        r = subprocess.run(cmd, env=ENV, timeout=60, capture_output=True, text=True)
        t1 = now_ns()
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
        end = time.time() + 10
        while True:
            try:
                os.listdir(probe)
                break
            except OSError as e:
                if time.time() > end:
                    raise RuntimeError(f"{probe} not visible 10 s after mount: {e}")
                time.sleep(0.0005)
        t2 = now_ns()
        return (t2 - t0) / 1e6, (t1 - t0) / 1e6

    def pid(self):
        p = pids_of(self.prog, self.mp)
        return p[0] if len(p) == 1 else (max(p) if p else None)

    def umount(self):
        """Unmounts (`ptefs umount` waits for pending commits) and waits for the daemon."""
        pids = pids_of(self.prog, self.mp)
        if not is_mounted(self.mp):
            return
        if self.kind == "ptefs":
            r = subprocess.run([PTEFS, "umount", self.mp], env=ENV, timeout=120, capture_output=True)
            if r.returncode != 0 and is_mounted(self.mp):
                subprocess.run(["umount", self.mp], timeout=60, capture_output=True)
        else:
            subprocess.run(["umount", self.mp], timeout=60, capture_output=True)
        if is_mounted(self.mp):
            subprocess.run(["umount", "-l", self.mp], timeout=60, capture_output=True)
        if not wait_gone(pids):
            log(f"{self.prog} daemon(s) {pids} still running after unmount")

    def fresh(self):
        self.umount()
        return self.mount()


# ---------------------------------------------------------------- table


def fmt(v, unit):
    if v is None:
        return "n/a"
    if unit == "GB/s":
        return f"{v:.2f} GB/s"
    if unit == "ms":
        return f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"
    if unit == "s":
        return f"{v * 1e3:.0f} ms" if v < 10 else f"{v:.1f} s"
    if unit == "MiB":
        return f"{v:.1f} MiB"
    if unit == "GiB":
        return f"{v:.2f} GiB" if v >= 1 else f"{v * 1024:.0f} MiB"
    return f"{v} {unit}"


class Table:
    """Rows of measure, ptefs value, baseline, ratio, target and verdict, and section titles."""

    def __init__(self):
        self.rows = []

    def add(self, measure, value, baseline_name, baseline, unit, target, ok=None, ratio=None):
        """`target` is a string; `ok` a bool or None. Ratio = value / baseline unless given."""
        if ratio is None:
            ratio = ratio_of(value, baseline)
        self.rows.append((
            measure, fmt(value, unit),
            "" if baseline_name is None else f"{baseline_name} {fmt(baseline, unit)}",
            "" if ratio is None else f"{ratio:.2f}×", target,
            "" if ok is None else ("ok" if ok else "MISS")))

    def section(self, title):
        self.rows.append((title,))

    def print(self):
        head = ("measure", "ptefs", "baseline", "ratio", "target", "")
        rows = [r for r in self.rows if len(r) > 1]
        w = [max(len(str(r[i])) for r in rows + [head]) for i in range(6)]
        print("  ".join(str(h).ljust(w[i]) for i, h in enumerate(head)).rstrip())
        print("  ".join("-" * x for x in w).rstrip())
        for r in self.rows:
            if len(r) == 1:
                print(r[0])
            else:
                print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip())


# ---------------------------------------------------------------- a run


def main(bench, cleanup=None):
    """Builds the release binaries, then `bench(tmp, mounts)` in a new temporary directory
    under BENCH_DIR (default /tmp). Afterwards every Mount added to `mounts` is unmounted,
    `cleanup()` runs, and the directory is removed, unless BENCH_KEEP=1 or a mount is left."""
    t_start = time.time()
    base_dir = os.environ.get("BENCH_DIR", "/tmp")
    log("cargo build --release --bins --examples")
    b = subprocess.run(["cargo", "build", "--release", "--bins", "--examples"], cwd=ROOT,
                       capture_output=True, text=True)
    if b.returncode != 0:
        print(b.stderr, file=sys.stderr)
        sys.exit("build failed")
    tmp = tempfile.mkdtemp(prefix=f"ptefs-{NAME}-", dir=base_dir)
    mounts = []
    try:
        bench(tmp, mounts)
    finally:
        for m in mounts:
            try:
                m.umount()
            except Exception as e:  # keep cleaning up
                log(f"unmount {m.mp}: {e}")
        if cleanup:
            cleanup()
        if os.environ.get("BENCH_KEEP") == "1":
            log(f"kept {tmp}")
        elif any(is_mounted(m.mp) for m in mounts):
            log(f"{tmp} still has mounts; not removed")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"total time {time.time() - t_start:.0f} s")
