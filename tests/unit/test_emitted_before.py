"""What a restart takes as already emitted (REL-1): runtime.processor.EmittedBefore."""

from __future__ import annotations

from nats.js.api import StreamConfig

from healthplane.contracts.streams import STREAMS
from healthplane.runtime.processor import EmittedBefore, drops_records


def _scanned() -> EmittedBefore:
    emitted = EmittedBefore()
    # Events (a stream keeping every record) of inputs 3 and 7; assessments (latest per
    # subject) of inputs 5 and 9 survive, their earlier ones replaced; 9 is the last found.
    emitted.add("IN", 3, "svc:IN:3:0", superseding=False)
    emitted.add("IN", 7, "svc:IN:7:0", superseding=False)
    emitted.add("IN", 5, "svc:IN:5:1", superseding=True)
    emitted.add("IN", 9, "svc:IN:9:0", superseding=True)
    emitted.add("OTHER", 2, "svc:OTHER:2:0", superseding=False)
    return emitted


def test_rel1_replaced_outputs_count_as_emitted_up_to_the_high_water_mark() -> None:
    emitted = _scanned()
    assert [seq for seq in range(1, 12) if ("IN", seq) in emitted] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert ("OTHER", 1) not in emitted and ("OTHER", 3) not in emitted


def test_rel1_the_last_input_found_is_refolded_with_what_it_stored() -> None:
    emitted = _scanned()
    assert ("IN", 9) not in emitted and emitted.stored_of("IN", 9) == {"svc:IN:9:0"}
    assert ("OTHER", 2) not in emitted and emitted.stored_of("OTHER", 2) == {"svc:OTHER:2:0"}
    assert emitted.stored_of("IN", 8) is None


def test_rel1_refolding_past_everything_found_leaves_nothing() -> None:
    emitted = _scanned()
    for seq in range(1, 10):
        emitted.passed("IN", seq)
    emitted.passed("OTHER", 2)
    assert not emitted


def test_rel1_a_snapshot_position_drops_what_lies_behind_it() -> None:
    kept = _scanned().behind({"IN": 9, "OTHER": 1})
    assert kept.inputs == {("OTHER", 2)} and kept.through == {} and set(kept.last) == {"OTHER"}
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
