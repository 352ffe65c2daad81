#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write seeds/postcopy.bin for fuzz-dest from seeds/hashed.bin.

The fuzzer's post-copy input (migrate-util.h: FAKE_POSTCOPY_MAGIC, then a
stream of a session that agreed to post-copy, then post-copy's records):
hashed.bin with post-copy's header flag, a LEFT record for region 0's
pages 2..3 before END (END's checksum made again), then the records that
travel after the handoff: a REQ, a DATA answer (its hash and page), the
source's ALL_IN, a recovery's map (LEFT, END).

usage: postcopy-seed.py FUZZ_DIR
"""
import struct
import sys

MAGIC = b"KVMDPCP\0"
HDR, REGION, REC = 32, 16, 24
DATA, ZERO, PASS, VCPU, END, VM, DEVICES, DEVICES_LIVE, LEFT, REQ, ALL_IN = 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12
COVERED = {VCPU, VM, DEVICES, DEVICES_LIVE}


def fnv(h, b):
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    d = sys.argv[1]
    s = bytearray(open(f"{d}/seeds/hashed.bin", "rb").read())
    flags = struct.unpack_from("<I", s, 24)[0]
    struct.pack_into("<I", s, 24, flags | 2)
    nreg = struct.unpack_from("<I", s, 16)[0]
    off = HDR + nreg * REGION
    h = fnv(0xCBF29CE484222325, s[:off])
    out = bytearray(s[:off])
    while True:
        kind, index, first, count = struct.unpack_from("<IIQQ", s, off)
        if kind == END:
            left = struct.pack("<IIQQ", LEFT, 0, 2, 2)
            h = fnv(h, left)
            out += left + struct.pack("<IIQQ", END, 0, h, 0)
            break
        rec = s[off:off + REC]
        plen = count * (4096 + 8) if kind == DATA else count if kind in COVERED else 0
        payload = s[off + REC:off + REC + plen]
        h = fnv(h, rec)
        if kind in COVERED:
            h = fnv(h, payload)
        out += rec + payload
        off += REC + plen
    page = bytes(4096)
    # the zero page's hash is the engine's to compute: any value exercises the check and its refusal
    out += struct.pack("<IIQQ", REQ, 0, 2, 1)
    out += struct.pack("<IIQQ", DATA, 0, 2, 1) + struct.pack("<Q", 0) + page
    out += struct.pack("<IIQQ", ALL_IN, 0, 0, 0)
    out += struct.pack("<IIQQ", LEFT, 0, 3, 1) + struct.pack("<IIQQ", END, 0, 1, 0)
    open(f"{d}/seeds/postcopy.bin", "wb").write(MAGIC + out)


main()
