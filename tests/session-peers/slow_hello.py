#!/usr/bin/env python3
"""A keyless peer trickling its hello, a byte a little faster than -T, must
not hold a keyed listener (no --deadline): a handshake as a whole is
bounded by a few seconds, and a keyed peer behind it gets its hello answered.  Exits
1 when it does not within 12 s."""
import os, socket, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(__file__))
BIN = sys.argv[1] if len(sys.argv) > 1 else "build/examples/kvmdirty-migrate/kvmdirty-migrate"

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kvm_skip import require_kvm  # noqa: E402

require_kvm("session-slow-hello", BIN)
d = tempfile.mkdtemp(); kp = os.path.join(d, "key")
fd = os.open(kp, os.O_WRONLY | os.O_CREAT, 0o600); os.write(fd, os.urandom(32).hex().encode()); os.close(fd)
port = 49000 + os.getpid() % 1000
p = subprocess.Popen([BIN, "listen", f"tcp:127.0.0.1:{port}", "-m", "16", "-v", "1", "--psk", kp, "-T", "2000"],
                     stderr=subprocess.DEVNULL)
for _ in range(100):
    try:
        slow = socket.create_connection(("127.0.0.1", port)); break
    except OSError:
        time.sleep(0.05)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hello import hello, SIZE  # noqa: E402
msg = b"KVMDSES\0" + bytes(SIZE - 8)
t0 = time.time()
slow.send(msg[:1])
legit = socket.create_connection(("127.0.0.1", port))
legit.sendall(hello(flags=1, share=os.urandom(32), name=b"127.0.0.1:%d" % port))
legit.settimeout(0.2)
got = b""; i = 1
while time.time() - t0 < 12 and not got:
    try:
        got = legit.recv(SIZE)
    except socket.timeout:
        pass
    if i < len(msg) and time.time() - t0 > i * 1.5:
        slow.send(msg[i:i + 1]); i += 1
print(f"keyed peer's hello answered after {time.time() - t0:.1f} s (trickler sent {i} bytes, -T 2000)"
      if got else f"keyed peer: no answer in {time.time() - t0:.1f} s while a keyless peer trickles (-T 2000)")
p.kill(); p.wait()
sys.exit(0 if got else 1)
