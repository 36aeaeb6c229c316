"""A Hugging Face hub on a loopback port, for the tests: the endpoints and headers that
huggingface-hub (2.x) really uses, answered as huggingface.co answers them.

- `GET /api/models/ORG/NAME[/revision/REV][?blobs=True]`: model_info (repo_info), the siblings
  with their sizes, blob ids and LFS metadata when `blobs` is asked for;
- `GET /api/models/ORG/NAME/tree/REV?recursive=...`: the file listing snapshot_download saves;
- `HEAD|GET /ORG/NAME/resolve/REV/FILE`: a small file answers 200 with `ETag` (its git blob id),
  `Content-Length` and `X-Repo-Commit`; an LFS file (weights) answers 302 with `Location` on
  another origin (the CDN below), `X-Linked-Etag` (its sha256), `X-Linked-Size`, `X-Repo-Commit`;
- the CDN, a second server: `GET /repos/SHA256` with `Range: bytes=N-` answered 206 + `Content-Range`.

Errors carry the hub's `X-Error-Code` (RepoNotFound, GatedRepo, EntryNotFound, RevisionNotFound),
which huggingface-hub turns into its exception types. Faults on request: a gated repository (401
on its files), a missing repository or file (it is simply not added), HTTP 500, a request that
hangs, a download cut half way (the connection closed mid-body, as a dropped network does), and a
slow download. Every request is logged as (method, path, Range header)."""

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")  # what the hub's .gitattributes puts in LFS


@dataclass
class HubFile:
    data: bytes
    git_sha: str  # the git blob id: a small file's ETag
    sha256: str | None  # an LFS file's oid: its ETag, and its name on the CDN

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None


@dataclass
class HubRepo:
    commit: str
    files: dict  # path in the repository -> HubFile
    gated: bool = False


@dataclass
class Fault:
    """What to do to requests for a repository (file None: any of its requests; an LFS file's: its
    download from the CDN, not the hub's answer about it)."""

    kind: str  # "500", "hang", "cut" (close the CDN body half way) or "slow" (a CDN body in 20 pieces over `seconds`)
    file: str | None = None
    times: int | None = None  # how many requests it hits (None: all)
    seconds: float = 2.0
    hits: int = field(default=0, init=False)


class LocalHub:
    def __init__(self):
        self.repos = {}
        self.faults = {}  # repo -> [Fault]
        self.requests = []  # (method, path, Range header or None), hub and CDN alike
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.hub = _server(self, cdn=False)
        self.cdn = _server(self, cdn=True)
        self.url = f"http://127.0.0.1:{self.hub.server_port}"
        self.cdn_url = f"http://127.0.0.1:{self.cdn.server_port}"
        for server in (self.hub, self.cdn):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self):
        self._stop.set()  # a hanging request returns
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- what it serves ------------------------------------------------------------------
    def add_repo(self, repo: str, source: Path, gated: bool = False) -> dict:
        """Serve the files of directory `source` as repository `repo`; returns {path: size}."""
        files = {}
        for p in sorted(Path(source).rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                name = p.relative_to(source).as_posix()
                git_sha = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                sha256 = hashlib.sha256(data).hexdigest() if name.endswith(LFS_SUFFIXES) else None
                files[name] = HubFile(data, git_sha, sha256)
        commit = hashlib.sha1(repo.encode() + b"".join(f.data for f in files.values())).hexdigest()
        self.repos[repo] = HubRepo(commit, files, gated)
        return {name: len(f.data) for name, f in files.items()}

    def fault(self, repo: str, kind: str, file: str = None, times: int = None, seconds: float = 2.0) -> Fault:
        f = Fault(kind, file, times, seconds)
        self.faults.setdefault(repo, []).append(f)
        return f

    def requested(self, repo: str = None, method: str = None) -> list:
        """The logged requests (method, path, range) for a repository's files and API routes (a
        CDN request counts for the repository whose blob it fetches)."""
        out = []
        for m, path, rng in list(self.requests):
            owner = _repo_of(path) or _blob_repo(self, path)
            if (repo is None or owner == repo) and (method is None or m == method):
                out.append((m, path, rng))
        return out

    def _fault_for(self, repo: str, file: str | None, kinds: tuple):
        with self._lock:
            for f in self.faults.get(repo, []):
                if f.kind in kinds and f.file in (None, file) and (f.times is None or f.hits < f.times):
                    f.hits += 1
                    return f
        return None


def _repo_of(path: str) -> str | None:
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "models"] and len(parts) >= 4:
        return "/".join(parts[2:4])
    if len(parts) >= 4 and parts[2] == "resolve":
        return "/".join(parts[:2])
    return None


def _blob_repo(hub: LocalHub, path: str) -> str | None:
    sha = path.removeprefix("/repos/")
    return next((name for name, r in hub.repos.items() if any(f.sha256 == sha for f in r.files.values())), None)


def _server(hub: LocalHub, cdn: bool) -> ThreadingHTTPServer:
    handler = type("Handler", (_CdnHandler if cdn else _HubHandler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return server


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHub
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects of the hub

    def log_message(self, *args):  # quiet: the tests read hub.requests
        pass

    def _log(self):
        self.hub.requests.append((self.command, urlsplit(self.path).path, self.headers.get("Range")))

    def _send(self, status: int, headers: dict = None, body: bytes = b"", length: int = None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value, headers: dict = None):
        self._send(
            status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, json.dumps(value).encode()
        )

    def _error(self, status: int, code: str | None, message: str, headers: dict = None):
        extra = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {}), **(headers or {})}
        self._json(status, {"error": message}, extra)

    def _apply(self, repo: str, file: str | None, kinds: tuple) -> bool:
        """A 500 or a hang for this request, if one is asked for; True when it answered."""
        fault = self.hub._fault_for(repo, file, kinds)
        if fault is None:
            return False
        if fault.kind == "hang":
            self.hub._stop.wait()  # until the hub closes: the client's timeout ends it first
            self.close_connection = True
            return True
        self._error(500, None, "Internal Error - We're working hard to fix this as soon as possible!")
        return True


class _HubHandler(_Handler):
    def do_HEAD(self):
        self._route()

    def do_GET(self):
        self._route()

    def _route(self):
        self._log()
        path = unquote(urlsplit(self.path).path)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._api("/".join(parts[2:4]), parts[4:])
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
        self._error(404, None, "Not Found")

    def _repo(self, repo: str) -> HubRepo | None:
        found = self.hub.repos.get(repo)
        if found is None:  # what the hub tells a client without a token about a missing or private repository
            self._error(401, "RepoNotFound", "Repository not found")
        return found

    def _revision(self, r: HubRepo, revision: str) -> bool:
        if revision in ("main", r.commit):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return False

    def _api(self, repo: str, rest: list):
        if self._apply(repo, None, ("500", "hang")):
            return
        r = self._repo(repo)
        if r is None:
            return
        if rest[:1] == ["tree"] and len(rest) >= 2:
            if self._revision(r, rest[1]):
                self._json(200, [self._tree_entry(name, f) for name, f in r.files.items()])
            return
        if rest[:1] == ["revision"] and not self._revision(r, "/".join(rest[1:])):
            return
        blobs = "blobs=" in (urlsplit(self.path).query or "").lower()
        siblings = [{"rfilename": name} for name in r.files]
        if blobs:
            for s, f in zip(siblings, r.files.values()):
                s.update(size=len(f.data), blobId=f.git_sha)
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": 134}
        org, name = repo.split("/")
        info = {
            "_id": r.commit[:24],
            "id": repo,
            "modelId": repo,
            "author": org,
            "sha": r.commit,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "private": False,
            "gated": "manual" if r.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["safetensors"],
            "library_name": "mlx",
            "siblings": siblings,
            "createdAt": "2026-01-01T00:00:00.000Z",
        }
        self._json(200, info)

    @staticmethod
    def _tree_entry(name: str, f: HubFile) -> dict:
        entry = {"type": "file", "oid": f.git_sha, "size": len(f.data), "path": name}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
        return entry

    def _resolve(self, repo: str, revision: str, file: str):
        served = self.hub.repos.get(repo)
        lfs = served is not None and file in served.files and served.files[file].lfs
        if self._apply(repo, None if lfs else file, ("500", "hang")):  # an LFS file's own faults: on the CDN
            return
        r = self._repo(repo)
        if r is None or not self._revision(r, revision):
            return
        if r.gated:
            self._error(
                401,
                "GatedRepo",
                f"Access to model {repo} is restricted. You must have access to it and be authenticated to access it. Please log in.",
            )
            return
        f = r.files.get(file)
        commit = {"X-Repo-Commit": r.commit}
        if f is None:
            self._error(404, "EntryNotFound", "Entry not found", commit)
            return
        if f.lfs:  # the hub redirects an LFS file to its CDN, the metadata on the redirect itself
            self._send(
                302,
                {
                    **commit,
                    "Location": f"{self.hub.cdn_url}/repos/{f.sha256}",
                    "ETag": f'"{f.sha256}"',
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(len(f.data)),
                    "Content-Type": "text/plain; charset=utf-8",
                },
                b"Found. Redirecting",
            )
            return
        self._send(
            200,
            {**commit, "ETag": f'"{f.git_sha}"', "Accept-Ranges": "bytes", "Content-Type": "text/plain; charset=utf-8"},
            f.data,
        )


class _CdnHandler(_Handler):
    """Blobs by sha256, with Range, as the hub's CDN serves them."""

    def do_HEAD(self):
        self._blob()

    def do_GET(self):
        self._blob()

    def _blob(self):
        self._log()
        sha = urlsplit(self.path).path.removeprefix("/repos/")
        found = next(
            ((name, path, f) for name, r in self.hub.repos.items() for path, f in r.files.items() if f.sha256 == sha),
            None,
        )
        if found is None:
            self._send(404, body=b"NoSuchKey")
            return
        repo, path, f = found
        if self._apply(repo, path, ("500", "hang")):
            return
        start, status, headers = 0, 200, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"}
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start = int(first)
            if start >= len(f.data) or (last and int(last) != len(f.data) - 1):
                self._send(416, {"Content-Range": f"bytes */{len(f.data)}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(f.data) - 1}/{len(f.data)}"
        body = f.data[start:]
        cut = self.command == "GET" and self.hub._fault_for(repo, path, ("cut",))
        slow = self.command == "GET" and not cut and self.hub._fault_for(repo, path, ("slow",))
        if not (cut or slow):
            self._send(status, headers, body)
            return
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        if cut:  # half the body, then the connection drops
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        pieces = 20
        for i in range(pieces):
            self.wfile.write(body[i * len(body) // pieces : (i + 1) * len(body) // pieces])
            self.wfile.flush()
            time.sleep(slow.seconds / pieces)
