"""The verification policy replayed over recorded outcomes: what each policy would have done, and
what knowing every outcome in advance would allow.

Greedy decoding makes a reply, and the draft's proposals at every position of it, fixed: the
draft sees only the target's hidden states of the committed tokens, which are the same whichever
cycles committed them. So one pass per request records, for every reply position taken as a
cycle's staged token, the draft's B-1 proposals and its probability of each (teacher-forced, as
the trainer scores blocks), and the target's probability of each reply token. A replay then runs
the engine's own `Policy` (dflash_core.engine.policy) over that record with the costs probed on
this machine (a plain step, the draft's forward, verifies of 1..B rows), in seconds per policy
instead of minutes per benchmark; the costs carry a little noise, as measured ones do.

Reported per prompt set, against plain decoding at the same costs: the adaptive and fixed policies,
"always draft" (the adaptive policy's choice of v with no plain steps), and the hindsight ceiling
(the fastest sequence of plain steps and drafted cycles of any v, chosen knowing every outcome: a
dynamic programme over reply positions), each as median / geometric mean / lowest speedup and the
count of requests under 1.0x.

    python scripts/policy_replay.py --record replay-record.json            # record (minutes), then replay
    python scripts/policy_replay.py --record replay-record.json --replay-only
    python scripts/policy_replay.py --record replay-record.json --replay-only --gpu-costs 3.3,1.0,3.6,4.2
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core import backend  # noqa: E402
from dflash_core.engine.cycle import accepted_length  # noqa: E402
from dflash_core.engine.events import CycleEvent, RunSummary  # noqa: E402
from dflash_core.engine.policy import (  # noqa: E402
    AcceptancePredictor,
    CostModel,
    CostProfile,
    Policy,
    probe_costs,
)
from dflash_core.loading import load_pair  # noqa: E402
from dflash_core.training.draft_blocks import block_logits  # noqa: E402
from scripts.plain_steps import plain_steps_ms  # noqa: E402

PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts"
SETS = {"chat_bench": 256, "examples": 128, "long_source": 128, "chat_heldout": 128}
CHUNK = 64  # blocks per draft forward while recording


def record_request(pair, ids: list, max_tokens: int) -> dict:
    """The greedy reply and, at each of its positions, the draft's proposals and confidences."""
    target, draft, head = pair.target, pair.draft, pair.target.draft_head(pair.draft_vocab)
    B, mask = pair.block_size, draft.config.mask_token_id
    reply = next(s for s in pair.baseline(ids, max_tokens) if isinstance(s, RunSummary)).tokens
    seq = ids + reply
    x = mx.array([seq])
    taps = [mx.stop_gradient(h) for h in target.sequence_taps(x)]
    logits = target.model(x)[0]
    sure = mx.exp(mx.max(logits, -1) - mx.logsumexp(logits, -1))  # at i: of token i + 1
    anchors = np.arange(len(ids), len(seq))
    proposals, confidence = [], []
    for c in range(0, len(anchors), CHUNK):
        at = anchors[c : c + CHUNK]
        blocks = np.full((len(at), B), mask)
        blocks[:, 0] = np.array(seq)[at]
        block = target.embed(mx.array(blocks))
        out = block_logits(draft, head.logits, taps, block, mx.array(at), mx.zeros(len(at), dtype=mx.int32))
        proposals += head.token_ids(mx.argmax(out, -1)).tolist()
        confidence += mx.exp(mx.max(out, -1) - mx.logsumexp(out, -1)).tolist()
    return {
        "prompt_len": len(ids),
        "seq": seq,
        "target_sure": sure[len(ids) - 1 :].tolist(),  # of reply token j (and one past the end)
        "proposals": proposals,
        "confidence": confidence,
    }


def measured_costs(pair, ids: list) -> dict:
    """Seconds of the draft's forward and of verifies of 1..B rows at this context (the probe's
    fastest of 3), and of a plain step as the engine takes it (pipelined, which hides graph
    building: cheaper than a one-row verify)."""
    head = pair.target.draft_head(pair.draft_vocab)
    profile = probe_costs(pair.target, pair.draft, head, pair.block_size, ids, repeats=3)
    plain_s = plain_steps_ms(pair.target, ids, 24) / 1e3
    return {"plain_s": plain_s, "draft_s": profile.draft_s, "verify_s": profile.verify_s}


def record(path: Path):
    pair = load_pair(None, None)
    out = {"block_size": pair.block_size, "prior": pair.acceptance_prior, "requests": {}, "costs": {}}
    for name, max_tokens in SETS.items():
        for i, text in enumerate(json.loads((PROMPTS / f"{name}.json").read_text())):
            ids = pair.encode(text, chat_template=True)
            out["requests"][f"{name}/{i}"] = record_request(pair, ids, max_tokens)
            print(f"recorded {name}/{i}", flush=True)
    short = pair.encode(json.loads((PROMPTS / "chat_bench.json").read_text())[0], chat_template=True)
    long = pair.encode(json.loads((PROMPTS / "long_source.json").read_text())[0], chat_template=True)
    out["costs"]["probe"] = measured_costs(pair, short[:64])  # the engine's own probe context
    out["costs"]["short"] = measured_costs(pair, (short * 8)[:300])
    out["costs"]["long"] = measured_costs(pair, long)
    path.write_text(json.dumps(out))


class AlwaysDraft(Policy):
    """The adaptive policy's choice of v, never a plain step."""

    def before_draft(self):
        return None


def replay(
    rec: dict, costs: dict, profile: CostProfile, prior: dict, B: int, policy: str, rng, noise: float, gpu: bool = False
) -> tuple:
    """(speedup against plain steps at the same costs, tokens per cycle, plain steps, cycles).
    `profile`: the probe's costs, and, as on a GPU, what the runs before this one left there (as
    one process's runs share it). `gpu`: as the engine runs on a GPU, the draft's confidence not
    read before the verify and the fixed rule verifying every proposal."""
    seq, start = rec["seq"], rec["prompt_len"]
    end = len(seq) - 1  # the last reply token ends the run (it is staged, then committed)
    cls = AlwaysDraft if policy == "always draft" else Policy
    rule = cls(
        B,
        CostModel(profile, way="pipelined" if gpu else None),  # a CPU's runs are synchronous
        AcceptancePredictor(B, prior),
        None if policy != "fixed" else backend.default_min_confidence(cpu=not gpu),
        reads_confidence=not gpu,  # as the engine passes backend.on_cpu()
    )

    def seconds(x):
        return x * max(0.5, 1 + noise * rng.standard_normal())

    def event(n, **fields):
        return CycleEvent(
            cycle=n,
            block_size=B,
            kv_trimmed=0,
            gdn_replayed=0,
            draft_ms=0.0,
            verify_ms=0.0,
            rollback_ms=0.0,
            t=0.0,
            **fields,
        )

    pos, t, cycles, plain = start, 0.0, 0, 0
    while pos < end:
        decision = rule.before_draft()
        if decision is not None:
            while pos < end:  # keep_plain is asked with one step in flight, as in the engine
                more = rule.keep_plain()
                ev = event(
                    cycles,
                    staged_token=seq[pos],
                    drafted=[],
                    confidence=[rec["target_sure"][pos - start + 1]],
                    verified=0,
                    posterior=[seq[pos + 1]],
                    accepted_len=0,
                    committed=[seq[pos]],
                    next_staged=seq[pos + 1],
                    decision=decision,
                )
                s = seconds(costs["plain_s"])
                rule.observe(ev, s)
                t, pos, cycles, plain = t + s, pos + 1, cycles + 1, plain + 1
                if not more:
                    break
            continue
        j = pos - start
        drafted, confidence = rec["proposals"][j], rec["confidence"][j]
        decision = rule.after_draft(confidence if rule.reads_confidence else None)
        v = min(decision.verified, end - pos)
        a = accepted_length(drafted[:v], seq[pos + 1 : pos + 1 + v] + [-1])
        ev = event(
            cycles,
            staged_token=seq[pos],
            drafted=drafted,
            confidence=confidence,
            verified=v,
            posterior=seq[pos + 1 : pos + a + 2],
            accepted_len=a,
            committed=seq[pos : pos + a + 1],
            next_staged=seq[min(pos + a + 1, end)],
            decision=decision,
        )
        s = seconds(costs["draft_s"] + costs["verify_s"][v])
        rule.observe(ev, s)
        t, pos, cycles = t + s, pos + a + 1, cycles + 1
    rule.costs.carry()
    steps = end - start  # plain decoding's steps after the first token (the prefill's), as timed
    return steps * costs["plain_s"] / t, min(pos - start, steps) / cycles, plain, cycles


def hindsight(rec: dict, costs: dict, B: int) -> float:
    """The fastest any policy could be, knowing each cycle's outcome: the least time to the end
    of the reply over every sequence of plain steps and drafted cycles of any v."""
    seq, start = rec["seq"], rec["prompt_len"]
    end = len(seq) - 1
    best = [0.0] * (end + 2)
    for pos in range(end - 1, start - 1, -1):
        drafted = rec["proposals"][pos - start]
        options = [costs["plain_s"] + best[pos + 1]]
        for v in range(1, min(B - 1, end - pos) + 1):
            a = accepted_length(drafted[:v], seq[pos + 1 : pos + 1 + v] + [-1])
            options.append(costs["draft_s"] + costs["verify_s"][v] + best[pos + a + 1])
        best[pos] = min(options)
    return (end - start) * costs["plain_s"] / best[start]


def milliseconds(text: str) -> tuple:
    """--gpu-costs' four figures."""
    try:
        ms = tuple(float(x) for x in text.split(","))
    except ValueError:
        ms = ()
    if len(ms) != 4 or min(ms) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give four positive milliseconds, e.g. 3.3,1.0,3.6,4.2")
    return ms


def gpu_costs(ms: tuple, B: int) -> dict:
    """(PLAIN, DRAFT, VERIFY_1, VERIFY_B) ms as the costs of every context: a verify's rows priced
    on the line between one row and B."""
    plain, draft, one, whole = (x / 1e3 for x in ms)
    costs = {"plain_s": plain, "draft_s": draft, "verify_s": [one + (whole - one) * v / (B - 1) for v in range(B)]}
    return {"probe": costs, "short": costs, "long": costs}


def report(data: dict, seeds: int, noise: float, gpu_ms: tuple = None):
    B, prior = data["block_size"], data["prior"]
    c = gpu_costs(gpu_ms, B) if gpu_ms else data["costs"]
    print(
        "costs, ms: plain step {:.1f} (short context) / {:.1f} (long); draft {:.1f} / {:.1f}; verify of 2 / 8 rows "
        "{:.1f} / {:.1f} (short)".format(
            c["short"]["plain_s"] * 1e3,
            c["long"]["plain_s"] * 1e3,
            c["short"]["draft_s"] * 1e3,
            c["long"]["draft_s"] * 1e3,
            c["short"]["verify_s"][1] * 1e3,
            c["short"]["verify_s"][B - 1] * 1e3,
        )
    )
    rows, profiles = {}, {}  # one profile per policy and noise draw, shared by its runs in order
    for key, rec in data["requests"].items():
        if gpu_ms and key.startswith("long_source"):  # a long context's costs on a GPU are not these
            continue
        costs = c["long"] if key.startswith("long_source") else c["short"]
        for policy in ("adaptive", "fixed", "always draft"):
            runs = [
                replay(
                    rec,
                    costs,
                    profiles.setdefault((policy, s), CostProfile(c["probe"]["draft_s"], c["probe"]["verify_s"])),
                    prior,
                    B,
                    policy,
                    np.random.default_rng(s),
                    noise,
                    bool(gpu_ms),
                )
                for s in range(seeds)
            ]
            rows.setdefault((key.split("/")[0], policy), []).append(float(np.median([r[0] for r in runs])))
        rows.setdefault((key.split("/")[0], "hindsight"), []).append(hindsight(rec, costs, B))
    print("| prompts | policy | median | geometric mean | lowest | requests under 1.0x |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (name, policy), xs in rows.items():
        gm = float(np.exp(np.mean(np.log(xs))))
        low = sum(round(x, 2) < 1 for x in xs)
        print(f"| {name} ({len(xs)}) | {policy} | {np.median(xs):.2f}x | {gm:.2f}x | {min(xs):.2f}x | {low} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--record", type=Path, required=True, help="the recorded outcomes (JSON; written unless --replay-only)"
    )
    ap.add_argument("--replay-only", action="store_true")
    ap.add_argument("--seeds", type=int, default=5, help="replays per request (noise draws); the median is reported")
    ap.add_argument("--noise", type=float, default=0.05, help="relative noise of each cycle's measured seconds")
    ap.add_argument(
        "--gpu-costs",
        type=milliseconds,
        metavar="PLAIN,DRAFT,VERIFY_1,VERIFY_B",
        help="replay as on a GPU at these costs (ms), instead of the recorded ones: the draft's confidence "
        "not read before the verify, the fixed rule verifying every proposal (the long prompt left out)",
    )
    args = ap.parse_args()
    if not args.replay_only:
        record(args.record)
    report(json.loads(args.record.read_text()), args.seeds, args.noise, args.gpu_costs)


if __name__ == "__main__":
    main()
