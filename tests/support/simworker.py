"""A protocol-level worker for arbiter tests: real HTTP, a no-op judge, retries with backoff."""

from __future__ import annotations

import threading
import time
import uuid

from worker.delivery.http_client import ArbiterClient, Unreachable


class SimWorker(threading.Thread):
    def __init__(self, urls, credential, verdict="AC", judge_secs=0.0, wait_secs=2.0, stop_after=None):
        super().__init__(daemon=True)
        self.client = ArbiterClient(urls, credential, timeout=10)
        self.worker_id = credential.split(".")[0]
        self.verdict = verdict
        self.judge_secs = judge_secs
        self.wait_secs = wait_secs
        self.stop_after = stop_after
        self.stopping = threading.Event()
        self.delivered: list[int] = []
        self.refused: list[int] = []
        self.errors = 0

    def _call(self, fn, *args):
        delay = 0.1
        while not self.stopping.is_set():
            try:
                return fn(*args)
            except Unreachable as exc:
                self.errors += 1
                time.sleep(min(exc.retry_after or delay, 1.0))
                delay = min(delay * 2, 1.0)
        return None

    def run(self):
        while not self.stopping.is_set():
            if self.stop_after is not None and len(self.delivered) >= self.stop_after:
                return
            request_id = str(uuid.uuid4())
            reply = self._call(self.client.acquire, request_id, None, self.wait_secs)
            if reply is None or reply.status != 200:
                continue
            lease = reply.body
            sid, token = lease["submission_id"], lease["lease_token"]
            hb = self._call(self.client.heartbeat, sid, token)
            if hb is None or hb.status != 200:
                continue
            time.sleep(self.judge_secs)
            out = self._call(self.client.result, sid, {"lease_token": token, "verdict": self.verdict, "time_ms": 1})
            if out is None:
                continue
            (self.delivered if out.status == 200 else self.refused).append(sid)

    def stop(self):
        self.stopping.set()
        self.join(15)
