"""Who may read the operator endpoints (/metrics, /v1/status, /status): resources with ``operator = True``.

Without an operator token only loopback clients may (an operator on the arbiter host, an SSH tunnel,
a Prometheus on the same host). With one (``operator_token_file``), any client presenting it may:
``Authorization: Bearer <token>`` (Prometheus' ``authorization`` / ``bearer_token_file``) or HTTP
Basic with the token as the password (a browser's login prompt, for the status page). The probes
(/healthz, /readyz) and /openapi.json stay open: load balancers and systemd need them, and they hold
nothing about submissions or workers."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress

import falcon


def _presented(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        return value.strip()
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class OperatorAccess:
    """Falcon middleware guarding resources with ``operator = True``."""

    def __init__(self, token: str):
        self.token = token.encode()

    async def process_resource(self, req, resp, resource, params):
        if not getattr(resource, "operator", False):
            return
        if not self.token:
            if _is_loopback(req.remote_addr):
                return
            raise falcon.HTTPForbidden(title="operators only",
                                       description="this arbiter answers operator endpoints on loopback only; "
                                                   "set operator_token_file to serve them to other hosts")
        presented = _presented(req.get_header("Authorization") or "")
        if presented is None or not hmac.compare_digest(presented.encode(), self.token):
            raise falcon.HTTPUnauthorized(title="unauthorized", description="operator token required",
                                          challenges=["Bearer", 'Basic realm="judge-arbiter operators"'])
