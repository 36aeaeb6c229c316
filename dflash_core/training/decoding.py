"""The frozen target and its own continuations: loaded once for training (`load_frozen_target`),
decoded in batches (`decode_batch`, `regenerate`: the draft's training text) or one prompt at a
time (`greedy`). What the draft recipe and `chat_prompts` both use."""

import time

import mlx.core as mx
from mlx_lm.sample_utils import make_sampler

from ..engine.cycle import baseline_generate


def regenerate(model, tokenizer, prompts: list, max_new: int, batch: int, log=print, temperature: float = 0.0) -> list:
    """The target's own continuations (token ids; greedy, or sampled at `temperature` > 0), in the
    prompts' order: a row that stopped ends with one EOS (the tokenizer's first), any other has
    max_new tokens."""
    eos = list(tokenizer.eos_token_ids)
    sampler = make_sampler(temperature) if temperature > 0 else None
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batch together: less padding
    out = [None] * len(prompts)
    t0, s = time.time(), 0
    while s < len(order):
        idx = order[s : s + batch]
        try:
            rows = decode_batch(model, [prompts[i] for i in idx], max_new, eos, sampler)
        except RuntimeError as e:
            # MLX CUDA 0.32 refused 1,200 qwen3_5 rows at once (a CUDA-graph error) and ran 8: halve and go on
            if batch == 1:
                raise
            batch //= 2
            log(f"batched generation failed ({str(e).splitlines()[0][:80]}); batches of {batch} from here")
            continue
        for i, row in zip(idx, rows):
            stop = next((j for j, t in enumerate(row) if t in eos), None)
            out[i] = row if stop is None else row[:stop] + eos[:1]  # what follows an EOS is junk
        s += len(idx)
        log(f"regenerated {s}/{len(prompts)} continuations, {time.time() - t0:.0f}s")
    return out


def decode_batch(model, prompts: list, max_new: int, eos: list, sampler=None) -> list:
    """Continuations of the prompts at once, greedy (or drawn by an mlx-lm `sampler` from each
    row's log-probabilities), max_new tokens a row, fewer once every row has produced an EOS; a
    row goes on after its EOS. A bare loop: mlx-lm's batch_generate spends most of its time in
    per-token bookkeeping (10x slower on an H200)."""
    from mlx_lm.models.cache import make_prompt_cache

    # The caches as mlx-lm's BatchGenerator makes them, so every layer kind it batches works (attention,
    # GatedDeltaNet): each layer's cache merged across the rows, the prompts prefilled right-padded (the
    # GatedDeltaNet state stops at each row's length), then finalize moves the padding to the left, so
    # every row's next token goes in one column.
    cache = [layer[0].merge(list(layer)) for layer in zip(*(make_prompt_cache(model) for _ in prompts))]
    heads = [p[:-1] for p in prompts]  # the last prompt token is the first decode input
    lengths = [len(h) for h in heads]
    width = max(lengths)
    if width:
        pad = [width - n for n in lengths]
        for c in cache:
            c.prepare(lengths=lengths, right_padding=pad)
        model(mx.array([h + [0] * k for h, k in zip(heads, pad)]), cache=cache)
        for c in cache:
            c.finalize()
    tok = mx.array([p[-1] for p in prompts])
    eos_ids = mx.array(eos)
    done = mx.zeros(len(prompts), dtype=mx.bool_)
    outs = []
    for step in range(max_new):
        logits = model(tok[:, None], cache=cache)[:, -1]
        if sampler is None:
            tok = mx.argmax(logits, axis=-1)
        else:
            tok = sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        done = done | (tok[:, None] == eos_ids).any(axis=1)
        mx.async_eval(tok, done)  # queue this step while the next one is built
        outs.append(tok)
        if step % 32 == 31 and done.all().item():  # a sync every 32 steps costs little
            break
    return mx.stack(outs, axis=1).tolist()


def greedy(model, prompt: list, max_new: int, eos: set) -> list:
    """Plain greedy continuation (the engine's baseline), with the EOS it stopped at."""
    *_, run = baseline_generate(model, prompt, max_tokens=max_new, eos_ids=eos)
    return run.tokens


def load_frozen_target(path: str, dtype=mx.float32):
    """(model, tokenizer), frozen, in `dtype`: a local directory, hub id or GGUF file."""
    from mlx_lm.utils import dequantize_model, load

    from ..models.loading import resolve

    model, tokenizer = load(str(resolve(str(path), "target")))
    dequantize_model(model)  # a quantized target (e.g. from a GGUF) trains as the CPU engine runs it
    model.set_dtype(dtype)  # stored in 16 bits; the engine runs float32 on CPU
    model.eval()
    model.freeze()
    return model, tokenizer
