"""The model picker's catalogue: which pairs a visitor may pick, and a small cache of loaded pairs.

Visitors pick from a fixed list (they never type host paths): the shipped pairs present on disk,
the directories the host passed on the command line, and the registered hub pairs, which are
offered only when the host started the app with --allow-downloads (a shared link must not make
the host download tens of GB).
"""
import threading
from collections import OrderedDict

from dflash_core.errors import DFlashError
from dflash_core.loading import SHIPPED, load_pair
from dflash_core.registry import known_pairs


def hub_target_id(base: str) -> str:
    """The hub repository of a registered base model name."""
    return f"meta-llama/{base}" if base.lower().startswith("llama") else f"Qwen/{base}"


class Catalogue:
    def __init__(self, worker, local_pairs: list = (), allow_downloads: bool = False, keep: int = 2):
        """local_pairs: [(target_dir, draft_dir)] given by the host."""
        self.worker = worker
        self.allow_downloads = allow_downloads
        self.keep = keep
        self.entries = OrderedDict()  # key -> (label, kind, target, draft)
        for name, (target, _) in SHIPPED.items():
            if target.is_dir():
                self.entries[name] = (f"{name} (shipped)", "shipped", name, None)
        for target, draft in local_pairs:
            key = f"{target} + {draft}"
            self.entries[key] = (f"{key} (local)", "local", target, draft)
        if allow_downloads:
            for base, draft, kind in known_pairs():
                if kind == "hub":
                    self.entries[base] = (f"{base} (hub download)", "hub", hub_target_id(base), draft)
        self._loaded = OrderedDict()  # key -> Pair, most recently used last
        self._lock = threading.Lock()

    def choices(self) -> list:
        return [(label, key) for key, (label, *_) in self.entries.items()]

    def default_key(self):
        return next(iter(self.entries), None)

    def kind(self, key: str) -> str:
        return self.entries[key][1] if key in self.entries else ""

    def is_loaded(self, key: str) -> bool:
        return key in self._loaded

    def get(self, key: str):
        """The loaded Pair for a key, loading it on the MLX worker if needed (DFlashError on failure)."""
        if key not in self.entries:
            raise DFlashError(f"unknown model '{key}'; pick one from the list")
        with self._lock:
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
            _, kind, target, draft = self.entries[key]
            pair = self.worker.call(load_pair, target, draft, self.allow_downloads if kind == "hub" else False)
            self._loaded[key] = pair
            while len(self._loaded) > self.keep:
                self._loaded.popitem(last=False)
            return pair
