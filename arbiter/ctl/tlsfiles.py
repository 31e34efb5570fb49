"""A site's own certificate authority and the arbiter's server certificate, as files.

Workers trust the site's CA only (their ``tls_ca_file``), never the system's store by default: a
certificate some public CA issued for the arbiter's name is not enough to talk to a worker. Keys are
EC P-256, written 0600 and never printed. Used by the lab (``judge-lab`` makes its own CA), the tests,
and ``python -m arbiter.ctl.tlsfiles`` for an operator without a CA of their own.

Idempotent: an existing CA is kept; a server certificate is issued again only when it is missing,
does not cover the names asked for, was not signed by this CA, or expires within ``renew_days``
(so re-running the same command is how it is renewed).

Across hosts (the Ansible roles) the key never leaves the arbiter host: ``request`` there says
"good" or makes the key (if absent) and prints a certificate signing request; ``sign`` on the
controller, where the CA lives, turns it into a certificate for the names the controller decides.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.crt", "ca.key"


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def ensure_ca(directory: str | os.PathLike, common_name: str = "judge-arbiter site CA",
              days: int = 3650) -> tuple[Path, bool]:
    """The CA in ``directory`` (ca.crt, ca.key 0600): created if absent. Returns (ca.crt, created)."""
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path, key_path = d / CA_CERT, d / CA_KEY
    if cert_path.exists() and key_path.exists():
        return cert_path, False
    os.chmod(d, 0o700)  # the CA's key is the one secret that signs for the arbiter
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_private(key_path, _key_pem(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, True


def _san(names: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _still_good(cert_path: Path, key_path: Path, ca_cert: x509.Certificate, names: list[str], renew_days: int) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError):
        return False
    if cert.issuer != ca_cert.subject or cert.public_key().public_numbers() != key.public_key().public_numbers():
        return False
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (InvalidSignature, ValueError, TypeError):
        return False
    if cert.not_valid_after_utc - _now() < dt.timedelta(days=renew_days):
        return False
    try:
        present = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return False
    return set(_san(names)) <= present


def _build_server_cert(public_key, names: list[str], ca_cert: x509.Certificate, ca_key, days: int) -> x509.Certificate:
    now = _now()
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_cert.subject).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))


def request(directory: str | os.PathLike, ca_cert_file: str | os.PathLike, names: list[str],
            renew_days: int = 30, stem: str = "server") -> bytes | None:
    """On the server's host: None when ``<stem>.crt`` is good (signed by the CA, covers the names, not
    expiring within renew_days); else a CSR (PEM) for ``<stem>.key``, which is made (0600) if absent."""
    d = Path(directory)
    cert_path, key_path = d / f"{stem}.crt", d / f"{stem}.key"
    ca_cert = x509.load_pem_x509_certificate(Path(ca_cert_file).read_bytes())
    if _still_good(cert_path, key_path, ca_cert, names, renew_days):
        return None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError):
        key = ec.generate_private_key(ec.SECP256R1())
        d.mkdir(parents=True, exist_ok=True)
        _write_private(key_path, _key_pem(key))
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])).sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM)


def sign(ca_directory: str | os.PathLike, csr_pem: bytes, names: list[str], days: int = 397) -> bytes:
    """On the controller: a certificate for ``names`` (not whatever the CSR asks for) on the CSR's key."""
    if not names:
        raise ValueError("a server certificate needs at least one name")
    ca_dir = Path(ca_directory)
    ca_cert = x509.load_pem_x509_certificate((ca_dir / CA_CERT).read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / CA_KEY).read_bytes(), password=None)
    csr = x509.load_pem_x509_csr(csr_pem)
    if not csr.is_signature_valid:
        raise ValueError("the certificate signing request's signature does not verify")
    cert = _build_server_cert(csr.public_key(), names, ca_cert, ca_key, days)
    return cert.public_bytes(serialization.Encoding.PEM)


def issue_server_cert(ca_directory: str | os.PathLike, out_directory: str | os.PathLike, names: list[str],
                      days: int = 397, renew_days: int = 30, stem: str = "server") -> tuple[Path, Path, bool]:
    """``<stem>.crt`` and ``<stem>.key`` (0600) in ``out_directory`` for ``names`` (DNS names or IP
    addresses), signed by the CA in ``ca_directory``. Returns (cert, key, issued)."""
    if not names:
        raise ValueError("a server certificate needs at least one name")
    ca_dir, out = Path(ca_directory), Path(out_directory)
    ca_cert = x509.load_pem_x509_certificate((ca_dir / CA_CERT).read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / CA_KEY).read_bytes(), password=None)
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / f"{stem}.crt", out / f"{stem}.key"
    if _still_good(cert_path, key_path, ca_cert, names, renew_days):
        return cert_path, key_path, False
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _build_server_cert(key.public_key(), names, ca_cert, ca_key, days)
    _write_private(key_path, _key_pem(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arbiter.ctl.tlsfiles", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ca", help="create the site's CA in DIR (kept if it exists)")
    p.add_argument("dir")
    p = sub.add_parser("server", help="issue (or renew) the arbiter's certificate for NAMES, signed by the CA in --ca")
    p.add_argument("--ca", required=True, help="the CA's directory")
    p.add_argument("--out", required=True, help="where server.crt and server.key go")
    p.add_argument("names", nargs="+", help="DNS names and IP addresses workers use to reach the arbiter")
    p = sub.add_parser("request", help="on the server's host: print 'good', or a CSR for DIR/server.key (made if absent)")
    p.add_argument("--dir", required=True)
    p.add_argument("--ca-cert", required=True, help="the CA certificate the present certificate must chain to")
    p.add_argument("--renew-days", type=int, default=30)
    p.add_argument("names", nargs="+")
    p = sub.add_parser("sign", help="on the controller: a CSR on stdin, the certificate for NAMES on stdout")
    p.add_argument("--ca", required=True, help="the CA's directory")
    p.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "ca":
            path, created = ensure_ca(args.dir)
            print(f"{'created' if created else 'kept'} CA {path}")
        elif args.command == "request":
            csr = request(args.dir, args.ca_cert, args.names, args.renew_days)
            sys.stdout.write("good\n" if csr is None else csr.decode())
        elif args.command == "sign":
            sys.stdout.write(sign(args.ca, sys.stdin.buffer.read(), args.names).decode())
        else:
            cert, _, issued = issue_server_cert(args.ca, args.out, args.names)
            print(f"{'issued' if issued else 'kept'} {cert} for {', '.join(args.names)}")
    except (OSError, ValueError) as exc:
        print(f"tlsfiles: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
