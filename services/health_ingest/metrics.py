"""health-ingest's own series: ``healthplane_detector_failures_total{detector}``, detector
plug-in calls that raised (the report went on without them, POL-8).

The fold never counts (a replay would count again): it notes a failing plug-in on the input
(``detector_failed:NAME``) and the Processor counts that note in
``healthplane_fold_notes_total{service,note}`` for live inputs only. This series reads those
counts back under their old name, plus the plug-ins that failed to load at start."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from healthplane.runtime import metrics
from healthplane_health_ingest.fold import DETECTOR_FAILED, SERVICE


class DetectorFailures(Collector):
    def __init__(self) -> None:
        self._not_loaded: Counter[str] = Counter()

    def not_loaded(self, detector: str) -> None:
        """A plug-in whose entry point raised on load (main.py, at start: not a fold)."""
        self._not_loaded[detector] += 1

    def collect(self) -> Iterator[CounterMetricFamily]:
        failures: dict[str, float] = dict(self._not_loaded)
        for family in metrics.FOLD_NOTES.collect():
            for sample in family.samples:
                note = sample.labels.get("note", "")
                if (sample.name.endswith("_total") and sample.labels.get("service") == SERVICE
                        and note.startswith(DETECTOR_FAILED)):
                    detector = note.removeprefix(DETECTOR_FAILED)
                    failures[detector] = failures.get(detector, 0.0) + sample.value
        family = CounterMetricFamily("healthplane_detector_failures",
                                     "Detector plug-in calls that raised (the report went on without them)",
                                     labels=["detector"])
        for detector, count in sorted(failures.items()):
            family.add_metric([detector], count)
        yield family
