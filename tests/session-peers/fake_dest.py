#!/usr/bin/env python3
"""A destination without the key against a keyed source (--psk --encrypt).

Modes: bad-proof (a hello and a proof of its own), reflect (the source's own
hello and proof sent back), inject (a refusal whose message holds newlines
and an escape sequence).  The source must send nothing of the guest after
its proof, and print what the peer says on one line, control bytes made
harmless.  Exits 1 when it does not."""
import os, socket, struct, subprocess, sys, tempfile, time
BIN = sys.argv[1] if len(sys.argv) > 1 else "build/examples/migrate/kvmdirty-migrate"

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kvm_skip import require_kvm  # noqa: E402

require_kvm("session-fake-dest", BIN)
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
h = recvn(96)
if mode == "inject":   # a refusal of our own words: newlines and an escape sequence
    c.sendall(b"KVMDSES\0" + struct.pack("<IIII", 1, 8, 1, 0) + bytes(72)
              + struct.pack("<i", -13) + b"ok\nkvmdirty-migrate: migrated, the guest runs there\n\x1b[2J".ljust(124, b"\0"))
    pr = b""
elif mode == "reflect":   # its own hello back, then its own proof back
    c.sendall(h)
    pr = recvn(32)
    c.sendall(struct.pack("<i", 0) + b"ok".ljust(124, b"\0") + pr)
else:
    c.sendall(b"KVMDSES\0" + struct.pack("<IIII", 1, 3, 1, 0) + os.urandom(64) + bytes(8))
    pr = recvn(32)
    c.sendall(struct.pack("<i", 0) + b"ok".ljust(124, b"\0") + os.urandom(32))
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
sys.exit(1 if rest or injected else 0)
