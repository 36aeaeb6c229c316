"""A loaded target + draft: what every consumer runs the engines through (`loading` makes them)."""

import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from mlx.utils import tree_flatten

from .. import backend
from ..benchmark import recorded_benchmark
from ..engine.cycle import baseline_generate, dflash_generate, first_divergence
from ..engine.draft import QUANT_GROUP, DraftContext, DraftModel
from ..engine.events import CONFIDENCE_EDGES
from ..engine.policy import POLICIES, default_policy
from ..engine.prefix_cache import PrefixCache, prefill
from ..engine.target import Target
from ..errors import DFlashError
from . import distributed, memory
from .tokenizer import encode_prompt

# a shared prefill's cache (Pair.prefilled) holds the prompt's snapshot and those its runs store
# (the prompt with its logits, the prompt and reply): a 3,800-token prompt of the default pair
# takes about 180 MB a snapshot
SHARED_PREFILL_BYTES = 2 * 2**30


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
    thinking_switch: bool = False  # the chat template has a thinking mode (Qwen3's enable_thinking)
    draft_quant: int = None  # bits of the draft's quantized linear layers; None: as stored
    draft_full_precision: list = field(default_factory=list)  # layers MLX could not quantize
    compute_dtype: object = None  # the dtype both models compute in (None: each its weights' own)
    cost_profiles: dict = field(default_factory=dict)  # the policy's probed costs (engine.dflash_generate)
    prefix_cache: PrefixCache = None  # DFlash runs resume from its snapshots (the server's, the playground's)

    @property
    def block_size(self) -> int:
        return self.draft.config.block_size

    def memory(self) -> dict:
        """Bytes the weights take: {"target": ..., "draft": ...}."""

        def nbytes(module) -> int:
            return sum(v.nbytes for _, v in tree_flatten(module.parameters()))

        return {"target": nbytes(self.model), "draft": nbytes(self.draft)}

    def fit_warning(self) -> str:
        """A warning when the loaded pair takes more than 90 % of the device's working set, else ''."""
        return memory.fit_warning(sum(self.memory().values()), f"the pair {self.name}")

    def draft_precision(self) -> str:
        """The draft's weights in words, e.g. "4-bit (all 26 linear layers), 118 MB"."""
        size = memory.gb(self.memory()["draft"])
        if not self.draft_quant:
            return f"{self.draft.fc.weight.dtype}".replace("mlx.core.", "") + f", {size}"
        kept = self.draft_full_precision
        note = (
            (
                f"; {len(kept)} layer(s) whose input size is not a multiple of {QUANT_GROUP} stay full precision "
                f"({', '.join(kept[:3])}{', ...' if len(kept) > 3 else ''})"
            )
            if kept
            else ""
        )
        return f"{self.draft_quant}-bit linear layers{note}, {size}"

    @property
    def eos_ids(self) -> set:
        return set(self.tokenizer.eos_token_ids)

    def encode(
        self, prompt: str, chat_template: bool = True, system_prompt: str = None, template_args: dict = None
    ) -> list:
        """`template_args`: extra keyword arguments for the chat template (thinking is off unless
        they turn it on); they and `system_prompt` apply only where the chat template does."""
        if not prompt or not prompt.strip():
            raise DFlashError("the prompt is empty; give some text to continue")
        ids = encode_prompt(self.tokenizer, prompt, chat_template, system_prompt, template_args)
        if len(ids) >= self.context_length:
            raise DFlashError(
                f"the prompt has {len(ids)} tokens but the model's context is {self.context_length}; shorten it"
            )
        return ids

    def check_request(self, prompt_ids: list, max_tokens: int, block_size: int):
        if not 2 <= block_size <= self.block_size:
            raise DFlashError(
                f"block size {block_size} is out of range: use 2..{self.block_size} (the draft's trained block size)"
            )
        room = self.context_length - len(prompt_ids)
        if not 1 <= max_tokens <= room:
            raise DFlashError(
                f"max tokens {max_tokens} is out of range: use 1..{room} (context {self.context_length} minus the prompt's {len(prompt_ids)} tokens)"
            )

    def decode(self, ids: list) -> str:
        return self.tokenizer.decode(ids)

    def text(self, ids: list) -> str:
        """What generated tokens read as: without the EOS token that ended the reply."""
        return self.tokenizer.decode([t for t in ids if t not in self.eos_ids])

    def dflash(
        self,
        prompt_ids,
        max_tokens,
        block_size=None,
        should_stop=lambda: False,
        draft_fn=None,
        min_confidence=None,
        sampling=None,
        policy=None,
        copy=False,
        pipelined=None,
        compiled=None,
        prefix_cache=None,
    ):
        """CycleEvents, then a RunSummary (see engine.dflash_generate). Call on the MLX thread.
        policy None: policy.default_policy; the fixed policy's min_confidence None: the backend's
        default (backend.default_min_confidence); sampling None: greedy; prefix_cache None: the
        pair's own (`self.prefix_cache`)."""
        block_size = self.block_size if block_size is None else block_size
        self.check_request(prompt_ids, max_tokens, block_size)
        policy = self.policy_for(policy, min_confidence, sampling)
        if min_confidence is None:
            min_confidence = backend.default_min_confidence()
        return self._run(
            "dflash",
            dflash_generate(
                self.target,
                self.draft,
                prompt_ids,
                max_tokens=max_tokens,
                block_size=block_size,
                eos_ids=self.eos_ids,
                should_stop=should_stop,
                draft_fn=draft_fn,
                policy=policy,
                min_confidence=min_confidence,
                cost_profiles=self.cost_profiles,
                acceptance_prior=self.acceptance_prior,
                sampling=sampling,
                draft_vocab=self.draft_vocab,
                plain_threads=self.blas_threads.get("baseline"),
                prefix_cache=self.prefix_cache if prefix_cache is None else prefix_cache,
                copy=copy,
                pipelined=pipelined,
                compiled=compiled,
            ),
        )

    @staticmethod
    def policy_for(policy=None, min_confidence=None, sampling=None) -> str:
        """The policy a run takes: `policy`, or else policy.default_policy; in a group of
        processes the fixed one (every rank must take the same decisions: no timing in them)."""
        grouped = distributed.size() > 1
        policy = policy or ("fixed" if grouped else default_policy(min_confidence, sampling))
        if policy not in POLICIES:
            raise DFlashError(f"policy '{policy}' is not one of {', '.join(POLICIES)}")
        if grouped and policy == "adaptive":
            raise DFlashError(
                "the adaptive policy decides from each process's own timings, which the processes of a "
                "group would not agree on: use --policy fixed under mlx.launch"
            )
        return policy

    @cached_property
    def acceptance_prior(self) -> dict:
        """The draft's acceptance by confidence and by block position as its recorded benchmark for
        this kind of device measured them (the adaptive policy's starting point), or {}."""
        summary = (recorded_benchmark(self.draft_dir) or {}).get("summary") or {}
        by_confidence = summary.get("acceptance_by_confidence")
        by_position = summary.get("acceptance_by_position")
        prior = {}
        if isinstance(by_confidence, list) and len(by_confidence) == len(CONFIDENCE_EDGES) + 1:
            prior["acceptance_by_confidence"] = by_confidence
        if isinstance(by_position, list) and all(isinstance(x, (int, float)) for x in by_position):
            prior["acceptance_by_position"] = by_position
        return prior

    @property
    def draft_vocab(self) -> tuple | None:
        """The tokens the draft proposes from here: its vocabulary where that pays (a CPU)."""
        return self.draft.config.draft_vocab if backend.draft_vocab_pays() else None

    def baseline(self, prompt_ids, max_tokens, should_stop=lambda: False, sampling=None, prefix_cache=None):
        """TokenEvents, then a RunSummary: plain decoding via mlx-lm (greedy unless `sampling`).
        `prefix_cache`: the target's caches resume from its longest snapshot of the prompt short
        of the last token, which is fed as generate_step feeds a prompt's last token."""
        self.check_request(prompt_ids, max_tokens, 2)
        found = None if prefix_cache is None else prefix_cache.find(prompt_ids, use_logits=False)
        caches = None if found is None else prefix_cache.target_caches(*found)
        return self._run(
            "baseline",
            baseline_generate(
                self.model,
                prompt_ids,
                max_tokens=max_tokens,
                eos_ids=self.eos_ids,
                should_stop=should_stop,
                sampling=sampling,
                prompt_cache=caches,
            ),
        )

    def prefilled(self, prompt_ids) -> PrefixCache:
        """A prefix cache holding the prompt but its last token, fed here once: runs of both
        engines given it decode the prompt from the same caches, feeding only the last token."""
        cache = PrefixCache(SHARED_PREFILL_BYTES)
        self._use_fastest_threads("dflash")
        prefill(self.target, DraftContext(self.draft), prompt_ids[:-1], cache)
        return cache

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
            # in a group every rank takes rank 0's measurement: the copies of the draft must
            # compute the same bits on every rank
            self.blas_threads[engine] = distributed.share(self._fastest_threads(engine, choices))
        backend.set_blas_threads(self.blas_threads[engine])

    def _fastest_threads(self, engine: str, choices: list) -> int:
        ids = self.tokenizer.encode("The quick brown fox jumps over the lazy dog, again and again.")[:16]

        def seconds() -> float:
            t = time.perf_counter()
            if engine == "baseline":
                runs = baseline_generate(self.model, ids, max_tokens=8, eos_ids=set())
            else:
                runs = dflash_generate(
                    self.target,
                    self.draft,
                    ids,
                    max_tokens=16,
                    block_size=self.block_size,
                    eos_ids=set(),
                    policy="fixed",
                    min_confidence=backend.default_min_confidence(),
                    cost_profiles=self.cost_profiles,
                    draft_vocab=self.draft_vocab,
                )
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
