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
import sys

import layercheck

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
        for lineno, name in layercheck.includes(os.path.join(libdir, f)):
            inc = os.path.basename(name)
            dst = component(inc)
            if dst is None or not os.path.exists(os.path.join(libdir, inc)):
                errors.append(f"{f}:{lineno}: includes {inc}, which is not a header of lib/")
            elif not allowed(src, dst):
                errors.append(f"{f}:{lineno}: {src} (layer {LAYER[src]}) includes {inc} ({dst}, layer {LAYER[dst]})")

    # symbols: which object defines what, and what each one uses
    defined, undefined = layercheck.symbols(archive)
    for obj, sym in undefined:
        if sym == "kd_test_hooks" or "test_hook" in sym:
            errors.append(f"{obj}: the shipped library refers to {sym}")
    uses = layercheck.uses_of(defined, undefined)
    if any("kd_test_hooks" == s for s in defined):
        errors.append("the shipped library defines kd_test_hooks")

    errors += layercheck.call_errors(uses, component, LAYER)

    # circles between objects
    for c in layercheck.circles(uses):
        errors.append("objects call each other in a circle: " + " -> ".join(c))

    return layercheck.report(errors, uses, f"layers: {len(files)} files in {len(LAYER)} components, {{calls}} "
                             "calls between objects, all pointing down, no circle, no test hook shipped")


if __name__ == "__main__":
    sys.exit(main())
