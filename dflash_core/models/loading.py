"""The one loader: resolve a local directory or hub id, load target and draft, check they fit.

A hub pair is resolved in the order that costs least when something is wrong: the draft's
config.json, then the target's (a few kB each), the draft checked against the target, then the
draft's weights, then the target's. An unmatched draft is one error line before anything large."""

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx

from .. import backend
from ..engine.draft import DRAFT_VOCAB_FILE, QUANT_GROUP, DraftConfig, DraftModel, quantize_draft
from ..engine.target import Target
from ..errors import DFlashError
from . import distributed, hub, memory
from .pair import Pair
from .registry import CHAT_PAIRS, DEFAULT_PAIR, SHIPPED, SMOLLM2_FETCH, draft_for, gpu_dtype

DRAFT_QUANT_BITS = (4, 8)


def resolve(name: str, what: str, allow_download: bool = True) -> Path:
    """A local directory, or a hub id fetched through huggingface-hub (its cache, HF_HUB_OFFLINE)."""
    return local_dir(name, what) or hub.snapshot(name, what, allow_download)


def local_dir(name: str, what: str) -> Path | None:
    """A local model directory (a target's GGUF file converted into one), or None for a hub id."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf" and what == "target":
        from .gguf import converted

        return converted(path, log=lambda m: print(m, file=sys.stderr, flush=True))
    if path.exists():
        raise DFlashError(
            f"{what} '{name}' is a file; give the model's directory" + (" or a .gguf file" if what == "target" else "")
        )
    looks_local = name.startswith((".", "/", "~")) or name.count("/") != 1
    if looks_local:
        raise DFlashError(f"{what} '{name}' does not exist; check the path")
    return None


def _read_config(path: Path, what: str) -> dict:
    cfg = path / "config.json"
    if not cfg.is_file():
        raise DFlashError(f"{what} directory '{path}' has no config.json")
    try:
        return json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DFlashError(f"{cfg} is not valid JSON ({e})") from None


def _weight_files(path: Path, what: str) -> list:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DFlashError(f"{what} directory '{path}' has no .safetensors weight files")
    return files


def _load_weights(files: list) -> dict:
    weights = {}
    for f in files:
        try:
            weights.update(mx.load(str(f)))
        except Exception as e:
            raise DFlashError(
                f"weight file '{f}' is unreadable or corrupt ({e}); re-download it".splitlines()[0]
            ) from None
    return weights


def _ready(module, dtype=None):
    """Compute dtype (`dtype`, else float32 on a CPU; see backend.compute_dtype) and the weights
    read now, not mid-generation.
    On a CPU a quantized model is dequantized: MLX's quantized matmuls there are slower than
    float32 BLAS (SmolLM2-135M 4-bit: one token 222 ms vs 100 ms dequantized, 2 cores)."""
    if backend.on_cpu():
        from mlx_lm.utils import dequantize_model

        dequantize_model(module)
    dtype = dtype or backend.compute_dtype()
    if dtype is not None:
        module.set_dtype(dtype)
    mx.eval(module.parameters())
    return module


def load_target(path: Path, dtype=None):
    """(model, tokenizer, config) through mlx-lm, computing in `dtype` (float32 on a CPU)."""
    from mlx_lm.utils import load_model, load_tokenizer

    config = _read_config(path, "target")
    files = _weight_files(path, "target")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise DFlashError(f"target directory '{path}' has no tokenizer.json")
    _load_weights(files)  # names a corrupt file before mlx-lm's less specific error
    sharded = distributed.size() > 1  # under mlx.launch: split across the group (distributed.py)
    try:
        model, config = load_model(path, lazy=sharded)
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except DFlashError:
        raise
    except Exception as e:
        raise DFlashError(f"could not load target from '{path}': {type(e).__name__}: {e}".splitlines()[0]) from None
    if sharded:
        distributed.shard(model)
    return _ready(model, dtype), tokenizer, config


def _draft_config(raw: dict, where: str) -> DraftConfig:
    try:
        cfg = DraftConfig.from_dict(raw)
    except KeyError as e:
        raise DFlashError(f"draft config {where} lacks {e}; is this a DFlash draft?") from None
    if not cfg.target_layer_ids or cfg.mask_token_id is None:
        raise DFlashError(
            f"draft config {where} has no dflash_config.target_layer_ids / mask_token_id; is this a DFlash draft?"
        )
    return cfg


def _draft_vocab(path: Path, vocab_size: int) -> tuple | None:
    """The tokens the draft may propose, if its directory says (see Target.draft_head)."""
    file = path / DRAFT_VOCAB_FILE
    if not file.is_file():
        return None
    try:
        tokens = json.loads(file.read_text())["tokens"]
        valid = bool(tokens) and all(isinstance(t, int) and 0 <= t < vocab_size for t in tokens)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        valid = False
    if not valid:
        raise DFlashError(
            f'{file} must hold {{"tokens": [token ids below {vocab_size}]}}; '
            "remove it to let the draft propose any token"
        )
    return tuple(tokens)


def load_draft(path: Path, dtype=None) -> DraftModel:
    cfg = _draft_config(_read_config(path, "draft"), str(path / "config.json"))
    cfg = replace(cfg, draft_vocab=_draft_vocab(path, cfg.vocab_size))
    files = _weight_files(path, "draft")
    weights = _load_weights(files)
    weights = {k.removeprefix("model."): v for k, v in weights.items()}
    draft = DraftModel(cfg)
    try:
        draft.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise DFlashError(f"draft weights in '{path}' do not match its config.json: {e}".splitlines()[0]) from None
    return _ready(draft, dtype)


def _check_dims(cfg: DraftConfig, hidden, vocab, num_target_layers):
    """The draft against the target's sizes (a size None: not known yet, checked after loading)."""
    fix = "pick the draft made for this target (`dflash models` lists the known pairs)"
    if hidden is not None and hidden != cfg.hidden_size:
        raise DFlashError(f"draft hidden_size {cfg.hidden_size} != target hidden size {hidden}; {fix}")
    if vocab is not None and cfg.vocab_size != vocab:
        raise DFlashError(f"draft vocab_size {cfg.vocab_size} != target vocabulary {vocab}; {fix}")
    if num_target_layers is not None:
        bad = [i for i in cfg.target_layer_ids if not 0 <= i < num_target_layers]
        if bad:
            raise DFlashError(
                f"draft target_layer_ids {bad} are outside the target's {num_target_layers} layers; {fix}"
            )
        if cfg.num_target_layers and cfg.num_target_layers != num_target_layers:
            raise DFlashError(
                f"draft expects a {cfg.num_target_layers}-layer target, this one has {num_target_layers}; {fix}"
            )
    if vocab is not None and not 0 <= cfg.mask_token_id < vocab:
        raise DFlashError(
            f"draft mask_token_id {cfg.mask_token_id} is outside the target's vocabulary (0..{vocab - 1})"
        )


def check_config_fit(cfg: DraftConfig, target_config: dict):
    """Before any weights are loaded or downloaded: the draft against the target's config.json
    (Qwen3.5's sizes are in its text_config)."""
    text = {**target_config, **(target_config.get("text_config") or {})}
    _check_dims(cfg, text.get("hidden_size"), text.get("vocab_size"), text.get("num_hidden_layers"))


def check_fit(model, draft: DraftModel, num_target_layers: int):
    embed = Target.text_model(model).embed_tokens
    if hasattr(embed, "num_embeddings"):  # quantized: the packed weight has other columns
        vocab, hidden = embed.num_embeddings, embed.dims
    else:
        vocab, hidden = embed.weight.shape
    _check_dims(draft.config, hidden, vocab, num_target_layers)


@dataclass
class PairPlan:
    """A pair resolved before any weights are downloaded: both configs read (a hub model's
    config.json alone) and the draft checked against the target. A directory is None while its hub
    repository is not wholly in the cache: fetch() downloads it."""

    name: str
    model: str  # as given: a shipped pair's name, a directory, a GGUF file or a hub id
    draft: str
    target_dir: Path | None
    draft_dir: Path | None
    target_config: dict
    draft_config: DraftConfig
    chat_pair: bool = True  # False: a shipped pair that is no chat model (the stdlib pair)
    allow_download: bool = True
    compute_dtype: object = None  # what the pair computes in here (backend.compute_dtype; None: the weights' own)

    def downloads(self) -> list:
        """[(what, hub id)] still to download, the draft first (smaller, and checked first)."""
        parts = [("draft", self.draft, self.draft_dir), ("target", self.model, self.target_dir)]
        return [(what, repo) for what, repo, path in parts if path is None]

    def sizes(self) -> dict:
        """what -> hub.RepoSize of the downloads (the hub's file listing: one request each)."""
        return {what: hub.size(repo) for what, repo in self.downloads()}

    def memory_estimate(self, sizes: dict, draft_quant: int = None) -> int | None:
        """About the bytes the pair will take once loaded, from its weight files (None: a download
        whose size is unknown). A quantized draft: `draft_quant` bits a weight, plus a 16-bit scale
        and bias per group of 64, instead of the computed dtype's 2 or 4 bytes."""

        def weights(what, path):
            return hub.weights_size(path) if path is not None else sizes[what].total

        target, draft = weights("target", self.target_dir), weights("draft", self.draft_dir)
        if target is None or draft is None:
            return None
        draft = memory.loaded_bytes({}, draft)
        if draft_quant:
            draft = int(draft * (draft_quant / 8 + 4 / QUANT_GROUP) / (4 if backend.on_cpu() else 2))
        return memory.loaded_bytes(self.target_config, target) + draft

    def notice(self, draft_quant: int = None) -> tuple:
        """Before anything large: (["the draft REPO: SIZE", ...] of the downloads, the memory the pair
        will take or None, a warning when that is near the device's working set or '')."""
        sizes = self.sizes()
        estimate = self.memory_estimate(sizes, draft_quant)
        warning = memory.fit_warning(estimate, f"the pair {self.name}") if estimate else ""
        return [f"the {what} {s.repo}: {s.text()}" for what, s in sizes.items()], estimate, warning

    def fetch(self, what: str, log=lambda message: None) -> "PairPlan":
        """Download the draft or the target if its hub repository is not all in the cache. The
        hub's progress bars go to stderr, or to the page through gr.Progress(track_tqdm=True)."""
        for part, repo in self.downloads():
            if part == what:
                if self.can_download():
                    log(f"downloading the {what} {repo} ...")
                return replace(self, **{f"{what}_dir": hub.snapshot(repo, what, self.allow_download)})
        return self

    def can_download(self) -> bool:
        return self.allow_download and not hub.offline()


def plan_pair(model: str = None, draft: str = None, allow_download: bool = True) -> PairPlan:
    """Resolve a pair without downloading weights (see PairPlan). With neither given: the shipped
    default pair; a shipped pair's name also works as `model`. Local paths are checked first (a
    GGUF target is converted), then the draft's config, then the target's."""
    model = model or DEFAULT_PAIR  # a draft alone is a new draft for the shipped target
    if model in SHIPPED:
        target_file, shipped_draft = SHIPPED[model]
        if target_file.suffix == ".gguf" and not target_file.is_file():
            raise DFlashError(
                f"the target of the shipped pair '{model}' ({target_file.name}) is not here yet; {SMOLLM2_FETCH}"
            )
        if not shipped_draft.is_dir():
            raise DFlashError(
                f"the shipped pair '{model}' is missing from {shipped_draft.parent}; is this a full clone?"
            )
        target_dir = local_dir(str(target_file), "target")
        draft_dir = shipped_draft if draft is None else local_dir(draft, "draft") or hub.cached(draft)
    else:
        if draft is None:
            draft = draft_for(model)
        target_dir, draft_dir = local_dir(model, "target"), local_dir(draft, "draft")
        target_dir, draft_dir = target_dir or hub.cached(model), draft_dir or hub.cached(draft)
    if draft_dir is not None:
        draft_config = _draft_config(_read_config(draft_dir, "draft"), str(draft_dir / "config.json"))
    else:
        draft_config = _draft_config(hub.config(draft, "draft", allow_download), f"of '{draft}'")
    target_config = (
        _read_config(target_dir, "target") if target_dir is not None else hub.config(model, "target", allow_download)
    )
    check_config_fit(draft_config, target_config)
    return PairPlan(
        name=model if draft is None else f"{model} + {draft}",
        model=model,
        draft=draft,
        target_dir=target_dir,
        draft_dir=draft_dir,
        target_config=target_config,
        draft_config=draft_config,
        chat_pair=not (model in SHIPPED and model not in CHAT_PAIRS),
        allow_download=allow_download,
        compute_dtype=backend.compute_dtype(gpu_dtype(model)),
    )


def _draft_at(path: Path, bits: int = None, dtype=None) -> tuple:
    """(the draft, the layers kept in full precision): with `bits`, its linear layers quantized."""
    draft = load_draft(path, dtype)
    kept = quantize_draft(draft, bits) if bits else []
    mx.eval(draft.parameters())
    return draft, kept


def _with_target(plan: PairPlan, draft_model: DraftModel, kept: list, draft_quant: int = None) -> Pair:
    """Load the plan's target and make the Pair (on the MLX thread)."""
    mlx_model, tokenizer, config = load_target(plan.target_dir, plan.compute_dtype)
    num_layers = len(mlx_model.layers)
    check_fit(mlx_model, draft_model, num_layers)
    text_cfg = config.get("text_config", config)
    context = min(
        text_cfg.get("max_position_embeddings", 1 << 20),
        draft_model.config.max_position_embeddings or 1 << 20,
    )
    return Pair(
        name=plan.name,
        model=mlx_model,
        tokenizer=tokenizer,
        target=Target(mlx_model, draft_model.config.target_layer_ids),
        draft=draft_model,
        context_length=context,
        chat_default=getattr(tokenizer, "has_chat_template", False) and plan.chat_pair,
        draft_dir=plan.draft_dir,
        thinking_switch=_has_thinking_switch(tokenizer),
        draft_quant=draft_quant,
        draft_full_precision=kept,
        compute_dtype=plan.compute_dtype,
    )


def load_planned(plan: PairPlan, draft_quant: int = None) -> Pair:
    """Load a plan whose files are all here (on the MLX thread): the draft, then the target;
    `draft_quant` 4 or 8 quantizes the draft's linear layers (quantize_draft)."""
    if plan.downloads():
        raise DFlashError(f"{plan.name} is not downloaded yet")  # fetch() first
    return _with_target(plan, *_draft_at(plan.draft_dir, draft_quant, plan.compute_dtype), draft_quant)


def with_draft_quant(pair: Pair, draft_quant: int = None) -> Pair:
    """The same pair with its draft reloaded at another precision (the target is shared; the
    prefix cache is not: its snapshots hold the other draft's context)."""
    draft_model, kept = _draft_at(pair.draft_dir, draft_quant, pair.compute_dtype)
    return replace(
        pair, draft=draft_model, draft_quant=draft_quant, draft_full_precision=kept, blas_threads={}, prefix_cache=None
    )


def _has_thinking_switch(tokenizer) -> bool:
    """Whether the chat template renders differently with thinking on (Qwen3's enable_thinking;
    mlx-lm passes it on under the name the template uses)."""
    if not getattr(tokenizer, "has_chat_template", False):
        return False
    messages = [{"role": "user", "content": "hi"}]
    try:
        on, off = (
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=flag)
            for flag in (True, False)
        )
    except Exception:  # a template that refuses a bare user turn has no switch we can offer
        return False
    return on != off


def load_pair(
    model: str = None, draft: str = None, allow_download: bool = True, draft_quant: int = None, log=lambda message: None
) -> Pair:
    """Load a target and its draft (see plan_pair): configs and fit first; then the draft,
    downloaded if need be and loaded, so that its weights are checked before the target's
    download; then the target. What downloads is announced with its size through `log`."""
    plan = plan_pair(model, draft, allow_download)
    if plan.downloads() and plan.can_download():
        parts, _, warning = plan.notice(draft_quant)
        log("to download: " + "; ".join(parts))
        if warning:
            log(f"warning: {warning}")
    plan = plan.fetch("draft", log)
    draft_model, kept = _draft_at(plan.draft_dir, draft_quant, plan.compute_dtype)
    return _with_target(plan.fetch("target", log), draft_model, kept, draft_quant)
