#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write fuzz-hello's seeds: tests/fuzz/hello-seeds.py tests/fuzz/hello-seeds"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session-peers"))
from hello import ack, hello  # noqa: E402

PSK, ENC, JOIN, REFUSED = 1, 2, 4, 8
NONCE = bytes(range(32))
SHARE = bytes(range(32, 64))
PROOF = bytes(32)


def h(**kw):
    kw.setdefault("nonce", NONCE)
    kw.setdefault("name", b"fuzz")
    return hello(**kw)


SEEDS = {
    # what a source sends a destination (first byte: a key, encryption, named)
    "dest-key": bytes([0x0e]) + h(flags=PSK | ENC, share=SHARE) + PROOF,
    "dest-join": bytes([0x0a]) + h(flags=PSK | JOIN, conns=4, conn=1, session=b"\x11" * 32) + PROOF,
    "dest-nokey-join": bytes([0x08]) + h(flags=JOIN, conns=4, conn=2, session=b"\x11" * 32),
    "dest-nokey-conns": bytes([0x08]) + h(flags=0, conns=3),
    "dest-version-1": bytes([0x0a]) + h(version=1, flags=PSK, share=SHARE) + PROOF,
    "dest-plain": bytes([0x00]) + b"KVMDMIG\0" + bytes(56),
    # what a destination sends a source
    "source-answer": bytes([0x0b]) + h(flags=PSK, share=SHARE) + PROOF + ack(0, b"ok", kind=4),
    "source-refused": bytes([0x0b]) + h(flags=REFUSED) + ack(-13, b"refused \x1b[31m\x9b2J", kind=0),
}

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(out, name + ".bin"), "wb") as f:
        f.write(data)
