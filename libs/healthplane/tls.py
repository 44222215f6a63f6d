"""TLS between every client and nats-server (SEC-4).

A client always verifies the server's certificate against a CA (``--tls-ca`` /
``HEALTHPLANE_NATS_TLS_CA``) and may present its own (``--tls-cert``/``--tls-key``).
``healthplane up --tls`` makes a throwaway CA and a server certificate for loopback in
``DATA_DIR/tls`` (keys 0600): a development stack that runs the same code path as a fleet
with an operator's PKI. The keys come from ``cryptography``, nothing hand-rolled.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

ENV_CA = "HEALTHPLANE_NATS_TLS_CA"
ENV_CERT = "HEALTHPLANE_NATS_TLS_CERT"
ENV_KEY = "HEALTHPLANE_NATS_TLS_KEY"


class TlsError(RuntimeError):
    """One line naming the file or setting that is wrong."""


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert: Path
    key: Path
    ca: Path

    def server_config(self) -> str:
        return (f'tls {{ cert_file: "{self.cert}", key_file: "{self.key}", ca_file: "{self.ca}", '
                "timeout: 2 }\n")


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca: str
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_env(cls, ca: str | None = None, cert: str | None = None, key: str | None = None) -> ClientTls | None:
        """Flags first, then ``HEALTHPLANE_NATS_TLS_*``; ``None`` when no CA is named."""
        ca = ca or os.environ.get(ENV_CA) or None
        cert = cert or os.environ.get(ENV_CERT) or None
        key = key or os.environ.get(ENV_KEY) or None
        if ca is None:
            if cert or key:
                raise TlsError(f"a client certificate needs the CA that verifies the server (--tls-ca or {ENV_CA})")
            return None
        if bool(cert) != bool(key):
            raise TlsError("--tls-cert and --tls-key go together")
        return cls(ca, cert, key)

    def context(self) -> ssl.SSLContext:
        """Verifies the server's certificate and host name against the CA."""
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
            if self.cert and self.key:
                context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"cannot load TLS files ({self.ca}{', ' + self.cert if self.cert else ''}): "
                           f"{getattr(exc, 'strerror', None) or exc}") from exc
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context


def make_throwaway(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> ServerTls:
    """A CA and a server certificate for ``hosts``, made once and kept (a client that
    trusted the CA keeps trusting it across restarts)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    files = ServerTls(directory / "server.pem", directory / "server-key.pem", directory / "ca.pem")
    if files.cert.exists() and files.key.exists() and files.ca.exists():
        return files
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)

    def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "healthplane throwaway CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=365))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .sign(ca_key, hashes.SHA256()))
    server_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_cert = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "healthplane nats-server")]))
                   .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=365))
                   .add_extension(x509.SubjectAlternativeName(names), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                   .sign(ca_key, hashes.SHA256()))
    write_key(files.key, server_key)
    write_key(directory / "ca-key.pem", ca_key)
    files.cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return files
