"""The model picker's catalogue: which pairs a visitor may pick, and a small cache of loaded pairs.

Visitors pick from a fixed list (they never type host paths): the pair the host named on the
command line (a local directory or a hub id, the host's own choice), the shipped pairs present on
disk, and the registered hub pairs, which are offered only when the host started the app with
--allow-downloads (a shared link must not make the host download tens of GB). A hub pair that is
not in the cache yet is downloaded only when a visitor, shown its size, asks for it (download()).
"""

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

from dflash_core.engine.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from dflash_core.errors import DFlashError
from dflash_core.models.loading import load_planned, plan_pair, with_draft_quant
from dflash_core.models.registry import CHAT_PAIRS, SHIPPED, known_pairs

HUB_KINDS = {"mlx-4bit": "4-bit MLX", "original": "original weights"}


@dataclass
class Entry:
    label: str
    kind: str  # "host" (named on the command line), "shipped" or "hub" (the registry's)
    target: str
    draft: str  # None: the shipped pair's own, or the registry's draft for the target


class Catalogue:
    def __init__(self, worker, host_pairs: list = (), allow_downloads: bool = False, keep: int = 2):
        """host_pairs: [(model, draft)] named by the host, listed first; draft None = the shipped
        pair of that name, or the registry's draft for the model."""
        self.worker = worker
        self.allow_downloads = allow_downloads
        self.keep = keep
        self.entries = OrderedDict()  # key -> Entry
        for model, draft in host_pairs:
            if model in SHIPPED and draft is None:
                continue  # listed with the shipped pairs below
            key = self.key_of(model, draft)
            self.entries[key] = Entry(key, "host", model, draft)
        for name, (target, _) in SHIPPED.items():
            if target.exists():  # SmolLM2's GGUF comes with scripts/install.sh
                self.entries[name] = Entry(f"{name} (shipped)", "shipped", name, None)
        for model, _ in host_pairs:
            if model in self.entries:
                self.entries.move_to_end(model, last=False)  # the host's shipped pick leads
        if allow_downloads:  # the 4-bit conversions first: what fits a laptop
            hub = [p for p in known_pairs() if p.kind in HUB_KINDS and not p.gated]
            for p in sorted(hub, key=lambda p: p.kind != "mlx-4bit"):
                self.entries[p.target] = Entry(
                    f"{p.base} · {HUB_KINDS[p.kind]} (hub download{', name unconfirmed' if p.unconfirmed else ''})",
                    "hub",
                    p.target,
                    p.draft,
                )
        self._plans = {}  # key -> PairPlan: configs read, draft checked, downloads done so far
        self._loaded = OrderedDict()  # (key, draft bits) -> Pair, most recently used last
        self._lock = threading.Lock()

    def choices(self) -> list:
        return [(e.label, key) for key, e in self.entries.items()]

    def default_key(self):
        return next(iter(self.entries), None)

    def kind(self, key: str) -> str:
        return self.entries[key].kind if key in self.entries else ""

    def loaded(self, key: str):
        """A loaded Pair of this key (any draft precision), or None."""
        return next((pair for (k, _), pair in reversed(self._loaded.items()) if k == key), None)

    def is_chat(self, key: str) -> bool:
        """Whether the page starts this pair with the chat template on: the loaded pair's own default
        (Pair.chat_default); before it loads, hub pairs and the shipped chat model are chat models."""
        pair = self.loaded(key)
        if pair is not None:
            return pair.chat_default
        return self.kind(key) == "hub" or (key in self.entries and self.entries[key].target in CHAT_PAIRS)

    def is_loaded(self, key: str, draft_quant: int = None) -> bool:
        return (key, draft_quant) in self._loaded

    @staticmethod
    def key_of(model: str, draft: str = None) -> str:
        return model if draft is None else f"{model} + {draft}"

    def add_loaded(self, key: str, pair):
        """A pair the host already loaded (the server's), so it is not loaded twice."""
        self._loaded[(key, pair.draft_quant)] = pair

    def plan(self, key: str):
        """The pair's PairPlan: its configs read and the draft checked against the target, on the
        MLX worker (a GGUF target converts there); downloads nothing large."""
        if key not in self.entries:
            raise DFlashError(f"unknown model '{key}'; pick one from the list")
        if key not in self._plans:
            e = self.entries[key]
            # the host's own pick may download; visitors' hub picks only with --allow-downloads
            allow = e.kind == "host" or (e.kind == "hub" and self.allow_downloads)
            self._plans[key] = self.worker.call(plan_pair, e.target, e.draft, allow)
        return self._plans[key]

    def pending_download(self, key: str):
        """The plan of a pair whose hub files are not all in the cache yet, else None."""
        if self.loaded(key) is not None:
            return None
        plan = self.plan(key)
        return plan if plan.downloads() else None

    def download(self, key: str, log=lambda message: None):
        """Download what the pair still needs, the draft first, in the calling thread: a Gradio
        handler's, so that gr.Progress(track_tqdm=True) shows the hub's own progress bars on the page."""
        self._plans[key] = self.plan(key).fetch("draft", log).fetch("target", log)

    def get(self, key: str, draft_quant: int = None):
        """The loaded Pair for a key, loading it on the MLX worker if needed (DFlashError on failure).
        Another draft precision of a loaded pair reloads only its draft."""
        plan = self.plan(key)
        with self._lock:
            if (key, draft_quant) in self._loaded:
                self._loaded.move_to_end((key, draft_quant))
                return self._loaded[(key, draft_quant)]
            loaded = self.loaded(key)
            if loaded is not None:
                pair = self.worker.call(with_draft_quant, loaded, draft_quant)
            else:
                if plan.downloads():
                    if self.kind(key) != "host":
                        raise DFlashError(
                            f"{plan.name} is not downloaded yet ({'; '.join(plan.notice()[0])}); "
                            "press Download to fetch it first"
                        )
                    # the host named it: its download shows in the host's terminal
                    self.download(key, log=lambda m: print(m, file=sys.stderr, flush=True))
                    plan = self._plans[key]
                pair = self.worker.call(load_planned, plan, draft_quant)
            if pair.prefix_cache is None:  # a prompt run again resumes from its snapshot
                pair.prefix_cache = PrefixCache(DEFAULT_PREFIX_CACHE_MB * 2**20)
            self._loaded[(key, draft_quant)] = pair
            while len(self._loaded) > self.keep:
                self._loaded.popitem(last=False)
            return pair
