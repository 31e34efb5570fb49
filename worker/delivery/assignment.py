"""One piece of work a transport handed to a slot: the job, and the lease it came with (none from
the legacy transport, which has no leases)."""

from __future__ import annotations

from dataclasses import dataclass

from worker.judging.judge import Job


@dataclass(frozen=True)
class Assignment:
    job: Job
    lease_token: str | None
    lease_gen: int | None
    transport: str  # the name of the transport that handed it out ("arbiter" or "direct")
