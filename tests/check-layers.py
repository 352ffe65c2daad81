#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Arrows point down (shared/DESIGN.md "Layers"), checked on lib/:

- includes: a file includes headers of its own component, or of a layer
  below its own, never one above nor a sibling of its layer;
- calls: in the shipped archive, an object uses symbols of its own
  component or of a layer below, and no group of objects calls each other
  in a circle (news goes up through sinks: function pointers, which are
  no calls here);
- the shipped archive holds no test hook;
- every file of lib/ has a place in the table below.

usage: check-layers.py LIB_DIR LIBKVMDIRTY.a
"""
import os
import re
import subprocess
import sys

# component: layer.  Layer 0 is what everything may use.
LAYER = {
    "base": 0,
    "kvm": 1, "scan": 1, "index": 1, "pageset": 1, "version": 1,
    "regions": 2,
    "dirty-log": 3, "dirty-ring": 3,
    "vcpu": 4,
    "tracker": 5,
    "vm": 6,
}
BASE = {"kvm-uapi.h", "barrier.h", "export.h", "hooks.h"}


def component(name):
    if name in BASE:
        return "base"
    stem = re.sub(r"\.(c|h)$", "", name)
    for comp in sorted(LAYER, key=len, reverse=True):
        if stem == comp or stem.startswith(comp + "-"):
            return comp
    return None


def allowed(src, dst):
    return src == dst or LAYER[dst] < LAYER[src]


def main():
    libdir, archive = sys.argv[1], sys.argv[2]
    errors = []
    files = sorted(f for f in os.listdir(libdir) if f.endswith((".c", ".h")))
    for f in files:
        if component(f) is None:
            errors.append(f"{f}: no layer for it in tests/check-layers.py")
    for f in files:
        src = component(f)
        if src is None:
            continue
        with open(os.path.join(libdir, f)) as fh:
            for lineno, line in enumerate(fh, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = os.path.basename(m.group(1))
                if inc == "kvmdirty.h":
                    continue
                dst = component(inc)
                if dst is None or not os.path.exists(os.path.join(libdir, inc)):
                    errors.append(f"{f}:{lineno}: includes {inc}, which is not a header of lib/")
                elif not allowed(src, dst):
                    errors.append(f"{f}:{lineno}: {src} (layer {LAYER[src]}) includes {inc} "
                                  f"({dst}, layer {LAYER[dst]})")

    # symbols: which object defines what, and what each one uses
    out = subprocess.run(["nm", "-A", "--defined-only", archive], capture_output=True, text=True,
                         check=True).stdout
    defined = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[-2] in "TDBRVW":
            obj = os.path.basename(line.split(":")[1])
            defined[parts[-1]] = obj
    out = subprocess.run(["nm", "-A", "--undefined-only", archive], capture_output=True, text=True,
                         check=True).stdout
    uses = {}
    for line in out.splitlines():
        parts = line.split()
        obj, sym = os.path.basename(line.split(":")[1]), parts[-1]
        if sym == "kd_test_hooks" or "test_hook" in sym:
            errors.append(f"{obj}: the shipped library refers to {sym}")
        if sym in defined and defined[sym] != obj:
            uses.setdefault(obj, set()).add(defined[sym])
    if any("kd_test_hooks" == s for s in defined):
        errors.append("the shipped library defines kd_test_hooks")

    def comp_of(obj):
        return component(re.sub(r"\.o$", "", obj))

    for obj, callees in sorted(uses.items()):
        for callee in sorted(callees):
            a, b = comp_of(obj), comp_of(callee)
            if a is None or b is None:
                errors.append(f"{obj} -> {callee}: object without a layer")
            elif not allowed(a, b):
                errors.append(f"{obj} ({a}, layer {LAYER[a]}) calls into {callee} ({b}, layer {LAYER[b]})")

    # circles between objects
    state = {}
    stack = []

    def visit(o):
        state[o] = 1
        stack.append(o)
        for n in sorted(uses.get(o, ())):
            if state.get(n) == 1:
                errors.append("objects call each other in a circle: " +
                              " -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[o] = 2

    for o in sorted(uses):
        if o not in state:
            visit(o)

    for e in errors:
        print(e)
    if errors:
        return 1
    edges = sum(len(v) for v in uses.values())
    print(f"layers: {len(files)} files in {len(LAYER)} components, {edges} calls between objects, "
          "all pointing down, no circle, no test hook shipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
