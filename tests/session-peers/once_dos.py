#!/usr/bin/env python3
"""A peer without the key must not end a `listen --psk --once` listener.

Each case starts a keyed --once listener, connects as a peer that holds no
key and sends one malformed or cut-short hello (or resets), then checks
whether the listener is still running.  The documented behaviour: a peer
that fails authentication never ends the listener.
"""
import os, socket, struct, subprocess, sys, tempfile, time

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/examples/kvmdirty-migrate/kvmdirty-migrate"

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kvm_skip import require_kvm  # noqa: E402

require_kvm("session-keyless-once", BIN)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hello import hello, SIZE  # noqa: E402

CASES = {
    "version 1": lambda s: s.sendall(hello(version=1, flags=1)),
    "version 3": lambda s: s.sendall(hello(version=3, flags=1)),
    "reserved bit": lambda s: s.sendall(hello(flags=1 | 16)),
    "conns 0": lambda s: s.sendall(hello(flags=1, conns=0)),
    "conn 3 on open": lambda s: s.sendall(hello(flags=1, conn=3)),
    "magic then close": lambda s: s.sendall(b"KVMDSES\0"),
    "reset before a byte": None,
    "hello, reset before proof": "rst-after-hello",
    "hello, silent past -T": lambda s: (s.sendall(good_hello(s)), time.sleep(4)),
    "no key at all (control)": lambda s: s.sendall(hello(flags=0)),
}

def good_hello(s):
    """A well-formed keyed hello naming the listener (its address, as it names
    itself without --name), so that it passes the hello's checks and the
    listener goes on to send its hello and proof and wait for ours."""
    host, port = s.getpeername()
    return hello(flags=1, share=os.urandom(32), name=b"%s:%d" % (host.encode(), port))

def run(name, act, keypath, port):
    log = tempfile.TemporaryFile()
    p = subprocess.Popen([BIN, "listen", f"tcp:127.0.0.1:{port}", "-m", "16", "-v", "1", "--once",
                          "--psk", keypath, "-T", "3000"], stdout=log, stderr=log)
    for _ in range(200):
        try:
            s = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            time.sleep(0.05)
    if act == "rst-after-hello":
        s.sendall(good_hello(s)); s.recv(SIZE)
        act = None
    if act is None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    else:
        act(s)
        time.sleep(0.3)
    s.close()
    time.sleep(1.0)
    alive = p.poll() is None
    if alive:
        p.kill()
    p.wait()
    log.seek(0)
    out = log.read().decode(errors="replace").strip().splitlines()
    print(f"{name:28s} listener {'STILL LISTENING' if alive else 'EXITED rc=%d' % p.returncode}: "
          f"{out[-1] if out else ''}")
    return alive

def main():
    d = tempfile.mkdtemp()
    keypath = os.path.join(d, "key")
    fd = os.open(keypath, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    port = 47000 + os.getpid() % 1000
    bad = 0
    for i, (name, act) in enumerate(CASES.items()):
        if not run(name, act, keypath, port + i):
            bad += 1
    print(f"{bad} of {len(CASES)} keyless peers ended the --once listener")
    return 1 if bad else 0

sys.exit(main())
