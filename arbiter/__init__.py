"""judge-arbiter: the central lease arbiter of an online judge."""

__version__ = "0.1.0"
