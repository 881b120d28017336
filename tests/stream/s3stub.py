"""A tiny S3 endpoint on the loopback address whose objects can be made to fail: the storage faults of a stream.

It answers the two calls boto3's ``download_file`` makes (``HeadObject``, then ``GetObject``; path-style URLs
``/bucket/key``) from a directory, and per key can be told to answer 404 (a deleted object) or to say nothing
(a frozen remote: the request is read, no answer comes until the stub stops); :meth:`S3Stub.stop` takes the
endpoint down (connections refused). In-process, started in milliseconds (moto's server takes seconds).
"""

from __future__ import annotations

import email.utils
import hashlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Stub:
    """``s3://<bucket>/<key>`` served from ``root/<key>``; ``faults[key]``: ``"missing"`` or ``"frozen"``.

    Example::

        stub = S3Stub(Path("mds"), bucket="b")
        env = stub.env  # S3_ENDPOINT_URL and test credentials, for the engine's S3 downloader
        stub.faults["shard.00001.mds"] = "frozen"
    """

    def __init__(self, root: Path, bucket: str = "bucket") -> None:
        self.root, self.bucket = root, bucket
        self.faults: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []  # (method, key) of every request
        self._release = threading.Event()  # ends the frozen answers
        self._connections: list[socket.socket] = []  # open keep-alive connections, cut by stop()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def setup(self) -> None:
                super().setup()
                stub._connections.append(self.connection)

            def _answer(self, body: bool) -> None:
                bucket, _, key = self.path.split("?")[0].lstrip("/").partition("/")
                stub.requests.append((self.command, key))
                fault = stub.faults.get(key)
                if fault == "frozen":
                    stub._release.wait()
                    return
                path = stub.root / key
                if bucket != stub.bucket or fault == "missing" or not path.is_file():
                    payload = (
                        b"<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>"
                    )
                    self.send_response(404)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload) if body else 0))
                    self.end_headers()
                    if body:
                        self.wfile.write(payload)
                    return
                data = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("ETag", f'"{hashlib.md5(data).hexdigest()}"')
                self.send_header("Last-Modified", email.utils.formatdate(usegmt=True))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                self._answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-stub", daemon=True)
        self._thread.start()

    @property
    def env(self) -> dict[str, str]:
        return {"S3_ENDPOINT_URL": f"http://127.0.0.1:{self.port}", **KEYS}

    def url(self) -> str:
        return f"s3://{self.bucket}"

    def stop(self) -> None:
        """Take the endpoint down: frozen answers end, new connections are refused."""
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        for connection in self._connections:  # the client's pooled connections would go on being served
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
