"""What an MLX custom kernel call costs the host, and which of its parts: on a GPU bound by the host
(a small target's forward), each of the fused attention's calls adds to every verify.

For each variant, 30 independent calls on small arrays (the work itself is negligible): the median
µs per call to build them (Python and MLX's graph construction) and to build and launch them
(mx.async_eval returns once every kernel is handed to the device). Variants: a built-in add; MLX's
sdpa at 1 and 8 rows (SmolLM2-135M's shape, 300 keys); the fused attention as the engine calls it;
then trivial custom kernels that differ in one thing each (template arguments, outputs, shape and
stride arguments, the source's size), which says where a custom call's cost comes from.

    python scripts/kernel_host_cost.py [--json FILE]
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

from dflash_core.engine import attention_kernels as ak  # noqa: E402
from dflash_core.engine import fused_attention as fa  # noqa: E402

CALLS = 30


def per_call_us(fn, repeats: int, launch: bool, warmup: int = 5) -> float:
    times = []
    for i in range(warmup + repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [fn() for _ in range(CALLS)]
        if launch:
            mx.async_eval(outs)
        t = time.perf_counter() - t0
        mx.eval(outs)
        if i >= warmup:
            times.append(t * 1e6 / CALLS)
    return median(times)


def trivial(name: str, source: str, inputs: list, outputs: int = 1, header: str = ""):
    return mx.fast.cuda_kernel(
        name=name,
        input_names=inputs,
        output_names=[f"o{i}" for i in range(outputs)],
        source=source,
        header=header,
        ensure_row_contiguous=False,
    )


def variants() -> dict:
    q8 = mx.random.normal((1, 9, 8, 64))
    q1 = mx.random.normal((1, 9, 1, 64))
    k = mx.random.normal((1, 3, 300, 64))
    v = mx.random.normal((1, 3, 300, 64))
    x = mx.random.normal((64,))
    mx.eval(q8, q1, k, v, x)
    body = "  const int i = threadIdx.x; o0[i] = q[i];"
    shaped = "  const int i = threadIdx.x; o0[i] = q[i] + q_shape[1] + k_strides[2] + v_shape[0];"
    padding = "// " + "x" * 8000 + "\n"
    plain = trivial("dfa_probe_min", body, ["q"])
    templated = trivial("dfa_probe_template", body, ["q"])
    three_out = trivial("dfa_probe_outputs", body, ["q"], outputs=3)
    with_shapes = trivial("dfa_probe_shapes", shaped, ["q", "k", "v"])
    big = trivial("dfa_probe_big", padding + body, ["q"])
    big_header = trivial("dfa_probe_header", body, ["q"], header=ak.CUDA_HEADER + padding)
    small = dict(grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)], output_dtypes=[mx.float32])
    template = [("T", mx.float32), ("D", 64), ("CAUSAL", True), ("MAXR", 32), ("RPW", 4)]
    return {
        "builtin add": lambda: x + 1.0,
        "mlx sdpa 1 row": lambda: mx.fast.scaled_dot_product_attention(q1, k, v, scale=0.125, mask="causal"),
        "mlx sdpa 8 rows": lambda: mx.fast.scaled_dot_product_attention(q8, k, v, scale=0.125, mask="causal"),
        "fused attention 8 rows (2 kernels)": lambda: fa.attention(q8, k, v, 0.125, "causal"),
        "custom: minimal": lambda: plain(inputs=[x], **small)[0],
        "custom: + 5 template arguments": lambda: templated(inputs=[x], template=template, **small)[0],
        "custom: 3 outputs": lambda: three_out(
            inputs=[x],
            grid=(32, 1, 1),
            threadgroup=(32, 1, 1),
            output_shapes=[(32,)] * 3,
            output_dtypes=[mx.float32] * 3,
        )[0],
        "custom: shape/stride arguments of 3 inputs": lambda: with_shapes(inputs=[q8, k, v], **small)[0],
        "custom: 8 KB source": lambda: big(inputs=[x], **small)[0],
        "custom: 9 KB header": lambda: big_header(inputs=[x], **small)[0],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if fa.gpu_backend() != "cuda":
        sys.exit("kernel_host_cost.py measures MLX's CUDA backend: run it on an NVIDIA GPU")
    rows = []
    for name, fn in variants().items():
        mx.eval(fn())  # compile once
        build = per_call_us(fn, args.repeats, launch=False)
        launch = per_call_us(fn, args.repeats, launch=True)
        rows.append({"variant": name, "build_us": round(build, 1), "build_and_launch_us": round(launch, 1)})
        print(f"{name:45s} build {build:6.1f} µs   build + launch {launch:6.1f} µs a call", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(mx.default_device()), "calls": CALLS, "rows": rows}))


if __name__ == "__main__":
    main()
