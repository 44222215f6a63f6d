"""The server side of SEC-4: ``healthplane up --tls``'s throwaway CA and loopback certificate
(``DATA_DIR/tls``, keys 0600), from ``cryptography``. Clients: ``healthplane.runtime.tls``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert: Path
    key: Path
    ca: Path

    def server_config(self) -> str:
        return (f'tls {{ cert_file: "{self.cert}", key_file: "{self.key}", ca_file: "{self.ca}", '
                "timeout: 2 }\n")


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
