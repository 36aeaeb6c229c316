"""What one attention call costs on this GPU by query rows: MLX's sdpa against the fused few-rows
kernels (dflash_core/fused_attention.py), for the shapes of two targets: SmolLM2-135M (9 heads,
3 KV heads, head dim 64) at a 300-token cache and Qwen3-4B (32 / 8, head dim 128) at 300, 1024, 2048 and 4096,
rows 1, 2, 3, 4, 8, 16 (causal, the verify forward's mask), float32 and bfloat16. Two figures each,
medians after warm-up with mx.synchronize around each evaluation: one call evaluated alone (bound
by the evaluation's own overhead), the cost per call of many calls evaluated at once (what a
call adds to a forward's graph, where every layer's attention is evaluated together), and the host
time per call of building and launching them; on CUDA the single pass and the two passes apart too.

    python scripts/attention_rows.py
    python scripts/attention_rows.py --json attention_rows.json --repeats 200
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

from dflash_core.engine import fused_attention as fa  # noqa: E402

SHAPES = [  # (name, heads, KV heads, head dim, cache lengths)
    ("smollm2-135m", 9, 3, 64, (300,)),
    ("qwen3-4b", 32, 8, 128, (300, 1024, 2048, 4096)),
]
ROWS = (1, 2, 3, 4, 8, 16)
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}


def time_ms(fn, repeats: int, calls: int = 1, warmup: int = 5) -> float:
    """Median ms per call of evaluating `calls` calls of fn() at once (1: a lone op, bound by
    the eval's own overhead; many: what a call adds inside a forward's graph), each evaluation
    between two mx.synchronize calls."""
    times = []
    for i in range(warmup + repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval([fn() for _ in range(calls)])
        mx.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3 / calls)
    return median(times)


def host_us(fn, repeats: int, calls: int, warmup: int = 5) -> float:
    """Median µs of host time per call to build `calls` calls of fn() and hand them to the device
    (mx.async_eval returns once every kernel is launched): what a call costs the Python thread,
    which on a small model's forward is the critical path."""
    times = []
    for i in range(warmup + repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.async_eval([fn() for _ in range(calls)])
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e6 / calls)
        mx.synchronize()
    return median(times)


def measure_one(
    heads: int, kv_heads: int, head_dim: int, keys: int, rows: int, dtype, causal: bool, repeats: int, calls: int
):
    """One shape's figures: ms per call, alone and in a graph of `calls`, for MLX's sdpa and the
    fused kernels (as `attention` picks them; on CUDA also the single pass and the two passes
    apart, in a graph), and their largest difference."""
    kq, kk, kv = mx.random.split(mx.random.key(rows + keys), 3)
    q = mx.random.normal((1, heads, rows, head_dim), key=kq).astype(dtype)
    k = mx.random.normal((1, kv_heads, keys, head_dim), key=kk).astype(dtype)
    v = mx.random.normal((1, kv_heads, keys, head_dim), key=kv).astype(dtype)
    mx.eval(q, k, v)
    scale, mask = head_dim**-0.5, "causal" if causal else None

    def sdpa():
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    def fused():
        return fa.few_rows_attention(q, k, v, scale, causal)

    # against MLX's sdpa (in float32 on CUDA that runs TF32 matmuls unless MLX_ENABLE_TF32=0; the
    # tests check the kernels against an exact reference)
    diff = mx.max(mx.abs(fused().astype(mx.float32) - sdpa().astype(mx.float32))).item()
    few = max(5, repeats // 10)
    kinds = {}
    if fa.gpu_backend() == "cuda":
        for name, single in (("one_pass", True), ("two_pass", False)):
            kinds[f"{name}_graph_ms"] = round(
                time_ms(lambda single=single: fa._fused("cuda", q, k, v, scale, causal, None, single), few, calls), 4
            )
    return dict(
        **kinds,
        sdpa_ms=round(time_ms(sdpa, repeats), 4),
        fused_ms=round(time_ms(fused, repeats), 4),
        sdpa_graph_ms=round(time_ms(sdpa, few, calls), 4),
        fused_graph_ms=round(time_ms(fused, few, calls), 4),
        sdpa_host_us=round(host_us(sdpa, few, calls), 1),
        fused_host_us=round(host_us(fused, few, calls), 1),
        max_abs_diff_vs_sdpa=diff,
    )


def measure(repeats: int, causal: bool = True, calls: int = 32) -> list:
    out = []
    for name, heads, kv_heads, head_dim, lengths in SHAPES:
        for keys in lengths:
            for dname, dtype in DTYPES.items():
                for rows in ROWS:
                    plan = fa.launch_plan(heads, kv_heads, rows, keys, head_dim, fa.gpu_backend())
                    r = dict(shape=name, heads=heads, kv_heads=kv_heads, head_dim=head_dim, keys=keys)
                    r.update(dtype=dname, rows=rows, chunks=plan["chunks"], row_groups=plan["row_groups"])
                    r.update(measure_one(heads, kv_heads, head_dim, keys, rows, dtype, causal, repeats, calls))
                    out.append(r)
                    print(
                        f"{name:13s} N {keys:5d} {dname:8s} L {rows:2d} | alone: sdpa {r['sdpa_ms']:.4f} "
                        f"fused {r['fused_ms']:.4f} | in a graph of {calls}: sdpa {r['sdpa_graph_ms']:.4f} "
                        f"fused {r['fused_graph_ms']:.4f} (x{r['sdpa_graph_ms'] / r['fused_graph_ms']:.2f}) "
                        f"| host µs a call: sdpa {r['sdpa_host_us']:.0f} fused {r['fused_host_us']:.0f} "
                        f"| diff {r['max_abs_diff_vs_sdpa']:.2g} | chunks {r['chunks']}"
                        + (
                            f" | one pass {r['one_pass_graph_ms']:.4f}, two {r['two_pass_graph_ms']:.4f}"
                            if "one_pass_graph_ms" in r
                            else ""
                        ),
                        flush=True,
                    )
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=100, help="timed evaluations per figure (default 100)")
    p.add_argument("--calls", type=int, default=32, help="calls per evaluation in the graph figures (default 32)")
    p.add_argument("--full", action="store_true", help="no mask (the draft's attention) instead of causal")
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    args = p.parse_args(argv)
    backend = fa.gpu_backend()
    if backend is None:
        sys.exit("attention_rows: needs an MLX GPU (CUDA or Metal); MLX runs on the CPU here")
    print(f"MLX {mx.__version__} on {backend}: {mx.default_device()}")
    out = measure(args.repeats, causal=not args.full, calls=args.calls)
    if args.json:
        Path(args.json).write_text(json.dumps({"mlx": mx.__version__, "backend": backend, "rows": out}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
