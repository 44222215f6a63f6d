"""The one backoff every retry loop uses: exponential from ``first_s`` to ``cap_s``, with
optional jitter so that a fleet of clients retrying after one outage does not retry in step.

Pure but for the draw: ``next()`` returns the delay and advances; ``reset()`` after a success.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    first_s: float
    cap_s: float
    factor: float = 2.0
    jitter: float = 0.0  # 0.2: each delay drawn from ±20 % around its nominal value
    draw: Callable[[], float] = field(default=random.random, repr=False)
    _nominal_s: float | None = field(default=None, init=False, repr=False)

    @property
    def current_s(self) -> float:
        """The nominal delay the next call returns (no jitter)."""
        return self.first_s if self._nominal_s is None else self._nominal_s

    def next(self) -> float:
        nominal = self.current_s
        self._nominal_s = min(nominal * self.factor, self.cap_s)
        return self._jittered(nominal)

    def reset(self) -> None:
        self._nominal_s = None

    def after(self, failures: int) -> float:
        """The delay after the ``failures``-th failure in a row, for a retry whose count is
        kept elsewhere (a JetStream delivery's count): leaves this backoff as it was."""
        return self._jittered(min(self.first_s * self.factor ** max(0, failures - 1), self.cap_s))

    def _jittered(self, nominal: float) -> float:
        if not self.jitter:
            return nominal
        return nominal * (1 - self.jitter + 2 * self.jitter * self.draw())
