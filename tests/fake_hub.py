"""A Hugging Face Hub on 127.0.0.1, for tests of the download path itself (``HF_ENDPOINT`` points at it).

It answers the few calls ``huggingface_hub.snapshot_download`` makes: a repository's revision
(``/api/models/ORG/NAME/revision/REV``), its file tree (``/api/models/ORG/NAME/tree/COMMIT``) and
each file (``/ORG/NAME/resolve/COMMIT/FILE``, HEAD for its metadata, GET for its bytes), with the
Hub's own error codes (``X-Error-Code``) for an unknown or gated repository and an unknown revision.
Every request is recorded, so a test can see what was fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

_LFS_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".onnx")


class FakeHub:
    """Repositories of files (name → bytes) at one commit each, served over HTTP on 127.0.0.1."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.gated: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (method, path)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, repo_id: str, folder: Path) -> str:
        """Serve ``folder``'s files as ``repo_id``; returns its commit."""
        self.repos[repo_id] = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        return self.commit(repo_id)

    def commit(self, repo_id: str) -> str:
        digest = hashlib.sha1(json.dumps(sorted(self.repos[repo_id])).encode() + repo_id.encode())
        return digest.hexdigest()

    def fetched(self) -> list[str]:
        """The files whose bytes were asked for (GET), in order."""
        return [
            path.rsplit("/", 1)[-1]
            for method, path in self.requests
            if method == "GET" and "/resolve/" in path
        ]

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # The answers ---------------------------------------------------------------------------------

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        self.requests.append((handler.command, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo_id, kind, revision = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
            if (error := self._refusal(repo_id, revision)) is not None:
                return self._send(handler, *error, body=body)
            files = self.repos[repo_id]
            if kind == "revision":
                info = {
                    "id": repo_id,
                    "sha": self.commit(repo_id),
                    "siblings": [{"rfilename": f} for f in files],
                }
                return self._send(handler, 200, {}, json.dumps(info).encode(), body=body)
            tree = [self._entry(name, content) for name, content in files.items()]
            return self._send(handler, 200, {}, json.dumps(tree).encode(), body=body)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, revision, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if (error := self._refusal(repo_id, revision)) is not None:
                return self._send(handler, *error, body=body)
            content = self.repos[repo_id].get(name)
            if content is None:
                return self._send(handler, 404, {"X-Error-Code": "EntryNotFound"}, b"", body=body)
            etag = self._entry(name, content)
            headers = {"X-Repo-Commit": self.commit(repo_id), "ETag": f'"{etag["oid"]}"'}
            if "lfs" in etag:
                headers.update(
                    {"X-Linked-Etag": f'"{etag["lfs"]["oid"]}"', "X-Linked-Size": str(len(content))}
                )
            return self._send(handler, 200, headers, content, body=body)
        self._send(handler, 404, {}, b"", body=body)

    def _refusal(self, repo_id: str, revision: str) -> tuple[int, dict, bytes] | None:
        if repo_id not in self.repos:
            return 404, {"X-Error-Code": "RepoNotFound"}, b'{"error": "Repository not found"}'
        if repo_id in self.gated:
            return 403, {"X-Error-Code": "GatedRepo"}, b'{"error": "Access to this model is restricted"}'
        if revision not in ("main", self.commit(repo_id)):
            return 404, {"X-Error-Code": "RevisionNotFound"}, b'{"error": "Invalid rev id"}'
        return None

    @staticmethod
    def _entry(name: str, content: bytes) -> dict:
        entry = {
            "type": "file",
            "path": name,
            "size": len(content),
            "oid": hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest(),
        }
        if name.endswith(_LFS_SUFFIXES):
            entry["lfs"] = {
                "oid": hashlib.sha256(content).hexdigest(),
                "size": len(content),
                "pointerSize": 134,
            }
        return entry

    @staticmethod
    def _send(handler, status: int, headers: dict, content: bytes, body: bool) -> None:
        handler.send_response(status)
        for key, value in {"Content-Type": "application/json", **headers}.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        if body:
            handler.wfile.write(content)
