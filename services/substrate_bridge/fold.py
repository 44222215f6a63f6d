"""The bridge's fold: the Processor core (BRG-1..BRG-3).

Inputs: ``HP_NODE_EVENTS`` filtered to NODE_REGISTERED (the bridge is their one writer: it
reads back what it registered) and then ``HP_RESOURCES``, folded only once the registrations
stored at start are (``after_others``): a restart without a snapshot never registers a node
twice. Outputs: each report, byte for byte, put into the KV bucket ``substrate-nodes`` under
the node's key, after the node's NODE_REGISTERED when it is the first report of the node.

The put may wait (``Emit.may_wait``, BRG-2): a bucket at its byte cap refuses it, and the
report comes back later (the Processor naks it with a growing delay) while other nodes'
reports go on. So a report can be folded twice, and the fold gives the same state for it:
registered nodes are a set, and a node's newest report is a maximum. A report that comes
back after a newer one of its node was folded puts nothing, so a waiting report never
overwrites a newer one in the bucket.

Pure: no I/O, no clock; the decode and the identity check are the codecs' (SEC-7).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from healthplane.contracts import streams, subjects, wire
from healthplane.runtime.fold import Codec, Emit, Inbound, Input, Step, node_record, record_of
from healthplane_substrate_bridge.rules import registration_event

SERVICE: Final = "substrate-bridge"
BUCKET_STREAM: Final = f"KV_{streams.NODES_BUCKET}"
BUCKET_SUBJECT_PREFIX: Final = f"$KV.{streams.NODES_BUCKET}."
INPUTS: Final = (
    Input("HP_NODE_EVENTS", ("hp.event.*.*.NODE_REGISTERED",)),
    Input("HP_RESOURCES", after_others=True),
)
OUTPUTS: Final = ("HP_NODE_EVENTS", BUCKET_STREAM)


class BridgeState(msgspec.Struct, kw_only=True):
    registered: set[str] = set()  # node keys (subjects.kv_node_key) with a NODE_REGISTERED stored
    newest: dict[str, int] = {}   # node key -> HP_RESOURCES sequence of its newest report folded


CODECS: Final[dict[str, Codec]] = {
    "HP_NODE_EVENTS": node_record(wire.NodeEvent),
    "HP_RESOURCES": node_record(wire.ResourceReport),
}


def evolve_report(state: BridgeState, inbound: Inbound, report: wire.ResourceReport) -> Step[BridgeState]:
    key = subjects.kv_node_key(report.cluster, report.node_id)
    newest = state.newest.get(key, 0)
    if inbound.seq < newest:
        return Step(state)  # back after it waited, and a newer report of the node went out since
    state.newest[key] = inbound.seq
    emits: list[Emit] = []
    if key not in state.registered:
        state.registered.add(key)
        if inbound.wants_output:
            event = registration_event(report, inbound.at)
            # The id is the node's: a registration repeated after a crash is de-duplicated.
            emits.append(Emit(subjects.event(report.cluster, report.node_id, "NODE_REGISTERED"),
                              wire.encode(event), msg_id=event.id))
    if inbound.wants_output:
        emits.append(Emit(f"{BUCKET_SUBJECT_PREFIX}{key}", inbound.data, may_wait=True))
    return Step(state, emits)


def evolve_event(state: BridgeState, event: wire.NodeEvent) -> Step[BridgeState]:
    if event.type == "NODE_REGISTERED":
        state.registered.add(subjects.kv_node_key(event.cluster, event.node_id))
    return Step(state)


class BridgeCore:
    def initial_state(self) -> BridgeState:
        return BridgeState()

    def step(self, state: BridgeState, inbound: Inbound) -> Step[BridgeState]:
        record: Any = record_of(CODECS, inbound)
        match record:
            case wire.ResourceReport():
                return evolve_report(state, inbound, record)
            case wire.NodeEvent():
                return evolve_event(state, record)
        return Step(state)
