"""POL-5 scheduler gating, the one rule every scheduler integration applies (the reference
scheduler and the Slurm adapter): no new work on a node whose score is below its
provisioner definition's ``drainBelow``; never for a node that has not reported.

The thresholds are folded from ``hp.config`` (:func:`thresholds`) into each scheduler's own
state; these functions are pure.
"""

from __future__ import annotations

from healthplane.contracts import wire
from healthplane.contracts.config import decode_config


def thresholds(envelope: wire.ConfigEnvelope) -> tuple[int, dict[str, int]]:
    """``(cluster drainBelow, drainBelow per provisioner definition)`` of one applied config."""
    config = decode_config(envelope)
    return (config.node_health.drain_below,
            {name: config.node_health_for(name).drain_below for name in config.provisioner_definitions})


def drain_below_for(cluster_drain_below: int, by_definition: dict[str, int], definition: str | None) -> int:
    """The threshold is resolved per provisioner definition, else the cluster's."""
    if definition is not None and definition in by_definition:
        return by_definition[definition]
    return cluster_drain_below


def gated(score: int | None, drain_below: int) -> bool:
    """No new placement below ``drainBelow``, in every policy mode; a node that has never
    reported has no score and is not gated."""
    return score is not None and score < drain_below
