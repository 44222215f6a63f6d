"""A network link a test can cut: a TCP relay on loopback between a client and a server.

``cut()`` drops every connection through it and refuses new ones (each is closed as soon as
it is accepted), the way a lost WAN link or a firewall change looks to both ends; ``mend()``
lets connections through again. Bounded: the relay listens on 127.0.0.1 only, copies at most
64 KiB at a time, and stops with its ``close()``.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress


class Link:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self._target = (host, target_port)
        self._listener = socket.create_server((host, 0))
        self.port = int(self._listener.getsockname()[1])
        self._open = True
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, name=f"link-{self.port}", daemon=True).start()

    @property
    def url(self) -> str:
        return f"nats-leaf://127.0.0.1:{self.port}"

    def cut(self) -> None:
        with self._lock:
            self._open = False
            for sock in self._sockets:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def mend(self) -> None:
        with self._lock:
            self._open = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if not self._open:
                    client.close()
                    continue
                try:
                    server = socket.create_connection(self._target, timeout=5)
                except OSError:
                    client.close()
                    continue
                server.settimeout(None)
                self._sockets |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
