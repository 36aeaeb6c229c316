"""DFlash over MLX's distributed backend: a target larger than one machine.

Under `mlx.launch` (ring, JACCL, MPI or NCCL backend) every process runs the same command. The
target is split across the group by mlx-lm's own tensor parallelism (`model.shard(group)`): each
process holds its share of the attention heads, MLP columns and GatedDeltaNet heads (and, in
qwen3_5, of the LM head's vocabulary). The draft is small: every process holds all of it.

Each sharded layer ends in an all-reduce, so every process holds the whole hidden state after
every layer: the same taps, the same logits, the same proposals from its copy of the draft, the
same accepted prefix. Every process runs the same cycle, and a cycle sends nothing beyond the
all-reduces of the sharded forwards (the processes also agree once, after loading, on whether all
loaded and on a random seed, and on the CPU once per engine on a BLAS thread count). Rollback is
local: a process's caches hold only its own heads (the KV entries of its attention heads; the
conv and recurrent state of its GatedDeltaNet heads), and every process trims the same number of
entries and replays the same accepted steps on them. mlx-lm's pipeline split (a share of the layers per process) is not used: the draft reads
hidden states from layers spread over the whole depth, which every process needs.

Only rank 0 prints and serves HTTP. Under `serve` rank 0 alone knows what to run, so it sends
each run's settings to the others before starting it (share) and, once a cycle, whether to stop
(a client gone, a stop string met), so that every process ends the run at the same cycle.
"""

import json
import os
import random
import sys
import time
from dataclasses import asdict

import mlx.core as mx
import numpy as np

from ..engine.sampling import Sampling
from ..engine.target import check_architecture
from ..errors import DFlashError

# mlx-lm model modules whose shard() DFlash runs on (each tested sharded, tests/test_distributed.py),
# and the sizes shard() divides by the group size: a size that does not divide fails inside
# mlx-lm with a shape error, at load or only in the first forward
SPLIT_SIZES = {
    "llama": ("num_attention_heads", "num_key_value_heads", "intermediate_size"),
    "qwen3": ("num_attention_heads", "num_key_value_heads", "intermediate_size"),
    "qwen3_5": ("num_attention_heads", "intermediate_size", "linear_num_key_heads", "linear_num_value_heads"),
    "qwen3_5_moe": (
        "num_attention_heads",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    ),
}

ERROR_EXIT_DELAY_S = 2.0  # see give_rank_0_time
_GROUP = None  # (group, backend name or None), made once


def _backends() -> list:
    """The backends in the order MLX's backend="any" tries them (NCCL only on CUDA)."""
    cuda = hasattr(mx, "cuda") and mx.cuda.is_available()
    return (["nccl"] if cuda else []) + ["ring", "mpi", "jaccl"]


def _group():
    """MLX's group, and its backend's name: each backend is asked in turn, as "any" would, so
    that doctor can name the one in use."""
    global _GROUP
    if _GROUP is None:
        for name in _backends():
            g = mx.distributed.init(backend=name)
            if g.size() > 1:
                _GROUP = (g, name)
                break
        else:
            _GROUP = (mx.distributed.init(), None)
    return _GROUP


def group():
    return _group()[0]


def size() -> int:
    return group().size()


def rank() -> int:
    return group().rank()


def primary() -> bool:
    return rank() == 0


def describe() -> dict:
    """For doctor: {"size", "rank", "backend"} (backend None: one process, no group)."""
    g, name = _group()
    return {"size": g.size(), "rank": g.rank(), "backend": name}


def quiet_unless_primary():
    """Every rank runs the same command: only rank 0 writes to stdout and stderr, so the group's
    output reads as one process's."""
    if not primary():
        sys.stdout = sys.stderr = open(os.devnull, "w")


def give_rank_0_time():
    """Called by a rank about to exit on an error. A rank other than 0 meets the error rank 0 meets
    (the same command, the same files: loaded_everywhere handles files that differ) and rank 0 says
    why; but mlx.launch stops the whole group as soon as any rank exits with an error code, which
    could cut rank 0 off before its line is out. A short wait prevents that (and, were the error
    this rank's alone, its exit still ends the group)."""
    if not primary():
        time.sleep(ERROR_EXIT_DELAY_S)


def loaded_everywhere(load):
    """load() on every rank, on the thread that will run the engines. Where it fails on some rank
    it fails on all, with rank 0's line: its own error, or which ranks failed, each of which says
    why on its own line (a model missing on one machine). Otherwise the ranks that loaded would
    wait forever in their first all-reduce."""
    if size() == 1:
        return load()
    try:
        loaded, error = load(), None
    except DFlashError as e:
        loaded, error = None, e
    flags = mx.distributed.all_gather(mx.array([int(error is not None)]), group=group()).tolist()
    failed = [r for r, flag in enumerate(flags) if flag]
    if not failed:
        # sampling without a seed draws from MLX's random state, which is the thread's own: make
        # this thread's rank 0's everywhere, so that every rank samples the same tokens
        seed = random.getrandbits(31) if primary() else 0
        mx.random.seed(mx.distributed.all_sum(seed, group=group()).item())
        return loaded
    if error is not None:
        if 0 not in failed:  # rank 0 loaded, so only this rank can say what went wrong here
            print(f"error: rank {rank()}: {error}", file=sys.__stderr__, flush=True)
        raise error
    raise DFlashError(
        f"rank {', '.join(map(str, failed))} of {size()} could not load the pair (its own error line "
        "says why): every machine needs the same model and draft, at the same path or as a hub id"
    )


def check_shardable(model, n: int):
    """One line, before mlx-lm's shard() fails on a shape (or a forward fails later)."""
    check_architecture(model)
    arch = type(model).__module__.rsplit(".", 1)[-1]
    if arch not in SPLIT_SIZES:
        raise DFlashError(
            f"mlx-lm cannot split a '{arch}' target across processes (DFlash does so for "
            f"{', '.join(SPLIT_SIZES)}); run this target in one process, without mlx.launch"
        )
    owner = getattr(model, "language_model", model)
    args = owner.args
    sizes = {name: getattr(args, name) for name in SPLIT_SIZES[arch] if getattr(args, name, None)}
    if arch.startswith("qwen3_5"):
        kv = args.num_key_value_heads  # fewer KV heads than processes: mlx-lm repeats them
        if (kv % n if kv >= n else n % kv) != 0:
            sizes["num_key_value_heads"] = kv
        if hasattr(owner, "lm_head"):  # an untied LM head is split by vocabulary
            sizes["vocab_size"] = args.vocab_size
    bad = [f"{name} {value}" for name, value in sizes.items() if value % n]
    if bad:
        raise DFlashError(
            f"the target cannot be split over {n} processes: its {', '.join(bad)} must divide by {n}; "
            f"launch a group whose size divides them"
        )


def shard(model):
    """Split the target across the group with mlx-lm's shard(), before its weights are read, so
    that each process reads only its own slices."""
    check_shardable(model, size())
    model.shard(group())


def share(message):
    """Rank 0's message (anything JSON can carry, None included) on every rank; what the other
    ranks pass is not used."""
    if size() == 1:
        return message
    data = np.frombuffer(json.dumps(message).encode(), dtype=np.uint8) if primary() else np.zeros(0, np.uint8)
    n = mx.distributed.all_sum(len(data), group=group()).item()
    if not primary():
        data = np.zeros(n, np.uint8)
    data = mx.distributed.all_sum(mx.array(data), group=group())
    return json.loads(bytes(np.array(data)))


def agreed(should_stop):
    """A should_stop that answers rank 0's answer on every rank (one all-reduce of one number a
    cycle): a rank that stopped alone would leave the others waiting in their next forward."""

    def stop() -> bool:
        mine = primary() and should_stop()
        return mx.distributed.all_sum(int(mine), group=group()).item() > 0

    return stop


def _start(pair, run: dict, should_stop):
    """The events of a run described by `run` (as Leader sends it)."""
    sampling = Sampling(**run["sampling"]) if run["sampling"] else None
    if run["engine"] == "dflash":
        return pair.dflash(
            run["prompt_ids"],
            run["max_tokens"],
            run["block_size"],
            should_stop,
            min_confidence=run["min_confidence"],
            sampling=sampling,
            policy=run.get("policy"),
        )
    return pair.baseline(run["prompt_ids"], run["max_tokens"], should_stop, sampling=sampling)


class Leader:
    """Rank 0's pair under `serve` in a group: each run it starts is sent to the other ranks
    first, which run it too (follow), and its stop decisions become theirs. Everything else is
    the pair's own. Only the fixed policy runs here: the adaptive one decides each cycle from
    the process's own timings, which the ranks would not agree on."""

    fixed_policy_only = True  # what the server reads (server.server_policy)

    def __init__(self, pair):
        self.pair = pair

    def __getattr__(self, name):
        return getattr(self.pair, name)

    def dflash(
        self,
        prompt_ids,
        max_tokens,
        block_size=None,
        should_stop=lambda: False,
        min_confidence=None,
        sampling=None,
        policy=None,
    ):
        if policy == "adaptive":
            raise DFlashError("the adaptive policy cannot run in a group (see Leader): use the fixed policy")
        policy = "fixed"  # also where none is given (see fixed_policy_only)
        return self._lead(
            {
                "engine": "dflash",
                "prompt_ids": list(prompt_ids),
                "max_tokens": max_tokens,
                "block_size": block_size,
                "min_confidence": min_confidence,
                "sampling": sampling and asdict(sampling),
                "policy": policy,
            },
            should_stop,
        )

    def baseline(self, prompt_ids, max_tokens, should_stop=lambda: False, sampling=None):
        return self._lead(
            {
                "engine": "baseline",
                "prompt_ids": list(prompt_ids),
                "max_tokens": max_tokens,
                "sampling": sampling and asdict(sampling),
            },
            should_stop,
        )

    def _lead(self, run: dict, should_stop):
        events = _start(self.pair, run, agreed(should_stop))  # a bad request fails here, before it is sent

        def sent_first():  # runs when the worker starts the run, not when it is queued
            share(run)
            yield from events

        return sent_first()

    def close(self):
        """Tell the other ranks that no run follows (they return from follow)."""
        share(None)


def follow(pair):
    """Ranks other than 0 under `serve`: run each run rank 0 starts, in its order, until it stops
    serving (Leader.close)."""
    from mlx_lm.generate import wired_limit

    while (run := share(None)) is not None:
        with wired_limit(pair.model):
            for _ in _start(pair, run, agreed(lambda: False)):
                pass
