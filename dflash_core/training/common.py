"""What the two trainers share: the learning-rate schedule, the optimizer step on float32 master
weights, the run's clock, progress bar, log lines and cadence, and the weight files they write."""

import argparse
import json
import math
import time
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map
from tqdm import tqdm

from ..backend import DTYPES


def add_compute_arguments(p):
    """How every trainer computes: the dtype of forward and backward, and whether the step is compiled."""
    p.add_argument(
        "--compute-dtype",
        choices=DTYPES,
        default="float32",
        help="bfloat16: forward and backward in 16 bits over float32 master weights "
        "(several times faster on a GPU; slow on a CPU)",
    )
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)


def count_params(model) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


def lr_at(progress: float, peak: float, warmup: float = 0.04, floor: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to floor * peak; progress in [0, 1]."""
    if progress < warmup:
        return peak * progress / warmup
    t = min(1.0, (progress - warmup) / (1 - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def value_and_master_grad(master, work, low, loss):
    """loss(work) and its gradient w.r.t. master's trainable weights, with `work` holding those
    weights cast to `low` (bfloat16: 16-bit forward and backward, float32 master weights for the
    optimizer). With low float32, work is master itself and this is plain value_and_grad."""

    def of(params):
        work.update(tree_map(lambda w: w.astype(low), params))
        return loss(work)

    return mx.value_and_grad(of)(master.trainable_parameters())


def make_step(master, work, low, opt, loss, state: list, compile: bool):
    """step(*batch) -> the batch's loss, after one update of master's weights by `opt` on the
    gradient of loss(model, *batch) (computed in `low`, see value_and_master_grad), clipped to
    norm 1. state: what the step reads and writes, for mx.compile (the models', the optimizer's)."""

    def step(*batch):
        value, grads = value_and_master_grad(master, work, low, lambda model: loss(model, *batch))
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(master, grads)
        return value

    return mx.compile(step, inputs=state, outputs=state) if compile else step


class Run:
    """A run's schedule and record. Iterating it yields each step's learning rate (lr_at) until
    the schedule is spent: `steps` steps, or with `minutes`, that much training time (the schedule
    then goes by the clock: a slower machine trains fewer steps), stopping at `steps` too if given.
    The clock starts after the first step, which traces the graph and compiles the kernels.
    Each step ends with record(); every log_every steps a line goes to `log`."""

    def __init__(
        self,
        steps: int,
        minutes: float,
        peak_lr: float,
        log_every: int,
        log,
        unit: str = "tok",
        steps_per_epoch: int = None,
    ):
        self.max_steps, self.budget = steps, minutes * 60 if minutes else None
        self.peak_lr, self.log_every, self._log = peak_lr, log_every, log
        self.unit, self.steps_per_epoch = unit, steps_per_epoch
        self.step = 0  # steps done
        self.losses = []  # every step's loss
        self.tokens = 0  # trained on, all steps
        self.lr = 0.0  # this step's
        self._t0 = time.time()
        self._timed_tokens = 0  # since the clock started: the tokens/s
        self._bar = None

    @property
    def seconds(self) -> float:
        """Training time so far (from the end of the first step)."""
        return time.time() - self._t0

    def spent(self) -> float:
        """The share of the schedule spent, by the clock or by steps."""
        return self.seconds / self.budget if self.budget else self.step / self.max_steps

    def __iter__(self):
        with tqdm(
            total=1.0,
            bar_format="{percentage:3.0f}%|{bar:20}| {elapsed}<{remaining}{postfix}",
            disable=None,
            leave=False,
        ) as self._bar:  # disable=None: a terminal only, not a log file
            while True:
                progress = self.spent()
                if progress >= 1 or (self.max_steps and self.step >= self.max_steps):
                    return
                self.lr = lr_at(progress, self.peak_lr)
                yield self.lr

    def record(self, loss: float, tokens: int):
        """The step just done: its loss and how many tokens it trained on."""
        if self.step == 0:
            self._t0 = time.time()
        else:
            self._timed_tokens += tokens
        self.tokens += tokens
        self.losses.append(loss)
        self.step += 1
        done = min(self.spent(), 1.0)
        self._bar.update(done - self._bar.n)
        if self.due(self.log_every):
            el = max(self.seconds, 1e-3)
            epoch = f"epoch {(self.step - 1) // self.steps_per_epoch + 1} " if self.steps_per_epoch else ""
            line = (
                f"{epoch}step {self.step} loss {np.mean(self.losses[-self.log_every :]):.3f} lr {self.lr:.2e} "
                f"{self._timed_tokens / el:,.0f} {self.unit}/s"
            )
            self._bar.set_postfix_str(line, refresh=False)
            self.log(f"{100 * done:3.0f}% {line} {el:.0f}s")

    def due(self, every: int) -> bool:
        """Whether something done every `every` steps (0: never) falls on the step just done."""
        return every > 0 and self.step % every == 0

    def log(self, message: str):
        """A line for the log, above the progress bar."""
        with tqdm.external_write_mode():
            self._log(message)


SHARD_BYTES = 16 * 2**20  # weight files stay small enough for any git host


def write_weights(out: Path, weights: dict, max_shard_bytes: int = SHARD_BYTES):
    """model.safetensors, or model-0000k-of-0000n.safetensors shards + model.safetensors.index.json
    when larger than max_shard_bytes (the Hugging Face layout, which mlx-lm reads)."""
    shards, size = [{}], 0
    for name, w in weights.items():
        if shards[-1] and size + w.nbytes > max_shard_bytes:
            shards, size = shards + [{}], 0
        shards[-1][name] = w
        size += w.nbytes
    n = len(shards)
    files = ["model.safetensors"] if n == 1 else [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    for old in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)  # an earlier save may have had another shard count
    for file, shard in zip(files, shards):
        mx.save_safetensors(str(out / file), shard, metadata={"format": "mlx"})
    if n > 1:
        index = {
            "metadata": {"total_size": sum(w.nbytes for w in weights.values())},
            "weight_map": {name: file for file, shard in zip(files, shards) for name in shard},
        }
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
