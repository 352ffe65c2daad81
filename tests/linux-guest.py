#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A stock Linux guest booted, migrated and snapshotted by kvmdirty-linux.

Runs where /dev/kvm runs a Linux guest (kvm-under-tcg's emulated kvm_amd:
tests/check-linux.sh starts it there).  Each scenario runs the VMMs, reads
the guests' consoles and checks what the guest's workload
(examples/linux/guest/workload.c) printed across the move:

  - every line's checksum verdict held (ok=1) and the workload ended ok;
  - guest time (t, CLOCK_MONOTONIC) only went forward, across the move too;
  - the timer still ticks after the move at the rate it ticked before
    (tick_hz, counted in guest time: what the guest's timer did);
  - lines came after the move (the guest ran on there, console included);
  - the kernel logged none of BUG, WARNING, Oops, an RCU stall, an
    unstable clocksource, a panic.

usage: linux-guest.py BUILD GUEST_DIR SCENARIO...
  scenarios: boot, migrate-log, migrate-ring, migrate-psk, snapshot,
             drop-devices (must fail: the console's state left behind)
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

BAD = re.compile(r"BUG:|WARNING: CPU:|Oops|rcu_sched self-detected stall|rcu: INFO|clocksource.*unstable|"
                 r"Kernel panic|bad frame|segfault")
LINE = re.compile(r"^wl: n=(\d+) t=([\d.]+) real=([\d.]+) ticks=(\d+) tick_hz=([\d.]+) pages=(\d+) "
                  r"mibps=([\d.]+) bad=(\d+) back=(\d+) ok=(\d)", re.M)
VCPUS = os.environ.get("LINUX_VCPUS", "1")
MEM = os.environ.get("LINUX_MEM", "192")
# kvm-under-tcg's nested SVM lets the guest's XSETBV through unseen: no
# XSAVE there (LINUX_XSAVE=1 keeps it, on a KVM that runs Linux natively)
CPU = [] if os.environ.get("LINUX_XSAVE") == "1" else ["--no-xsave"]
# a boot that prints nothing for STALL s has stopped; LINUX_TRIES boots a scenario at most, only such stops again
STALL = int(os.environ.get("LINUX_STALL", "45"))
TRIES = int(os.environ.get("LINUX_TRIES", "1"))
WL = f"wl.mib=16 wl.rate=4 wl.threads={os.environ.get('LINUX_THREADS', '1')} wl.hz=100"


class Proc:
    """A VMM: its console (stdout) and its own lines (stderr), read as they come."""

    def __init__(self, args, name, stdin=subprocess.DEVNULL, read_console=True, stderr=subprocess.PIPE):
        self.name = name
        self.out, self.err = [], []
        self.p = subprocess.Popen(args, stdin=stdin, stdout=subprocess.PIPE,
                                  stderr=stderr, text=True, errors="replace")
        self.threads = []
        self.boot_stalled = False
        if self.p.stderr:  # else the caller's fd, read by the caller
            self.threads.append(threading.Thread(target=self._read, args=(self.p.stderr, self.err), daemon=True))
            self.threads[0].start()
        if read_console:
            self.read_console()

    def watch_boot(self, secs):
        """
        A guest that prints nothing on its console for secs before it reaches
        userspace has stopped (under kvm-under-tcg: doc/tests.md, "The Linux
        guest"): its vCPUs' registers (SIGQUIT) go to the VMM's lines, and it is killed.
        """
        def watch():
            seen, since = -1, time.monotonic()
            while self.p.poll() is None and not any("init: userspace at" in l for l in self.out):
                if len(self.out) != seen:
                    seen, since = len(self.out), time.monotonic()
                elif time.monotonic() - since > secs:
                    self.boot_stalled = True
                    self.p.send_signal(signal.SIGQUIT)
                    time.sleep(2)
                    self.err.append(f"(the guest printed nothing for {secs} s before userspace: killed)\n")
                    self.p.kill()
                    return
                time.sleep(0.5)
        threading.Thread(target=watch, daemon=True).start()

    def read_console(self):
        """Read the console from now on (a Proc made with read_console=False leaves it unread until then)."""
        t = threading.Thread(target=self._read, args=(self.p.stdout, self.out), daemon=True)
        t.start()
        self.threads.append(t)

    @staticmethod
    def _read(f, into):
        for line in f:
            into.append(line)

    def wait(self, secs):
        try:
            rc = self.p.wait(timeout=secs)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
            self.err.append(f"(killed after {secs} s)\n")
            rc = "timeout"
        for t in self.threads:
            t.join(5)
        return rc

    def type(self, text):
        """Bytes on the console's input (a Proc made with stdin=subprocess.PIPE); False where it is gone."""
        try:
            self.p.stdin.write(text)
            self.p.stdin.flush()
            return True
        except (BrokenPipeError, ValueError):
            return False

    def wait_out(self, pattern, secs, start=0):
        """The first console line from index start on that matches pattern, waited for up to secs; None."""
        end = time.monotonic() + secs
        while time.monotonic() < end:
            for l in self.out[start:]:
                m = re.search(pattern, l)
                if m:
                    return m
            if self.p.poll() is not None:
                break
            time.sleep(0.02)
        return None

    def wait_err(self, text, secs):
        end = time.monotonic() + secs
        while time.monotonic() < end:
            if any(text in l for l in self.err):
                return True
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        return False

    def console(self):
        return "".join(self.out)

    def log(self):
        return "".join(self.err)


def signal_at(proc, ns):
    """SIGUSR2 to proc (run with --on-signal) once its guest printed workload line n, for each n in ns."""
    def watch():
        for n in ns:
            while proc.p.poll() is None and not any(l.startswith(f"wl: n={n} ") for l in proc.out):
                time.sleep(0.05)
            if proc.p.poll() is not None:
                return
            proc.p.send_signal(signal.SIGUSR2)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def lines(text):
    return [dict(n=int(m[0]), t=float(m[1]), ticks=int(m[3]), hz=float(m[4]), pages=int(m[5]),
                 bad=int(m[7]), back=int(m[8]), ok=int(m[9])) for m in LINE.findall(text)]


def vmm(build):
    return os.path.join(build, "examples", "linux", "kvmdirty-linux")


def boot_args(build, guest, secs):
    return [vmm(build), "--kernel", os.path.join(guest, "vmlinuz"), "--initrd",
            os.path.join(guest, "initramfs.cpio.gz"), "--mem", MEM, "--vcpus", VCPUS,
            "--append", f"{WL} wl.secs={secs}"] + CPU


def judge(name, before, after, rcs, moved=True):
    """Check the consoles of one guest before and after a move; returns a list of failures."""
    fails = []
    text = before + after
    for m in BAD.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        fails.append(f"the kernel logged: {text[start:text.find(chr(10), m.end())].strip()}")
        break
    if "init: userspace at" not in before:
        fails.append("the guest never reached userspace")
    lb, la = lines(before), lines(after)
    every = lb + la
    if not every:
        fails.append("the workload printed no line")
        return fails
    if moved and len(la) < 2:
        fails.append(f"{len(la)} workload line(s) after the move: the guest did not run on there")
    for a, b in zip(every, every[1:]):
        if b["t"] <= a["t"] or b["n"] != a["n"] + 1:
            fails.append(f"guest time or line order went back: n={a['n']} t={a['t']} then n={b['n']} t={b['t']}")
            break
    if any(l["ok"] != 1 for l in every):
        l = next(l for l in every if l["ok"] != 1)
        fails.append(f"the workload's check failed: n={l['n']} bad={l['bad']} back={l['back']}")
    if moved and len(lb) >= 2 and len(la) >= 2:
        rate_b = (lb[-1]["ticks"] - lb[0]["ticks"]) / (lb[-1]["t"] - lb[0]["t"])
        rate_a = (la[-1]["ticks"] - la[0]["ticks"]) / (la[-1]["t"] - la[0]["t"])
        print(f"linux: {name}: timer {rate_b:.1f} Hz before, {rate_a:.1f} Hz after (guest time)")
        if not 0.5 * rate_b <= rate_a <= 2 * rate_b:
            fails.append(f"the timer ticks at {rate_a:.1f} Hz after the move, {rate_b:.1f} Hz before")
    if not re.search(r"^wl: end .* ok=1", after if moved else text, re.M):
        fails.append("the workload did not end ok")
    for who, rc in rcs:
        if rc != 0:
            fails.append(f"{who} exited {rc}")
    return fails


def userspace_at(text):
    m = re.search(r"init: userspace at ([\d.]+)", text)
    return m.group(1) if m else "?"


def scenario_boot(build, guest, tmp):
    p = Proc(boot_args(build, guest, 6), "boot")
    p.watch_boot(STALL)
    rc = p.wait(240)
    print(f"linux: boot: userspace at {userspace_at(p.console())} s of guest uptime")
    return judge("boot", p.console(), "", [("the VMM", rc)], moved=False), p


def scenario_migrate(build, guest, tmp, track, extra, name, dst_wait=240):
    sock = f"unix:{tmp}/{name}.sock"
    dst = Proc([vmm(build), "--incoming", sock, "--mem", MEM, "--vcpus", VCPUS] + CPU + extra, "destination")
    if not dst.wait_err("listening at", 30):
        dst.p.kill()
        return [f"the destination never listened: {dst.log().strip()}"], dst
    # moved once the workload runs: its third line (--on-signal)
    src = Proc(boot_args(build, guest, 12) + ["--track", track, "--migrate-to", sock, "--on-signal"] + extra,
               "source")
    src.watch_boot(STALL)
    signal_at(src, [3])
    rs = src.wait(240)
    rd = dst.wait(1 if src.boot_stalled else dst_wait)  # no guest will come
    for l in src.log().splitlines():
        if "migrated to" in l:
            print(f"linux: {name}: {l}")
    fails = judge(name, src.console(), dst.console(), [("the source", rs), ("the destination", rd)])
    return fails, (src, dst)


def scenario_snapshot(build, guest, tmp):
    prefix = os.path.join(tmp, "snap")
    src = Proc(boot_args(build, guest, 14) + ["--snapshot", prefix, "--on-signal", "--count", "3"], "snapshot")
    src.watch_boot(STALL)
    signal_at(src, [3, 6, 9])
    rs = src.wait(240)
    for l in src.log().splitlines():
        if "snapshot " in l:
            print(f"linux: snapshot: {l}")
    files = sorted(os.path.join(tmp, f) for f in os.listdir(tmp) if f.startswith("snap-") and f.endswith(".snap"))
    if len(files) != 3:
        return [f"{len(files)} snapshot files, 3 wanted: {src.log().strip()}"], src
    fails = judge("snapshot (the source)", src.console(), "", [("the source", rs)], moved=False)
    dst = Proc([vmm(build), "--mem", MEM, "--vcpus", VCPUS] + CPU + ["--restore"] + files, "restore")
    rd = dst.wait(240)
    for l in dst.log().splitlines():
        if "restored" in l:
            print(f"linux: snapshot: {l}")
    # the restored guest goes on from the last snapshot: its lines follow
    # those the source printed up to it (the source's later lines are
    # another future of the same guest)
    cut = lines(dst.console())
    before = src.console()
    if cut:
        keep = [m for m in LINE.finditer(before) if int(m.group(1)) < cut[0]["n"]]
        before = before[:keep[-1].end()] + "\n" if keep else before
    fails += judge("restore", before, dst.console(), [("the restored VMM", rd)])
    return fails, (src, dst)


def as_tuple(procs):
    return procs if isinstance(procs, tuple) else (procs,)


def run_scenario(build, guest, name):
    """One attempt at a scenario: (failures, the VMMs), or (None, None) for an unknown name."""
    tmp = tempfile.mkdtemp(prefix=f"linux-{name}-")
    if name == "boot":
        fails, procs = scenario_boot(build, guest, tmp)
    elif name in ("migrate-log", "migrate-ring"):
        fails, procs = scenario_migrate(build, guest, tmp, name.split("-")[1], [], name)
    elif name == "migrate-psk":
        key = os.path.join(tmp, "key")
        subprocess.run([os.path.join(build, "examples", "kvmdirty-migrate", "kvmdirty-migrate"), "genkey", key],
                       check=True, stdout=subprocess.DEVNULL)
        fails, procs = scenario_migrate(build, guest, tmp, "log",
                                        ["--psk", key, "--encrypt", "--connections", "2"], name)
    elif name == "snapshot":
        fails, procs = scenario_snapshot(build, guest, tmp)
    elif name == "drop-devices":
        # the console's registers left behind: the destination's UART
        # has its interrupts off, the guest's console writes wait for
        # an interrupt that never comes, the workload's lines stop
        fails, procs = scenario_migrate(build, guest, tmp, "log", ["--drop-devices"], name, dst_wait=40)
        moved = "migrated to" in procs[0].log()
        if moved and any("did not run on there" in f for f in fails):
            print(f"linux: {name}: failed as it must: {fails[0]}")
            fails = []
        else:
            fails = ["the guest ran on without its console's state (or never moved): this test cannot see "
                     "device state"] + fails
    else:
        print(f"linux-guest.py: unknown scenario '{name}'", file=sys.stderr)
        return None, None
    return fails, procs


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    build, guest = sys.argv[1], sys.argv[2]
    status = 0
    for name in sys.argv[3:]:
        t0 = time.monotonic()
        for attempt in range(1, TRIES + 1):
            fails, procs = run_scenario(build, guest, name)
            if fails is None:
                return 2
            if not fails or attempt == TRIES or not any(p.boot_stalled for p in as_tuple(procs)):
                break
            print(f"linux: {name}: attempt {attempt}: the guest stopped before userspace (the emulator's stop, "
                  f"doc/tests.md): booted again")
            for p in as_tuple(procs):
                print(f"--- {p.name}: VMM lines ---\n{p.log()}", end="")
            sys.stdout.flush()
        verdict = "ok" if not fails else "FAILED"
        print(f"linux: {name}: {verdict} ({time.monotonic() - t0:.0f} s)")
        if fails:
            status = 1
            for f in fails:
                print(f"linux: {name}:   {f}")
            for p in procs if isinstance(procs, tuple) else (procs,):
                print(f"--- {p.name}: VMM lines ---\n{p.log()}--- {p.name}: console (last 40 lines) ---")
                print("".join(p.out[-40:]))
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
