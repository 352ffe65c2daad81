#!/usr/bin/env python3
"""Every fault at every step of the handoff, between two real daemons.

`kvmdirty-migrate listen` and `send`, each with a control socket, talk
through a relay that finds the handoff's messages (the destination says
nothing before READY; the first bytes from the source after it are COMMIT
or ABORT; the destination's next message is the ACK) and, at one of them,
drops it, delays it past -T, cuts both connections, or kills (SIGKILL) the
source or the destination before passing it on (or, ready-cut-resumed,
cuts at READY and kills the source once it ran its guest on).  Then, as an
orchestrator would, it queries both control sockets, resolves each side
whose outcome is unknown by the rule of kvmdirty-migrate-control(7): the
destination "here" only where the source provably never ran the guest
after its pause (its outcome "there", or killed with no "resume" line in
its --stats file: an exit, or such a line, says it ran on), the source
"here" only where the destination's outcome is "there" or it was killed
before running; and checks:
  - at most one side ever ran the guest after the pause (two histories),
    and exactly one unless the relay killed the side that had it;
  - each side is unknown exactly where the table says, and decides by
    itself everywhere else;
  - a resolved side does what it was told.
Case names are STEP-FAULT.  Exits 77 with the daemon's line where this host
has no usable KVM.
usage: handoff-faults.py KVMDIRTY-MIGRATE [CASE...]
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvm_skip import require_kvm  # noqa: E402

MSG = 128
T_MS = 1500
LATE_S = 3.5

# step, fault -> (source unknown, destination unknown, who runs the guest at the end: "source", "dest" or None)
CASES = {
    "none-pass": ("none", "pass", False, False, "dest"),
    "ready-drop": ("ready", "drop", False, False, "source"),
    "ready-delay": ("ready", "delay", False, False, "source"),
    "ready-cut": ("ready", "cut", False, True, "source"),
    "ready-kill-source": ("ready", "kill-source", False, True, "dest"),
    "ready-kill-dest": ("ready", "kill-dest", True, False, "source"),
    # the attack's case: READY cut, the source runs on, then dies; "dead" alone would run a second history
    "ready-cut-resumed": ("ready", "cut-resumed", False, True, "source"),
    "commit-drop": ("commit", "drop", True, True, "source"),
    "commit-delay": ("commit", "delay", False, False, "dest"),
    "commit-cut": ("commit", "cut", True, True, "source"),
    "commit-kill-source": ("commit", "kill-source", False, False, "dest"),
    "commit-kill-dest": ("commit", "kill-dest", True, False, "source"),
    "ack-drop": ("ack", "drop", True, False, "dest"),
    "ack-delay": ("ack", "delay", False, False, "dest"),
    "ack-cut": ("ack", "cut", True, False, "dest"),
    "ack-kill-source": ("ack", "kill-source", False, False, "dest"),
    "ack-kill-dest": ("ack", "kill-dest", False, False, None),
}


class Relay(threading.Thread):
    """Unix socket in front of the destination; acts on one handoff message."""

    def __init__(self, path, dest_path, step, fault, procs):
        super().__init__(daemon=True)
        self.lsock = socket.socket(socket.AF_UNIX)
        self.lsock.bind(path)
        self.lsock.listen(1)
        self.dest_path, self.step, self.fault, self.procs = dest_path, step, fault, procs
        self.ready_passed = False
        self.cut = False
        self.hit = False
        self.killed_running = False  # ready-cut-resumed: the source killed 0.5 s after it kept the guest

    def run(self):
        s, _ = self.lsock.accept()
        d = socket.socket(socket.AF_UNIX)
        d.connect(self.dest_path)
        self.s, self.d = s, d
        a = threading.Thread(target=self.pump, args=(s, d, False), daemon=True)
        b = threading.Thread(target=self.pump, args=(d, s, True), daemon=True)
        a.start()
        b.start()
        a.join()
        b.join()

    def act(self, msg, to):
        """The chosen message: what the fault does to it; True if it still goes on."""
        self.hit = True
        f = self.fault
        if f == "drop":
            return False
        if f == "delay":
            time.sleep(LATE_S)
            return True
        if f == "cut":
            self.cut_all()
            return False
        if f == "cut-resumed":
            self.cut_all()
            threading.Thread(target=self.kill_once_resumed, daemon=True).start()
            return False
        victim = self.procs["source" if f == "kill-source" else "dest"]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        return True

    def kill_once_resumed(self):
        """The source, once its control socket says it keeps the guest (it then runs it on), killed while it does."""
        for _ in range(600):
            r = control(self.procs["sctl"], {"execute": "query"})
            if r and r.get("return", {}).get("outcome") == "here":
                time.sleep(0.5)
                self.killed_running = True
                break
            time.sleep(0.05)
        self.procs["source"].send_signal(signal.SIGKILL)

    def cut_all(self):
        self.cut = True
        for x in (self.s, self.d):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def send(self, to, data):
        try:
            to.sendall(data)
        except OSError:
            pass

    def pump(self, frm, to, to_source):
        buf, nth = b"", 0
        while not self.cut:
            try:
                data = frm.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                try:
                    to.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if not to_source and not self.ready_passed:
                self.send(to, data)  # the stream, before READY
                continue
            buf += data
            while len(buf) >= MSG:
                msg, buf = buf[:MSG], buf[MSG:]
                step = ("ready" if nth == 0 else "ack") if to_source else "commit"
                nth += 1
                # READY comes only after the whole stream went through: from now on the source's
                # next bytes are COMMIT or ABORT.  Said before READY is passed on, so that a COMMIT
                # sent the moment READY arrives is never taken for the stream
                if to_source and step == "ready":
                    self.ready_passed = True
                go = True
                if step == self.step and not self.hit:
                    go = self.act(msg, to)
                if go and not self.cut:
                    self.send(to, msg)
            if not to_source and buf:
                self.send(to, buf)
                buf = b""


def control(path, request):
    """One request on a control socket: its reply, or None where no one answers."""
    try:
        c = socket.socket(socket.AF_UNIX)
        c.settimeout(5)
        c.connect(path)
        f = c.makefile("rwb")
        f.readline()  # the greeting
        f.write((json.dumps(request) + "\n").encode())
        f.flush()
        line = f.readline()
        c.close()
        return json.loads(line) if line else None
    except OSError:
        return None


def resumed(stats):
    """The source's --stats file has a resume line: it ran its guest on after its pause."""
    try:
        with open(stats) as f:
            return any(json.loads(l).get("type") == "resume" for l in f if l.strip())
    except (OSError, ValueError):
        return False


def outcome(path, proc, side, stats=None):
    """As an orchestrator sees a side: its query's outcome, or how it ended."""
    if proc.poll() is not None:
        if proc.returncode < 0:
            # killed: a source whose stats say it resumed ran the guest on; one whose stats do not died paused
            if side == "source" and resumed(stats):
                return "here"
            return "dead"
        # the source exits 1 where the guest runs on there, the destination 0 where it ran
        ran = proc.returncode == (1 if side == "source" else 0)
        return "here" if ran else "there"
    r = control(path, {"execute": "query"})
    return r["return"]["outcome"] if r and "return" in r else "?"


def run_case(migrate, name, tmp):
    step, fault, src_unknown, dst_unknown, runs = CASES[name]
    dsock, rsock = os.path.join(tmp, name + ".d"), os.path.join(tmp, name + ".r")
    dctl, sctl = os.path.join(tmp, name + ".dctl"), os.path.join(tmp, name + ".sctl")
    stats = os.path.join(tmp, name + ".stats")
    guest = ["-m", "16", "-v", "1", "-T", str(T_MS)]
    procs = {"stats": stats, "sctl": sctl}
    procs["dest"] = subprocess.Popen([migrate, "listen", "unix:" + dsock, "--once", "--run-ms", "200",
                                      "--control", dctl] + guest, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
    for _ in range(600):
        if os.path.exists(dsock) or procs["dest"].poll() is not None:
            break
        time.sleep(0.05)
    relay = Relay(rsock, dsock, step, fault, procs)
    relay.start()
    # ready-cut-resumed: the source runs its guest on long enough to be killed while it does
    run_ms = "5000" if fault == "cut-resumed" else "200"
    procs["source"] = subprocess.Popen([migrate, "send", "unix:" + rsock, "-w", "4", "-d", "500", "-p", "4",
                                        "--force-switchover", "--run-ms", run_ms, "--control", sctl,
                                        "--stats", stats] + guest,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # long enough for every -T and the delay: what is unknown then stays so until resolved
    deadline = time.time() + 120
    while time.time() < deadline and not relay.hit and name != "none-pass":
        if any(procs[k].poll() is not None for k in ("source", "dest")):
            break
        time.sleep(0.05)
    time.sleep(LATE_S + 3 * T_MS / 1000)
    if fault == "cut-resumed":
        procs["source"].wait(timeout=60)
    so, do = outcome(sctl, procs["source"], "source", stats), outcome(dctl, procs["dest"], "dest")
    bad = []
    if (so == "unknown") != src_unknown:
        bad.append(f"source {so}, the table says {'unknown' if src_unknown else 'known'}")
    if (do == "unknown") != dst_unknown:
        bad.append(f"destination {do}, the table says {'unknown' if dst_unknown else 'known'}")
    # resolve as an orchestrator would (kvmdirty-migrate-control(7)): both unknown, the destination "nowhere" first,
    # then the source, unless the destination's answer to its resolve reached it; one unknown, it runs the guest
    # only where the other side provably never did after the pause (killed before, or its outcome "there")
    def resolve(side, run):
        r = control(dctl if side == "dest" else sctl, {"execute": "resolve", "arguments": {"run": run}})
        if not r or "return" not in r:
            bad.append(f"resolving the {side} ({run}): {r}")
    if do == "unknown":
        resolve("dest", "here" if so in ("dead", "there") else "nowhere")
        time.sleep(1)
        if so == "unknown":
            so = outcome(sctl, procs["source"], "source", stats)
            if so == "unknown":
                resolve("source", "here")
    elif so == "unknown":
        resolve("source", "here" if do in ("dead", "there") else "nowhere")
    out = {}
    for k in ("source", "dest"):
        p = procs[k]
        try:
            o, e = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            bad.append(f"{k} did not end")
        out[k] = (p.returncode, o, e)
    # the source ran its guest on: it said so at its end, or its stats say it resumed (killed while it ran)
    src_ran = ("runs on here" in out["source"][2] and out["source"][0] >= 0) or resumed(stats) or relay.killed_running
    dst_ran = "resuming the guest" in out["dest"][1] and out["dest"][0] >= 0
    if src_ran and dst_ran:
        bad.append("BOTH sides ran the guest")
    ran = "source" if src_ran else "dest" if dst_ran else None
    if ran != runs:
        bad.append(f"the guest runs at {ran}, expected {runs}")
    print(f"{name:20s} source {so:8s} exit {out['source'][0]:3d}  destination {do:8s} exit {out['dest'][0]:3d}  "
          f"runs at {ran}")
    for b in bad:
        print(f"  FAIL {name}: {b}")
        for k in out:
            print(f"    {k} stdout: {out[k][1].strip()}\n    {k} stderr: {out[k][2].strip()}")
    return not bad


def main():
    migrate = sys.argv[1]
    require_kvm("handoff-faults", migrate)
    names = sys.argv[2:] or list(CASES)
    tmp = tempfile.mkdtemp()
    failed = [n for n in names if not run_case(migrate, n, tmp)]
    if failed:
        print(f"handoff-faults: {len(failed)} of {len(names)} cases failed: {' '.join(failed)}")
        return 1
    print(f"handoff-faults: {len(names)} cases, the guest ran in at most one place in each, unknown exactly where "
          "the table says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
