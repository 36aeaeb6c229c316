"""The Hugging Face hub side of loading, through huggingface-hub itself (its cache, HF_HUB_OFFLINE,
its progress bars): a model's small config.json before anything large, the snapshot of the files a
model needs, what those weigh before they are downloaded (the hub's file listing; the cache when
offline), and one error line for each way the hub can fail."""

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from ..errors import DFlashError
from .memory import gb

# The files a model needs: weights, configs, tokenizer, chat template (no README, images, other formats)
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt", "*.model", "*.tiktoken"]


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cached(repo: str) -> Path | None:
    """The repository's snapshot when the Hugging Face cache holds all the files it needs, else None.
    No network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo, allow_patterns=HUB_FILES, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):
        return None
    return path if _has_weights(path) else None


def _has_weights(path: Path) -> bool:
    """Whether every weight file is there. huggingface-hub checks a cached snapshot against the
    file listing it saved when it downloaded; a snapshot from an interrupted download by an older
    version, or one fetched file by file, is checked here against its safetensors index."""
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return any(path.glob("*.safetensors"))
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return all((path / name).is_file() for name in shards)


def _labelled_bars(label: str):
    """The hub's progress bar class with every bar's description led by what it downloads
    ("downloading the target REPO: Fetching 4 files"), in a terminal and on the page alike: the page shows
    the newest bar's description alone, so a line said before the bars start is soon covered."""
    from huggingface_hub.utils import tqdm

    class Labelled(tqdm):
        def __init__(self, *args, desc: str = None, **kwargs):
            super().__init__(*args, desc=f"downloading {label}: {desc}" if desc else f"downloading {label}", **kwargs)

    return Labelled


def config(repo: str, what: str, allow_download: bool = True) -> dict:
    """The repository's config.json alone (a few kB): from the cache, else from the hub."""
    from huggingface_hub import hf_hub_download

    def fetch(local: bool):
        if not local and not isinstance(_cached_file(repo, "config.json"), str):
            _look_up(repo, "config.json")
        return hf_hub_download(repo, "config.json", local_files_only=local)

    path = _call(fetch, repo, what, allow_download)
    try:
        return json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DFlashError(f"{what} '{repo}' has a config.json that is not valid JSON ({e})") from None


def _look_up(repo: str, filename: str):
    """One HEAD request for a file that is not in the cache, without retries: hf_hub_download
    retries a file it cannot find in the cache five times with backoff (about 25 s of waiting and a
    warning a try) when the hub does not answer or answers 5xx; this fails at once instead."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    get_hf_file_metadata(hf_hub_url(repo, filename), timeout=constants.HF_HUB_ETAG_TIMEOUT)


def snapshot(repo: str, what: str, allow_download: bool = True) -> Path:
    """The files the model needs, downloaded into the Hugging Face cache where missing (the hub's
    own progress bars go to stderr; a Gradio handler with gr.Progress(track_tqdm=True) shows them)."""
    from huggingface_hub import snapshot_download

    path = cached(repo)
    if path is not None:
        return path
    if (offline() or not allow_download) and isinstance(_cached_file(repo, "config.json"), str):
        # its config is here, some weights are not (an interrupted download), and none may come
        why = (
            f"HF_HUB_OFFLINE=1 is set; run `hf download {repo}` online to complete it, or unset HF_HUB_OFFLINE"
            if offline()
            else "downloads are off on this host; start the app with --allow-downloads"
        )
        raise DFlashError(f"{what} '{repo}' is only partly in the Hugging Face cache and {why}")
    path = Path(
        _call(
            lambda local: snapshot_download(
                repo, allow_patterns=HUB_FILES, local_files_only=local, tqdm_class=_labelled_bars(f"the {what} {repo}")
            ),
            repo,
            what,
            allow_download,
        )
    )
    if not _has_weights(path):
        raise DFlashError(
            f"{what} '{repo}' has no complete set of .safetensors weights on the hub; "
            "is it an MLX or Hugging Face model repository?"
        )
    return path


def _cached_file(repo: str, filename: str):
    from huggingface_hub import try_to_load_from_cache

    return try_to_load_from_cache(repo, filename)


def _call(fetch, repo: str, what: str, allow_download: bool):
    """fetch(local_files_only), its failures as one line that says what to do."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return fetch(offline() or not allow_download)
    except LocalEntryNotFoundError as e:
        if offline():
            raise DFlashError(
                f"{what} '{repo}' is not in the Hugging Face cache and HF_HUB_OFFLINE=1 is set; "
                f"run `hf download {repo}` online first, or unset HF_HUB_OFFLINE"
            ) from None
        if not allow_download:
            raise DFlashError(
                f"{what} '{repo}' is not downloaded and downloads are off on this host; "
                "start the app with --allow-downloads or pick a local pair"
            ) from None
        # online: huggingface-hub says "not in the cache" for why the hub failed, its cause
        raise DFlashError(_unreachable(e.__cause__, repo, what)) from None
    except HFValidationError:
        raise DFlashError(f"{what} '{repo}' is neither a local directory nor a hub id") from None
    except GatedRepoError:
        raise DFlashError(
            f"{what} '{repo}' is gated: accept its license on huggingface.co and log in with "
            "`hf auth login`, or use an mlx-community conversion (`dflash models` lists them)"
        ) from None
    except RepositoryNotFoundError:
        raise DFlashError(f"{what} '{repo}' is not on the Hugging Face hub (or is private); check the name") from None
    except EntryNotFoundError as e:
        name = _requested_file(e) or "config.json"
        raise DFlashError(f"{what} '{repo}' has no {name} on the hub; is it a model repository?") from None
    except Exception as e:  # no connection, no answer, HTTP errors, the hub down
        raise DFlashError(_unreachable(e, repo, what)) from None


def _requested_file(error) -> str | None:
    """The file a hub request that failed asked for (its /resolve/REVISION/FILE url), if any."""
    response = getattr(error, "response", None)
    url = str(response.url) if response is not None else ""
    return unquote(url.split("/resolve/", 1)[1].split("/", 1)[1]) if "/resolve/" in url else None


def _unreachable(error, repo: str, what: str) -> str:
    """One line for a hub that could not be reached, did not answer, or failed (5xx)."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError

    where = f"the hub ({constants.ENDPOINT})"
    if isinstance(error, httpx2.TimeoutException):
        return f"could not download {what} '{repo}': {where} did not answer in time; try again later"
    if isinstance(error, httpx2.TransportError):
        return f"could not download {what} '{repo}': no connection to {where}; check the network (and HF_ENDPOINT)"
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return (
            f"could not download {what} '{repo}': {where} answered HTTP {error.response.status_code}; try again later"
        )
    return f"could not fetch {what} '{repo}' from the hub: {type(error).__name__}: {error}".splitlines()[0]


@dataclass
class RepoSize:
    """What a repository's needed files weigh. `total` None: unknown (offline, not in the cache)."""

    repo: str
    total: int | None
    to_download: int | None  # of which not in the cache yet
    source: str  # "cache" (all there, measured on disk), "hub" (its file listing) or "unknown"

    def text(self) -> str:
        if self.total is None:
            return "size unknown offline" if offline() else "size unknown (the hub did not answer)"
        if self.source == "cache":
            return f"{gb(self.total)} in the cache"
        if gb(self.to_download) != gb(self.total):  # not for the configs read before it: a few kB
            return f"{gb(self.total)} ({gb(self.to_download)} to download)"
        return gb(self.total)


def size(repo: str) -> RepoSize:
    """The sizes of the files the model needs: measured in the cache when all are there (no
    network), else from the hub's file listing (one request; none when offline)."""
    path = cached(repo)
    if path is not None:
        return RepoSize(repo, local_size(path), 0, "cache")
    if offline():
        return RepoSize(repo, None, None, "unknown")
    from huggingface_hub import HfApi, constants
    from huggingface_hub.utils import filter_repo_objects

    try:
        info = HfApi().model_info(repo, files_metadata=True, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception:  # no connection, gated, gone: the size is only information
        return RepoSize(repo, None, None, "unknown")
    files = list(filter_repo_objects(info.siblings or [], allow_patterns=HUB_FILES, key=lambda f: f.rfilename))
    total = sum(f.size or 0 for f in files)
    missing = sum(f.size or 0 for f in files if not isinstance(_cached_file(repo, f.rfilename), str))
    return RepoSize(repo, total, missing, "hub")


def local_size(path: Path) -> int:
    """Bytes of a model directory's files (a cache snapshot's links are followed to their blobs)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def weights_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
