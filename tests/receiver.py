"""A real webhook on loopback for the notifications a sweep sends (``sweeps.running.notify``)."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


class Receiver(ThreadingHTTPServer):
    """A webhook on loopback that keeps every JSON body posted to it."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.folder = Path(tempfile.mkdtemp(prefix="seqae-receiver-"))  # mode 700
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server_address[1]}/hook"

    def titles(self) -> list[str]:
        return [m["title"] for m in self.received]

    def notify(self) -> str:
        """The `--set` that sends a sweep's notifications here: the URL in a file only its owner
        reads, as a sweep file names a URL (a token's holder) by reference."""
        path = self.folder / "hook-url"
        path.write_text(self.url)
        path.chmod(0o600)
        return f"notify={{urls: ['file:{path}']}}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()
    shutil.rmtree(server.folder, ignore_errors=True)
