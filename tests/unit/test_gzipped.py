"""Issue 25 (/metrics within 1 s at 100,000 nodes): runtime.gzipped joins pieces deflated at
different times into one gzip stream whose text is theirs in order, read whole by Python's gzip
module and by a zlib stream decoder that stops at the end of a first member (what httpx and
curl do), and inflates each piece back to its text."""

from __future__ import annotations

import gzip
import zlib

from hypothesis import given
from hypothesis import strategies as st

from healthplane.runtime import gzipped

texts = st.lists(st.binary(max_size=3000) | st.sampled_from([b"", b"# HELP x\n" * 400]), max_size=8)


def test_zlibs_crc32_combine_was_found_here() -> None:
    # Debian's zlib (the CI image's and the Dockerfile's) has it; elsewhere the scorer would
    # send its node series plain, and this names why.
    assert gzipped.NOT_JOINABLE is None


@given(texts)
def test_pieces_join_into_one_gzip_stream_of_their_texts(parts: list[bytes]) -> None:
    pieces = [gzipped.piece(text) for text in parts]
    data = b"".join(gzipped.stream(pieces))
    assert gzip.decompress(data) == b"".join(parts)
    one_member = zlib.decompressobj(zlib.MAX_WBITS | 16)
    assert one_member.decompress(data) + one_member.flush() == b"".join(parts) and one_member.eof
    assert not one_member.unused_data
    assert [gzipped.inflate(p) for p in pieces] == parts


def test_a_piece_is_kept_compressed() -> None:
    text = b"".join(b'healthplane_node_condition{cluster="c",condition="gpu_xid_errors",node_id="n%d"} 0.0\n' % i
                    for i in range(250))
    assert len(gzipped.piece(text).deflated) < len(text) / 10
