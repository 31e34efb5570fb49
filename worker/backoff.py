"""Exponential backoff with jitter: 1, 2, 4 ... capped (30 s by default)."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial: float = 1.0, maximum: float = 30.0, jitter: float = 0.2, rng=None):
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self.rng = rng or random.Random()
        self.attempt = 0

    def next_delay(self, at_least: float | None = None) -> float:
        base = min(self.initial * (2 ** self.attempt), self.maximum)
        self.attempt += 1
        delay = base * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        if at_least is not None:
            delay = max(delay, at_least)
        return min(delay, self.maximum * (1 + self.jitter))

    def reset(self) -> None:
        self.attempt = 0
