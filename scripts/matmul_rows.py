"""What x @ w.T costs by rows of x on this GPU, MLX's own against dflash_core's few-row kernel
(dflash_core/engine/few_rows_matmul.py), for the weight shapes of the default target and of
Qwen3-4B, float32 (and MLX's bfloat16 beside them): the verify forward's matrix products.

    python scripts/matmul_rows.py --save matmul-rows.json
"""

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core.engine import few_rows_matmul as frm  # noqa: E402

SHAPES = {  # name -> (N, K) of w
    "smollm2 q/o 576x576": (576, 576),
    "smollm2 up 1536x576": (1536, 576),
    "smollm2 down 576x1536": (576, 1536),
    "smollm2 head 49152x576": (49152, 576),
    "qwen3-4b q 4096x2560": (4096, 2560),
    "qwen3-4b kv 1024x2560": (1024, 2560),
    "qwen3-4b o 2560x4096": (2560, 4096),
    "qwen3-4b up 9728x2560": (9728, 2560),
    "qwen3-4b down 2560x9728": (2560, 9728),
    "qwen3-4b head 151936x2560": (151936, 2560),
}


def per_call_ms(fn, xs, w, repeats: int) -> float:
    """Median ms a call, len(xs) calls evaluated together (launch costs overlap as in a forward)."""
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        mx.eval([fn(x, w) for x in xs])
        if i:
            times.append((time.perf_counter() - t0) * 1e3 / len(xs))
    return median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,4,8,16")
    parser.add_argument("--shapes", default="", help="only the shapes whose name holds this (e.g. qwen3-4b)")
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--save")
    args = parser.parse_args()
    shapes = {name: nk for name, nk in SHAPES.items() if args.shapes in name}
    if not shapes:
        sys.exit(f"error: no shape's name holds {args.shapes!r}; the names: {', '.join(SHAPES)}")
    if not frm.on_cuda():
        sys.exit("error: the few-row kernel needs MLX's CUDA backend; run this on an NVIDIA GPU")
    if not frm.self_check():
        sys.exit(f"error: the few-row kernel failed ({frm._state['failed']})")
    out = []
    for name, (n, k) in shapes.items():
        w = mx.random.normal((n, k)) * 0.02
        w16 = w.astype(mx.bfloat16)
        mx.eval(w, w16)
        for rows in [int(r) for r in args.rows.split(",")]:
            xs = [mx.random.normal((rows, k)) for _ in range(args.calls)]
            xs16 = [x.astype(mx.bfloat16) for x in xs]
            mx.eval(xs, xs16)
            row = {"shape": name, "rows": rows}
            row["mlx_f32_ms"] = per_call_ms(lambda x, w: x @ w.T, xs, w, args.repeats)
            row["mlx_bf16_ms"] = per_call_ms(lambda x, w: x @ w.T, xs16, w16, args.repeats)
            # the kernel at one row too (the engine sends it 2..16): what it would make of a plain step
            for nw in (2, 4, 8):
                row[f"kernel_nw{nw}_ms"] = per_call_ms(
                    lambda x, w, nw=nw: frm.few_rows_matmul(x, w, nw), xs, w, args.repeats
                )
            ref = xs[0] @ w.T
            row["max_rel_diff"] = (mx.abs(frm.few_rows_matmul(xs[0], w) - ref).max() / mx.abs(ref).max()).item()
            row["mlx_rows_vs_one_rel_diff"] = (mx.abs(ref[0] - xs[0][:1] @ w.T).max() / mx.abs(ref).max()).item()
            row["gb_per_s_mlx_f32"] = n * k * 4 / row["mlx_f32_ms"] / 1e6
            row["gb_per_s_kernel_nw4"] = n * k * 4 / row["kernel_nw4_ms"] / 1e6
            out.append({key: round(v, 4) if isinstance(v, float) else v for key, v in row.items()})
            print(json.dumps(out[-1]), flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps({"device": str(mx.default_device()), "rows": out}, separators=(",", ":")))


if __name__ == "__main__":
    main()
