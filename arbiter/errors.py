"""The base of every error the arbiter's own code raises (server, store, judgectl, lab)."""


class ArbiterError(Exception):
    pass
