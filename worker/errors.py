"""The base of every error the worker's own code raises (judging, sandbox, delivery)."""


class WorkerError(Exception):
    pass
