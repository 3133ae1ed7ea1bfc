"""A local webhook receiver for notification tests: it records every JSON POST and can be told
to fail the next N requests (HTTP 500) to play a chat service that is down for a while."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class Receiver:
    def __init__(self):
        self.received: list[dict] = []
        self.refused = 0
        self.fail_next = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    failing = receiver.fail_next > 0
                    if failing:
                        receiver.fail_next -= 1
                        receiver.refused += 1
                    else:
                        receiver.received.append(json.loads(body))
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server.server_address[1]}/hook"

    def messages(self) -> list[str]:
        with self.lock:
            return [r["message"] for r in self.received]

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
