# SPDX-License-Identifier: MIT
"""The KVM tests written in Python skip as the C ones do: where this host
has no usable KVM, `kvmdirty-migrate probe` says why in one line and exits
77; the test prints that line as its own skip reason and exits 77 too."""
import subprocess
import sys


def require_kvm(name, migrate):
    p = subprocess.run([migrate, "probe"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode == 77:
        why = p.stderr.strip().removeprefix("kvmdirty-migrate: ")
        print(f"{name}: skipped: {why}")
        sys.exit(77)
    if p.returncode != 0:
        print(f"{name}: kvmdirty-migrate probe exited {p.returncode}: {p.stderr.strip()}")
        sys.exit(1)
