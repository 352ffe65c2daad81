# SPDX-License-Identifier: MIT
"""The KVM tests written in Python skip as the C ones do: where this host
has no usable KVM, `kvmdirty-migrate probe` says why in one line and exits
77; the test prints that line as its own skip reason and exits 77 too."""
import subprocess
import sys


def kvm_missing(migrate):
    """None where this host can run a VM; else the line that says why
    ("/dev/kvm: ..."), as `kvmdirty-migrate probe` prints it."""
    p = subprocess.run([migrate, "probe"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode == 77:
        return p.stderr.strip().removeprefix("kvmdirty-migrate: ")
    if p.returncode != 0:
        raise RuntimeError(f"kvmdirty-migrate probe exited {p.returncode}: {p.stderr.strip()}")
    return None


def require_kvm(name, migrate):
    try:
        why = kvm_missing(migrate)
    except RuntimeError as e:
        print(f"{name}: {e}")
        sys.exit(1)
    if why:
        print(f"{name}: skipped: {why}")
        sys.exit(77)
