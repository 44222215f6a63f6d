"""The event-sourced service loop: snapshot, replay, fold, emit exactly once, ack.

A service supplies a :class:`Core` — ``initial_state()`` and a pure
``step(state, inbound) -> (state, emits)`` — and this module does the rest:

1. **Start.** Load the latest snapshot (``HP_SNAPSHOTS``, one subject per service and
   partition); with none, start from the initial state at sequence 0.
2. **Already emitted.** Read the headers of every output stream past the positions the
   snapshot recorded and collect the causations this producer already wrote; from a stream
   with limits (which may have dropped replaced or aged-out records), the latest input seen
   there covers every input before it (:class:`EmittedBefore`).
3. **Consume.** One consumer per input starts right after the snapshot's position; replay and
   live processing are the same path, so the state after a restart equals a full replay.
4. **Emit.** Each output carries ``Hp-Producer``, ``Hp-Causation`` (input stream and sequence)
   and a deterministic ``Nats-Msg-Id``. Outputs of inputs already reflected in the streams are
   not emitted again (REL-1), whatever the de-duplication window says. A batch's outputs go
   out as one write and their acks are read together (``Publisher.store_all``), in order
   within each output stream (a lease holder's on a cluster: one atomic batch per stream,
   ``Processor._store``).
5. **Ack.** Inputs are acked only after every output of their batch is stored (the batch's
   acks, too, go out as one write).
6. **Snapshot** every ``snapshot_every`` inputs or seconds, and on a clean stop; never so
   often that taking them costs more than ``SNAPSHOT_DUTY`` of the time (a snapshot encodes
   the whole state: at 100,000 nodes that is a few tenths of a second, docs/benchmarks.md).

**What cannot be processed is set aside, never retried forever and never lost**
(``runtime.deadletters``): a malformed input (the core raised :class:`Reject` or a decode
error, before changing the state), an input on which the core raised anything else, and an
input one of whose outputs JetStream refuses for good (``PublishError.permanent``, or a
subject none of the output streams takes) is written to ``HP_DEAD_LETTERS`` with the error,
counted and logged, and acked. A core that raised, or a fold whose outputs cannot be stored,
may have left the state half-changed, so the processor then rebuilds in place: it reloads
the snapshot and replays, passing over every input it dead-lettered, exactly as a restart
would. Transient errors (no ack in time, a stream leader moving) are retried.

**An output may wait** (``Emit.may_wait``: a record a bucket at its byte cap refuses, BRG-2):
refused by the server, it is not a dead letter and does not hold up the batch. Its input is
nak'd with a growing delay (``WAIT_REDELIVERY``) and folded again when it comes back, the
core's step being idempotent for such inputs; ``on_wait`` is told of each refusal (the bridge
counts and logs them). A snapshot records positions below the oldest waiting input, so a
restart folds it again; one whose stream already shows a later input's output takes it as
passed (``EmittedBefore``): the latest value on its subject comes with the next input.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar, cast

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import APIError

from healthplane.contracts import streams, subjects, wire
from healthplane.contracts.config import ConfigError
from healthplane.runtime import (
    configstore,
    consumers,
    converge,
    deadletters,
    fencing,
    heap,
    lease,
    metrics,
    snapshots,
    telemetry,
)
from healthplane.runtime.backoff import Backoff
from healthplane.runtime.fold import (
    Core,
    Emit,
    IdentityMismatch,
    Inbound,
    Input,
    Note,
    Reject,
    Step,
    TickingCore,
)
from healthplane.runtime.publish import Ack, Outbound, Publisher, PublishError, Run
from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.runtime.replay import StoredMsg, read_all

S = TypeVar("S")

PRODUCER_HEADER = "Hp-Producer"
CAUSATION_HEADER = "Hp-Causation"
MSG_ID_HEADER = "Nats-Msg-Id"


FENCE_MARKS = streams.FENCE_PREFIX + "."
CLUSTER_ACK_TIMEOUT_S = 3.0  # an R3 stream elects a new leader in 4-9 s: a few tries meanwhile
FENCE_POLL_S = 0.1  # how often a holder waiting on its closed fence looks again
# A fold is caught up with a stream when nothing is pending, or when what it folds was stored
# this recently: under a fleet's steady flow something is always pending, and a service that
# called that "replaying" would flap its /readyz and skip its ticks (heartbeat deadlines).
CAUGHT_UP_WITHIN_NS = 5 * 10**9
# At most this share of the time goes to periodic snapshots: one taking 0.3 s (a 100,000-node
# state) waits 6 s for the next, so a restart replays at most 1/SNAPSHOT_DUTY snapshot-times
# of inputs beyond snapshot_every_inputs / snapshot_every_s.
SNAPSHOT_DUTY = 0.05
# A caught-up input waits this long to gather a batch: a fleet's reports arrive a few at a
# time, and each batch costs a write, its acks and a settlement (docs/benchmarks.md, "Fleet").
LINGER_S = 0.02
# An input whose output waits (``Emit.may_wait``) comes back after 2 s, then 4, 8 … up to a
# minute (±20 %): a bucket full at 100,000 nodes would otherwise redeliver tens of thousands
# of inputs every 2 s.
WAIT_REDELIVERY = Backoff(2.0, 60.0, jitter=0.2)


class LeaseLost(Exception):
    """The fence closed (``fence`` answered ``None``): this replica may no longer write, so the
    processor stops without writing anything more, snapshot included."""


class _Rebuild(Exception):
    """The state may be half-changed (a core raised, an output was refused for good): rebuild
    it from the snapshot and a replay that passes over the dead-lettered inputs."""


def tell(service: str, log: Any, notes: Sequence[Note], **where: object) -> None:
    """Log and count what a core noted, once, on live state (never in a replay)."""
    for note in notes:
        if note.counter is not None:
            metrics.FOLD_NOTES.labels(service, note.counter).inc()
        if log is not None:
            getattr(log, note.level)(note.event, **where, **note.fields)


def message_id(producer: str, stream: str, seq: int, index: int) -> str:
    return f"{producer}:{stream}:{seq}:{index}"


class EmittedBefore:
    """The inputs whose outputs a restart found already in the output streams (REL-1): those
    are refolded without emitting again. Read per output stream.

    Outputs are stored in input order within each output stream, and an input is acked only
    after all its outputs are stored. A lease holder on a cluster writes a batch's records as
    one atomic batch per output stream, the streams' batches in flight together
    (``Processor._store``), so a crash leaves each output stream a prefix of *its* records,
    not of all of them: an input may have its SCORE_CHANGED stored and not its view. So what
    is known is known per output stream (and input stream):

    An output stream that keeps every record shows each input's outputs there (``inputs``).
    One with a limit may have dropped some: those that later ones replaced (the latest
    assessment, the latest view of a node) or that aged out (the 7-day commands and
    directives, the 90-day events), so what it shows is a high-water mark: every input of
    that input stream up to the latest one seen there (``through``) had its outputs there
    stored. Re-emitting a replaced output would put an older record back on top of its
    subject (a node's latest assessment gone stale); re-emitting an aged-out one would
    replay an old command or directive after a restart without a snapshot.

    A crash can cut a stream's write short (a batch longer than the server's largest is
    several, in order; a single server's records go plain): the stream then holds a prefix,
    and the one input whose outputs there straddle the cut is the latest input found there.
    That input (``last``, with the ids of its outputs found there) has the outputs after the
    last one found emitted on that stream.

    On a refold an input's outputs are built unless every output stream holds them all
    (``in``), and each one found already stored is dropped (``stored``); its notes are told
    only when no output stream holds any of its outputs (``touched``: a life before this one
    got as far as writing, so it told them).

    Not covered: a record the server refused while later records of the same stream were
    stored (an output waiting, ``Emit.may_wait``, on a stream with limits), when the
    process dies before the retry that follows stores it; the input is then taken as
    emitted there. And a producer none of whose outputs is left in a stream (all aged out)
    has no mark there: a restart without a snapshot then emits again what its old inputs
    caused there. Nor an output replaced by one that an input of another input stream caused
    (a node's view from an assessment, replaced by its view from a resource report) when no
    later input of the first stream left an output there: the high-water marks are per input
    stream, so that output is written again on the refold, on top, until the node's next
    input (as before HA-6; tests/unit/test_emitted_before.py keeps subjects per input stream).
    """

    def __init__(self, outputs: Sequence[str]) -> None:
        self.outputs = tuple(outputs)
        self.inputs: dict[str, set[tuple[str, int]]] = {}  # by output stream: inputs found
        self.through: dict[tuple[str, str], int] = {}  # by output and input stream
        self.last: dict[tuple[str, str], tuple[int, set[str]]] = {}  # by output and input stream

    def add(self, output: str, stream: str, seq: int, msg_id: str, *, superseding: bool) -> None:
        """An output of input ``seq`` of ``stream``, found on ``output``."""
        key = (output, stream)
        if superseding:
            if seq > self.through.get(key, 0):
                self.through[key] = seq
        else:
            self.inputs.setdefault(output, set()).add((stream, seq))
        last_seq, ids = self.last.get(key, (0, set()))
        if seq > last_seq:
            self.last[key] = (seq, {msg_id})
        elif seq == last_seq:
            ids.add(msg_id)

    def __bool__(self) -> bool:
        return bool(self.inputs) or bool(self.through) or bool(self.last)

    def held(self, output: str, stream: str, seq: int) -> bool | set[str]:
        """What ``output`` holds of this input's outputs: True, every one; the ids found when it
        is the last input found there (a cut write may have stored only some); False, none
        found (none stored, or none emitted there)."""
        key = (output, stream)
        last = self.last.get(key)
        if last is not None and last[0] == seq:
            return last[1]
        if seq <= self.through.get(key, 0):
            return True
        found = self.inputs.get(output)
        return found is not None and (stream, seq) in found

    def __contains__(self, key: tuple[str, int]) -> bool:
        """Every output of this input is stored, on every output stream: it need not be built."""
        stream, seq = key
        return all(self.held(output, stream, seq) is True for output in self.outputs)

    def touched(self, stream: str, seq: int) -> bool:
        """Some output stream holds some of this input's outputs."""
        return any(self.held(output, stream, seq) is not False for output in self.outputs)

    def stored(self, stream: str, seq: int, outputs: Sequence[tuple[str | None, str]]) -> set[int]:
        """Which of this input's outputs (each its output stream, None where none takes it,
        and its message id), by place, are stored already: on a stream that holds them all,
        each; on one where it is the last input found, each up to the last one found there
        (those before it were stored, or replaced by later ones on their subjects)."""
        places: dict[str, list[int]] = {}
        for place, (output, _) in enumerate(outputs):
            if output is not None:
                places.setdefault(output, []).append(place)
        stored: set[int] = set()
        for output, on_output in places.items():
            held = self.held(output, stream, seq)
            if held is True:
                stored.update(on_output)
            elif held:
                found = [place for place in on_output if outputs[place][1] in held]
                if found:
                    stored.update(place for place in on_output if place <= found[-1])
        return stored

    def behind(self, positions: dict[str, int]) -> EmittedBefore:
        """Only what lies past ``positions`` (a restored snapshot's), which is all a refold
        will ask about."""
        kept = EmittedBefore(self.outputs)
        for output, found in self.inputs.items():
            past = {(stream, seq) for stream, seq in found if seq > positions.get(stream, 0)}
            if past:
                kept.inputs[output] = past
        kept.through = {key: seq for key, seq in self.through.items() if seq > positions.get(key[1], 0)}
        kept.last = {key: last for key, last in self.last.items() if last[0] > positions.get(key[1], 0)}
        return kept

    def passed(self, stream: str, seq: int) -> None:
        """The fold has refolded this input: forget what is behind it."""
        for output in self.outputs:
            found = self.inputs.get(output)
            if found is not None:
                found.discard((stream, seq))
                if not found:
                    del self.inputs[output]
            key = (output, stream)
            if seq >= self.through.get(key, seq + 1):
                del self.through[key]
            if seq >= self.last.get(key, (seq + 1, None))[0]:
                del self.last[key]


def drops_records(config: StreamConfig) -> bool:
    """Whether a stream may have dropped records a producer stored: any limit (records per
    subject, age, count, bytes) does. Its outputs are then read as a high-water mark."""
    return any((limit or 0) > 0 for limit in (
        config.max_msgs_per_subject, config.max_age, config.max_msgs, config.max_bytes))


@dataclass(frozen=True, slots=True)
class _Taken:
    """A snapshot taken and not yet stored: the state's JSON and where the fold stood."""

    started: float  # time.monotonic()
    taken_at: datetime
    positions: dict[str, int]
    outputs: dict[str, int]
    lease_revisions: dict[str, int]
    state_json: bytes
    headers: dict[str, str] | None  # a lease holder's fence on the snapshot stream


@dataclass(frozen=True, slots=True)
class Handoff:
    """Where the previous layout of a partitioned service stood (HA-4): ``positions`` per
    partition of ``partitions``. An input it had folded has its outputs in the streams
    already; which partition folded it follows from the slot its subject carries, and an
    input every partition reads (the config) was folded by all of them."""

    partitions: int
    positions: dict[int, dict[str, int]]

    def folded(self, stream: str, seq: int, subject: str) -> bool:
        slot = subject.rpartition(".")[2]
        definition = streams.STREAMS_BY_NAME.get(stream)
        if self.partitions > 1 and slot.isdigit() and definition is not None and definition.slotted:
            return seq <= self.positions.get(int(slot) % self.partitions, {}).get(stream, 0)
        return seq <= min((p.get(stream, 0) for p in self.positions.values()), default=0)


def _cause_of(record: Outbound, inputs: dict[tuple[str, int], Delivery]) -> Delivery | None:
    """The input of this batch an output was emitted for (its ``Hp-Causation``); None for a
    tick's output, which has none."""
    cause_stream, _, cause_seq = (record[2] or {}).get(CAUSATION_HEADER, "").rpartition(":")
    return inputs.get((cause_stream, int(cause_seq))) if cause_seq.isdigit() else None


def _tick_headers(emit: Emit, producer: str) -> dict[str, str]:
    """A tick's record has no causation; its id is the one the core chose (if any)."""
    headers = {PRODUCER_HEADER: producer, **emit.headers}
    if emit.msg_id:
        headers[MSG_ID_HEADER] = emit.msg_id
    return headers


class Processor(Generic[S]):
    def __init__(
        self,
        *,
        nc: NATS,
        js: JetStreamContext,
        service: str,
        core: Core[S],
        state_type: type[S],
        inputs: Sequence[Input],
        outputs: Sequence[str],
        partition: int = 0,
        partitions: int = 1,
        batch: int = 256,
        snapshot_every_inputs: int = 50_000,
        snapshot_every_s: float = 10.0,
        log: Any = None,
        fence: Callable[[], int | None] | None = None,
    ) -> None:
        self._nc, self._js = nc, js
        self.service, self.partition, self.partitions = service, partition, partitions
        self.label = subjects.partition_label(partition, partitions)
        self.producer = f"{service}.{self.label}"
        # HA-4: the node slots this partition folds; None is every node (one partition).
        self.slots = streams.slots_of(partition, partitions) if partitions > 1 else None
        # Where the layout before this one stood, when this one starts without a snapshot.
        self._handoff: Handoff | None = None
        self._core = core
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        self._batch = batch
        self._snapshot_every_inputs = snapshot_every_inputs
        self._snapshot_every_s = snapshot_every_s
        self._log = log
        self._lock = asyncio.Lock()
        self._publisher = Publisher(nc)
        self._loops: list[PullLoop] = []
        self.state: S = core.initial_state()
        self.positions: dict[str, int] = {}
        self._already_emitted = EmittedBefore(self._outputs)
        self._since_snapshot = 0
        self._last_snapshot_at = time.monotonic()
        self._snapshot_took_s = 0.0  # the last snapshot's wall time: what the next one may cost
        self._writing: asyncio.Task[None] | None = None  # a periodic snapshot being stored
        self._state_decoder = msgspec.json.Decoder(state_type)
        self._stopping = asyncio.Event()
        self._caught_up: dict[str, bool] = {}
        self.tick_every_s = 1.0
        self._dead: set[tuple[str, int]] = set()
        self._output_subjects: list[tuple[str, str]] = []  # each output stream's subjects: (subject, stream)
        self._rebuilding = False
        self._stopping_requested = False
        self.rebuilds = 0
        # A replica behind a lease: asked before every write, stamped on every output, and
        # bound by the server to this holder's marks (runtime.fencing).
        self._fence = fence
        self._marks: fencing.Marks | None = None
        self._superseded = False  # the server refused a write: a newer holder writes now
        self._replicated_outputs: frozenset[str] = frozenset()  # output streams kept on several servers
        self._lease_revisions: dict[str, int] = {}
        self._aside = deadletters.SetAside(nc, self._publisher, service, self.producer, log,
                                          before_write=self._write_allowed)
        # Inputs whose output waits (``Emit.may_wait``): nak'd, folded again when they return.
        self._waiting: set[tuple[str, int]] = set()
        self.on_wait: Callable[[Outbound, PublishError], None] | None = None
        # INT-4: what the fold calls per input. With OpenTelemetry export on, the core's step
        # inside a span per input whose outputs carry its traceparent, and each write followed
        # by the node events it stored as OTLP logs; off, the core's step and nothing else.
        self._step: Callable[[S, Inbound], Step[S]] = core.step
        exporting = telemetry.active
        if exporting is not None:
            self._step = exporting.traced_step(service, core.step)
            self._store = exporting.logging_store(self._store)  # type: ignore[method-assign,assignment]

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        if self.slots is not None:
            await self._check_slotted()
        if self._fence is not None:
            await self._claim_marks()
        await self._restore()
        self._dead = await deadletters.skipped_inputs(self._nc, self._js, self.service, self.producer)
        infos = [await self._js.stream_info(stream) for stream in self._outputs]
        self._output_subjects = [(subject, stream) for stream, info in zip(self._outputs, infos, strict=True)
                                 for subject in info.config.subjects or []]
        # On a cluster a batch waits for another of its stream (Publisher.store_runs).
        self._replicated_outputs = frozenset(stream for stream, info in zip(self._outputs, infos, strict=True)
                                             if (info.config.num_replicas or 1) > 1)
        if self._replicated_outputs:
            # A write an R3 stream's leader took with it when its member died is never
            # answered: retried sooner (by its ids, so never stored twice), the holder resumes
            # with the new leader instead of at a single server's ack timeout.
            self._publisher.ack_timeout_s = CLUSTER_ACK_TIMEOUT_S
        self._already_emitted = (await self._scan_emitted(self._snapshot_outputs)).behind(self.positions)
        self._start_seq = {spec.stream: (await self._js.stream_info(spec.stream)).state.last_seq
                           for spec in self._inputs if not spec.after_others}
        for spec in self._inputs:
            name = self._consumer_name(spec)
            await self._create_consumer(spec)
            info = await self._js.consumer_info(spec.stream, name)
            self._caught_up[spec.stream] = info.num_pending == 0
            loop = PullLoop(
                self._nc, spec.stream, name, self._handle, service=self.service,
                batch=self._batch, log=self._log, linger_s=LINGER_S,
                recreate=lambda spec=spec: self._create_consumer(spec),  # type: ignore[misc]
            )
            self._loops.append(loop)
        heap.settle()
        if heap.NOT_TRIMMED is not None and self._log is not None:
            self._log.warning("freed memory is not returned to the system: RSS stays at its high-water mark",
                              reason=heap.NOT_TRIMMED)

    async def _check_slotted(self) -> None:
        """A partition of an install without slots would fold nothing, silently: refuse."""
        for spec in self._inputs:
            definition = streams.STREAMS_BY_NAME.get(spec.stream)
            if definition is not None and definition.slotted is not None:
                info = await self._js.stream_info(spec.stream)
                if info.config.subject_transform is None:
                    raise converge.StreamConflict(
                        f"{self.service} cannot run as partition {self.partition} of {self.partitions}: stream "
                        f"{spec.stream} has no partition slots (partitions are chosen at install: up --partitions, "
                        f"docs/operations.md \"Partitions\")")

    async def _claim_marks(self) -> None:
        revision = self._fence() if self._fence is not None else None
        if revision is None:
            raise LeaseLost
        marks = fencing.Marks(self._js, self.service, self.label, lease.instance_name(),
                              [*self._outputs, snapshots.STREAM])
        try:
            await marks.claim(revision)
        except fencing.Superseded as exc:
            if self._log is not None:
                self._log.warning("a newer lease holder writes: not taking over", reason=str(exc))
            raise LeaseLost from exc
        self._marks = marks

    async def _store(self, records: list[Outbound]) -> list[Ack]:
        """Store ``records``, bound to this holder's marks (runtime.fencing) behind a lease.

        On a stream kept on several servers a write with an expectation on the holder's mark
        waits for the one before it on that mark (the cluster serialises them), so each
        stream's records go as one atomic batch (cut at the server's largest), in emit order,
        the expectation on its first record, and the batches of different streams in flight
        together: one write per call, whatever the number of streams and however they
        alternate (the scorer's SCORE_CHANGED and view of each assessment). What a kill then
        leaves stored is, per output stream, a prefix of that stream's records, which the
        restart's scan of its own outputs reads per stream (``EmittedBefore``).

        On a single server's stream every record carries the expectation and goes plain, in
        emit order: it checks expectations in order, record by record, for a few µs each,
        while an atomic batch there costs 3.4 ms however small (it is staged in a file store of
        its own, created and deleted on disk; docs/benchmarks.md). The acks come back in the
        order of the records given; a PublishError's index names one of them."""
        marks = self._marks
        if marks is None or not records:
            return await self._publisher.store_all(records)
        plain: list[int] = []
        sent = list(records)
        batched: dict[str, list[int]] = {}  # by stream, in emit order
        for index, record in enumerate(records):
            stream = marks.stream_of(record[0])
            first = marks.headers(stream) if stream is not None else None
            if first is None or stream is None:
                plain.append(index)
            elif stream in self._replicated_outputs:
                batched.setdefault(stream, []).append(index)
            else:
                sent[index] = (record[0], record[1], {**(record[2] or {}), **first})
                plain.append(index)
        if not batched:
            return await self._publisher.store_all(sent)
        runs: list[Run] = [([sent[index] for index in plain], None, None)] if plain else []
        runs += [([sent[index] for index in indices], marks.headers(stream), stream)
                 for stream, indices in batched.items()]
        order = plain + [index for indices in batched.values() for index in indices]
        try:
            acks = await self._publisher.store_runs(runs, one_per_stream=True)
        except PublishError as exc:
            if exc.index is not None and exc.index < len(order):
                exc.index = order[exc.index]
            raise
        in_order: list[Ack | None] = [None] * len(records)
        for index, ack in zip(order, acks, strict=True):
            in_order[index] = ack
        return [ack for ack in in_order if ack is not None]

    async def run(self) -> None:
        """Process until :meth:`stop`; then snapshot and return."""
        try:
            while await self._run_until_stopped_or_rebuilt():
                await self._rebuild()
        except BaseException:
            if self._writing is not None:
                self._writing.cancel()  # its manifest unwritten, the snapshot in force stands
            raise
        if self._nc.is_connected:
            await self.snapshot()
        else:  # a bus that is gone takes no snapshot: the stop need not wait on it, and the
            # restart refolds from the last one stored, as after a crash (REL-1)
            if self._writing is not None:
                self._writing.cancel()
            if self._log is not None:
                self._log.warning("stopping without a snapshot: not connected to the bus")
        gc.unfreeze()  # what start() set aside may be collected again (a test process goes on)

    async def _rebuild(self) -> None:
        await self._snapshot_stored()  # stored before the state it was taken from is set aside
        self.rebuilds += 1
        if self._log is not None:
            self._log.warning("rebuilding the state from the snapshot, without the dead-lettered inputs",
                              dead_letters=len(self._dead))
        self._loops = []
        self.state, self.positions, self._lease_revisions = self._core.initial_state(), {}, {}
        self._waiting.clear()  # the snapshot's positions lie below them: the replay folds them again
        await self.start()
        self._rebuilding = False

    async def _run_until_stopped_or_rebuilt(self) -> bool:
        """True when the loops stopped for a rebuild, False on :meth:`stop`."""
        later = [loop for loop, spec in zip(self._loops, self._inputs, strict=True) if spec.after_others]
        config = [loop for loop, spec in zip(self._loops, self._inputs, strict=True)
                  if spec.stream == configstore.STREAM and not spec.after_others]
        rest = [loop for loop in self._loops if loop not in later and loop not in config]
        # Each of these returns once its loops have drained after stop(). The config is folded
        # first: a restart's replay would otherwise decide on a node's input under the default
        # config when that input's consumer delivers before the config's (seen: a cordon
        # recommended instead of acted on).
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(loop.run()) for loop in config]
        if rest:
            tasks.append(asyncio.create_task(self._start_after([configstore.STREAM] if config else [], rest)))
        if later:
            tasks.append(asyncio.create_task(self._start_after_others(later)))
        ticking = asyncio.create_task(self._tick_forever()) if hasattr(self._core, "tick") else None
        stop = asyncio.create_task(self._stopping.wait())
        watched = [*tasks, stop] + ([ticking] if ticking else [])
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        self._stopping.set()
        for loop in self._loops:
            loop.stop()
        if ticking is not None:
            ticking.cancel()
        results = await asyncio.gather(*tasks, *([ticking] if ticking else []), return_exceptions=True)
        stop.cancel()
        failures: list[BaseException] = [r for r in results if isinstance(r, BaseException)
                                         and not isinstance(r, asyncio.CancelledError)]
        if any(isinstance(f, _Rebuild) for f in failures) and not self._stopping_requested:
            self._stopping.clear()
            return True
        for failure in failures:
            if not isinstance(failure, _Rebuild):
                raise failure
        return False

    def stop(self) -> None:
        self._stopping_requested = True
        self._stopping.set()

    async def _start_after_others(self, loops: list[PullLoop]) -> None:
        await self._start_after(list(self._start_seq), loops)

    async def _start_after(self, streams_first: list[str], loops: list[PullLoop]) -> None:
        """Run ``loops`` once every stream of ``streams_first`` has been folded up to where it
        stood at start."""
        def folded(stream: str) -> bool:
            return self._caught_up.get(stream, False) or self.positions.get(stream, 0) >= self._start_seq[stream]

        while not all(folded(stream) for stream in streams_first):
            if self._stopping.is_set():
                return
            await asyncio.sleep(0.02)
        await asyncio.gather(*(loop.run() for loop in loops))

    async def _tick_forever(self) -> None:
        tick = cast(TickingCore[S], self._core).tick
        while True:
            await asyncio.sleep(self.tick_every_s)
            if self.caught_up:
                await self.act(tick)

    @property
    def caught_up(self) -> bool:
        """Every input has been folded up to where it stood at start: live decisions may be taken."""
        return all(self._caught_up.values())

    async def act(self, decide: Callable[[S, datetime], Step[S]]) -> bool:
        """One live decision on the folded state, its records stored before the state moves on
        (a tick's path). A service whose decisions need I/O first (the Slurm adapter reads Slurm,
        then decides) calls this itself; ``decide`` is pure and runs under the fold's lock.
        False, and nothing decided, while the state is being rebuilt."""
        async with self._lock:
            if self._rebuilding:
                return False
            state, emits, notes = decide(self.state, datetime.now(UTC))
            await self._emit_all([(e, _tick_headers(e, self.producer)) for e in emits])
            self.state = state
            if notes:  # a live decision's: told once
                self._tell(notes)
            return True

    def _consumer_name(self, spec: Input) -> str:
        return streams.consumer_name(self.service, spec.stream, self.partition)

    async def _create_consumer(self, spec: Input) -> None:
        self._write_allowed()  # the durable is shared by the replicas: only the holder may reset it
        await consumers.ensure(self._js, spec.stream, consumers.durable(
            self._consumer_name(spec), start_seq=self.positions.get(spec.stream, 0) + 1,
            filter_subjects=streams.stored_filters(spec.stream, spec.filter_subjects, self.slots), ack_wait_s=60.0, max_ack_pending=self._batch * 8,
            inactive_threshold_s=3600.0), reset=True)

    # ------------------------------------------------------------------ snapshots

    async def _restore(self) -> None:
        self._snapshot_outputs: dict[str, int] = {}
        self._slot: int | None = None
        self._handoff = await self._previous_layout()
        if self._handoff is not None:
            if self._log is not None:
                self._log.info("partitions changed: replaying where the last layout stood, without its outputs",
                               partition=self.label, previous=self._handoff.partitions)
            return
        try:
            found = await snapshots.load(self._js, self.service, self.partition, self.partitions)
        except snapshots.SnapshotDamaged as exc:
            if self._log is not None:
                self._log.warning("snapshot unusable, replaying from the start", reason=str(exc))
            return
        if found is None:
            return
        manifest, state_json = found
        try:
            self.state = self._state_decoder.decode(state_json)
        except msgspec.DecodeError as exc:
            # Another version's state (an upgrade whose state changed shape without a way to
            # read the old one): starting from the streams beats a crash loop.
            if self._log is not None:
                self._log.warning("snapshot unusable, replaying from the start",
                                  reason=f"its state does not decode as this version's: {exc}")
            self._slot = manifest.slot
            return
        self.positions = dict(manifest.positions)
        self._lease_revisions = dict(manifest.lease_revisions)
        self._snapshot_outputs = dict(manifest.outputs)
        self._slot = manifest.slot
        if self._log is not None:
            self._log.info("snapshot restored", positions=self.positions, taken_at=manifest.taken_at.isoformat(),
                           bytes=manifest.size)

    async def _previous_layout(self) -> Handoff | None:
        """The layout (another P) that ran this service last, when it is newer than this
        partition's own snapshot: this partition then starts empty and replays, taking every
        input the last layout had folded as already emitted (HA-4, changing P)."""
        if self._fence is None and self.partitions == 1:
            return None  # an unreplicated, unpartitioned processor (tests, tools): its own snapshot
        by_layout: dict[int, list[wire.Snapshot]] = {}
        for manifest in await snapshots.manifests(self._nc, self._js, self.service):
            by_layout.setdefault(manifest.partitions, []).append(manifest)
        mine = [m for m in by_layout.pop(self.partitions, []) if m.partition == self.partition]
        newest_mine = max((m.taken_at for m in mine), default=None)
        candidates = [(max(m.taken_at for m in found), p, found) for p, found in by_layout.items()]
        if not candidates:
            return None
        taken_at, partitions, found = max(candidates, key=lambda c: c[0])
        if newest_mine is not None and newest_mine >= taken_at:
            return None
        missing = sorted(set(range(partitions)) - {m.partition for m in found})
        if missing and self._log is not None:
            # A partition of the last layout that never took a snapshot (it died first): its
            # slots' inputs are folded again with their outputs, which may repeat some.
            self._log.warning("the last layout left no snapshot of some partitions", previous=partitions,
                              missing=missing)
        return Handoff(partitions, {m.partition: dict(m.positions) for m in found})

    async def snapshot(self) -> None:
        """Take a snapshot and store it, after the one being written, if any (a clean stop's)."""
        await self._snapshot_stored()
        taken = await self._take_snapshot()
        if taken is not None:
            await self._store_snapshot(taken)

    async def _snapshot_stored(self) -> None:
        """Wait for the snapshot being written; what it failed with is raised here."""
        writing, self._writing = self._writing, None
        if writing is not None:
            await writing

    async def _take_snapshot(self) -> _Taken | None:
        """The state as of ``positions``, encoded under the fold's lock: the only part of a
        snapshot the fold waits for (a 100,000-node state: 0.06 s of 0.3 to 0.5 s in all)."""
        async with self._lock:
            if self._superseded or (self._fence is not None and self._fence() is None):
                return None  # a fenced-off holder must not overwrite the new holder's snapshot
            # A restart's refold that has not yet passed every input it found already emitted:
            # their outputs lie before the streams' ends, so a restart from this snapshot must
            # look for them where this one did (found by tests/component/test_processor.py: a
            # crash after a snapshot taken mid-refold emitted those outputs again).
            self._already_emitted = self._already_emitted.behind(self.positions)
            positions = dict(self.positions)
            for stream, seq in self._waiting:  # a restart folds a waiting input again
                positions[stream] = min(positions[stream], seq - 1)
            if self._already_emitted:
                outputs = dict(self._snapshot_outputs)
            else:
                outputs = {stream: (await self._js.stream_info(stream)).state.last_seq for stream in self._outputs}
            started = time.monotonic()
            self._since_snapshot = 0
            self._last_snapshot_at = started
            return _Taken(
                started=started, taken_at=datetime.now(UTC), positions=positions, outputs=outputs,
                lease_revisions=dict(self._lease_revisions), state_json=msgspec.json.encode(self.state),
                headers=self._marks.headers(snapshots.STREAM) if self._marks is not None else None)

    async def _store_snapshot(self, taken: _Taken) -> None:
        """Compress and store a snapshot taken before, while the fold goes on: its chunks go to
        the slot not in force and its manifest last, so a crash meanwhile leaves the last one."""
        try:
            manifest = await snapshots.save(
                self._js, service=self.service, partition=self.partition, partitions=self.partitions,
                taken_at=taken.taken_at, positions=taken.positions, outputs=taken.outputs,
                state_json=taken.state_json, previous_slot=self._slot, lease_revisions=taken.lease_revisions,
                headers=taken.headers)
        except APIError as exc:
            if taken.headers is not None and exc.err_code == fencing.EXPECTATION_IN_PROCESS:
                # A cluster storing another write with an expectation on the same mark (this
                # holder's own claim, made again as its lease was renewed or retaken): not a
                # verdict. The snapshot in force stands, the next is taken on schedule; a newer
                # holder, if there is one, is found by the next fenced write (10071 there).
                if self._log is not None:
                    self._log.warning("snapshot not stored: the server was storing another write on its mark; "
                                      "the next is taken on schedule", error=str(exc))
                return
            if taken.headers is not None and exc.err_code == fencing.WRONG_LAST_SEQUENCE:
                self._superseded = True
                raise LeaseLost from exc  # a newer holder marked the stream: its snapshot stands
            raise
        self._slot = manifest.slot
        # A fleet's nodes arrive after start: without this every full collection (one is
        # set off by any burst of allocations, a /metrics render's too) walks all of them.
        heap.settle()
        self._snapshot_took_s = time.monotonic() - taken.started
        metrics.SNAPSHOT_SECONDS.labels(self.service, self.label).set(self._snapshot_took_s)
        metrics.SNAPSHOT_BYTES.labels(self.service, self.label).set(manifest.size)

    async def _scan_emitted(self, from_positions: dict[str, int]) -> EmittedBefore:
        emitted = EmittedBefore(self._outputs)
        for stream in self._outputs:
            info = await self._js.stream_info(stream)
            superseding = drops_records(info.config)

            def note(msg: StoredMsg, stream: str = stream, superseding: bool = superseding) -> None:
                headers = msg.headers or {}
                if headers.get(PRODUCER_HEADER) != self.producer:
                    return
                cause_stream, _, cause_seq = headers.get(CAUSATION_HEADER, "").rpartition(":")
                if cause_seq.isdigit():
                    emitted.add(stream, cause_stream, int(cause_seq), headers.get(MSG_ID_HEADER, ""),
                                superseding=superseding)

            await read_all(self._nc, self._js, stream, list(info.config.subjects or []),
                           start_seq=from_positions.get(stream, 0) + 1, sink=note)
        if emitted and self._log is not None:
            self._log.info("outputs already in the streams",
                           inputs={output: len(found) for output, found in emitted.inputs.items()},
                           through={f"{output} {stream}": seq for (output, stream), seq in emitted.through.items()},
                           last={f"{output} {stream}": seq for (output, stream), (seq, _) in emitted.last.items()})
        return emitted

    # ------------------------------------------------------------------ the fold

    async def _handle(self, batch: list[Delivery]) -> None:
        async with self._lock:
            if self._rebuilding:  # another loop's batch set it off: this one is folded after
                for delivery in batch:
                    delivery.nak(0.0)
                return
            emits: list[tuple[Emit, dict[str, str]]] = []
            malformed: list[tuple[Delivery, str]] = []
            state = self.state
            step = self._step
            positions = self.positions
            already_emitted = self._already_emitted
            producer = self.producer
            dead = self._dead
            waiting = self._waiting
            recent_ns = time.time_ns() - CAUGHT_UP_WITHIN_NS
            for delivery in batch:
                stream, seq = delivery.stream, delivery.stream_seq
                caught_up = delivery.pending == 0 or delivery.timestamp_ns >= recent_ns
                self._caught_up[stream] = caught_up
                if seq <= positions.get(stream, 0):
                    if not waiting or (stream, seq) not in waiting:
                        continue  # redelivered after we folded it; the ack was lost
                    # Back after its output waited: folded again, the position where it is.
                    waiting.discard((stream, seq))
                    seq_ahead = positions[stream]
                else:
                    seq_ahead = seq
                if dead and (stream, seq) in dead:
                    positions[stream] = seq_ahead  # set aside before: a replay passes over it
                    continue
                msg = delivery.msg
                if msg.subject.startswith(FENCE_MARKS):  # a holder's mark: no record to fold
                    positions[stream] = seq_ahead
                    continue
                if msg.headers and lease.HEADER in msg.headers and self._fenced_off(stream, msg.headers):
                    positions[stream] = seq_ahead
                    continue
                wants_output = not already_emitted or (stream, seq) not in already_emitted
                if self._handoff is not None and wants_output and self._handoff.folded(stream, seq, msg.subject):
                    wants_output = False
                inbound = Inbound(stream, seq, msg.subject, msg.data, msg.headers or {},  # positional: cheaper
                                  datetime.fromtimestamp(delivery.timestamp_ns / 1e9, UTC), caught_up, wants_output)
                try:
                    state, outputs, notes = step(state, inbound)
                except (Reject, wire.WireError, ConfigError) as exc:  # a record that cannot be folded
                    malformed.append((delivery, str(exc)))
                    if isinstance(exc, IdentityMismatch):  # SEC-7: counted apart from the merely malformed
                        metrics.IDENTITY_MISMATCH.labels(self.service, stream).inc()
                    positions[stream] = seq_ahead
                    continue
                except Exception as exc:
                    # The core may have changed the state halfway: set the input aside and
                    # rebuild (this batch's other inputs are folded again by the replay).
                    await self._dead_letter(delivery, "error", f"{type(exc).__name__}: {exc}")
                    self._rebuilding = True
                    raise _Rebuild from exc
                positions[stream] = seq_ahead
                if not wants_output:
                    if already_emitted:
                        already_emitted.passed(stream, seq)
                    metrics.DUPLICATES_SKIPPED.labels(self.service).inc()
                    continue
                stored: set[int] | None = None
                if already_emitted and already_emitted.touched(stream, seq):
                    # A life before this one wrote some of its outputs (and told its notes):
                    # those are not written again, stream by stream.
                    stored = already_emitted.stored(stream, seq, [
                        (emit.purge_stream or self._output_of(emit.subject),
                         emit.msg_id or message_id(producer, stream, seq, index))
                        for index, emit in enumerate(outputs)])
                    already_emitted.passed(stream, seq)
                    if stored:
                        metrics.DUPLICATES_SKIPPED.labels(self.service).inc(len(stored))
                elif notes:  # live, not a refold of what a life before this one told
                    self._tell(notes, stream=stream, seq=seq)
                if outputs:
                    causation = f"{stream}:{seq}"
                    for index, emit in enumerate(outputs):  # message_id() inlined: every output passes here
                        if stored is None or index not in stored:
                            emits.append((emit, {**emit.headers, CAUSATION_HEADER: causation,
                                                 PRODUCER_HEADER: producer,
                                                 MSG_ID_HEADER: emit.msg_id or f"{producer}:{causation}:{index}"}))
            for delivery, why in malformed:
                self._dead.add((delivery.stream, delivery.stream_seq))
                await self._aside.reject(delivery, why)
            await self._emit_all(emits, {(d.stream, d.stream_seq): d for d in batch})
            self.state = state
            acked = Counter(d.stream for d in batch if d.disposition == "ack")
            for stream, count in acked.items():  # one label lookup per stream and batch
                metrics.MESSAGES_PROCESSED.labels(self.service, stream).inc(count)
            self._since_snapshot += len(batch)
        if self._writing is not None and self._writing.done():
            await self._snapshot_stored()  # raises what it failed with, as a snapshot taken here would
        since = time.monotonic() - self._last_snapshot_at
        if (
            self._writing is None
            and (self._since_snapshot >= self._snapshot_every_inputs or since >= self._snapshot_every_s)
            and since * SNAPSHOT_DUTY >= self._snapshot_took_s
        ):
            taken = await self._take_snapshot()
            if taken is not None:
                self._writing = asyncio.create_task(self._store_snapshot(taken))

    def _tell(self, notes: Sequence[Note], **where: object) -> None:
        tell(self.service, self._log, notes, **where)

    def _fenced_off(self, stream: str, headers: dict[str, str]) -> bool:
        """A record from a lease holder that has been fenced off since: its writer's revision
        is lower than one already folded from the same producer."""
        revision = headers[lease.HEADER]
        if not revision.isdigit():
            return False
        key = f"{stream} {headers.get(PRODUCER_HEADER, '')}"
        if int(revision) < self._lease_revisions.get(key, 0):
            metrics.MESSAGES_REJECTED.labels(self.service, stream, "fenced").inc()
            return True
        self._lease_revisions[key] = int(revision)
        return False

    async def _fence_reopened(self) -> None:
        """While the fence is closed but the lease not lost (renewals unanswered while the bus
        elects a leader), write nothing and wait: the next renewal reopens it, or the lease is
        lost and this processor is stopped."""
        if self._fence is None:
            return
        while self._fence() is None and not self._superseded:
            if self._stopping.is_set():
                raise LeaseLost
            await asyncio.sleep(FENCE_POLL_S)

    def _write_allowed(self) -> str | None:
        """The lease revision to stamp on a write (``None`` when no lease fences this
        processor); raises :class:`LeaseLost` once the fence has closed."""
        if self._fence is None:
            return None
        if self._superseded:
            raise LeaseLost
        revision = self._fence()
        if revision is None:
            raise LeaseLost
        return str(revision)

    def _stored_anywhere(self, subject: str) -> bool:
        return self._output_of(subject) is not None

    def _output_of(self, subject: str) -> str | None:
        """The output stream that stores ``subject``, if any."""
        for pattern, stream in self._output_subjects:
            if subjects.matches(pattern, subject):
                return stream
        return None

    async def _set_aside(self, refused: Outbound, why: str, emits: list[tuple[Emit, dict[str, str]]],
                         inputs: dict[tuple[str, int], Delivery]) -> list[tuple[Emit, dict[str, str]]]:
        """An output JetStream will never store: dead-letter its cause, then rebuild; a tick's
        output (no input behind it) is dead-lettered itself and the rest goes on."""
        subject, payload, headers = refused
        cause = _cause_of(refused, inputs)
        if cause is not None:
            await self._dead_letter(cause, "refused", f"output {subject}: {why}")
            self._rebuilding = True
            raise _Rebuild
        await self._aside.store(deadletters.record(
            service=self.service, producer=self.producer, input_stream="tick", input_seq=int(time.time() * 1000),
            input_subject=subject, payload=payload, reason="refused", error=why,
            max_payload=self._nc.max_payload), "refused", why)
        return [(e, h) for e, h in emits if h is not headers]

    def _waits(self, refused: Outbound, exc: PublishError, inputs: dict[tuple[str, int], Delivery]) -> bool:
        """An output that may wait, refused by the server: its input is nak'd to come back later
        and every output of it is held back (the next fold emits them again); True if so."""
        cause = _cause_of(refused, inputs)
        if cause is None:  # a tick's: no input to wait with
            return False
        cause.nak(WAIT_REDELIVERY.after(cause.delivered))
        self._waiting.add((cause.stream, cause.stream_seq))
        metrics.INPUTS_WAITING.labels(self.service, cause.stream).inc()
        if self.on_wait is not None:
            self.on_wait(refused, exc)
        return True

    async def _dead_letter(self, delivery: Delivery, reason: deadletters.Reason, why: str) -> None:
        self._dead.add((delivery.stream, delivery.stream_seq))
        await self._aside.dead_letter(delivery, reason, why)

    async def _emit_all(self, emits: list[tuple[Emit, dict[str, str]]],
                        inputs: dict[tuple[str, int], Delivery] | None = None) -> None:
        """Store every output, in order, each batch of records as one write with its acks
        awaited together; on a transient failure retry the same records (same ids) until
        stored. An output refused for good sets aside the input that caused it (``inputs``)
        and rebuilds; a tick's is itself set aside and dropped."""
        # At most a second between tries: what fails here is mostly a stream electing its
        # leader (HA-2), which answers again within seconds, and one batch a second is no storm.
        backoff = Backoff(0.2, 1.0)
        while True:
            acks: list[Ack] = []
            records: list[Outbound] = []
            sources: list[Emit] = []  # records' emits, by place
            if emits:
                await self._fence_reopened()
            revision = self._write_allowed() if emits else None
            try:
                if self._marks is not None and emits:
                    await self._marks.renew_if_due()
                for emit, headers in emits:
                    if emit.purge_stream is not None:
                        acks += await self._store(records)  # what came before lands first
                        records, sources = [], []
                        self._write_allowed()
                        await self._js.purge_stream(emit.purge_stream, subject=emit.subject)
                        continue
                    if revision is not None:
                        headers = {**headers, lease.HEADER: revision}
                    records.append((emit.subject, emit.payload, headers))
                    sources.append(emit)
                acks += await self._store(records)
            except fencing.Superseded as exc:
                raise LeaseLost from exc
            except PublishError as exc:
                if self._nc.is_closed:
                    raise
                if self._marks is not None and exc.err_code == fencing.WRONG_LAST_SEQUENCE:
                    # The server refused this holder's write: a newer holder has marked the
                    # stream. Nothing more from this one, not even a snapshot.
                    if self._log is not None:
                        self._log.warning("write refused by the server's fence: a newer lease holder writes")
                    self._superseded = True
                    raise LeaseLost from exc
                refused = records[exc.index] if exc.index is not None and exc.index < len(records) else None
                if refused is not None and exc.err_code is not None and sources[exc.index or 0].may_wait \
                        and self._waits(refused, exc, inputs or {}):
                    cause = (refused[2] or {}).get(CAUSATION_HEADER)
                    emits = [(e, h) for e, h in emits if h.get(CAUSATION_HEADER) != cause]
                    continue
                if refused is not None and (exc.permanent or (exc.code == 503 and not self._stored_anywhere(refused[0]))):
                    emits = await self._set_aside(refused, str(exc), emits, inputs or {})
                    continue
                delay = backoff.next()
                if self._log is not None:
                    self._log.warning("emit failed, retrying", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                continue
            emitted = Counter(ack.stream for ack in acks if not ack.duplicate)
            for stream, count in emitted.items():
                metrics.EMITTED.labels(self.service, stream).inc(count)
            return
