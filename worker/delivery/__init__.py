"""The worker process's way out: the on-disk outbox and the two transports (the arbiter's HTTP API,
and the legacy direct-DB one used during the cutover), with the HTTP client they share."""
