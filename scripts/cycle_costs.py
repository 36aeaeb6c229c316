"""What one DFlash cycle costs against one plain decoding step, for target shapes with random
weights: the `cycle / step` table in docs/benchmarks.md. The speedup a draft can give is
tokens-per-cycle / (cycle / step), so this says how good a draft a target shape needs.

    python scripts/cycle_costs.py 6x256 16x256          # layers x hidden (MLP 3x hidden, 64-wide heads)
"""

import sys
import tempfile
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)
from dflash_core.engine.events import CycleEvent  # noqa: E402
from dflash_core.models.loading import load_pair  # noqa: E402
from dflash_core.training.random_models import write_draft, write_target  # noqa: E402


def measure(layers: int, hidden: int, draft_layers: int = 2, tokens: int = 128, repeats: int = 5) -> dict:
    root = Path(tempfile.mkdtemp())
    heads = hidden // 64
    target = write_target(
        root / "target",
        "qwen3",
        model_vocab=4096,
        tie=True,
        hidden=hidden,
        layers=layers,
        intermediate=3 * hidden,
        heads=heads,
        kv_heads=2 if heads % 2 == 0 else 1,
        head_dim=64,
    )
    pair = load_pair(str(target), str(write_draft(root / "draft", target, layers=draft_layers)), allow_download=False)
    ids = pair.encode("def parse(line):\n    x = 1\n", False)
    full = dict(min_confidence=0.0)  # the cost of verifying the whole block, whatever the draft's confidence
    list(pair.baseline(ids, tokens)), list(pair.dflash(ids, tokens, **full))  # warm-up
    # random weights make plain decoding's speed vary run to run: its best run is its cost
    step_ms = min(1e3 / list(pair.baseline(ids, tokens))[-1].decode_tps for _ in range(repeats))
    cycles = [e for e in pair.dflash(ids, tokens, **full) if isinstance(e, CycleEvent)]
    draft_ms, verify_ms, rollback_ms = (
        median(getattr(e, k) for e in cycles) for k in ("draft_ms", "verify_ms", "rollback_ms")
    )
    ratio = (draft_ms + verify_ms + rollback_ms) / step_ms
    return dict(
        shape=f"{layers}x{hidden}",
        step_ms=step_ms,
        draft_ms=draft_ms,
        verify_ms=verify_ms,
        cycle_per_step=ratio,
        tokens_per_cycle_for_2_5x=2.5 * ratio,
    )


if __name__ == "__main__":
    for shape in sys.argv[1:] or ["6x256"]:
        layers, hidden = map(int, shape.split("x"))
        r = measure(layers, hidden)
        print(
            f"{r['shape']}: step {r['step_ms']:.2f} ms, draft {r['draft_ms']:.2f} ms, verify {r['verify_ms']:.2f} ms, "
            f"cycle/step {r['cycle_per_step']:.2f}, tokens per cycle for 2.5x {r['tokens_per_cycle_for_2_5x']:.1f}"
        )
