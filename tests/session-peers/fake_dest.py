#!/usr/bin/env python3
"""A destination without the key against a keyed source (--psk --encrypt).

Modes: bad-proof (a hello and a proof of its own), reflect (the source's own
hello sent back, and a proof), inject (a refusal whose message holds
newlines, an escape sequence and a C1 control).  The destination proves
first: the source must send nothing after its hello, no proof of its own
and nothing of the guest, and print what the peer says on one line, as
printable ASCII.  Exits 1 when it does not."""
import os, socket, struct, subprocess, sys, tempfile, time
BIN = sys.argv[1] if len(sys.argv) > 1 else "build/examples/kvmdirty-migrate/kvmdirty-migrate"

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kvm_skip import require_kvm  # noqa: E402

require_kvm("session-fake-dest", BIN)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hello import hello, ack, SIZE  # noqa: E402
mode = sys.argv[2] if len(sys.argv) > 2 else "bad-proof"
d = tempfile.mkdtemp(); kp = os.path.join(d, "key")
fd = os.open(kp, os.O_WRONLY | os.O_CREAT, 0o600); os.write(fd, os.urandom(32).hex().encode()); os.close(fd)
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(("127.0.0.1", 0)); ls.listen(4)
port = ls.getsockname()[1]
p = subprocess.Popen([BIN, "send", f"tcp:127.0.0.1:{port}", "-m", "16", "-v", "1", "--psk", kp, "--encrypt",
                      "-T", "3000", "-t", "5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
c, _ = ls.accept()
c.settimeout(5)
def recvn(n):
    b = b""
    while len(b) < n:
        k = c.recv(n - len(b))
        if not k: break
        b += k
    return b
h = recvn(SIZE)
name = h[8 + 16 + 96:8 + 16 + 96 + 64]
if mode == "inject":   # a refusal of our own words: newlines and an escape sequence
    c.sendall(hello(flags=8) + ack(-13, b"ok\nkvmdirty-migrate: migrated, the guest runs there\n\x1b[2J\xc2\x9b2J"))
    pr = b""
elif mode == "reflect":   # its own hello back, then a proof it cannot have: the source's hello holds none
    c.sendall(h + bytes(32))
    pr = recvn(32)
else:   # a hello of its own, and a proof made up
    c.sendall(hello(flags=3, share=os.urandom(32), name=name) + os.urandom(32))
    pr = recvn(32)
    c.sendall(ack(0, b"ok", kind=4))
rest = b""
try:
    while True:
        k = c.recv(65536)
        if not k: break
        rest += k
except socket.timeout:
    pass
out = p.communicate(timeout=30)[0].decode(errors="replace").strip().splitlines()
if mode == "inject":
    print(repr("\n".join(out[-3:])))
print(f"{mode}: hello {len(h)} B, proof {len(pr)} B, then {len(rest)} B more; source rc {p.returncode}: "
      f"{[l for l in out if 'authentication' in l or 'refused' in l][:2]}")
injected = mode == "inject" and any("\x1b" in l or l.startswith("kvmdirty-migrate: migrated") for l in out)
if injected:
    print("the destination's words reached the source's stderr as lines of their own")
injected = injected or (mode == "inject" and any(ord(ch) >= 0x7f or (ord(ch) < 0x20 and ch != "\t") for l in out for ch in l))
sys.exit(1 if rest or pr or injected else 0)
