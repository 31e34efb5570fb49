"""Bearer authentication of workers (``Authorization: Bearer <worker_id>.<secret>``)."""

from __future__ import annotations

import falcon
from psycopg.rows import dict_row

from arbiter.server.loops.tickets import WorkerIdentity
from arbiter.store import credentials, leases


def _unauthorized(description: str) -> falcon.HTTPUnauthorized:
    return falcon.HTTPUnauthorized(title="unauthorized", description=description, challenges=["Bearer"])


class WorkerAuth:
    """Falcon middleware: resources with ``auth = True`` get ``req.context.worker``."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.cache = runtime.credentials
        self.last_seen = runtime.last_seen

    async def process_resource(self, req, resp, resource, params):
        if not getattr(resource, "auth", False):
            return
        header = req.get_header("Authorization") or ""
        scheme, _, credential = header.partition(" ")
        if scheme.lower() != "bearer" or not credential:
            raise _unauthorized("missing bearer credential")
        parsed = credentials.parse_credential(credential)
        if parsed is None:
            raise _unauthorized("malformed credential")
        worker_id, secret = parsed
        digest = credentials.hash_secret(secret)
        identity = self.cache.get(worker_id, digest)
        if identity is None:
            generation = self.cache.generation()
            verified = await self.runtime.db(self._verify, worker_id, digest,
                                             urgent=getattr(resource, "urgent", False))
            if verified is None:
                # Same answer for unknown, revoked, rotated-out and wrong secret: nothing to probe.
                raise _unauthorized("unknown or revoked credential")
            identity, valid_secs = verified
            self.cache.put(worker_id, digest, identity, generation, valid_secs)
        else:
            self.last_seen.mark(worker_id)
        req.context.worker = identity

    def _verify(self, worker_id: str, digest: str) -> tuple[WorkerIdentity, float | None] | None:
        """On a database thread: the identity and, for a rotated-out secret still in its overlap, the
        seconds it stays valid (DB time). A good credential also touches ``last_seen_at`` (a liveness
        mark of the worker, not state of any submission: it happens even if the request is then refused)."""
        with self.runtime.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(leases.Q.find_worker_credential, {"worker_id": worker_id}).fetchone()
            if row is None or row["revoked"]:
                return None
            if credentials.digest_matches(digest, row["secret_sha256"]):
                valid_secs = None
            elif row["previous_secret_sha256"] and credentials.digest_matches(digest, row["previous_secret_sha256"]):
                valid_secs = row["previous_valid_secs"]
            else:
                return None
            conn.execute(leases.Q.touch_worker, {"worker_id": worker_id})
            return WorkerIdentity(worker_id, row["kind"], tuple(row["languages"]), row["slots"]), valid_secs
