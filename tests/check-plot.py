#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""kvmdirty-migrate plot, as an operator runs it, checked two ways:

  recorded KVMDIRTY-MIGRATE DATA-DIR
      every stats file DATA-DIR holds (tests/data: real runs on the
      two-host rig, with and without the throttle) renders to an SVG that
      Python's XML parser (and xmllint, where installed) reads, with one
      series per quantity, a vertex per line that has it, pass boundaries,
      the downtime and the outcome; every prefix cut at a line boundary or
      inside a line renders, marked incomplete; an empty file, a file of
      another version and a bad line before the last are refused with one
      line naming it, and leave no picture;
  live KVMDIRTY-MIGRATE
      (needs /dev/kvm) the same for stats the daemon writes now, over a
      Unix socket: a migration with the throttle, one without, and a
      source killed mid-migration (SIGKILL: its stats end wherever stdio
      last flushed, usually inside a line);
  same KVMDIRTY-MIGRATE STATS SVG
      (from the top of the tree) SVG, the picture doc/migration.md shows,
      is what plot draws from STATS today.

Exits 1 with what is wrong, 77 (live) where this host has no usable KVM
(tests/kvm_skip.py).

tests/data was recorded on the rig (as root), NAME and MODE for each file:
stats-ring-throttled (dirty-ring), stats-clear-throttled (clear-log) and
stats-no-throttle (clear-log, with --no-throttle added to send):

  flock /tmp/rig.lock tests/two-hosts.sh --rate 800mbit \
    --dst "$M listen tcp:\$DST_ADDR:4444 -m 256 -v 2 --run-ms 300 -T 30000" \
    --src "for i in \$(seq 100); do (echo >/dev/tcp/\$DST_ADDR/4444) 2>/dev/null && break; sleep 0.1; done;
           $M send tcp:\$DST_ADDR:4444 -m 256 -v 2 -M MODE --vcpu 0=dirty:64 --vcpu 1=compute -d 20 -p 8 \
           -T 30000 --baseline 300 --stats tests/data/NAME.json"
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

from kvm_skip import require_kvm

NS = "{http://www.w3.org/2000/svg}"
errors = []


def fail(msg):
    errors.append(msg)


def plot(migrate, stats, out):
    r = subprocess.run([migrate, "plot", stats, "-o", out], capture_output=True, text=True)
    return r.returncode, r.stderr


def parse_lines(text):
    """The complete lines of a stats file (a last line cut short left out)."""
    out = []
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def diff_count(points, vid, key, start):
    """Vertices of a vCPU's held share or speed: lines with key that have a line
    (or, for progress, the start line) earlier to take the difference from."""
    def entry(p):
        return next((v for v in p.get("vcpu", []) if v.get("id") == vid and key in v), None)

    n = 0
    for i, p in enumerate(points):
        if entry(p) is None:
            continue
        t, ref, j, k = p["t_ms"], None, i, 0
        while j > 0 and k < 32:
            j -= 1
            k += 1
            if entry(points[j]) is not None:
                ref = points[j]["t_ms"]
                if t - ref >= 50:
                    break
        if j == 0 and start is not None and (ref is None or t - ref < 50):
            ref = start
        if ref is not None and t - ref > 0:
            n += 1
    return n


def expected(lines):
    """Series name -> vertices, from the stats lines."""
    start = lines[0]
    points = [l for l in lines if l["type"] in ("sample", "pass")]
    t0 = start["t_ms"]
    want = {
        "bytes_sent": len(points),
        "dirty_bytes": len(points),
        "link": sum("link_bytes_per_s" in p for p in points),
        "dirty_rate": sum("dirty_pages_per_s" in p for p in points),
        "redirty_rate": sum("redirty_pages_per_s" in p for p in points),
    }
    if "downtime_limit_ms" in start:
        want["downtime_fit"] = want["link"]
    before = {v["id"]: v for v in start.get("vcpu", [])}
    for vid in range(start.get("vcpus", 0)):
        def has(cond):
            return sum(any(v["id"] == vid and cond(v) for v in p.get("vcpu", [])) for p in points)

        want[f"vcpu{vid}_dirty"] = has(lambda v: "dirty_per_s" in v)
        want[f"vcpu{vid}_limit"] = has(lambda v: v.get("dirty_limit", 0) > 0)
        want[f"vcpu{vid}_share"] = has(lambda v: "run_share" in v)
        want[f"vcpu{vid}_held"] = diff_count(points, vid, "held_ms", None)
        if before.get(vid, {}).get("before_per_s", 0) > 0:
            want[f"vcpu{vid}_speed"] = diff_count(points, vid, "progress",
                                                  t0 if "progress" in before[vid] else None)
    # a vCPU's series is left out where no line has its figure, and every series when no line has any
    return {k: v for k, v in want.items() if points and (v or not k.startswith("vcpu"))}


def read_svg(path, what):
    """The parsed SVG, checked to refer to nothing outside itself."""
    if shutil.which("xmllint"):
        r = subprocess.run(["xmllint", "--noout", path], capture_output=True, text=True)
        if r.returncode:
            fail(f"{what}: xmllint: {r.stderr.strip()}")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        fail(f"{what}: not XML: {e}")
        return None
    if root.tag != NS + "svg":
        fail(f"{what}: the root is {root.tag}, not svg")
    for el in root.iter():
        if el.tag in (NS + "script", NS + "image", NS + "use", NS + "foreignObject"):
            fail(f"{what}: a <{el.tag}> element")
        for k, v in el.attrib.items():
            if "href" in k or ("url(" in v and not v.startswith("url(#")):
                fail(f"{what}: {el.tag} {k}={v!r} refers outside the file")
    with open(path) as fh:
        text = fh.read()
    for bad in ("@import", "@font-face", "http://", "https://"):
        if bad in text.replace('xmlns="http://www.w3.org/2000/svg"', ""):
            fail(f"{what}: '{bad}' in the SVG")
    return root


def series(root):
    """Series name -> list of (x, y) vertices."""
    out = {}
    for g in root.iter(NS + "g"):
        if g.get("class") != "series":
            continue
        pts = []
        for pl in g.iter(NS + "polyline"):
            pts += [tuple(map(float, xy.split(","))) for xy in pl.get("points").split()]
        out[g.get("data-series")] = pts
    return out


def texts(root):
    return ["".join(t.itertext()) for t in root.iter(NS + "text")]


def check_picture(svg, lines, what, complete):
    """The picture of stats lines: its series, vertices, marks and outcome."""
    root = read_svg(svg, what)
    if root is None:
        return
    got = series(root)
    want = expected(lines)
    points = [l for l in lines if l["type"] in ("sample", "pass")]
    for name in sorted(set(got) | set(want)):
        if len(got.get(name, [])) != want.get(name, 0) or (name in want) != (name in got):
            fail(f"{what}: series {name}: {len(got[name]) if name in got else 'none'} vertices, "
                 f"expected {want[name] if name in want else 'none'}")
    for name in ("bytes_sent", "dirty_bytes", "link", "dirty_rate"):
        if name not in got and points:
            fail(f"{what}: no series {name}")
    # the shared time axis runs left to right, and more bytes sent is higher
    xs = [x for x, _ in got.get("bytes_sent", [])]
    if xs != sorted(xs):
        fail(f"{what}: bytes_sent's vertices go back in time: {xs}")
    for (a, ya), (b, yb) in zip([(p["bytes_sent"], y) for p, (_, y) in zip(points, got.get("bytes_sent", []))][:-1],
                                [(p["bytes_sent"], y) for p, (_, y) in zip(points, got.get("bytes_sent", []))][1:]):
        if (b - a) * (yb - ya) > 0:
            fail(f"{what}: bytes_sent {a} -> {b} drawn from y {ya} to {yb}")
    passes = [g for g in root.iter(NS + "g") if g.get("class") == "passmark"]
    if len(passes) != sum(l["type"] == "pass" for l in lines):
        fail(f"{what}: {len(passes)} pass boundaries marked, {sum(l['type'] == 'pass' for l in lines)} passes")
    if root.get("data-points") != str(len(points)):
        fail(f"{what}: data-points {root.get('data-points')}, {len(points)} lines")
    end = lines[-1] if lines[-1]["type"] == "end" else None
    if root.get("data-incomplete") != ("false" if complete and end else "true"):
        fail(f"{what}: data-incomplete {root.get('data-incomplete')}")
    t = texts(root)
    head = root.find(NS + "title").text
    if not end:
        if not head.startswith("Incomplete: the stats stop before their end line"):
            fail(f"{what}: title {head!r}")
        if points and "stats end here" not in t:
            fail(f"{what}: the end of the stats is not marked")
        return
    if end["ok"] and end["converged"] and not head.startswith(f"Converged after {end['passes']} pass"):
        fail(f"{what}: title {head!r} for a migration that converged")
    if not end["converged"] and not head.startswith(f"Did not converge ({end['reason']})"):
        fail(f"{what}: title {head!r} for a migration that did not converge ({end['reason']})")
    if end.get("detail") and not any(end["detail"][:60] in s for s in t):
        fail(f"{what}: the detail {end['detail']!r} is not written")
    if end["ok"] and end["downtime_ms"] > 0:
        mark = f"downtime {end['downtime_ms']:.1f} ms"
        if mark not in t:
            fail(f"{what}: no '{mark}' on the picture")
        if not any(r.get("class") == "downtime" for r in root.iter(NS + "rect")):
            fail(f"{what}: the downtime is not shaded")


def check_file(migrate, path, tmp, complete=True):
    svg = os.path.join(tmp, os.path.basename(path) + ".svg")
    rc, err = plot(migrate, path, svg)
    with open(path) as fh:
        text = fh.read()
    lines = parse_lines(text)
    if rc != 0:
        fail(f"{path}: plot exited {rc}: {err.strip()}")
        return
    if not complete or not lines or lines[-1]["type"] != "end":
        if err.count("\n") != 1 or "marked incomplete" not in err:
            fail(f"{path}: for an incomplete file, stderr {err!r}")
    elif err:
        fail(f"{path}: stderr {err!r}")
    check_picture(svg, lines, path, complete)


def refused(migrate, path, text, want, tmp):
    with open(path, "w") as fh:
        fh.write(text)
    out = os.path.join(tmp, "refused.svg")
    rc, err = plot(migrate, path, out)
    line = f"kvmdirty-migrate: plot: '{path}': {want}"
    if rc != 1 or not err.startswith(line) or err.count("\n") != 1:
        fail(f"{path}: exit {rc}, stderr {err!r}; expected exit 1 and one line starting {line!r}")
    if os.path.exists(out):
        fail(f"{path}: refused, and still wrote {out}")


def cuts(migrate, path, tmp):
    """Every line boundary, the middle of every line, and random bytes: each prefix renders, incomplete."""
    with open(path, "rb") as fh:
        data = fh.read()
    ends = [i + 1 for i, c in enumerate(data) if c == ord("\n")]
    first = ends[0]
    at = set(ends[1:-1]) | {(a + b) // 2 for a, b in zip(ends, ends[1:])}
    rnd = random.Random(1010)
    at |= {rnd.randrange(first, len(data) - 1) for _ in range(20)}
    cut = os.path.join(tmp, "cut.json")
    for k in sorted(at):
        with open(cut, "wb") as fh:
            fh.write(data[:k])
        before = len(errors)
        check_file(migrate, cut, tmp, complete=False)
        if len(errors) > before:
            errors.append(f"  ... {path} cut after {k} of {len(data)} bytes")
            return
    return len(at)


def broken(migrate, path, tmp):
    with open(path) as fh:
        lines = fh.read().split("\n")
    bad = os.path.join(tmp, "bad.json")
    refused(migrate, bad, "", "empty: no stats lines", tmp)
    v2 = list(lines)
    v2[2] = v2[2].replace('"v":1,', '"v":2,', 1)
    refused(migrate, bad, "\n".join(v2), "line 3: stats format version 2; this reads version 1", tmp)
    cut = list(lines)
    cut[3] = cut[3][:len(cut[3]) // 2]
    refused(migrate, bad, "\n".join(cut), "line 4: column ", tmp)
    garbage = list(lines)
    garbage[1] = garbage[1][:-1] + ",}"
    refused(migrate, bad, "\n".join(garbage), "line 2: column ", tmp)


def cmd_recorded(migrate, data):
    files = sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".json"))
    if not files:
        return fail(f"{data}: no stats files")
    tmp = tempfile.mkdtemp()
    try:
        kinds = set()
        for f in files:
            before = len(errors)
            check_file(migrate, f, tmp)
            n = cuts(migrate, f, tmp)
            broken(migrate, f, tmp)
            with open(f) as fh:
                lines = parse_lines(fh.read())
            want = expected(lines)
            kinds |= {"limit" for k in want if k.endswith("_limit")} | {"share" for k in want if k.endswith("_share")}
            end = lines[-1]
            kinds.add("throttled" if end.get("throttled") else "not throttled")
            if len(errors) == before:
                print(f"{os.path.basename(f)}: {len(lines)} lines, series "
                      f"{', '.join(f'{k} {v}' for k, v in sorted(want.items()))}; {n} prefixes incomplete; "
                      "empty, version 2 and bad lines refused: ok")
        # what the recorded runs must cover between them
        for k in ("limit", "share", "throttled", "not throttled"):
            if k not in kinds:
                fail(f"{data}: no recorded run with {k}")
    finally:
        shutil.rmtree(tmp)


def cmd_live(migrate):
    require_kvm("plot-live", migrate)
    tmp = tempfile.mkdtemp()
    guest = ["-m", "256", "-v", "2"]
    try:
        for name, extra in (("throttle", ["-M", "dirty-ring"]), ("no-throttle", ["--no-throttle"])):
            sock = os.path.join(tmp, name + ".sock")
            stats = os.path.join(tmp, name + ".json")
            dst = subprocess.Popen([migrate, "listen", "unix:" + sock] + guest + ["--run-ms", "100", "--once"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(300):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            src = subprocess.run([migrate, "send", "unix:" + sock] + guest +
                                 ["--vcpu", "0=dirty:16", "--vcpu", "1=compute", "--fill", "all", "-d", "5", "--baseline", "100",
                                  "--stats", stats] + extra, capture_output=True, text=True, timeout=120)
            dst.communicate(timeout=60)
            # without the throttle pre-copy may not converge: the source gives up (1), the stats say why
            if src.returncode not in (0, 1) or '"type":"end"' not in open(stats).read():
                fail(f"live {name}: send exited {src.returncode} ({src.stderr.strip()}), listen {dst.returncode}")
                continue
            before = len(errors)
            check_file(migrate, stats, tmp)
            lines = parse_lines(open(stats).read())
            if len(errors) == before:
                print(f"live {name}: picture of {len(lines)} stats lines ({lines[-1].get('reason')}): ok")

        # a source killed mid-migration: -d 0 never converges, so it is still sending
        sock = os.path.join(tmp, "killed.sock")
        stats = os.path.join(tmp, "killed.json")
        dst = subprocess.Popen([migrate, "listen", "unix:" + sock] + guest, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        for _ in range(300):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        src = subprocess.Popen([migrate, "send", "unix:" + sock] + guest +
                               ["--vcpu", "0=dirty:16", "-d", "0", "-p", "100000", "--stats", stats],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            if os.path.exists(stats) and os.path.getsize(stats) > 12288:
                break
            time.sleep(0.05)
        src.send_signal(signal.SIGKILL)
        src.wait()
        dst.send_signal(signal.SIGTERM)
        dst.wait()
        with open(stats, "rb") as fh:
            data = fh.read()
        before = len(errors)
        check_file(migrate, stats, tmp, complete=False)
        where = "cut inside a line" if data[-1:] != b"\n" else "cut at a line's end"
        if len(errors) == before:
            print(f"live killed: {len(data)} bytes, {where}, picture marked incomplete: ok")
    finally:
        shutil.rmtree(tmp)
    return 0


def cmd_same(migrate, stats, svg):
    tmp = tempfile.mkdtemp()
    try:
        out = os.path.join(tmp, "now.svg")
        rc, err = plot(migrate, stats, out)
        if rc != 0:
            return fail(f"{stats}: plot exited {rc}: {err.strip()}")
        with open(out, "rb") as a, open(svg, "rb") as b:
            if a.read() != b.read():
                return fail(f"{svg} is not what plot draws from {stats} now: run "
                            f"'kvmdirty-migrate plot {stats}' from the top of the tree, and look at it")
        print(f"{svg}: what plot draws from {stats}: ok")
    finally:
        shutil.rmtree(tmp)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "recorded":
        cmd_recorded(sys.argv[2], sys.argv[3])
        status = 0
    elif len(sys.argv) == 5 and sys.argv[1] == "same":
        cmd_same(sys.argv[2], sys.argv[3], sys.argv[4])
        status = 0
    elif len(sys.argv) == 3 and sys.argv[1] == "live":
        status = cmd_live(sys.argv[2])
    else:
        sys.exit("usage: check-plot.py recorded KVMDIRTY-MIGRATE DATA-DIR | live KVMDIRTY-MIGRATE\n"
                 "       check-plot.py same KVMDIRTY-MIGRATE STATS SVG")
    for e in errors:
        print(e)
    return 1 if errors else status


if __name__ == "__main__":
    sys.exit(main())
