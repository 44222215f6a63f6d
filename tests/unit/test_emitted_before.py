"""What a restart takes as already emitted (REL-1): runtime.processor.EmittedBefore, read per
output stream (a lease holder on a cluster writes one atomic batch per output stream, so a
kill leaves each stream a prefix of its own records, not of all of them: HA-6)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from nats.js.api import StreamConfig

from healthplane.contracts.streams import STREAMS
from healthplane.runtime.processor import EmittedBefore, drops_records

OUTPUTS = ("EVENTS", "VIEWS")


def _scanned() -> EmittedBefore:
    emitted = EmittedBefore(OUTPUTS)
    # Events (a stream keeping every record) of inputs 3 and 7; views (latest per subject) of
    # inputs 5 and 9 survive, their earlier ones replaced; 9 is the last found there.
    emitted.add("EVENTS", "IN", 3, "svc:IN:3:0", superseding=False)
    emitted.add("EVENTS", "IN", 7, "svc:IN:7:0", superseding=False)
    emitted.add("VIEWS", "IN", 5, "svc:IN:5:1", superseding=True)
    emitted.add("VIEWS", "IN", 9, "svc:IN:9:0", superseding=True)
    emitted.add("EVENTS", "OTHER", 2, "svc:OTHER:2:0", superseding=False)
    return emitted


def test_rel1_replaced_outputs_count_as_emitted_up_to_the_high_water_mark_of_their_stream() -> None:
    emitted = _scanned()
    assert [seq for seq in range(1, 12) if emitted.held("VIEWS", "IN", seq) is True] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [seq for seq in range(1, 12) if emitted.held("EVENTS", "IN", seq) is True] == [3]
    # Built only where every output stream holds them all: 3 (its event and its view).
    assert [seq for seq in range(1, 12) if ("IN", seq) in emitted] == [3]
    assert [seq for seq in range(1, 12) if emitted.touched("IN", seq)] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert ("OTHER", 1) not in emitted and not emitted.touched("OTHER", 1) and not emitted.touched("OTHER", 3)


def test_rel1_the_last_input_found_on_a_stream_is_refolded_with_what_it_stored_there() -> None:
    emitted = _scanned()
    assert emitted.held("VIEWS", "IN", 9) == {"svc:IN:9:0"} and emitted.held("EVENTS", "IN", 9) is False
    assert emitted.held("EVENTS", "IN", 7) == {"svc:IN:7:0"} and emitted.held("VIEWS", "IN", 7) is True
    assert emitted.held("EVENTS", "OTHER", 2) == {"svc:OTHER:2:0"}
    # Input 9 emitted a view, an event and a second view: the first view is found, so the
    # event (another stream, nothing of 9 there) and the second view are written again.
    outputs = [("VIEWS", "svc:IN:9:0"), ("EVENTS", "svc:IN:9:1"), ("VIEWS", "svc:IN:9:2")]
    assert emitted.stored("IN", 9, outputs) == {0}
    # Input 7: every view stored (below the high-water mark), the event found.
    assert emitted.stored("IN", 7, [("EVENTS", "svc:IN:7:0"), ("VIEWS", "svc:IN:7:1")]) == {0, 1}
    # An output no stream takes is never found.
    assert emitted.stored("IN", 7, [(None, "svc:IN:7:0")]) == set()


def test_rel1_refolding_past_everything_found_leaves_nothing() -> None:
    emitted = _scanned()
    for seq in range(1, 10):
        emitted.passed("IN", seq)
    emitted.passed("OTHER", 2)
    assert not emitted


def test_rel1_a_snapshot_position_drops_what_lies_behind_it() -> None:
    kept = _scanned().behind({"IN": 9, "OTHER": 1})
    assert kept.inputs == {"EVENTS": {("OTHER", 2)}} and kept.through == {} and set(kept.last) == {("EVENTS", "OTHER")}
    assert not _scanned().behind({"IN": 9, "OTHER": 2})


def test_rel1_every_healthplane_stream_is_read_as_one_that_may_drop_records() -> None:
    """Replaced records (latest per subject) and aged-out ones (commands and directives keep 7
    days, events 90) are gone from the streams; a restart must not take their inputs for
    never emitted and issue an old command again."""
    assert all(drops_records(stream.config(replicas=1)) for stream in STREAMS)
    assert drops_records(StreamConfig(max_age=7 * 86400.0))
    assert drops_records(StreamConfig(max_msgs_per_subject=1))
    assert drops_records(StreamConfig(max_bytes=1 << 30))
    assert not drops_records(StreamConfig(max_msgs_per_subject=-1, max_age=0, max_msgs=-1, max_bytes=-1))
    assert not drops_records(StreamConfig())


# ---------------------------------------------------------------- any cut, any interleaving

@dataclass(frozen=True)
class _Out:
    """One output of the model fold: its input, place among that input's outputs, stream,
    subject and id (the Processor's message_id)."""

    stream: str
    seq: int
    index: int
    output: str
    subject: int

    @property
    def msg_id(self) -> str:
        return f"svc:{self.stream}:{self.seq}:{self.index}"


@st.composite
def _lives(draw: st.DrawFn) -> tuple[dict[str, bool], list[tuple[str, int]], list[list[_Out]], dict[str, int],
                                     dict[str, int], list[tuple[str, int]]]:
    """A life of a producer with two input streams and up to three output streams (each
    keeping every record or only the latest per subject), killed at any per-stream prefix of
    its outputs; and the order its next life refolds in."""
    superseding = {name: draw(st.booleans()) for name in ("EVENTS", "VIEWS", "COMMANDS")[:draw(st.integers(1, 3))]}
    outputs = list(superseding)
    counts = {"IN": draw(st.integers(0, 12)), "OTHER": draw(st.integers(0, 6))}

    def interleaving() -> list[tuple[str, int]]:
        streams = ["IN"] * counts["IN"] + ["OTHER"] * counts["OTHER"]
        order = draw(st.permutations(streams))
        seen = {"IN": 0, "OTHER": 0}
        folded = []
        for stream in order:
            seen[stream] += 1
            folded.append((stream, seen[stream] * 2))  # an input stream's sequences, not consecutive
        return folded

    folded = interleaving()
    # What the fold emits for each input, in order: any mix of streams, subjects shared
    # between inputs of an input stream (a node's view replaced by a later one) and within
    # one input. (Not between input streams: see EmittedBefore's "Not covered".)
    emits = [[_Out(stream, seq, index, outputs[o], subject) for index, (o, subject) in enumerate(draw(st.lists(
        st.tuples(st.integers(0, len(outputs) - 1), st.integers(0, 3)), max_size=4)))] for stream, seq in folded]
    per_stream = {name: sum(1 for outs in emits for out in outs if out.output == name) for name in outputs}
    cut = {name: draw(st.integers(0, per_stream[name])) for name in outputs}
    # The snapshot's positions: a prefix of the inputs every output of which was stored.
    written = dict.fromkeys(outputs, 0)
    complete = 0
    for outs in emits:
        for out in outs:
            written[out.output] += 1
        if any(written[name] > cut[name] for name in outputs):
            break
        complete += 1
    snapshot = draw(st.integers(0, complete))
    positions = {stream: max((seq for s, seq in folded[:snapshot] if s == stream), default=0) for stream in counts}
    refold = [(stream, seq) for stream, seq in interleaving() if seq > positions[stream]]
    return superseding, folded, emits, cut, positions, refold


@settings(max_examples=500, deadline=None)
@given(_lives())
def test_rel1_ha6_a_refold_after_any_per_stream_cut_emits_exactly_what_is_missing(
        life: tuple[dict[str, bool], list[tuple[str, int]], list[list[_Out]], dict[str, int], dict[str, int],
                    list[tuple[str, int]]]) -> None:
    # HA-6: whatever the interleaving of outputs over streams and wherever each stream's write
    # was cut, the restart's scan (per output stream) and refold emit, on every stream,
    # exactly the outputs it lacks, in order: nothing lost, nothing twice.
    superseding, folded, emits, cut, positions, refold = life
    outputs = tuple(superseding)
    sequence = {name: [out for outs in emits for out in outs if out.output == name] for name in outputs}
    stored = {name: sequence[name][:cut[name]] for name in outputs}

    emitted = EmittedBefore(outputs)
    for name in outputs:  # the scan: what each stream still holds, in stream order
        kept = stored[name]
        if superseding[name]:  # only the latest record of each subject is left
            latest = {(out.stream, out.subject): place for place, out in enumerate(kept)}
            kept = [out for place, out in enumerate(kept) if latest[(out.stream, out.subject)] == place]
        for out in kept:
            emitted.add(name, out.stream, out.seq, out.msg_id, superseding=superseding[name])
    emitted = emitted.behind(positions)

    by_input = {(stream, seq): outs for (stream, seq), outs in zip(folded, emits, strict=True)}
    again: dict[str, list[_Out]] = {name: [] for name in outputs}
    for stream, seq in refold:  # the Processor's _handle
        outs = by_input[(stream, seq)]
        if emitted and (stream, seq) in emitted:
            emitted.passed(stream, seq)
            continue  # not even built
        skip: set[int] = set()
        if emitted and emitted.touched(stream, seq):
            skip = emitted.stored(stream, seq, [(out.output, out.msg_id) for out in outs])
            emitted.passed(stream, seq)
        for out in outs:
            if out.index not in skip:
                again[out.output].append(out)

    for name in outputs:
        # Every output once; each input stream's in its order (the refold may interleave the
        # input streams otherwise than the life before it did, as any replay may).
        written = stored[name] + again[name]
        assert sorted(out.msg_id for out in written) == sorted(out.msg_id for out in sequence[name]), name
        assert len({out.msg_id for out in written}) == len(written), name
        for stream in ("IN", "OTHER"):
            assert [out for out in written if out.stream == stream] == [
                out for out in sequence[name] if out.stream == stream], (name, stream)
    assert not emitted  # every input found was refolded and passed
