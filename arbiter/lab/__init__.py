"""The lab (judge-lab: an arbiter and workers on one machine) and the development PostgreSQL cluster
the lab and the tests use. Not part of a production deployment."""
