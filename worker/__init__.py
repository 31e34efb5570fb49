"""judge-worker: judges leases in a local sandbox and delivers results through a durable outbox."""
