# SPDX-License-Identifier: MIT
"""struct mig_hello of session version 2 (lib/migrate/net/session.h), for peers that speak it by hand."""
import os
import struct

SIZE = 192
ACK = 128


def hello(version=2, flags=0, conns=1, conn=0, share=None, name=b"", reserved=0, nonce=None, session=None):
    return (b"KVMDSES\0" + struct.pack("<IIII", version, flags, conns, conn)
            + (nonce if nonce is not None else os.urandom(32))
            + (session if session is not None else bytes(32))
            + (share if share is not None else bytes(32))
            + name.ljust(64, b"\0")[:64] + struct.pack("<Q", reserved))


def ack(status, text, kind=0):
    """struct mig_ack: status, kind (0 REFUSED ... 4 ACK), 120 bytes of message."""
    return struct.pack("<iI", status, kind) + text.ljust(120, b"\0")[:120]
