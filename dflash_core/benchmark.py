"""Baseline vs DFlash, measured one after the other on the same token ids; medians of repeats."""

import json
import os
import platform
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from . import backend
from .engine.cycle import OracleDraft, compile_default, pipeline_default
from .engine.events import lossless_verdict
from .layout import ASSETS

PROMPTS = ASSETS / "prompts"
# the default prompts: chat requests (one of each kind of the held-out set) for chat models, code to
# continue for the stdlib pair
DEFAULT_PROMPTS = {True: PROMPTS / "chat_bench.json", False: PROMPTS / "python.json"}


def _median(xs):
    return statistics.median(xs) if xs else None


def _last(events):
    *_, summary = events
    return summary


def run_benchmark(
    pair,
    prompts: list,
    *,
    max_tokens: int = 256,
    repeat: int = 3,
    block_size: int = None,
    chat_template: bool = False,
    oracle: bool = False,
    sweep: list = (),
    log=print,
    policy: str = None,
    policy_sweep: list = (),
    min_confidence: float = None,
    confidence_sweep: list = (),
    sampling=None,
    template_args: dict = None,
    copy: bool = False,
    copy_sweep: bool = False,
    pipeline_sweep: bool = False,
    compile_sweep: bool = False,
    shared_prefill: bool = False,
) -> dict:
    """With `sampling` (temperature > 0) the baseline is plain sampling and DFlash speculative
    sampling, each run seeded alike: the outputs share a distribution, not tokens. `template_args`:
    the chat template's extra arguments (e.g. thinking on). `policy` None: the pair's default (Pair.policy_for);
    `policy_sweep` runs other policies side by side,
    `confidence_sweep` the fixed policy at other thresholds, `copy_sweep` DFlash with the copy
    source (dflash_core.engine.copy_source) the other way than `copy`, `pipeline_sweep` with
    pipelined cycles (dflash_core.engine.pipeline) the other way than the default, `compile_sweep`
    pipelined cycles compiled (pipeline.CompiledCycles) the other way than the default.
    `shared_prefill`: each prompt is prefilled once (all but its last token, Pair.prefilled) and
    every engine's run of it resumes from there, so that their decodes follow each other closely:
    a long prompt's prefill takes minutes on a CPU, through which the machine's speed drifts
    between the runs compared (their prefill_s then times the last token alone)."""
    block_size = pair.block_size if block_size is None else block_size
    policy = pair.policy_for(policy, min_confidence, sampling)
    if min_confidence is None:
        min_confidence = backend.default_min_confidence()
    encoded = [pair.encode(p, chat_template, template_args=template_args) for p in prompts]
    for ids in encoded:
        pair.check_request(ids, max_tokens, block_size)
    for b in sweep:
        pair.check_request(encoded[0], max_tokens, b)
    piped, compiled = pipeline_default(), pipeline_default() and compile_default()
    main = Variant(block_size, policy, min_confidence, copy, piped, compiled)
    sweeps = {
        "sweep": [Variant(b, policy, min_confidence, copy, piped, compiled) for b in sweep],
        "policy_sweep": [Variant(block_size, p, min_confidence, copy, piped, compiled) for p in policy_sweep],
        "confidence_sweep": [Variant(block_size, "fixed", c, copy, piped, compiled) for c in confidence_sweep],
        "copy_sweep": [Variant(block_size, policy, min_confidence, not copy, piped, compiled)] if copy_sweep else [],
        "pipeline_sweep": [
            Variant(block_size, policy, min_confidence, copy, not piped, not piped and compile_default())
        ]
        if pipeline_sweep
        else [],
        "compile_sweep": [Variant(block_size, policy, min_confidence, copy, True, not compiled)]
        if compile_sweep
        else [],
    }
    sweeps = {name: list(dict.fromkeys([main, *group])) if group else [] for name, group in sweeps.items()}
    sweeps["sweep"].sort(key=lambda v: v.block_size)
    variants = list(dict.fromkeys([main, *(v for group in sweeps.values() for v in group)]))

    def prefilled(ids) -> dict:
        """The runs' keyword for a prompt's shared prefill, fed here (or none)."""
        return {"prefix_cache": pair.prefilled(ids)} if shared_prefill else {}

    def dflash(ids, v, **kw):
        return _last(
            pair.dflash(
                ids,
                max_tokens,
                v.block_size,
                min_confidence=v.min_confidence,
                policy=v.policy,
                copy=v.copy,
                pipelined=v.pipeline,
                compiled=v.compiled,
                **kw,
            )
        )

    # full-length warm-up: one-time costs (GPU kernel JIT, allocator growth, the policy's cost
    # probe) can depend on the cache length, so the warm-up goes as far as the measured runs do
    ceiling = Variant(block_size, "fixed", 0.0, False, piped, compiled)  # the oracle's: every proposal verified
    log("warm-up ...")
    shared = prefilled(encoded[0])
    warm = _last(pair.baseline(encoded[0], max_tokens, sampling=sampling, **shared))
    for v in variants:
        dflash(encoded[0], v, sampling=sampling, **shared)
    if oracle:
        dflash(encoded[0], ceiling, draft_fn=OracleDraft(len(encoded[0]), warm.tokens), **shared)

    runs = []
    for r in range(repeat):
        for i, ids in enumerate(encoded):
            shared = prefilled(ids)
            base = _last(pair.baseline(ids, max_tokens, sampling=sampling, **shared))
            rows = [("baseline", main, base)]
            rows += [("dflash", v, dflash(ids, v, sampling=sampling, **shared)) for v in variants]
            if oracle:
                oracle_draft = OracleDraft(len(ids), base.tokens)
                rows.append(("oracle", ceiling, dflash(ids, ceiling, draft_fn=oracle_draft, **shared)))
            for engine, v, s in rows:
                verdict = lossless_verdict(s, base)
                run = {
                    "repeat": r,
                    "prompt": i,
                    "engine": engine,
                    "block_size": v.block_size,
                    "identical": None if sampling else verdict == "identical",
                    "speedup": s.decode_tps / base.decode_tps if base.decode_tps else None,
                    **s.stats(),
                }
                if engine == "dflash":
                    run["min_confidence"] = v.min_confidence if v.policy == "fixed" else None
                    run["pipeline"] = v.pipeline  # asked for (`pipelined`: what the run could do)
                    run["compile"] = v.compiled  # likewise (`compiled`)
                if verdict == "diverged":  # where, and whether the target was torn between two tokens there
                    run["divergence"] = asdict(pair.divergence(ids, s.tokens, base.tokens))
                runs.append(run)
            line = ", ".join(
                f"{v.label} {s.decode_tps:.1f} tok/s ({s.decode_tps / base.decode_tps:.2f}x, "
                f"{s.tokens_per_cycle:.2f} tokens/cycle)"
                for engine, v, s in rows
                if engine == "dflash"
            )
            log(f"repeat {r + 1}/{repeat} prompt {i + 1}/{len(encoded)}: baseline {base.decode_tps:.1f} tok/s, {line}")
    return {
        "config": {
            "model": pair.name,
            "max_tokens": max_tokens,
            "repeat": repeat,
            "block_size": block_size,
            "policy": policy,
            "min_confidence": min_confidence,
            "prompts": prompts,
            "chat_template": chat_template,
            "template_args": template_args or {},
            "draft_quant": pair.draft_quant,
            "draft_vocab": len(pair.draft_vocab) if pair.draft_vocab else None,
            "memory_mb": {k: round(v / 2**20, 1) for k, v in pair.memory().items()},
            "oracle": oracle,
            "sweep": list(sweep),
            "policy_sweep": list(policy_sweep),
            "confidence_sweep": list(confidence_sweep),
            "copy": copy,
            "copy_sweep": copy_sweep,
            "pipeline_sweep": pipeline_sweep,
            "compile_sweep": compile_sweep,
            "shared_prefill": shared_prefill,
            "temperature": sampling.temperature if sampling else 0.0,
            "top_p": sampling.top_p if sampling else 1.0,
            "seed": sampling.seed if sampling else None,
            "machine": {
                "platform": platform.platform(),
                "processor": platform.processor(),
                "cores": os.cpu_count(),
                **{k: v for k, v in backend.describe().items() if k != "hf_cache"},
                "dtype": str(pair.compute_dtype or "the weights' own"),  # this pair's (registry.gpu_dtype)
            },
            "blas_threads": dict(pair.blas_threads),  # as measured for this model (empty off the CPU)
        },
        "runs": runs,
        "summary": summarize(runs, main, sweeps),
    }


@dataclass(frozen=True)
class Variant:
    """One DFlash setting a benchmark runs: a block size, a policy (the fixed one's threshold), and
    whether proposals are also copied from the context."""

    block_size: int
    policy: str
    min_confidence: float
    copy: bool = False
    pipeline: bool = False  # cycles pipelined where the run allows (dflash_core.engine.pipeline)
    compiled: bool = False  # ... and compiled (pipeline.CompiledCycles)

    def __post_init__(self):
        if self.policy == "adaptive":  # the threshold is the fixed policy's alone
            object.__setattr__(self, "min_confidence", None)

    @property
    def label(self) -> str:
        knob = "" if self.policy == "adaptive" else f" {self.min_confidence:g}"
        return f"{self.policy}{knob} B={self.block_size}{' copy' if self.copy else ''}{' pipelined' if self.pipeline else ''}{' compiled' if self.compiled else ''}"

    def matches(self, run: dict) -> bool:
        fields = ("block_size", "policy", "min_confidence", "copy", "pipeline", "compile")
        have = tuple(run.get(f, False) for f in fields)
        return have == (self.block_size, self.policy, self.min_confidence, self.copy, self.pipeline, self.compiled)


def summarize(runs: list, main: Variant, sweeps: dict = None) -> dict:
    """Medians of the main setting's runs; `sweeps`: {"sweep" | "policy_sweep" |
    "confidence_sweep": [Variant, ...]}, each summarised by its own runs only."""
    sweeps = sweeps or {}
    base = [r for r in runs if r["engine"] == "baseline"]
    dfl = [r for r in runs if r["engine"] == "dflash" and main.matches(r)]
    orc = [r for r in runs if r["engine"] == "oracle"]

    def medians(rows):
        return {
            "dflash_tps_median": _median([r["decode_tps"] for r in rows]),
            "speedup_median": _median([r["speedup"] for r in rows]),
            "speedup_min": min((r["speedup"] for r in rows if r["speedup"] is not None), default=None),
            "overall_speedup_median": overall_speedup(rows, base),
            "tokens_per_cycle_median": _median([r["tokens_per_cycle"] for r in rows]),
            "tokens_per_cycle_mean": mean_tokens_per_cycle(rows),
            "plain_steps": sum(r["plain_steps"] for r in rows),
            "cycles": sum(r["cycles"] for r in rows),
            "identical": all(r["identical"] for r in rows)
            if rows and None not in (r["identical"] for r in rows)
            else None,
            **_by_source(rows),
            "engine_efficiency_median": _median([r["engine_efficiency"] for r in rows]),
            "allowed_speedup_median": _median(
                [r["speedup"] / r["engine_efficiency"] for r in rows if r["speedup"] and r["engine_efficiency"]]
            ),
        }

    out = {
        "baseline_tps_median": _median([r["decode_tps"] for r in base]),
        **medians(dfl),
        "acceptance_rate_median": _median([r["acceptance_rate"] for r in dfl]),
        # sampled runs share the baseline's distribution, not its tokens: no verdict (None)
        "identical": None
        if any(r["identical"] is None for r in runs)
        else all(r["identical"] for r in runs if r["engine"] in ("dflash", "oracle")),
    }
    diverged = [r for r in runs if "divergence" in r]
    if diverged:
        out["divergences"] = [
            {k: r.get(k) for k in ("repeat", "prompt", "engine", "block_size", "policy", "min_confidence")}
            | r["divergence"]
            for r in diverged
        ]
    if dfl:
        drafted = sum(r["cycles"] - r["plain_steps"] for r in dfl)
        per_pos = [sum(r["accepted_per_position"][k] for r in dfl) for k in range(main.block_size - 1)]
        out["acceptance_by_position"] = [n / drafted for n in per_pos] if drafted else []
        # what the adaptive policy starts from when this file ships beside the draft (Pair.acceptance_prior)
        out["acceptance_by_confidence"] = [
            [sum(r["acceptance_by_confidence"][b][k] for r in dfl) for k in (0, 1)]
            for b in range(len(dfl[0]["acceptance_by_confidence"]))
        ]
    if orc:
        out["oracle_tps_median"] = _median([r["decode_tps"] for r in orc])
        out["oracle_speedup_median"] = _median([r["speedup"] for r in orc])
        out["oracle_overall_speedup_median"] = overall_speedup(orc, base)
        out["oracle_tokens_per_cycle_median"] = _median([r["tokens_per_cycle"] for r in orc])
    for name, group in sweeps.items():  # each setting side by side with the main one
        if len(group) > 1:
            key = {
                "sweep": "block_size",
                "policy_sweep": "policy",
                "confidence_sweep": "min_confidence",
                "copy_sweep": "copy",
                "pipeline_sweep": "pipeline",
                "compile_sweep": "compiled",
            }[name]
            out[name] = [
                {key: getattr(v, key)} | medians([r for r in runs if r["engine"] == "dflash" and v.matches(r)])
                for v in group
            ]
    return out


def _by_source(rows: list) -> dict:
    """Tokens per cycle by the proposals' source, over these runs: the draft's cycles, the
    copies' (where the copy source was on), and how many cycles each took."""
    copied = sum(r.get("copied_cycles", 0) for r in rows)
    plain = sum(r["plain_steps"] for r in rows)
    drafted = sum(r["cycles"] for r in rows) - plain - copied
    drafted_tokens = sum(
        r["tokens_per_drafted_cycle"] * (r["cycles"] - r["plain_steps"] - r.get("copied_cycles", 0)) for r in rows
    )
    copied_tokens = sum(r.get("tokens_per_copied_cycle", 0) * r.get("copied_cycles", 0) for r in rows)
    return {
        "drafted_cycles": drafted,
        "tokens_per_drafted_cycle": drafted_tokens / drafted if drafted else None,
        "copied_cycles": copied,
        "tokens_per_copied_cycle": copied_tokens / copied if copied else None,
    }


def divergence_line(summary: dict) -> str:
    """One line on the runs whose tokens differ from plain greedy decoding: where the first one
    parts and the target's top-2 logit margin there (a margin near 0 is a near-tie that float
    rounding between a many-row verify and a one-token step can flip)."""
    found = summary.get("divergences") or []
    if not found:
        return ""
    d = found[0]
    where = f"prompt {d['prompt'] + 1}, {d['engine']}, block {d['block_size']}"
    if d.get("policy"):
        where += f", {d['policy']} policy"
    if d.get("min_confidence"):
        where += f", min confidence {d['min_confidence']}"
    margin = "" if d["top2_margin"] is None else f" (the target's top-2 logit margin there: {d['top2_margin']:.2g})"
    return (
        f"not identical: {len(found)} run(s) differ from plain greedy decoding; the first, {where}, "
        f"parts at generated token {d['index']}{margin}"
    )


def overall_speedup(rows: list, base: list):
    """The prompts of one repeat as one workload (each engine's decode tokens over its decode
    time, summed over prompts), median over repeats. With few prompts of very different
    acceptance the median of per-run ratios falls between clusters; this weighs each prompt by
    the time it takes, as a user decoding all of them would see it."""

    def tps(rs):
        seconds = sum(r["decode_s"] for r in rs)
        return sum(r["generated_tokens"] - 1 for r in rs) / seconds if seconds else None

    ratios = []
    for k in sorted({r["repeat"] for r in rows}):
        ours, theirs = tps([r for r in rows if r["repeat"] == k]), tps([r for r in base if r["repeat"] == k])
        if ours and theirs:
            ratios.append(ours / theirs)
    return _median(ratios)


def mean_tokens_per_cycle(rows: list):
    """Mean acceptance length over every cycle of these runs: committed tokens / cycles."""
    cycles = sum(r["cycles"] for r in rows)
    return sum(r["generated_tokens"] for r in rows) / cycles if cycles else None


def recorded_benchmark(draft_dir) -> dict | None:
    """The benchmark recorded beside a draft for this kind of device (the benchmark command's own
    --save output, as benchmark-cpu.json / benchmark-gpu.json), or None when there is none."""
    if draft_dir is None:
        return None
    path = Path(draft_dir) / f"benchmark-{'cpu' if backend.on_cpu() else 'gpu'}.json"
    try:
        saved = json.loads(path.read_text())
        return saved if isinstance(saved, dict) else None
    except (OSError, ValueError):
        return None


def recorded_figure(draft_dir) -> dict:
    """The headless figure of the recorded benchmark (recorded_benchmark), or None."""
    saved = recorded_benchmark(draft_dir)
    try:
        config, summary = saved["config"], saved["summary"]
        machine = config["machine"]
        where = (
            "an NVIDIA GPU (MLX CUDA)"
            if machine.get("cuda")
            else "Apple silicon"
            if machine.get("metal")
            else f"a {machine['cores']}-core CPU"
            if machine.get("cores")
            else "a CPU"
        )
        return {
            "speedup": summary["speedup_median"],
            "tokens_per_cycle": summary["tokens_per_cycle_median"],
            "prompts": len(config["prompts"]),
            "repeat": config["repeat"],
            "device": where,
        }
    except (KeyError, TypeError):
        return None


def load_prompts(prompt: str = None, prompts_file: str = None, chat: bool = True) -> list:
    from .errors import DFlashError

    if prompt is not None:
        return [prompt]
    path = Path(prompts_file) if prompts_file else DEFAULT_PROMPTS[chat]
    if not path.is_file():
        raise DFlashError(f"prompts file '{path}' does not exist")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            prompts = json.loads(text)
        except json.JSONDecodeError as e:
            raise DFlashError(f"prompts file '{path}' is not valid JSON ({e})") from None
    else:
        prompts = [p for p in text.split("\n\n") if p.strip()]  # blank-line separated
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise DFlashError(
            f"prompts file '{path}' holds no prompts (a JSON list of strings, or blank-line separated text)"
        )
    return prompts
