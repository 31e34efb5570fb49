"""The OpenAPI description served at /openapi.json (kept in sync with app.ROUTES by a test)."""

from __future__ import annotations

from arbiter.protocol.vocabulary import LANGUAGES, VERDICTS

_error = {"$ref": "#/components/schemas/Error"}


def _resp(description: str, schema=None, headers=None) -> dict:
    out: dict = {"description": description}
    if schema is not None:
        out["content"] = {"application/json": {"schema": schema}}
    if headers:
        out["headers"] = headers
    return out


_retry = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds to wait before retrying"}}
_common_worker = {
    "400": _resp("malformed JSON or request", _error),
    "401": _resp("missing, unknown or revoked credential", _error),
    "408": _resp("the body did not arrive within body_timeout_secs; the connection is closed", _error),
    "413": _resp("body larger than the configured limit", _error),
    # Beside each call's own 422s: a value PostgreSQL cannot store (NUL, a lone surrogate, 1e400).
    "422": _resp("a value that cannot be stored (the description names the field)", _error),
    "503": _resp("database unreachable, not the leader, or too many parked requests", _error, _retry),
}
# The operator endpoints: loopback only, or whoever presents the operator token (docs/protocol.md).
_operator = {
    "401": _resp("an operator token is configured and was not presented", _error),
    "403": _resp("no operator token is configured and the client is not on loopback", _error),
}
_lease_path = {"name": "submission_id", "in": "path", "required": True,
               "schema": {"type": "integer", "minimum": 1, "maximum": 9223372036854775807}}

SPEC = {
    "openapi": "3.0.3",
    "info": {"title": "judge-arbiter", "version": "1",
             "description": "Lease protocol between judge workers and the central arbiter."},
    "components": {
        "securitySchemes": {"worker": {"type": "http", "scheme": "bearer",
                                       "description": "<worker_id>.<secret> as issued by `judgectl worker add`"},
                            "operator": {"type": "http", "scheme": "bearer",
                                         "description": "the arbiter's operator token (or HTTP Basic with it as "
                                                        "the password); loopback clients need none when no "
                                                        "token is configured"}},
        "schemas": {
            "Error": {"type": "object", "properties": {"title": {"type": "string"},
                                                        "description": {"type": "string"}},
                      "required": ["title"]},
            "AcquireRequest": {
                "type": "object", "required": ["request_id"],
                "properties": {
                    "request_id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$",
                                   "description": "reuse across retries of one attempt: a retry gets the same lease"},
                    "languages": {"type": "array", "items": {"type": "string", "enum": sorted(LANGUAGES)}},
                    "wait_secs": {"type": "number", "minimum": 0,
                                  "description": "at most long_poll_max_secs is waited; a longer wait is served as that"},
                    "slot": {"type": "integer", "minimum": 0, "default": 0,
                             "description": "the worker's judge slot that asks (0 .. its registered slots - 1); "
                                            "recorded with the lease"},
                },
            },
            "Lease": {
                "type": "object",
                "required": ["submission_id", "lease_token", "lease_gen", "expires_at", "problem", "language",
                             "source", "attempt"],
                "properties": {
                    "submission_id": {"type": "integer"},
                    "lease_token": {"type": "string", "format": "uuid"},
                    "lease_gen": {"type": "integer"},
                    "expires_at": {"type": "string", "format": "date-time"},
                    "problem": {"type": "object", "required": ["id", "slug", "time_limit_ms", "memory_limit_kb"],
                                "properties": {"id": {"type": "integer"}, "slug": {"type": "string"},
                                               "time_limit_ms": {"type": "integer"},
                                               "memory_limit_kb": {"type": "integer"},
                                               "comparer": {"type": "string", "description":
                                                            "tokens | lines | float:abs=A,rel=R | checker"},
                                               "checker_sha256": {"type": ["string", "null"], "description":
                                                                  "SHA-256 of the problem's checker.cpp "
                                                                  "(comparer checker)"},
                                               "data_digest": {"type": ["string", "null"], "description":
                                                               "the test data to judge with (arbiter/protocol/testdata.py); "
                                                               "null: the worker's own copy"}}},
                    "language": {"type": "string", "enum": sorted(LANGUAGES)},
                    "source": {"type": "string"},
                    "attempt": {"type": "integer"},
                    "lease_port": {"type": "integer", "description":
                                   "with lease processes (lease_bind): the port at the arbiter URL's host "
                                   "where this lease's heartbeats, result, release and test data go "
                                   "(docs/protocol.md)"},
                },
            },
            "HeartbeatRequest": {"type": "object", "required": ["lease_token"],
                                 "properties": {"lease_token": {"type": "string"}}},
            "HeartbeatResponse": {"type": "object", "required": ["submission_id", "expires_at"],
                                  "properties": {"submission_id": {"type": "integer"},
                                                 "expires_at": {"type": "string", "format": "date-time"}}},
            "ResultRequest": {
                "type": "object", "required": ["lease_token", "verdict"],
                "properties": {
                    "lease_token": {"type": "string"},
                    "verdict": {"type": "string", "enum": sorted(VERDICTS)},
                    "time_ms": {"type": "integer", "minimum": 0, "maximum": 2147483647},
                    "memory_kb": {"type": "integer", "minimum": 0, "maximum": 2147483647},
                    "detail": {"type": "object"},
                    "data_digest": {"type": "string", "pattern": "^[0-9a-f]{64}$",
                                    "description": "the digest of the test data judged with"},
                },
            },
            "ResultResponse": {"type": "object", "required": ["submission_id", "verdict", "status"],
                               "properties": {"submission_id": {"type": "integer"},
                                              "verdict": {"type": "string", "enum": sorted(VERDICTS)},
                                              "status": {"type": "string", "enum": ["received"]}}},
            "ReleaseRequest": {"type": "object", "required": ["lease_token"],
                               "properties": {"lease_token": {"type": "string"},
                                              "reason": {"type": "string", "maxLength": 500}}},
            "ReleaseResponse": {"type": "object", "required": ["submission_id", "status"],
                                "properties": {"submission_id": {"type": "integer"},
                                               "status": {"type": "string", "enum": ["pending", "system_error"]}}},
            "Ready": {"type": "object", "required": ["ready", "reasons"],
                      "properties": {"ready": {"type": "boolean"},
                                     "reasons": {"type": "array", "items": {"type": "string"}}}},
        },
    },
    "paths": {
        "/v1/acquire": {"post": {
            "summary": "Long-poll for work (up to wait_secs, at most 30 s)",
            "security": [{"worker": []}],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/AcquireRequest"}}}},
            "responses": {"200": _resp("a lease (the same one again for a retried request_id)",
                                       {"$ref": "#/components/schemas/Lease"}),
                          "204": _resp("nothing came within the wait"),
                          "410": _resp("this request_id was served and its lease is gone", _error),
                          **_common_worker,
                          "422": _resp("unknown or no usable language, a slot the worker is not registered "
                                       "with, or a value that cannot be stored", _error),
                          "429": _resp("this worker already has max_parked_per_worker requests parked per slot", _error,
                                       _retry)}}},
        "/v1/leases/{submission_id}/heartbeat": {"post": {
            "summary": "Confirm (first call) or extend a lease",
            "security": [{"worker": []}],
            "parameters": [_lease_path],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/HeartbeatRequest"}}}},
            "responses": {"200": _resp("lease extended", {"$ref": "#/components/schemas/HeartbeatResponse"}),
                          "403": _resp("the lease belongs to another worker", _error),
                          "404": _resp("no such submission", _error),
                          "410": _resp("the lease is no longer current: stop judging", _error),
                          **_common_worker}}},
        "/v1/leases/{submission_id}/result": {"post": {
            "summary": "Report the verdict of a lease (idempotent per lease_token)",
            "security": [{"worker": []}],
            "parameters": [_lease_path],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/ResultRequest"}}}},
            "responses": {"200": _resp("received (a repeat of the same token answers the same)",
                                       {"$ref": "#/components/schemas/ResultResponse"}),
                          "403": _resp("the lease belongs to another worker", _error),
                          "404": _resp("no such submission", _error),
                          "410": _resp("stale lease token: nothing was written", _error),
                          **_common_worker,
                          "422": _resp("unknown verdict, or a value that cannot be stored", _error)}}},
        "/v1/leases/{submission_id}/release": {"post": {
            "summary": "Hand a lease back: the submission is pending again at once, its attempt given back "
                       "(system_error once released max_releases times)",
            "security": [{"worker": []}],
            "parameters": [_lease_path],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/ReleaseRequest"}}}},
            "responses": {"200": _resp("released", {"$ref": "#/components/schemas/ReleaseResponse"}),
                          "403": _resp("the lease belongs to another worker", _error),
                          "404": _resp("no such submission", _error),
                          "410": _resp("stale lease token (or released already): nothing was written", _error),
                          **_common_worker,
                          "422": _resp("a value that cannot be stored", _error)}}},
        "/v1/data/{digest}": {"get": {
            "summary": "The files of a test-data set (the digest a lease carries): path, size, sha256 each",
            "security": [{"worker": []}],
            "parameters": [{"name": "digest", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}],
            "responses": {"200": _resp("the data set", {"type": "object", "required": ["digest", "files"],
                                                         "properties": {"digest": {"type": "string"},
                                                                        "files": {"type": "array",
                                                                                  "items": {"type": "object"}}}}),
                          "404": _resp("no data set stored under this digest", _error),
                          "400": _resp("not a digest", _error),
                          "401": _common_worker["401"], "503": _common_worker["503"]}}},
        "/v1/blobs/{sha256}": {"get": {
            "summary": "One test-data file by its sha256, streamed; Range: bytes=N- resumes a download",
            "security": [{"worker": []}],
            "parameters": [{"name": "sha256", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
                           {"name": "Range", "in": "header", "required": False, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "the whole file",
                                  "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                      "format": "binary"}}}},
                          "206": {"description": "the part asked for",
                                  "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                      "format": "binary"}}}},
                          "404": _resp("no file stored under this sha256", _error),
                          "416": _resp("the range is outside the file", _error),
                          "400": _resp("not a sha256, or a malformed Range", _error),
                          "401": _common_worker["401"], "503": _common_worker["503"]}}},
        "/v1/status": {"get": {"summary": "Read-only status: live queue, decided (estimate), leases, workers, last canary per worker",
                               "security": [{"operator": []}, {}],
                               "responses": {"200": _resp("status", {"type": "object"}), **_operator,
                                             "503": _resp("database unreachable", _error, _retry)}}},
        "/status": {"get": {"summary": "Read-only status page (HTML)",
                            "security": [{"operator": []}, {}],
                            "responses": {"200": {"description": "status page",
                                                  "content": {"text/html": {"schema": {"type": "string"}}}},
                                          **_operator,
                                          "503": _resp("database unreachable", _error, _retry)}}},
        "/healthz": {"get": {"summary": "Liveness: the process serves HTTP",
                             "responses": {"200": _resp("alive", {"type": "object"})}}},
        "/readyz": {"get": {"summary": "Readiness: DB reachable, leader, a dispatch round completed recently",
                            "responses": {"200": _resp("ready", {"$ref": "#/components/schemas/Ready"}),
                                          "503": _resp("not ready", {"$ref": "#/components/schemas/Ready"})}}},
        "/metrics": {"get": {"summary": "Prometheus metrics",
                             "security": [{"operator": []}, {}],
                             "responses": {"200": {"description": "text exposition format",
                                                   "content": {"text/plain": {"schema": {"type": "string"}}}},
                                           **_operator}}},
        "/openapi.json": {"get": {"summary": "This document",
                                  "responses": {"200": _resp("OpenAPI 3 document", {"type": "object"})}}},
    },
}


def build_spec(settings) -> dict:
    """The document with this arbiter's own limits filled in."""
    import copy

    spec = copy.deepcopy(SPEC)
    acquire = spec["components"]["schemas"]["AcquireRequest"]["properties"]
    acquire["wait_secs"]["description"] = (f"seconds to wait for work, at most {settings.long_poll_max_secs:g} "
                                           "(a longer wait is served as that)")
    # What a client must stay within, published so that a worker's detail budget and this arbiter's
    # limits cannot drift apart unnoticed (tests/test_verdict_delivery.py reads them from here).
    from arbiter.server.http.base import MAX_JSON_DEPTH
    from arbiter.server.serving import MAX_HEADER_BYTES
    from arbiter.store.leases import MAX_SOURCE_BYTES

    spec["info"]["x-limits"] = {"max_header_bytes": MAX_HEADER_BYTES, "max_body_bytes": settings.max_body_bytes,
                                "max_json_depth": MAX_JSON_DEPTH, "max_source_bytes": MAX_SOURCE_BYTES}
    return spec
