"""``healthplane service scorer``: the Processor behind the service's lease, and the node series.

Replicas are warm standbys (``lifecycle.serve_replicated``, HA-3): only the lease holder
consumes and appends, so SCORE_CHANGED and the node views have one writer and every replica
does not each need a full consumer of its own. A standby takes the lease within its TTL when
the holder dies, then restores the latest snapshot and replays what came after it. A holder
that loses the lease (a partition longer than the TTL, or an event loop frozen past it)
stops before writing anything more, snapshot included, and the server itself refuses any
write it still had queued (``runtime.fencing``). Every output carries the lease revision it
was written under. The node series are the holder's only: a standby serves none.
"""

from __future__ import annotations

import argparse

from healthplane.runtime.lifecycle import run_processor_service
from healthplane_scorer.fold import INPUTS, OUTPUTS, SERVICE, ScorerCore, ScorerState
from healthplane_scorer.metrics import NodeSeries


def main(args: argparse.Namespace) -> int:
    return run_processor_service(args, SERVICE, lambda _: ScorerCore(), ScorerState, INPUTS, OUTPUTS,
                                 series=NodeSeries, partitionable=True)
