"""The arbiter process's background work: the leader lock, the dispatcher that wakes parked acquires
(LISTEN/NOTIFY), the parking lot of tickets, the janitor that expires leases, probes, the canary probe."""
