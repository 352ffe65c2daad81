#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The manual pages (doc/man), checked four ways:

  render MANDIR
      every page renders with groff -ww (every warning) without one, and
      every page that is not a link (.so) has a NAME line "names \- what"
      that lexgrog (what mandb and whatis use) can parse;
  installed BUILD-DIR MANDIR-UNDER-PREFIX VERSION-SCRIPT[:SCRIPT...] SOURCE-MANDIR
      after `meson install --destdir`, the pages installed are those of the
      tree, each symbol of the version script has man3/SYMBOL.3 (a page, or
      a link page that resolves to one) whose NAME line names it, `man`
      finds and renders each without a warning, and every page a SEE ALSO
      names is installed;
  options MANPAGE PROGRAM SOURCE...
      (a SOURCE may be a directory: its .c and .h files)
      every long option in the sources' option tables (struct option), every
      short option of their getopt strings and every option and command the
      program's --help prints is an entry (a line that starts with it) of
      the page;
  examples MANDIR LIBRARY.so INCLUDE-DIR...
      every complete program (one with main) in a page's EXAMPLES builds
      with -Wall -Wextra -Werror against the library, and where the page
      says what it prints, it runs (given /dev/kvm) and prints that;
  stream MANPAGE STREAM.H SOURCE...
      every record kind of STREAM.H's enum mig_kind, its version, and every
      key of the statistics lines the sources print is in the page.

Each prints what is missing and exits 1 then.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from kvm_skip import kvm_missing


def fail(errors, ok_message):
    for e in errors:
        print(e)
    if errors:
        return 1
    print(ok_message)
    return 0


def pages(mandir):
    out = []
    for sec in sorted(os.listdir(mandir)):
        d = os.path.join(mandir, sec)
        if sec.startswith("man") and os.path.isdir(d):
            out += [os.path.join(sec, f) for f in sorted(os.listdir(d))]
    return out


def link_target(path):
    """The page a link page (.so) points to, relative to the man root, or None."""
    with open(path) as fh:
        lines = [l for l in fh.read().splitlines() if l.strip()]
    if len(lines) == 1 and lines[0].startswith(".so "):
        return lines[0].split(None, 1)[1].strip()
    return None


def name_line(path):
    """The names a page's NAME section lists."""
    with open(path) as fh:
        text = fh.read()
    m = re.search(r"^\.SH NAME\n(.*?)^\.SH", text, re.M | re.S)
    names, sep, _ = (m.group(1) if m else "").partition(" \\- ")
    if not sep:
        return []
    return [n.replace("\\-", "-") for n in re.split(r"[,\s]+", names) if n]


def groff(path, cwd, device="utf8"):
    return subprocess.run(["groff", "-ww", "-t", "-man", "-T" + device, "-P-cbou"] +
                          (["-z"] if device == "utf8" else []) + [path],
                          cwd=cwd, capture_output=True, text=True)


def cmd_render(mandir):
    errors = []
    all_pages = pages(mandir)
    for p in all_pages:
        r = groff(p, mandir)
        if r.returncode or r.stderr:
            errors.append(f"{p}: groff -ww: exit {r.returncode}: {r.stderr.strip()}")
        if link_target(os.path.join(mandir, p)):
            continue
        if not name_line(os.path.join(mandir, p)):
            errors.append(f"{p}: no NAME section of the form 'name, name \\- what they do'")
        r = subprocess.run(["lexgrog", os.path.join(mandir, p)], capture_output=True, text=True)
        if r.returncode or "parse failed" in r.stdout:
            errors.append(f"{p}: lexgrog cannot parse its NAME section: {r.stdout.strip()} {r.stderr.strip()}")
    if not all_pages:
        errors.append(f"{mandir}: no pages")
    return fail(errors, f"man-render: {len(all_pages)} pages render without a warning, NAME lines parse")


def cmd_installed(build, mandir_rel, symfile, src_mandir):
    errors, text = [], ""
    for f in symfile.split(os.pathsep):  # one version script per library
        with open(f) as fh:
            text += fh.read()
    symbols = sorted(set(re.findall(r"^\s*(kvmdirty_[a-z0-9_]+);", text, re.M)))
    if not symbols:
        return fail([f"{symfile}: no symbols found"], "")
    dest = tempfile.mkdtemp()
    try:
        subprocess.run(["meson", "install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"],
                       check=True, stdout=subprocess.DEVNULL)
        mandir = dest + os.path.join("/", mandir_rel)
        if not os.path.isdir(mandir):
            return fail([f"no manual pages installed under {mandir_rel}"], "")
        installed, source = set(pages(mandir)), set(pages(src_mandir))
        for p in sorted(source - installed):
            errors.append(f"{p}: in doc/man but not installed (doc/meson.build)")
        for p in sorted(installed - source):
            errors.append(f"{p}: installed but not in doc/man")

        for sym in symbols:
            page = os.path.join("man3", sym + ".3")
            path = os.path.join(mandir, page)
            if not os.path.exists(path):
                errors.append(f"{sym}: no {page} installed: `man {sym}` finds nothing")
                continue
            target = link_target(path) or page
            if not os.path.exists(os.path.join(mandir, target)):
                errors.append(f"{sym}: {page} links to {target}, which is not installed")
                continue
            if sym not in name_line(os.path.join(mandir, target)):
                errors.append(f"{sym}: {target} (what {page} shows) does not name it in its NAME section")
            if shutil.which("man"):
                r = subprocess.run(["man", "--warnings", "-M", mandir, "3", sym], capture_output=True, text=True,
                                   env=dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="80",
                                            LC_ALL="C.UTF-8"))
                if r.returncode or r.stderr.strip() or sym not in r.stdout:
                    errors.append(f"{sym}: `man 3 {sym}` exit {r.returncode}: {r.stderr.strip()}")
            else:
                errors.append("man (man-db) is not installed: .ci/setup installs it")
                break

        # every page a SEE ALSO names
        for p in sorted(installed):
            with open(os.path.join(mandir, p)) as fh:
                text = fh.read()
            m = re.search(r"^\.SH SEE ALSO\n(.*?)(^\.SH|\Z)", text, re.M | re.S)
            for name, sec in re.findall(r"^\.BR\s+(\S+)\s+\((\d)\)", m.group(1) if m else "", re.M):
                name = name.replace("\\-", "-")
                if name in ("jq", "pkg-config"):
                    continue
                if not os.path.exists(os.path.join(mandir, f"man{sec}", f"{name}.{sec}")):
                    errors.append(f"{p}: SEE ALSO {name}({sec}), which is not installed")
    finally:
        shutil.rmtree(dest)
    return fail(errors, f"man-installed: {len(symbols)} exported symbols, each reachable by `man` and named "
                        f"in its page's NAME; {len(installed)} pages installed, SEE ALSO resolved")


def rendered(page):
    r = groff(os.path.basename(page), os.path.dirname(page) or ".", device="ascii")
    if r.returncode:
        sys.exit(f"{page}: groff: {r.stderr}")
    return r.stdout


def entry(text, word):
    """True if some line of the rendered page starts with an option list or command holding word."""
    pat = re.compile(r"(^|[\s,\[])" + re.escape(word) + r"(?![\w-])")
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(word) or (s.startswith("-") and pat.search(s)):
            return True
    return False


def source_files(paths):
    """Files, and the .c and .h files of directories and their folders."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            for d, dirs, files in sorted(os.walk(p)):
                dirs.sort()
                out += sorted(os.path.join(d, f) for f in files if f.endswith((".c", ".h")))
        else:
            out.append(p)
    return out


def cmd_options(page, program, sources):
    long_opts, short_opts = set(), set()
    sources = source_files(sources)
    for src in sources:
        with open(src) as fh:
            code = fh.read()
        long_opts |= set(re.findall(r'\{\s*"([A-Za-z0-9][A-Za-z0-9-]*)"\s*,\s*(?:no|required|optional)_argument',
                                    code))
        for optstring in re.findall(r'getopt(?:_long)?\s*\([^;]*?"([^"]*)"', code, re.S):
            short_opts |= set(c for c in optstring if c.isalnum())
    errors = []
    if not long_opts or not short_opts:
        errors.append(f"found no option table or no getopt string in {' '.join(sources)}: has the parser moved?")
    r = subprocess.run([program, "--help"], capture_output=True, text=True)
    usage = r.stdout + r.stderr
    name = os.path.basename(program)
    commands = set(re.findall(re.escape(name) + r"\s+([a-z][a-z0-9-]*)", usage))
    long_opts |= set(re.findall(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)", usage))
    short_opts |= set(re.findall(r"(?<![\w-])-([A-Za-z0-9])(?![\w-])", usage))
    if r.returncode != 0 or not commands:
        errors.append(f"{name} --help: exit {r.returncode}, no command found in:\n{usage}")
    text = rendered(page)
    for o in sorted(long_opts):
        if not entry(text, "--" + o):
            errors.append(f"{page}: no entry for --{o}, which {name} accepts")
    for o in sorted(short_opts):
        if not entry(text, "-" + o):
            errors.append(f"{page}: no entry for -{o}, which {name} accepts")
    for c in sorted(commands):
        if not entry(text, c):
            errors.append(f"{page}: no entry for the command '{c}', which {name} --help lists")
    return fail(errors, f"man-options: {len(long_opts)} long options, {len(short_opts)} short options and "
                        f"{len(commands)} commands of {name}, each in {os.path.basename(page)}")


# a call of mig_status_event(): the status, the event's name, the format of its data
EVENT_CALL = re.compile(r'mig_status_event\(\s*[^,]+,\s*"([a-z_-]+)"\s*,((?:\s*(?:"(?:[^"\\]|\\.)*"|PRI[a-zA-Z0-9]+))+)')


def cmd_events(page, *sources):
    """Every event the engine emits, and every member of its data, has its entry in the control page."""
    errors, events, keys = [], set(), set()
    for src in source_files(sources):
        with open(src) as fh:
            for name, fmt in EVENT_CALL.findall(fh.read()):
                events.add(name)
                keys |= set(re.findall(r'\\"([a-z_]+)\\":', fmt))
    events.add("events_lost")
    if len(events) < 5:
        errors.append("found no events: has the engine's event call moved?")
    text = rendered(page)
    section = text[text.find("\n       subscribe"):text.find("\nERRORS")]
    for e in sorted(events):
        if not re.search(rf"^\s*{e}\b", section, re.M):
            errors.append(f"{page}: no entry for the event \"{e}\"")
    for k in sorted(keys):
        if not re.search(rf"\b{k}\b", section):
            errors.append(f"{page}: no entry for the event data member \"{k}\"")
    return fail(errors, f"man-events: {len(events)} events and {len(keys)} data members, each in "
                        f"{os.path.basename(page)}")


def cmd_stream(page, stream_h, sources):
    errors = []
    with open(stream_h) as fh:
        h = fh.read()
    kinds = re.findall(r"^\s*MIG_([A-Z]+)\s*=\s*(\d+)\s*,", h, re.M)
    version = re.search(r"#define MIG_VERSION (\d+)", h)
    keys = set()
    # the --stats lines are the source's (source*.c); the JSON of the control
    # socket and of the status it reports is kvmdirty-migrate-control(7)'s
    # the events' data (mig_status_event()) is kvmdirty-migrate-control(7)'s too
    for src in source_files(sources):
        if not os.path.basename(src).startswith("source"):
            continue
        with open(src) as fh:
            code = EVENT_CALL.sub("", fh.read())
        keys |= set(re.findall(r'\\"([a-z_]+)\\":', code))
    if not kinds or not version or not keys:
        errors.append("found no record kinds, version or statistics keys: has the format moved?")
    text = rendered(page)
    stats = text[text.find("\nSTATISTICS"):]
    for name, num in kinds:
        if not re.search(rf"^\s*{num} {name}\b", text, re.M):
            errors.append(f"{page}: no entry for record kind {num} {name}")
    if version and not re.search(rf"version\s+{version.group(1)}\b", text):
        errors.append(f"{page}: does not give the stream version {version.group(1)}")
    for k in sorted(keys):
        if not re.search(rf"\b{k}\b", stats):
            errors.append(f"{page}: no entry for the statistics key \"{k}\"")
    return fail(errors, f"man-stream: {len(kinds)} record kinds, version {version.group(1) if version else '?'} "
                        f"and {len(keys)} statistics keys, each in {os.path.basename(page)}")


def unescape(roff):
    for a, b in (("\\-", "-"), ("\\(aq", "'"), ("\\(dq", '"'), ("\\&", ""), ("\\e", "\\")):
        roff = roff.replace(a, b)
    return roff


def cmd_examples(mandir, library, *includes):
    errors, built, ran = [], 0, 0
    cc = os.environ.get("CC", "cc").split()
    cflags = os.environ.get("CONSUMER_CFLAGS", "").split()
    libdir = os.path.dirname(os.path.abspath(library))
    # where this host cannot run a VM the programs are built and not run
    no_kvm = kvm_missing(os.environ["KVMDIRTY_MIGRATE"])
    tmp = tempfile.mkdtemp()
    try:
        for p in pages(mandir):
            with open(os.path.join(mandir, p)) as fh:
                text = fh.read()
            m = re.search(r"^\.SH EXAMPLES\n(.*?)(^\.SH|\Z)", text, re.M | re.S)
            if not m:
                continue
            section = m.group(1)
            blocks = list(re.finditer(r"^\.EX\n(.*?)^\.EE", section, re.M | re.S))
            for i, b in enumerate(blocks):
                code = unescape(b.group(1))
                if not re.search(r"^int main\(", code, re.M):
                    continue
                src, exe = os.path.join(tmp, "example.c"), os.path.join(tmp, "example")
                with open(src, "w") as fh:
                    fh.write(code)
                r = subprocess.run(cc + ["-std=gnu11", "-Wall", "-Wextra", "-Werror"] + cflags +
                                   ["-I" + d for d in includes] + ["-o", exe, src, library,
                                   "-Wl,-rpath," + libdir], capture_output=True, text=True)
                if r.returncode:
                    errors.append(f"{p}: its example does not build:\n{r.stderr}")
                    continue
                built += 1
                # "It prints:" and the next block: what the program prints
                between = section[b.end():blocks[i + 1].start()] if i + 1 < len(blocks) else ""
                if "prints" not in between:
                    continue
                if no_kvm:
                    print(f"{p}: example built, not run: {no_kvm}")
                    continue
                r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
                want = unescape(blocks[i + 1].group(1))
                if r.returncode or r.stdout != want:
                    errors.append(f"{p}: its example exited {r.returncode} and printed\n{r.stdout}{r.stderr}"
                                  f"where the page says\n{want}")
                ran += 1
    finally:
        shutil.rmtree(tmp)
    if not built:
        errors.append(f"{mandir}: no complete program in any EXAMPLES section")
    return fail(errors, f"man-examples: {built} programs in the pages build, {ran} print what their page says")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "render":
        return cmd_render(*args)
    if cmd == "installed":
        return cmd_installed(*args)
    if cmd == "options":
        return cmd_options(args[0], args[1], args[2:])
    if cmd == "examples":
        return cmd_examples(*args)
    if cmd == "events":
        return cmd_events(*args)
    if cmd == "stream":
        return cmd_stream(args[0], args[1], args[2:])
    sys.exit(f"usage: {sys.argv[0]} render|installed|options|examples|stream|events ...")


if __name__ == "__main__":
    sys.exit(main())
