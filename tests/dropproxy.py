"""A small TCP proxy for fault tests: forwards to a target, and can swallow chosen replies."""

from __future__ import annotations

import socket
import threading


class DropReplyProxy:
    """HTTP-agnostic at the socket level: one upstream connection per client connection.

    ``drop_next(marker)`` makes the proxy forward the next request whose bytes contain ``marker`` and
    then close the client's connection instead of passing the reply back: the server did the work,
    the client never hears.
    """

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._drop: list[bytes] = []
        self.dropped = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_next(self, marker: bytes) -> None:
        with self._lock:
            self._drop.append(marker)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        swallow = threading.Event()

        def client_to_upstream():
            try:
                while data := client.recv(65536):
                    with self._lock:
                        marker = next((m for m in self._drop if m in data), None)
                        if marker is not None:
                            self._drop.remove(marker)
                            swallow.set()
                    upstream.sendall(data)
            except OSError:
                pass
            finally:
                upstream.close()

        threading.Thread(target=client_to_upstream, daemon=True).start()
        try:
            while data := upstream.recv(65536):
                if swallow.is_set():
                    self.dropped += 1
                    return  # the server answered; the client gets a closed connection instead
                client.sendall(data)
        except OSError:
            return
        finally:
            client.close()

    def close(self) -> None:
        self.listener.close()
