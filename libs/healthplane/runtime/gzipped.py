"""One gzip response (RFC 1952) put together from pieces compressed at different times, so a
large exposition keeps its text compressed and compresses again only the pieces that changed
(the scorer's node series: 143 MB of text at 100,000 nodes, 5.4 MB as pieces).

A :class:`Piece` is text deflated on its own (a fresh compressor: nothing refers back before
its start) and flushed to a byte boundary without ending the stream, so pieces laid end to end
are one valid deflate stream; :func:`stream` puts a gzip header before them and the final
block and trailer after. The trailer's CRC-32 is of the whole text: each piece keeps its own,
and zlib's ``crc32_combine`` joins them without the text. Python's zlib module does not offer
that function, so it is taken from the zlib library that module is linked with (public C API,
looked up once, checked against ``zlib.crc32`` at import). Where it is missing or wrong,
:data:`NOT_JOINABLE` says why and callers send the text uncompressed (:func:`inflate`); one
gzip stream rather than several concatenated members because common clients (httpx, curl)
read only a response's first member.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Final, NamedTuple

LEVEL: Final = 1  # Prometheus text is repetitive: level 1 gives 27x at a third of level 6's time
# RFC 1952 member header: magic, deflate, no flags, no modification time, no extra flags, OS unknown.
HEADER: Final = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_LAST_BLOCK: Final = zlib.compressobj(LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS).flush()  # an empty final block


class Piece(NamedTuple):
    deflated: bytes  # raw deflate, no final block, ending on a byte boundary
    crc: int  # CRC-32 of the text
    size: int  # bytes of text


def piece(text: bytes) -> Piece:
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return Piece(compressor.compress(text) + compressor.flush(zlib.Z_SYNC_FLUSH), zlib.crc32(text), len(text))


def inflate(part: Piece) -> bytes:
    """The piece's text."""
    return zlib.decompressobj(-zlib.MAX_WBITS).decompress(part.deflated)


def stream(pieces: Iterable[Piece]) -> Iterator[bytes]:
    """The gzip stream of the pieces' texts in order (only where :data:`NOT_JOINABLE` is None)."""
    assert _COMBINE is not None, NOT_JOINABLE
    yield HEADER
    crc = size = 0
    for part in pieces:
        yield part.deflated
        crc, size = _COMBINE(crc, part.crc, part.size), size + part.size
    yield _LAST_BLOCK + struct.pack("<II", crc, size & 0xFFFFFFFF)


def _crc32_combine() -> tuple[Callable[[int, int, int], int] | None, str | None]:
    """zlib's ``crc32_combine64`` (crc of A, crc of B, length of B -> crc of AB), or None and why."""
    name = ctypes.util.find_library("z") or "libz.so.1"
    try:
        combine = ctypes.CDLL(name).crc32_combine64
    except (AttributeError, OSError) as exc:
        return None, f"the zlib library has no crc32_combine64 ({exc})"
    combine.argtypes = [ctypes.c_ulong, ctypes.c_ulong, ctypes.c_int64]
    combine.restype = ctypes.c_ulong
    first, second = b"healthplane ", b"node series\n" * 1000
    if combine(zlib.crc32(first), zlib.crc32(second), len(second)) != zlib.crc32(first + second):
        return None, f"{name}'s crc32_combine64 disagrees with zlib.crc32"
    return combine, None


_COMBINE, NOT_JOINABLE = _crc32_combine()
