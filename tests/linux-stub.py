#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kvmdirty-linux on this host's KVM, with tests/linux-stub.S for its kernel.

A stock Linux kernel needs a KVM that runs one (tests/linux-guest.py, under
kvm-under-tcg); the stub is a bzImage whose 64-bit entry is a loop at CPL 0
that any KVM runs, this host's PVM-based one included.  So every path of
the VMM runs here, in each build (plain, ASan/UBSan, TSan): the bzImage
loader (the command line and e820 map the stub reads back), the console
both ways, the exit port, migration (clear-log, dirty-ring, and
--psk --encrypt over two connections), a snapshot chain (a full and two
diffs) and its restore, with two vCPUs (the second waits for its SIPI and
must move as it is).  The stub checks, round after round, that each of its
1024 pages holds what it last wrote (a page the move lost or left stale is
"bad"), that R12 kept its value and that the console's scratch register
still holds what it wrote; its exit status says which failed.
--drop-devices must make that last check fail (exit status 4): this test
can see the device state.

usage: linux-stub.py KVMDIRTY-LINUX KVMDIRTY-MIGRATE STUB [SCENARIO...]
  scenarios: boot, migrate-log, migrate-ring, migrate-psk, snapshot, drop-devices,
             stalled-console, stalled-irq, stalled-irq-restore, reader-gone, dump, dump-stderr-full,
             dump-during-snapshots (default: all)
Exits 77 with kvmdirty-migrate probe's one line where this host has no usable KVM.
"""
import fcntl
import importlib.util
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time

_spec = importlib.util.spec_from_file_location("linux_guest", os.path.join(os.path.dirname(__file__),
                                                                           "linux-guest.py"))
linux_guest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(linux_guest)
Proc = linux_guest.Proc

DEFAULT_CMDLINE = "console=ttyS0 reboot=k panic=-1 pci=off"
UP = r"^stub: up cmdline=(.*) e820=0x([0-9a-f]+)$"
ROUND = r"^stub: round=0x([0-9a-f]+) bad=0x([0-9a-f]+) ticks=0x([0-9a-f]+)$"
END = (r"^stub: end rounds=0x([0-9a-f]+) bad=0x([0-9a-f]+) ticks=0x([0-9a-f]+) scr=0x([0-9a-f]+) "
       r"status=0x([0-9a-f]+)$")
MEM = "64"
VCPUS = "2"
# bounds on a hang, never on speed: the stub's rounds take milliseconds
SECS = 60
F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032


class Fail(Exception):
    pass


def restore(vmm, tmp, procs, want=None):
    """A VMM restoring the chain of snapshots in tmp (want files, where given), once it runs the guest."""
    files = sorted(os.path.join(tmp, f) for f in os.listdir(tmp) if f.startswith("snap-") and f.endswith(".snap"))
    if want is not None and len(files) != want:
        raise Fail(f"{len(files)} snapshot files, {want} wanted")
    dst = start([vmm, "--mem", MEM, "--vcpus", VCPUS, "--restore"] + files, "restore")
    procs.append(dst)
    if not dst.wait_err(f"restored {len(files)} file(s)", SECS):
        raise Fail("the restore never ran the guest")
    return dst


def ask_round(p):
    """The stub's round and bad-page counts, asked through its console ('p'); its PIT ticks in p.ticks."""
    n = len(p.out)
    if not p.type("p"):
        raise Fail(f"{p.name}: its console's input is closed")
    m = p.wait_out(ROUND, SECS, n)
    if not m:
        raise Fail(f"{p.name}: no answer to 'p' on the console")
    p.ticks = int(m[3], 16)
    return int(m[1], 16), int(m[2], 16)


def ticks_go_on(p, since):
    """The PIT's interrupts keep coming: 10 more than since (0.1 s of the guest's time), asked until then."""
    end = time.monotonic() + SECS
    ask_round(p)
    while p.ticks <= since + 10 and time.monotonic() < end:
        time.sleep(0.05)
        ask_round(p)
    if p.ticks <= since + 10:
        raise Fail(f"{p.name}: the PIT's ticks stopped: {p.ticks}, and {since} before the move")


def finish(p, want_status=0):
    """'q': the stub checks itself and ends; its end line and the VMM's exit status must say want_status."""
    n = len(p.out)
    p.type("q")
    rc = p.wait(SECS)
    m = p.wait_out(END, 1, n)
    if not m:
        raise Fail(f"{p.name}: no end line after 'q' (exit {rc})")
    rounds, bad, _, scr, status = (int(x, 16) for x in m.groups())
    if status != want_status or rc != want_status:
        raise Fail(f"{p.name}: the stub ended with status {status} (bad pages {bad}, scratch 0x{scr:x}), "
                   f"the VMM with {rc}; {want_status} wanted")
    return rounds, bad, scr


def up(p):
    m = p.wait_out(UP, SECS)
    if not m:
        raise Fail(f"{p.name}: the stub never printed its first line")
    return m[1], int(m[2], 16)


def start(args, name):
    return Proc(args, name, stdin=subprocess.PIPE)


def scenario_boot(vmm, stub, tmp, procs):
    p = start([vmm, "--kernel", stub, "--mem", MEM, "--vcpus", VCPUS, "--append", "stub.word=hello"], "boot")
    procs.append(p)
    cmdline, e820 = up(p)
    if cmdline != DEFAULT_CMDLINE + " stub.word=hello":
        raise Fail(f"the stub read the command line '{cmdline}'")
    if e820 != 3:
        raise Fail(f"the stub read {e820} e820 entries, 3 wanted")
    r1, _ = ask_round(p)
    r2, _ = ask_round(p)
    if r2 <= r1:
        raise Fail(f"the stub's rounds went {r1} -> {r2}: it does not run")
    finish(p)
    if "exit status 0 to port 0x501" not in p.log():
        raise Fail("the VMM did not say how the guest ended")


def scenario_migrate(vmm, stub, tmp, procs, track, extra, want_status=0):
    sock = f"unix:{tmp}/m.sock"
    dst = start([vmm, "--incoming", sock, "--mem", MEM, "--vcpus", VCPUS] + extra, "destination")
    procs.append(dst)
    if not dst.wait_err("listening at", SECS):
        raise Fail("the destination never listened")
    src = start([vmm, "--kernel", stub, "--mem", MEM, "--vcpus", VCPUS, "--track", track, "--migrate-to", sock,
                 "--on-signal"] + extra, "source")
    procs.append(src)
    up(src)
    before, bad = ask_round(src)
    src.p.send_signal(signal.SIGUSR2)
    rs = src.wait(SECS)
    moved = next((l for l in src.log().splitlines() if "migrated to" in l), None)
    if rs != 0 or not moved:
        raise Fail(f"the source exited {rs} without a migration")
    print(f"stub: {' '.join(extra) or track}: {moved}")
    if any(re.search(END, l) for l in src.out):
        raise Fail("the stub ended at the source too")
    if not dst.wait_err("running the guest", SECS):
        raise Fail("the destination never ran the guest")
    after, bad = ask_round(dst)
    if after <= before:
        raise Fail(f"round {after} at the destination, {before} at the source before the move")
    if want_status == 0 and bad:
        raise Fail(f"{bad} bad pages at the destination")
    ticks_go_on(dst, src.ticks)
    finish(dst, want_status)


def unread_source(args, name):
    """A source VMM whose console nobody reads: a pipe of 4 KiB, filled by the guest's output."""
    src = Proc(args, name, stdin=subprocess.PIPE, read_console=False)
    fcntl.fcntl(src.p.stdout.fileno(), F_SETPIPE_SZ, 4096)
    return src


def wait_stalled(src):
    """Until the VMM says its console's output backed up (its pipe full, then the UART's buffer)."""
    if not src.wait_err("the console's output is not being read", SECS):
        raise Fail(f"the console never backed up (pipe holds {pipe_bytes(src.p.stdout.fileno())} bytes)")


def scenario_stalled(vmm, stub, tmp, procs, how):
    """
    A console nobody reads, the guest's output backed up: a migration must
    still pause the guest and move it, and the guest's console must go on at
    the destination with nothing typed there.  how: 'f' (written by polling
    LSR) or 'i' (by the "transmitter empty" interrupt, 16 bytes each, as
    Linux's 8250 driver does: the interrupt the UART owes must travel).
    """
    sock = f"unix:{tmp}/m.sock"
    dst = start([vmm, "--incoming", sock, "--mem", MEM, "--vcpus", VCPUS], "destination")
    procs.append(dst)
    if not dst.wait_err("listening at", SECS):
        raise Fail("the destination never listened")
    src = unread_source([vmm, "--kernel", stub, "--mem", MEM, "--vcpus", VCPUS, "--migrate-to", sock,
                         "--on-signal"], "source")
    procs.append(src)
    # 'f' twice: 16 KiB, more than the pipe and the UART's buffer hold
    src.type("ff" if how == "f" else "i")
    wait_stalled(src)
    src.p.send_signal(signal.SIGUSR2)
    rs = src.wait(SECS)
    src.read_console()
    moved = next((l for l in src.log().splitlines() if "migrated to" in l), None)
    if rs != 0 or not moved:
        raise Fail(f"the source exited {rs} without a migration, its console unread")
    print(f"stub: stalled console ({how}): {moved}")
    if not dst.wait_err("running the guest", SECS):
        raise Fail("the destination never ran the guest")
    if how == "i":
        # nothing typed at the destination: the flood must finish there on its interrupts alone
        if not dst.wait_out(r"^stub: irq flood done$", SECS):
            raise Fail("the interrupt-driven output stopped at the destination (no \"irq flood done\"): "
                       f"{sum(l.count('y') for l in dst.out)} 'y' bytes came out there")
    ask_round(dst)
    finish(dst)
    if how == "f":
        # the second 'f' was still in the UART's input when the guest moved (the first flood stalled): its
        # 64 lines come out at the destination (the source's unwritten output is lost with the source)
        flood = sum(l == "x" * 127 + "\n" for l in dst.out)
        if flood < 64:
            raise Fail(f"{flood} whole lines of the second flood at the destination, 64 wanted")


def scenario_dump(vmm, stub, tmp, procs):
    """SIGQUIT: each vCPU says where it is (the stub's loop, and the AP waiting for its SIPI), the guest runs on."""
    p = start([vmm, "--kernel", stub, "--mem", MEM, "--vcpus", VCPUS], "dump")
    procs.append(p)
    up(p)
    r1, _ = ask_round(p)
    for n in (1, 2):
        p.p.send_signal(signal.SIGQUIT)
        end = time.monotonic() + SECS
        while sum("rip=" in l for l in p.err) < 2 * n and time.monotonic() < end and p.p.poll() is None:
            time.sleep(0.02)
        got = [l for l in p.err if "rip=" in l]
        if len(got) != 2 * n:
            raise Fail(f"{len(got)} vCPU lines after SIGQUIT number {n}, {2 * n} wanted: {p.log()}")
    bsp = re.search(r"vCPU 0: rip=0x([0-9a-f]+) .* cr0=0x([0-9a-f]+) ", next(l for l in got if "vCPU 0:" in l))
    ap = next(l for l in got if "vCPU 1:" in l)
    # the stub's code is the bzImage's protected-mode part: 0x100000 up to 0x100c00
    if not bsp or not 0x100200 <= int(bsp[1], 16) < 0x100c00 or not int(bsp[2], 16) & 0x80000000:
        raise Fail(f"vCPU 0 is not in the stub's code with paging on: {got[0]}")
    if "mp_state=1 " not in ap or "rip=0xfff0 " not in ap:  # KVM_MP_STATE_UNINITIALIZED: waiting for INIT, SIPI
        raise Fail(f"vCPU 1 is not at reset waiting for INIT and SIPI: {ap}")
    print(f"stub: {got[0].strip()}")
    r2, _ = ask_round(p)
    if r2 <= r1:
        raise Fail(f"the stub stopped after the dump: round {r1} then {r2}")
    finish(p)


def scenario_dump_during_snapshots(vmm, stub, tmp, procs):
    """SIGQUIT every few milliseconds while ten snapshots pause and resume the guest: each completes, as does the restore."""
    prefix = os.path.join(tmp, "snap")
    src = start([vmm, "--kernel", stub, "--mem", MEM, "--vcpus", VCPUS, "--snapshot", prefix, "--every", "50",
                 "--count", "10"], "snapshots")
    procs.append(src)
    up(src)
    end = time.monotonic() + SECS
    while sum("snapshot " in l for l in src.err) < 10 and src.p.poll() is None and time.monotonic() < end:
        src.p.send_signal(signal.SIGQUIT)
        time.sleep(0.005)
    if sum("snapshot " in l for l in src.err) < 10:
        raise Fail(f"{sum('snapshot ' in l for l in src.err)} snapshots of 10 under SIGQUITs")
    dumps = sum("rip=" in l for l in src.err)
    ask_round(src)
    finish(src)
    dst = restore(vmm, tmp, procs)
    ask_round(dst)
    finish(dst)
    print(f"stub: dump-during-snapshots: {dumps} vCPU lines beside 10 snapshots")


def scenario_dump_stderr_full(vmm, stub, tmp, procs):
    """SIGQUIT with a stderr nobody reads (a 4 KiB pipe, filled by the dumps): the guest still runs and answers."""
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    p = Proc([vmm, "--kernel", stub, "--mem", MEM, "--vcpus", VCPUS], "dump, stderr full", stdin=subprocess.PIPE,
             stderr=w)
    os.close(w)
    procs.append(p)
    try:
        up(p)
        # dumps until the pipe takes no more: a writer of the next one is then blocked in write()
        end, last, still = time.monotonic() + SECS, -1, 0
        while still < 5 and time.monotonic() < end:
            p.p.send_signal(signal.SIGQUIT)
            time.sleep(0.1)
            n = pipe_bytes(r)
            still, last = (still + 1 if n == last else 0), n
        if still < 5 or last < 2048:
            raise Fail(f"the dumps did not fill stderr's pipe ({last} bytes)")
        ask_round(p)  # the vCPUs, the console and the guest go on, stderr full
    finally:
        # stderr read again: the VMM's last line (how the guest ended) can go out
        threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(r, 65536), b"")], daemon=True).start()
    finish(p)


def scenario_reader_gone(vmm, stub, tmp, procs):
    """The console's reader goes away: the guest's output is dropped (EPIPE), the VMM and guest go on."""
    p = Proc([vmm, "--kernel", stub, "--mem", MEM, "--vcpus", VCPUS], "reader gone", stdin=subprocess.PIPE,
             read_console=False)
    procs.append(p)
    p.p.stdout.close()
    p.type("fpq")
    rc = p.wait(SECS)
    if rc != 0 or "exit status 0 to port 0x501" not in p.log():
        raise Fail(f"the VMM exited {rc} once its console's reader was gone (the guest did not end it)")


def scenario_stalled_restore(vmm, stub, tmp, procs):
    """A snapshot taken while the interrupt-driven output is backed up: its restore must finish the output."""
    prefix = os.path.join(tmp, "snap")
    src = unread_source([vmm, "--kernel", stub, "--mem", MEM, "--vcpus", VCPUS, "--snapshot", prefix,
                         "--on-signal", "--count", "1"], "snapshot")
    procs.append(src)
    src.type("i")
    wait_stalled(src)
    src.p.send_signal(signal.SIGUSR2)
    if not src.wait_err("snapshot ", SECS):
        raise Fail("no snapshot taken")
    src.read_console()
    if not src.wait_out(r"^stub: irq flood done$", SECS):
        raise Fail("the source's output never finished once read")
    finish(src)
    dst = restore(vmm, tmp, procs)
    if not dst.wait_out(r"^stub: irq flood done$", SECS):
        raise Fail("the interrupt-driven output stopped in the restored guest (no \"irq flood done\"): "
                   f"{sum(l.count('y') for l in dst.out)} 'y' bytes came out")
    ask_round(dst)
    finish(dst)


def pipe_bytes(fd):
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def scenario_snapshot(vmm, stub, tmp, procs):
    prefix = os.path.join(tmp, "snap")
    src = start([vmm, "--kernel", stub, "--mem", MEM, "--vcpus", VCPUS, "--snapshot", prefix, "--on-signal",
                 "--count", "3"], "snapshot")
    procs.append(src)
    up(src)
    for i in range(3):
        last, _ = ask_round(src)
        src.p.send_signal(signal.SIGUSR2)
        end = time.monotonic() + SECS
        while sum("snapshot " in l for l in src.err) <= i and time.monotonic() < end and src.p.poll() is None:
            time.sleep(0.02)
    for l in src.log().splitlines():
        if "snapshot " in l:
            print(f"stub: {l}")
    finish(src)
    dst = restore(vmm, tmp, procs, want=3)
    after, bad = ask_round(dst)
    # the last snapshot was taken after round `last` was printed
    if after <= last or bad:
        raise Fail(f"the restored stub is at round {after} with {bad} bad pages; the snapshot came after "
                   f"round {last}")
    ticks_go_on(dst, src.ticks)
    finish(dst)


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    vmm, migrate, stub = sys.argv[1:4]
    names = sys.argv[4:] or ["boot", "migrate-log", "migrate-ring", "migrate-psk", "snapshot", "drop-devices",
                             "stalled-console", "stalled-irq", "stalled-irq-restore", "reader-gone", "dump", "dump-stderr-full",
                             "dump-during-snapshots"]
    pr = subprocess.run([migrate, "probe"], capture_output=True, text=True)
    if pr.returncode == 77:
        print((pr.stderr or pr.stdout).strip())
        return 77
    status = 0
    for name in names:
        tmp = tempfile.mkdtemp(prefix=f"linux-stub-{name}-")
        t0 = time.monotonic()
        procs = []
        try:
            if name == "boot":
                scenario_boot(vmm, stub, tmp, procs)
            elif name in ("migrate-log", "migrate-ring"):
                scenario_migrate(vmm, stub, tmp, procs, name.split("-")[1], [])
            elif name == "migrate-psk":
                key = os.path.join(tmp, "key")
                subprocess.run([migrate, "genkey", key], check=True, stdout=subprocess.DEVNULL)
                scenario_migrate(vmm, stub, tmp, procs, "ring", ["--psk", key, "--encrypt", "--connections", "2"])
            elif name == "stalled-console":
                scenario_stalled(vmm, stub, tmp, procs, "f")
            elif name == "stalled-irq":
                scenario_stalled(vmm, stub, tmp, procs, "i")
            elif name == "dump":
                scenario_dump(vmm, stub, tmp, procs)
            elif name == "dump-during-snapshots":
                scenario_dump_during_snapshots(vmm, stub, tmp, procs)
            elif name == "dump-stderr-full":
                scenario_dump_stderr_full(vmm, stub, tmp, procs)
            elif name == "reader-gone":
                scenario_reader_gone(vmm, stub, tmp, procs)
            elif name == "stalled-irq-restore":
                scenario_stalled_restore(vmm, stub, tmp, procs)
            elif name == "snapshot":
                scenario_snapshot(vmm, stub, tmp, procs)
            elif name == "drop-devices":
                # the console's scratch register left behind: the stub must see it (status 4)
                scenario_migrate(vmm, stub, tmp, procs, "log", ["--drop-devices"], want_status=4)
            else:
                print(f"linux-stub.py: unknown scenario '{name}'", file=sys.stderr)
                return 2
            print(f"stub: {name}: ok ({time.monotonic() - t0:.1f} s)")
        except Fail as e:
            status = 1
            print(f"stub: {name}: FAILED: {e}")
            for p in procs:
                print(f"--- {p.name}: VMM lines ---\n{p.log()}--- {p.name}: console (last 20 lines) ---")
                print("".join(p.out[-20:]))
        finally:
            for p in procs:  # none outlives its scenario: wait() kills what is still running
                p.wait(5)
            subprocess.run(["rm", "-rf", tmp])
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
