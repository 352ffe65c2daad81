#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Arrows point down in the migration engine too (lib/migrate/meson.build):

- every file of lib/migrate sits in a folder of the table below;
- includes: a file includes headers of its own folder or of a layer
  below, never one above nor a sibling of its layer (the tracking
  library's kvmdirty.h is below them all);
- calls: in the engine's archive, an object uses symbols of its own
  folder or of a layer below, and no group of objects calls each other in
  a circle, but for the splits of one object's work across files of one
  folder named in SPLITS (each with its reason).

usage: check-engine-layers.py ENGINE_DIR ENGINE.a
"""
import os
import sys

import layercheck

# folder: layer
LAYER = {
    "base": 0,
    "wire": 1,
    "net": 2, "guest": 2, "rate": 2,
    "source": 3, "dest": 3, "snapshot": 3,
    "control": 4,
    "api": 5,
}

# Circles allowed: one job split over files of one folder, each file a part
# of it (names without .o).
SPLITS = {}


def allowed(src, dst):
    return src == dst or LAYER[dst] < LAYER[src]


def main():
    root, archive = sys.argv[1], sys.argv[2]
    errors, folder_of = [], {}
    for d in sorted(os.listdir(root)):
        p = os.path.join(root, d)
        if not os.path.isdir(p):
            continue
        if d not in LAYER:
            errors.append(f"{d}/: no layer for it in tests/check-engine-layers.py")
            continue
        for f in sorted(os.listdir(p)):
            if f.endswith((".c", ".h")):
                if f in folder_of:
                    errors.append(f"{d}/{f}: its name is also {folder_of[f]}/{f}'s")
                folder_of[f] = d
    for f, d in sorted(folder_of.items()):
        for lineno, name in layercheck.includes(os.path.join(root, d, f)):
            inc = os.path.basename(name)
            dst = folder_of.get(inc)
            if dst is None:
                errors.append(f"{d}/{f}:{lineno}: includes {name}, which is not the engine's")
            elif not allowed(d, dst):
                errors.append(f"{d}/{f}:{lineno}: {d} (layer {LAYER[d]}) includes {dst}/{inc} (layer {LAYER[dst]})")

    uses = layercheck.uses_of(*layercheck.symbols(archive))

    def where(obj):
        # meson names an object FOLDER_FILE.c.o
        d, _, f = obj.partition("_")
        return d if folder_of.get(f) == d else None

    errors += layercheck.call_errors(uses, where, LAYER)

    # circles between objects, but for the named splits
    for c in layercheck.circles(uses):
        if not any(set(c) <= set(members) for members in SPLITS.values()):
            errors.append("objects call each other in a circle: " + " -> ".join(c))

    return layercheck.report(errors, uses, f"engine layers: {len(folder_of)} files in {len(LAYER)} folders, "
                             f"{{calls}} calls between objects, all pointing down, no circle but {len(SPLITS)} "
                             "named split(s)")


if __name__ == "__main__":
    sys.exit(main())
