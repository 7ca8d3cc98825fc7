"""A loopback stand-in for the Hugging Face hub, for ``huggingface_hub`` pointed at it with
``HF_ENDPOINT``: it answers as the hub does (its documented HTTP behaviour, written here from the
headers ``huggingface_hub`` reads, not from the hub's code) for ``/{repo}/resolve/{rev}/{path}``
(HEAD and GET: ``X-Repo-Commit``, ``ETag`` / ``X-Linked-Etag`` = the sha256 of an LFS file, sizes,
byte ranges for resume), ``/api/models/{repo}/revision/{rev}`` and ``/api/models/{repo}/tree/{rev}``.
``files``: {repo: {path: bytes}}; every branch name resolves to ``COMMIT``; ``requests`` counts the
GETs of file bodies (a cached file is not fetched again)."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "c0ffee" + "0" * 34
_HEX40 = re.compile(r"[0-9a-f]{40}")


class HubServer:
    def __init__(self, files: dict[str, dict[str, bytes]]):
        self.files = files
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):     # quiet: the test reads the CLI's output
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "HubServer":
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def _commit(rev: str) -> str:
        return rev if _HEX40.fullmatch(rev) else COMMIT

    def _json(self, h, doc, body: bool) -> None:
        data = json.dumps(doc).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _answer(self, h, body: bool) -> None:
        path = h.path.split("?")[0]
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?", path)
        if m and m.group(1) in self.files:
            repo, what, rev = m.group(1), m.group(2), m.group(3)
            files = self.files[repo]
            if what == "revision":
                return self._json(h, {"id": repo, "sha": self._commit(rev),
                                      "siblings": [{"rfilename": p} for p in files]}, body)
            return self._json(h, [{"type": "file", "path": p, "size": len(d), "oid": hashlib.sha1(d).hexdigest(),
                                   "lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 130}}
                                  for p, d in files.items()], body)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        data = self.files.get(m.group(1), {}).get(m.group(3)) if m else None
        if data is None:
            h.send_response(404)
            h.send_header("X-Error-Code", "EntryNotFound" if m and m.group(1) in self.files else "RepoNotFound")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        start = 0
        rng = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range", ""))
        if rng and body:
            start = int(rng.group(1))
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", self._commit(m.group(2)))
        etag = f'"{hashlib.sha256(data).hexdigest()}"'
        h.send_header("ETag", etag)
        h.send_header("X-Linked-Etag", etag)
        h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        if body:
            self.requests.append(m.group(3))
            h.wfile.write(data[start:])
