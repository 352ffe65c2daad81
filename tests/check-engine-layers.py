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

- the tools over the engine (TOOL_DIR..., e.g. examples/kvmdirty-migrate)
  see it through its public header alone: no file there includes a
  header of the engine's own, but for the engine's tests' view of the test
  guest (testguest-engine.*), which the tools do not link, and the JSON
  reader (TOOL_HEADERS): a leaf of base/ with nothing of the engine in
  it, its own archive (migrate-json), which plot reads --stats files with.

usage: check-engine-layers.py ENGINE_DIR ENGINE.a [TOOL_DIR...]
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

# Headers of the engine's a tool may include, and why.
TOOL_HEADERS = {"json.h": "the JSON reader: a leaf of base/, its own archive, plot's reader of --stats files"}

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

    tools = 0
    for tool in sys.argv[3:]:
        for f in sorted(os.listdir(tool)):
            if not f.endswith((".c", ".h")) or f.startswith("testguest-engine."):
                continue
            tools += 1
            for lineno, name in layercheck.includes(os.path.join(tool, f)):
                if os.path.basename(name) in folder_of and os.path.basename(name) not in TOOL_HEADERS:
                    errors.append(f"{tool}/{f}:{lineno}: includes the engine's {name}: a tool sees the engine "
                                  "through kvmdirty-migrate.h alone")

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
                             f"named split(s); {tools} files of the tools over it, the public header alone")


if __name__ == "__main__":
    sys.exit(main())
