"""Exponential backoff with jitter: 1, 2, 4 ... capped (30 s by default), for silence; and the
wait a server that did answer asked for (Retry-After), for a refusal that says when."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial: float = 1.0, maximum: float = 30.0, jitter: float = 0.2, rng=None):
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self.rng = rng or random.Random()
        self.attempt = 0

    def next_delay(self, retry_after: float | None = None) -> float:
        """The wait before the next try: what the server said (``retry_after``, from its Retry-After:
        :meth:`as_told`), or when nothing was said, the next step of the exponential series."""
        if retry_after is not None:
            return self.as_told(retry_after)
        base = min(self.initial * (2 ** self.attempt), self.maximum)
        self.attempt += 1
        delay = base * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        return min(delay, self.maximum * (1 + self.jitter))

    def as_told(self, seconds: float) -> float:
        """A live server answered "not now, again in ``seconds``" (503 or 429 with Retry-After): that
        wait, up to ``jitter`` more (a crowd of workers told the same does not come back at once), and
        the exponential series starts over. The series is for silence (a host or a link down), when
        nobody says how long; an arbiter that answers says it, and waiting longer than it asks only
        adds to what an outage costs: through a database failover the arbiter answers 503 with
        Retry-After 1 and leases again within a second of the new primary (docs/decisions.md).
        A server asking for less than ``initial`` (0, say) gets ``initial``: no busy loop."""
        self.attempt = 0
        delay = max(seconds, self.initial) * self.rng.uniform(1, 1 + self.jitter)
        return min(delay, self.maximum * (1 + self.jitter))

    def reset(self) -> None:
        self.attempt = 0
