#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Bytes over TCP, for checks of the two-host rig.

  netcount.py recv ADDR PORT        accept one connection, print the bytes received
  netcount.py send ADDR PORT MIB    connect (retrying for up to 10 s), send MIB MiB,
                                    print the rate seen
"""
import socket
import sys
import time


def main():
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "recv":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        s.listen(1)
        c, _ = s.accept()
        n = 0
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            n += len(b)
        print(f"received {n} bytes")
        return 0
    mib = int(sys.argv[4])
    for _ in range(100):
        try:
            s = socket.create_connection((addr, port))
            break
        except OSError:
            time.sleep(0.1)
    else:
        print(f"netcount.py: cannot connect to {addr}:{port}", file=sys.stderr)
        return 1
    buf = b"x" * (1 << 20)
    t = time.monotonic()
    for _ in range(mib):
        s.sendall(buf)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    print(f"sent {mib << 20} bytes at {mib * 1.048576 / (time.monotonic() - t):.1f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
