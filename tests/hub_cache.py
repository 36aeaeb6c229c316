"""A Hugging Face cache laid out as huggingface-hub writes it, filled from local model directories,
so that hub ids load offline (HF_HUB_OFFLINE=1) through the real huggingface-hub.

One repository is `models--ORG--NAME/` with `blobs/` (each file's content, named by its git blob
hash, or its sha256 for LFS files such as weights), `snapshots/COMMIT/PATH` (relative links to the
blobs), `refs/main` (the commit) and `trees/COMMIT.json` (the repository's file listing that
huggingface-hub >= 2 saves when it downloads, and checks an offline snapshot against).
"""

import hashlib
import json
import os
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def put_repo(cache: Path, repo: str, source: Path, leave_out=(), listing: bool = True) -> dict:
    """Put `source`'s files into `cache` as repository `repo` (a downloaded snapshot); the files
    named in `leave_out` are listed but not there, as after an interrupted download (a later call
    without them completes the snapshot, as a finished download would). Returns
    {path in repo: size} of all the files, the left-out ones included."""
    files = {p.relative_to(source).as_posix(): p.read_bytes() for p in sorted(Path(source).rglob("*")) if p.is_file()}
    commit = hashlib.sha1(repo.encode() + b"".join(files.values())).hexdigest()
    root = Path(cache) / f"models--{repo.replace('/', '--')}"
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    tree = {}
    for name, data in files.items():
        git_sha = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        entry = {"size": len(data), "blob_id": git_sha}
        blob = git_sha
        if name.endswith(LFS_SUFFIXES):
            blob = hashlib.sha256(data).hexdigest()
            entry.update(lfs_sha256=blob, lfs_size=len(data))
        tree[name] = entry
        link = root / "snapshots" / commit / name
        if name in leave_out or link.is_symlink():  # left out, or there from an earlier call
            continue
        (root / "blobs" / blob).write_bytes(data)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(root / "blobs" / blob, link.parent))
    if listing:
        (root / "trees").mkdir(exist_ok=True)
        (root / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": tree}, indent=1))
    return {name: entry["size"] for name, entry in tree.items()}
