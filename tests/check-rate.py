#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kvmdirty-migrate rate as an operator runs it: the lines it promises, in
each tracking mode, as text and as JSON, and beside a migration that still
completes bit-exact.  Exact checks only (the format, the counts of lines
and vCPUs, bytes as pages times 4096, a dirtying guest seen dirtying): the
rates themselves are the benchmark's.
usage: check-rate.py KVMDIRTY-MIGRATE"""
import json
import re
import subprocess
import sys

from kvm_skip import require_kvm

failures = 0


def check(ok, what):
    global failures
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures += 1


def run(migrate, *args, timeout=600):
    p = subprocess.run([migrate, "rate", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout.splitlines(), p.stderr


LINE = re.compile(r"^rate t_ms=(\d+) guest_pages_per_s=(\d+) guest_bytes_per_s=(\d+) vcpu_by=(ring|faults)((?: vcpu\d+=\d+ vcpu\d+_bytes_per_s=\d+)*)$")


def text_lines(migrate, mode, by):
    guest = ["-m", "64", "-v", "2", "-M", mode, "--vcpu", "0=dirty:4:100", "--vcpu", "1=idle"]
    rc, out, err = run(migrate, *guest, "--interval", "300", "--count", "3")
    rates = [l for l in out if l.startswith("rate ")]
    check(rc == 0 and len(rates) == 3 and len(out) == 3, f"{mode}: exit 0 and 3 lines ({rc}, {out}, {err.strip()})")
    last_t = -1
    for l in rates:
        m = LINE.match(l)
        check(m is not None, f"{mode}: '{l}' has the documented form")
        if not m:
            continue
        t, pages, nbytes, vby, rest = int(m[1]), int(m[2]), int(m[3]), m[4], m[5]
        vc = re.findall(r" vcpu(\d+)=(\d+) vcpu(\d+)_bytes_per_s=(\d+)", rest)
        check(t > last_t and nbytes == pages * 4096 and vby == by and pages > 0,
              f"{mode}: t_ms rising, bytes = pages x 4096, vcpu_by={by}, the guest dirtying: '{l}'")
        check([int(v[0]) for v in vc] == [0, 1] and all(v[0] == v[2] and int(v[3]) == int(v[1]) * 4096 for v in vc),
              f"{mode}: vCPUs 0 and 1, each its bytes = pages x 4096")
        last_t = t


def main():
    migrate = sys.argv[1]
    require_kvm("check-rate", migrate)
    text_lines(migrate, "clear-log", "faults")
    text_lines(migrate, "dirty-log", "faults")
    text_lines(migrate, "dirty-ring", "ring")
    # JSON: one object a line, the same figures
    rc, out, err = run(migrate, "-m", "64", "-v", "3", "-w", "4", "-r", "100", "--interval", "200", "--count", "2",
                       "--json")
    check(rc == 0 and len(out) == 2, f"--json: exit 0 and 2 lines ({rc}, {err.strip()})")
    for l in out:
        try:
            o = json.loads(l)
        except ValueError:
            check(False, f"--json: '{l}' is JSON")
            continue
        check(set(o) == {"t_ms", "guest_pages_per_s", "guest_bytes_per_s", "vcpu_by", "vcpus"} and
              len(o["vcpus"]) == 3 and o["guest_bytes_per_s"] == o["guest_pages_per_s"] * 4096 and
              all(v["bytes_per_s"] == v["pages_per_s"] * 4096 for v in o["vcpus"]) and o["vcpu_by"] == "faults",
              f"--json: the documented keys, 3 vCPUs, bytes = pages x 4096: {l}")
    # beside a migration: lines until it ends, and the guest arrives whole and runs on
    # lines every 10 ms (the shortest interval) over a guest dirtying 32 MiB flat out: several passes, on any host
    rc, out, err = run(migrate, "-m", "256", "-v", "2", "-w", "32", "-r", "0", "--interval", "10", "--count", "0",
                       "--during-migration")
    rates = [l for l in out if LINE.match(l)]
    check(rc == 0, f"--during-migration: exit 0 ({rc}: {err.strip()})")
    check(len(rates) >= 1, f"--during-migration: rate lines while it ran ({len(rates)})")
    check(any(l.startswith("source: migrated") and "verified" in l for l in out),
          "--during-migration: the source says migrated and verified")
    check(any("self-check ok" in l for l in out), "--during-migration: the destination's guest runs on, self-check ok")
    print(f"check-rate: {failures} failure(s)")
    sys.exit(1 if failures else 0)


main()
