"""The state machine over sql/: named statements, leases and their fencing tokens, migrations,
database roles, test-data blobs, worker credentials, canaries. Used by the server, judgectl, the lab
and the worker's legacy (direct-DB) transport; imports nothing of the server or judgectl."""
