"""The webhook transport's HTTP/1.1 wire format (services/webhook_dispatcher/transport.py):
request heads, response heads, framing and body decoding. h11 (the HTTP/1.1 implementation
under httpx's default transport) is the reference: what h11 writes, this reads the same way,
and what this writes, h11 reads back as sent."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthplane_webhook_dispatcher.transport import (
    BodyDecoder,
    Framing,
    ProtocolViolation,
    ResponseHead,
    chunk_size,
    head_end,
    parse_head,
    request_head,
    response_framing,
    wants_close,
)

TCHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
names = st.text(alphabet=TCHARS, min_size=1, max_size=20).map(str.encode).filter(
    lambda n: n.lower() not in (b"content-length", b"transfer-encoding", b"connection", b"host"))
# Field values as h11 accepts them: visible ASCII and inner spaces/tabs, no edge whitespace.
values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40) \
    .map(lambda v: v.strip(" \t").encode())
header_lists = st.lists(st.tuples(names, values), max_size=8)


def _h11_answer(request: bytes, status: int, reason: bytes, headers: list[tuple[bytes, bytes]],
                pieces: list[bytes]) -> bytes:
    """What an h11 server writes for this answer to ``request``, the body sent in ``pieces``."""
    server = h11.Connection(h11.SERVER)
    server.receive_data(request)
    while type(server.next_event()) is not h11.EndOfMessage:
        pass
    out = server.send(h11.Response(status_code=status, reason=reason, headers=headers))
    for piece in pieces:
        if piece:
            out += server.send(h11.Data(data=piece))  # type: ignore[operator]
    return out + server.send(h11.EndOfMessage())  # type: ignore[operator]


def _read(wire: bytes, cuts: list[int], method: bytes = b"POST") -> tuple[ResponseHead, Framing, bytes, bytes]:
    """Feed ``wire`` in the pieces ``cuts`` makes, as the socket would hand it over; returns
    the head, its framing, the body and what is left after the body."""
    buffer = bytearray()
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    head: ResponseHead | None = None
    decoder: BodyDecoder | None = None
    framing: Framing | None = None
    body = b""
    for i, piece in enumerate(pieces):
        buffer += piece
        eof = i == len(pieces) - 1
        if head is None:
            end = head_end(buffer)
            if end < 0:
                continue
            head = parse_head(bytes(buffer[:end]))
            del buffer[:end]
            framing = response_framing(method, head, request_close=False)
            decoder = BodyDecoder(framing)
        assert decoder is not None
        body += decoder.feed(buffer, eof and framing is not None and framing.kind == "until_close")
        if decoder.done:
            break
        # It took everything it could: the I/O loop waits for the network next, so bytes
        # left behind that could have been decoded would stall the answer.
        assert not buffer if framing.kind == "length" else b"\n" not in buffer
    assert head is not None and framing is not None and decoder is not None and decoder.done
    return head, framing, body, bytes(buffer)


HTTP11_REQUEST = b"POST /hooks HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
HTTP10_REQUEST = b"POST /hooks HTTP/1.0\r\nContent-Length: 0\r\n\r\n"


@settings(max_examples=300)
@given(status=st.integers(200, 599).filter(lambda s: s not in (204, 304)),
       reason=st.sampled_from([b"OK", b"Not Found", b"Whatever You Like", b""]),
       headers=header_lists, body=st.binary(max_size=600) | st.binary(min_size=2000, max_size=6000),
       framing=st.sampled_from(["length", "chunked", "until_close"]),
       sizes=st.lists(st.integers(1, 3000), max_size=6), data=st.data())
def test_reads_what_h11_writes(status: int, reason: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
                               framing: str, sizes: list[int], data: st.DataObject) -> None:
    """Any answer h11 writes (Content-Length, chunked in pieces of any size, or ended by
    close), cut anywhere by the network, reads back as h11 was given it."""
    request = HTTP10_REQUEST if framing == "until_close" else HTTP11_REQUEST
    framing_headers = [(b"Content-Length", b"%d" % len(body))] if framing == "length" else []
    pieces, rest = [], body
    for size in sizes:
        pieces.append(rest[:size])
        rest = rest[size:]
    pieces.append(rest)
    wire = _h11_answer(request, status, reason, framing_headers + headers, pieces)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(wire) - 1)), max_size=8))))
    head, found, read_body, left = _read(wire, [c for c in cuts if c < len(wire)])
    assert (head.status, head.reason, head.minor_version) == (status, reason, 1)
    sent = [(n.lower(), v) for n, v in headers]
    assert [(n.lower(), v) for n, v in head.headers if n.lower() in {n for n, _ in sent}] == sent
    assert found.kind == framing
    assert found.keep_alive == (framing != "until_close")
    assert read_body == body and left == b""


@given(headers=header_lists, target=st.text(alphabet=TCHARS + "/?=&%", max_size=40).map(lambda t: b"/" + t.encode()),
       body=st.binary(max_size=500))
def test_h11_reads_the_request_head_as_written(headers: list[tuple[bytes, bytes]], target: bytes, body: bytes) -> None:
    all_headers = [(b"Host", b"127.0.0.1:9"), *headers, (b"Content-Length", b"%d" % len(body))]
    server = h11.Connection(h11.SERVER)
    server.receive_data(request_head(b"POST", target, all_headers) + body)
    request = server.next_event()
    assert isinstance(request, h11.Request)
    assert (request.method, request.target) == (b"POST", target)
    assert [(n.lower(), v) for n, v in request.headers] == [(n.lower(), v) for n, v in all_headers]
    received = server.next_event()
    assert isinstance(received, h11.Data | h11.EndOfMessage)
    if body:
        assert isinstance(received, h11.Data) and received.data == body


@pytest.mark.parametrize(("method", "target", "headers"), [
    (b"POST", b"/x", [(b"X-Event", b"a\r\nX-Injected: 1")]),     # CRLF in a value: a smuggled header
    (b"POST", b"/x", [(b"X-Event", b"a\nb")]),
    (b"POST", b"/x", [(b"X-Event", b"a\rb")]),
    (b"POST", b"/x", [(b"X-Event", b"a\x00b")]),
    (b"POST", b"/x", [(b"X-Event: y", b"a")]),                    # a colon in the name
    (b"POST", b"/x", [(b"X Event", b"a")]),
    (b"POST", b"/x", [(b"", b"a")]),
    (b"POST", b"/x y", []),                                        # a space in the target
    (b"POST", b"/x\r\nHost: evil", []),
    (b"PO ST", b"/x", []),
    (b"POST", b"x", []),                                           # not origin-form
])
def test_request_head_refuses_what_would_smuggle(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(ProtocolViolation):
        request_head(method, target, headers)


def _head(status: int = 200, *headers: tuple[bytes, bytes], minor: int = 1) -> ResponseHead:
    return ResponseHead(minor, status, b"", list(headers))


@pytest.mark.parametrize(("method", "head", "request_close", "expected"), [
    (b"HEAD", _head(200, (b"Content-Length", b"10")), False, Framing("none", 0, True)),
    (b"POST", _head(204, (b"Content-Length", b"10")), False, Framing("none", 0, True)),
    (b"POST", _head(304), False, Framing("none", 0, True)),
    (b"POST", _head(200, (b"Content-Length", b"10")), False, Framing("length", 10, True)),
    (b"POST", _head(200, (b"Content-Length", b"10, 10")), False, Framing("length", 10, True)),
    (b"POST", _head(200, (b"Content-Length", b"10"), (b"content-length", b"10")), False, Framing("length", 10, True)),
    (b"POST", _head(200, (b"Transfer-Encoding", b"chunked")), False, Framing("chunked", 0, True)),
    (b"POST", _head(200, (b"Transfer-Encoding", b"gzip, chunked")), False, Framing("chunked", 0, True)),
    # Both framings: chunked wins, and the connection is not trusted again.
    (b"POST", _head(200, (b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3")), False,
     Framing("chunked", 0, False)),
    (b"POST", _head(200, (b"Transfer-Encoding", b"gzip")), False, Framing("until_close", 0, False)),
    (b"POST", _head(200), False, Framing("until_close", 0, False)),
    (b"POST", _head(200, (b"Content-Length", b"0"), (b"Connection", b"close")), False, Framing("length", 0, False)),
    (b"POST", _head(200, (b"Content-Length", b"0"), (b"Connection", b"Keep-Alive, Close")), False,
     Framing("length", 0, False)),
    (b"POST", _head(200, (b"Content-Length", b"0")), True, Framing("length", 0, False)),
    (b"POST", _head(200, (b"Content-Length", b"0"), minor=0), False, Framing("length", 0, False)),
    (b"POST", _head(200, (b"Content-Length", b"0"), (b"Connection", b"keep-alive"), minor=0), False,
     Framing("length", 0, True)),
])
def test_framing_follows_rfc9112(method: bytes, head: ResponseHead, request_close: bool, expected: Framing) -> None:
    assert response_framing(method, head, request_close=request_close) == expected


@pytest.mark.parametrize("lengths", [[b"10, 11"], [b"10", b"11"], [b"abc"], [b"-1"], [b"+5"], [b""], [b"1" * 19]])
def test_bad_content_length_is_refused(lengths: list[bytes]) -> None:
    with pytest.raises(ProtocolViolation):
        response_framing(b"POST", _head(200, *((b"Content-Length", v) for v in lengths)), request_close=False)


@pytest.mark.parametrize("raw", [
    b"HTTP/2 200 OK\r\n\r\n",
    b"HTTP/1.1 20 OK\r\n\r\n",
    b"HTTP/1.1 099 Odd\r\n\r\n",
    b"ICY 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length : 3\r\n\r\n",   # whitespace before the colon
    b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",     # obsolete line folding
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\n\r\n",
])
def test_malformed_heads_are_refused(raw: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        parse_head(raw)


def test_head_accepts_bare_lf_and_keeps_header_order_and_case() -> None:
    raw = b"HTTP/1.1 429 Too Many Requests\nRetry-After: 7\nX-Trace: a, b\n\nbody"
    end = head_end(raw)
    assert raw[end:] == b"body"
    head = parse_head(raw[:end])
    assert (head.status, head.reason) == (429, b"Too Many Requests")
    assert head.headers == [(b"Retry-After", b"7"), (b"X-Trace", b"a, b")]
    assert head_end(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n") == -1


@pytest.mark.parametrize(("line", "size"), [(b"0\r\n", 0), (b"1a\r\n", 26), (b"FF;name=value\r\n", 255),
                                           (b"10 ;x\r\n", 16), (b"a\n", 10)])
def test_chunk_sizes(line: bytes, size: int) -> None:
    assert chunk_size(line) == size


@pytest.mark.parametrize("line", [b"\r\n", b"0x10\r\n", b"-1\r\n", b"g\r\n", b"1" * 16 + b"\r\n"])
def test_bad_chunk_sizes_are_refused(line: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        chunk_size(line)


@pytest.mark.parametrize(("kind", "wire"), [
    ("length", b"abc"),                              # 3 of 5 bytes, then the server closed
    ("chunked", b"5\r\nabc"),                        # inside a chunk
    ("chunked", b"3\r\nabc\r\n"),                    # no last chunk
    ("chunked", b"3\r\nabc\r\n0\r\nX-Trailer: 1\r\n"),  # trailer not ended
])
def test_a_body_cut_short_by_close_is_an_error(kind: str, wire: bytes) -> None:
    decoder = BodyDecoder(Framing(kind, 5, True))  # type: ignore[arg-type]
    with pytest.raises(ProtocolViolation):
        decoder.feed(bytearray(wire), True)


def test_chunk_data_must_end_with_crlf() -> None:
    with pytest.raises(ProtocolViolation):
        BodyDecoder(Framing("chunked", 0, True)).feed(bytearray(b"3\r\nabcXY\r\n0\r\n\r\n"), False)


def test_chunked_body_with_extensions_and_trailers_leaves_the_next_answer_alone() -> None:
    buffer = bytearray(b"4;ext=1\r\nWiki\r\n5\r\npedia\r\n0\r\nX-Checksum: 1\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    decoder = BodyDecoder(Framing("chunked", 0, True))
    assert decoder.feed(buffer, False) == b"Wikipedia" and decoder.done
    assert buffer == b"HTTP/1.1 204 No Content\r\n\r\n"


def test_connection_close_tokens() -> None:
    assert wants_close([(b"Connection", b"Upgrade, close")])
    assert not wants_close([(b"Connection", b"keep-alive"), (b"X-Close", b"close")])
