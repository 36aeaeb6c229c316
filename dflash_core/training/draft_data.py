"""The draft recipe's data: prompts from --data, the target's regenerated replies (cached in
--data-cache files), padded sequences, the draft's vocabulary."""

import json
import math
import random
from pathlib import Path

import numpy as np

from ..engine.draft import DRAFT_VOCAB_FILE
from ..errors import DFlashError
from ..models.tokenizer import encode_prompt
from .chat_prompts import chat_prompts, heldout_requests
from .corpus import read_corpus, stdlib_dir, top_level_prompts, with_renamed_names
from .decoding import load_frozen_target, regenerate


def prompt_texts(data: str, seed: int, n: int) -> tuple:
    """(train prompts, eval prompts) as user texts. data: 'stdlib' (this interpreter's standard
    library, minus the target trainer's held-out files), a directory or file of source text
    (prompts are top-level lines of it), or a .jsonl file with a "prompt" field per line."""
    rng = random.Random(seed)
    path = Path(data)
    if data == "stdlib":
        docs, heldout = read_corpus(stdlib_dir())
        prompts = [p for _, text in docs for p in top_level_prompts(text, rng, math.ceil(n * 1.3 / len(docs)))]
        rng.shuffle(prompts)
        eval_prompts = [p for _, text in heldout for p in top_level_prompts(text, rng, 1)]
        rng.shuffle(eval_prompts)
        return prompts[:n], eval_prompts
    elif path.suffix == ".jsonl" and path.is_file():
        prompts = []
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    prompts.append(json.loads(line)["prompt"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise DFlashError(f'{path}: every line must be a JSON object with a "prompt" field') from None
        rng.shuffle(prompts)
        n_eval = max(1, min(8, len(prompts) // 10))
        return prompts[n_eval:], prompts[:n_eval]
    elif path.is_dir():
        docs = [
            (str(f), f.read_text(errors="replace"))
            for f in sorted(path.rglob("*"))
            if f.is_file() and f.suffix in (".py", ".txt", ".md")
        ]
    elif path.is_file():
        docs = [(str(path), path.read_text(errors="replace"))]
    else:
        raise DFlashError(f"--data '{data}' is neither 'stdlib', a directory, nor a file")
    if not docs:
        raise DFlashError(f"--data '{data}' holds no .py/.txt/.md text")
    per_doc = max(1, math.ceil(n * 1.3 / len(docs)))
    prompts = [p for _, text in docs for p in top_level_prompts(text, rng, per_doc)]
    rng.shuffle(prompts)
    if len(prompts) < 2:
        raise DFlashError(f"--data '{data}' gave too few prompts ({len(prompts)})")
    n_eval = max(1, min(8, len(prompts) // 10))
    return prompts[n_eval : n_eval + n], prompts[:n_eval]


class Sequences:
    """Prompt + response token ids padded to one length, with where each response starts/ends."""

    def __init__(self, prompts: list, responses: list, pad_id: int):
        lens = [len(p) + len(r) for p, r in zip(prompts, responses)]
        self.length = max(lens)
        self.ids = np.full((len(prompts), self.length), pad_id, dtype=np.int32)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            self.ids[i, : lens[i]] = p + r
        self.start = np.array([len(p) for p in prompts])
        self.end = np.array(lens)  # exclusive

    def __len__(self):
        return len(self.ids)

    def anchors(self, rows, n: int, block: int, rng) -> tuple:
        """(anchors, valid) each (len(rows), n): up to n distinct anchors a per row with
        start <= a <= end - block (a full block of labels); unused slots are invalid."""
        anchors = np.zeros((len(rows), n), dtype=np.int32)
        valid = np.zeros((len(rows), n), dtype=bool)
        for j, r in enumerate(rows):
            cand = np.arange(self.start[r], self.end[r] - block + 1)
            if len(cand) == 0:
                continue
            pick = rng.choice(cand, size=min(n, len(cand)), replace=False)
            anchors[j, : len(pick)] = pick
            valid[j, : len(pick)] = True
        return anchors, valid


def write_draft_vocab(out: Path, vocab: tuple | None):
    """draft_vocab.json beside config.json; none for a draft without a vocabulary (a file left by
    an earlier draft in `out` is not this one's)."""
    if vocab:
        (out / DRAFT_VOCAB_FILE).write_text(json.dumps({"tokens": list(vocab)}))
    else:
        (out / DRAFT_VOCAB_FILE).unlink(missing_ok=True)


def draft_vocab(responses: list, size: int, keep: set) -> tuple:
    """The `size` tokens the target writes most often in these responses, most frequent first,
    plus `keep` (its EOS tokens): the draft's vocabulary (Target.draft_head). Frequency-ranked
    vocabularies are FR-Spec's idea (Zhao et al. 2025): a few thousand tokens cover nearly all
    that a chat model writes."""
    counts = np.bincount(np.concatenate([np.asarray(r, dtype=np.int64) for r in responses]))
    ranked = [int(t) for t in np.argsort(-counts, kind="stable")[:size] if counts[t]]
    return tuple(ranked + sorted(set(keep) - set(ranked)))


def training_data(args, model, tokenizer, log=print) -> tuple:
    """(prompts, responses, eval prompts) as token ids: the target's own greedy continuations,
    read from --data-cache if it holds them (several files: merged), else regenerated (and
    written there)."""
    caches = [Path(c) for c in args.data_cache or []]
    reuse = reuses_data(caches)
    if args.data == "chat":  # a chat target's requests: every one in its chat template
        texts, eval_texts = (
            ([], heldout_requests())
            if reuse
            else chat_prompts(model, tokenizer, args.num_prompts, args.seed, args.own_prompts, log)
        )
        chat_fraction = 1.0
    else:
        texts, eval_texts = prompt_texts(args.data, args.seed, args.num_prompts)
        chat_fraction = args.chat_fraction
    eval_prompts = [encode_prompt(tokenizer, t, True)[-args.max_prompt_tokens :] for t in eval_texts]
    if reuse:
        return (*read_data(caches, log), eval_prompts)
    cache = caches[0] if caches else None
    texts = with_renamed_names(texts, args.rename_fraction, random.Random(args.seed + 1))
    rng = random.Random(args.seed)
    chat = [rng.random() < chat_fraction for _ in texts]
    prompts = [encode_prompt(tokenizer, t, c)[-args.max_prompt_tokens :] for t, c in zip(texts, chat)]
    prompts = [list(p) for p in dict.fromkeys(map(tuple, prompts))]  # drawn twice: generated and trained once
    responses = regenerate(model, tokenizer, prompts, args.response_tokens, args.gen_batch, log, args.reply_temperature)
    if cache:  # written whole, then renamed: a concurrent run may be waiting for it
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".partial")
        tmp.write_text(json.dumps({"target": str(args.target), "prompts": prompts, "responses": responses}))
        tmp.replace(cache)
    return prompts, responses, eval_prompts


def reuses_data(caches: list) -> bool:
    """Whether --data-cache names data regenerated earlier (several files, or one that exists),
    to be read rather than written."""
    return len(caches) > 1 or bool(caches) and Path(caches[0]).is_file()


def read_data(paths: list, log=print) -> tuple:
    """(prompts, responses) from regenerated-data files, in order. A prompt drawn again (by
    another seed, or twice by one) keeps its first response only: repeats would weigh double."""
    prompts, responses, seen = [], [], set()
    for path in paths:
        if not path.is_file():
            raise DFlashError(
                f"--data-cache {path} does not exist; regenerate it first (train-draft --data-only "
                f"--data-cache {path}): several files are only read"
            )
        saved = json.loads(path.read_text())
        for p, r in zip(saved["prompts"], saved["responses"]):
            if tuple(p) not in seen:
                seen.add(tuple(p))
                prompts.append(p)
                responses.append(r)
    where = paths[0] if len(paths) == 1 else f"{len(paths)} files"
    log(f"data: {len(prompts)} regenerated sequences from {where}")
    return prompts, responses


def write_data(args, log=print):
    """--data-only: regenerate the data into --data-cache (or read it), train nothing."""
    model, tokenizer = load_frozen_target(str(args.target))
    regenerates = not reuses_data(args.data_cache)
    prompts, responses, _ = training_data(args, model, tokenizer, log)
    log(f"data: {len(prompts)} sequences, {sum(map(len, responses)):,} response tokens")
    if regenerates:
        log(f"wrote {args.data_cache[0]}")
    if args.draft_vocab:  # for a draft already trained on this data (--out; checked by the command)
        vocab = draft_vocab(responses, args.draft_vocab, set(tokenizer.eos_token_ids))
        write_draft_vocab(Path(args.out), vocab)
        log(f"draft vocabulary: {len(vocab)} tokens written to {Path(args.out) / DRAFT_VOCAB_FILE}")
