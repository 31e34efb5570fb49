"""The base of every error the seam raises (a config file refused, a comparer spec refused)."""


class ProtocolError(Exception):
    """Something a worker or the arbiter was given does not follow the protocol's rules."""
