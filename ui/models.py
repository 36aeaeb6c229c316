"""The model picker's catalogue: which pairs a visitor may pick, and a small cache of loaded pairs.

Visitors pick from a fixed list (they never type host paths): the pair the host named on the
command line (a local directory or a hub id, the host's own choice), the shipped pairs present on
disk, and the registered hub pairs, which are offered only when the host started the app with
--allow-downloads (a shared link must not make the host download tens of GB).
"""
import threading
from collections import OrderedDict

from dflash_core.errors import DFlashError
from dflash_core.loading import CHAT_PAIRS, SHIPPED, load_pair
from dflash_core.registry import hub_target, known_pairs


class Catalogue:
    def __init__(self, worker, host_pairs: list = (), allow_downloads: bool = False, keep: int = 2):
        """host_pairs: [(model, draft)] named by the host, listed first; draft None = the shipped
        pair of that name, or the registry's draft for the model."""
        self.worker = worker
        self.allow_downloads = allow_downloads
        self.keep = keep
        self.entries = OrderedDict()  # key -> (label, kind, target, draft)
        for model, draft in host_pairs:
            if model in SHIPPED and draft is None:
                continue  # listed with the shipped pairs below
            key = self.key_of(model, draft)
            self.entries[key] = (key, "host", model, draft)
        for name, (target, _) in SHIPPED.items():
            if target.exists():  # SmolLM2's GGUF comes with scripts/install.sh
                self.entries[name] = (f"{name} (shipped)", "shipped", name, None)
        for model, _ in host_pairs:
            if model in self.entries:
                self.entries.move_to_end(model, last=False)  # the host's shipped pick leads
        if allow_downloads:
            for base, draft, kind in known_pairs():
                if kind == "hub":
                    self.entries[base] = (f"{base} (hub download)", "hub", hub_target(base), draft)
        self._loaded = OrderedDict()  # key -> Pair, most recently used last
        self._lock = threading.Lock()

    def choices(self) -> list:
        return [(label, key) for key, (label, *_) in self.entries.items()]

    def default_key(self):
        return next(iter(self.entries), None)

    def kind(self, key: str) -> str:
        return self.entries[key][1] if key in self.entries else ""

    def is_chat(self, key: str) -> bool:
        """Whether the page starts this pair with the chat template on: hub pairs and the shipped
        chat model are chat models; the stdlib pair completes code."""
        return self.kind(key) == "hub" or (key in self.entries and self.entries[key][2] in CHAT_PAIRS)

    def is_loaded(self, key: str) -> bool:
        return key in self._loaded

    @staticmethod
    def key_of(model: str, draft: str = None) -> str:
        return model if draft is None else f"{model} + {draft}"

    def add_loaded(self, key: str, pair):
        """A pair the host already loaded (the server's), so it is not loaded twice."""
        self._loaded[key] = pair

    def get(self, key: str):
        """The loaded Pair for a key, loading it on the MLX worker if needed (DFlashError on failure)."""
        if key not in self.entries:
            raise DFlashError(f"unknown model '{key}'; pick one from the list")
        with self._lock:
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
            _, kind, target, draft = self.entries[key]
            # the host's own pick may download; visitors' hub picks only with --allow-downloads
            allow = {"host": True, "hub": self.allow_downloads}.get(kind, False)
            pair = self.worker.call(load_pair, target, draft, allow)
            self._loaded[key] = pair
            while len(self._loaded) > self.keep:
                self._loaded.popitem(last=False)
            return pair
