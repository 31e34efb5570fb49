"""judgectl, the operator's command line (runs on an operator's machine or the arbiter host), and the
TLS file helper the Ansible roles run. Talks to the database through the store only."""
