# SPDX-License-Identifier: MIT
"""What the layer checks share (check-layers.py, check-engine-layers.py)."""
import os
import re
import subprocess


def symbols(archive):
    """(defined, undefined) of an archive: {symbol: object}, and [(object, symbol)]; objects without .o."""
    def nm(flag):
        return subprocess.run(["nm", "-A", flag, archive], capture_output=True, text=True,
                              check=True).stdout.splitlines()

    def obj(line):
        return re.sub(r"\.o$", "", os.path.basename(line.split(":")[1]))

    defined = {}
    for line in nm("--defined-only"):
        parts = line.split()
        if len(parts) >= 3 and parts[-2] in "TDBRVW":
            defined[parts[-1]] = obj(line)
    return defined, [(obj(line), line.split()[-1]) for line in nm("--undefined-only")]


def circles(uses):
    """Each circle of calls found by a depth-first walk of uses (object -> set of objects): lists of objects."""
    state, stack, found = {}, [], []

    def visit(o):
        state[o] = 1
        stack.append(o)
        for n in sorted(uses.get(o, ())):
            if state.get(n) == 1:
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[o] = 2

    for o in sorted(uses):
        if o not in state:
            visit(o)
    return found


def call_errors(uses, place, layer):
    """Each call between objects that does not point down: place(object) is its component (None: it has
    none), layer {component: layer}; a component may call itself and any of a lower layer."""
    errors = []
    for obj, callees in sorted(uses.items()):
        for callee in sorted(callees):
            a, b = place(obj), place(callee)
            if a is None or b is None:
                errors.append(f"{obj} -> {callee}: an object without a place in the layers")
            elif a != b and layer[b] >= layer[a]:
                errors.append(f"{obj} ({a}, layer {layer[a]}) calls into {callee} ({b}, layer {layer[b]})")
    return errors


def includes(path):
    """The project's headers a file includes ("..." but kvmdirty.h, the library's public one): (line, name)."""
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m and os.path.basename(m.group(1)) != "kvmdirty.h":
                yield lineno, m.group(1)


def uses_of(defined, undefined):
    """Which objects each object calls: {object: set of objects}."""
    uses = {}
    for obj, sym in undefined:
        if sym in defined and defined[sym] != obj:
            uses.setdefault(obj, set()).add(defined[sym])
    return uses


def report(errors, uses, summary):
    """Each error on a line of its own and 1; or, with none, the summary (the calls counted into {calls}) and 0."""
    for e in errors:
        print(e)
    if errors:
        return 1
    print(summary.format(calls=sum(len(v) for v in uses.values())))
    return 0
