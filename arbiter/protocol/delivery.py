"""What became of one attempt to deliver a result, and which answers of the arbiter lead to which.

docs/protocol.md, "Every answer and what the worker does", is the table; the worker's transports
return a ``DeliveryOutcome`` and its outbox acts on the kind. The arbiter counts a result answer as
a refusal (``arbiter_results_refused_total``) exactly when this module says the worker will not
retry it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Delivery(enum.Enum):
    DELIVERED = "delivered"  # stored (or already stored: a duplicate of what is there)
    GONE = "gone"  # the lease is over (410, or a stale token): nothing left to deliver; the entry is done
    RETRY = "retry"  # not now (unreachable, 401, 408, 429, 5xx): the same entry again after a backoff
    TOO_LARGE = "too_large"  # 413: the worker sends the verdict again without the detail
    REJECTED = "reject"  # refused for good (any other 4xx): the entry goes to rejected/ for an operator


@dataclass(frozen=True)
class DeliveryOutcome:
    kind: Delivery
    why: str = ""  # for REJECTED: what the refusal said (kept in rejected/ beside the entry)
    retry_after: float | None = None  # for RETRY: the wait the arbiter asked for (Retry-After), if it answered

    @property
    def done(self) -> bool:
        """The outbox entry has nothing more to do: cleared."""
        return self.kind in (Delivery.DELIVERED, Delivery.GONE)


# Answers to a result that are not about the result: credentials, timing, load.
_RETRIED_RESULT_STATUSES = frozenset({401, 408, 429})


def for_result_status(status: int) -> Delivery:
    """What the worker does with the arbiter's answer to POST /v1/result."""
    if status == 200:
        return Delivery.DELIVERED
    if status == 410:
        return Delivery.GONE
    if status == 413:
        return Delivery.TOO_LARGE
    if status in _RETRIED_RESULT_STATUSES or status >= 500:
        return Delivery.RETRY
    return Delivery.REJECTED


def is_refusal(status: int) -> bool:
    """A result answer the arbiter counts as refused: the worker cannot deliver that body as it is."""
    return 400 <= status < 500 and for_result_status(status) in (Delivery.TOO_LARGE, Delivery.REJECTED)
