"""TLS between every client and nats-server (SEC-4).

A client always verifies the server's certificate against a CA (``--tls-ca`` /
``HEALTHPLANE_NATS_TLS_CA``) and may present its own (``--tls-cert``/``--tls-key``).
The server side (``healthplane.stack.tls``): ``healthplane up --tls`` makes a throwaway CA and a server certificate for loopback in
``DATA_DIR/tls`` (keys 0600): a development stack that runs the same code path as a fleet
with an operator's PKI. The keys come from ``cryptography``, nothing hand-rolled.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

ENV_CA = "HEALTHPLANE_NATS_TLS_CA"
ENV_CERT = "HEALTHPLANE_NATS_TLS_CERT"
ENV_KEY = "HEALTHPLANE_NATS_TLS_KEY"


class TlsError(RuntimeError):
    """One line naming the file or setting that is wrong."""


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
