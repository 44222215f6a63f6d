"""issue 46.5: the pull tap's header reader (``nats_internals.header_lines``) reads any header
block exactly as nats-py's own does, so a delivery cut out of the socket buffer carries the
headers the ordinary path would have given it (the processor's fencing looks at them)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client

from healthplane.runtime.nats_internals import header_lines

# Lines of every shape: names with spaces, tabs, control and non-ASCII characters, no colon,
# several colons, empty names and values, invalid UTF-8 in values.
_piece = st.binary(max_size=12) | st.sampled_from(
    [b"Nats-Msg-Id", b" Hp-Lease ", b"a b", b"\x1c", b"\xc3\xa9", b"", b"\t", b"x\x0bY", b":", b"\xff\xfe"])
_line = st.lists(_piece, max_size=4).map(b"".join)


@given(st.lists(_line, max_size=8), st.booleans())
def test_header_lines_reads_a_block_as_nats_py_does(lines: list[bytes], trailing: bool) -> None:
    raw = b"\r\n".join(lines) + (b"\r\n\r\n" if trailing else b"")
    assert header_lines(raw) == Client._parse_header_lines(raw)


def test_header_lines_of_a_record_of_ours() -> None:
    raw = (b"Nats-Msg-Id: scorer:default:n1:HP_ASSESSMENTS:7\r\nHp-Producer: scorer/0\r\n"
           b"Nats-Expected-Last-Subject-Sequence: 12\r\n\r\n")
    assert header_lines(raw) == {"Nats-Msg-Id": "scorer:default:n1:HP_ASSESSMENTS:7", "Hp-Producer": "scorer/0",
                                 "Nats-Expected-Last-Subject-Sequence": "12"}
