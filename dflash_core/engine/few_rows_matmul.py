"""x @ w.T for a few rows of x (2..16) in float32 on CUDA: one read of the weights for all rows.

Why: a verify forward multiplies 2..16 rows by every weight matrix of the target. In bfloat16
MLX 0.32's CUDA matmul costs about the same for 1 and 16 rows, but in float32 (which the GPU runs
for exact greedy agreement) a Qwen3-4B-shaped target's forward of 16 rows cost 1.97 one-row
forwards on an H100, 8 rows 1.91 (bfloat16: 1.39), so the float32 multi-row matmul (TF32 off)
does not stream the weights once. The kernel here does: a block of 4 warps owns NW consecutive
output columns, its 128 threads split the shared dimension four floats at a time, each reading
those columns' weights once (coalesced) and every row of x (a few KB, served from cache), keep
NW x ROWS partial sums in registers, and sum them across the warp (shuffles) and then the block
(shared memory) at the end. On an H100 it took that forward to 1.41 (8 rows) and 1.76 (16 rows)
one-row forwards, against 2.03 and 2.02 for MLX's in the same visit (scripts/matmul_rows.py and
scripts/forward_rows.py; docs/benchmarks.md), and the oracle's cycle with it.

`install(model)` routes the model's nn.Linear layers (not quantized ones) through `matmul_t` by
swapping them for FewRowsLinear (same parameters); `matmul_t` is the bare product, for a tied LM
head. Anything else (one row, prefill, other dtypes, the CPU, Metal) takes MLX's own path, so the
baseline's one-row steps are MLX's, bit for bit. DFLASH_FEW_ROWS_MATMUL=0|1 overrides the default
(DEFAULT_ON). The sums run in another order than MLX's, so a verify's logits move in the last
bits, as MLX's own multi-row path moves them against its one-row path.
"""

import os
import threading

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

MIN_ROWS, MAX_ROWS = 2, 16
THREADS = 128  # 4 warps a block
ENV = "DFLASH_FEW_ROWS_MATMUL"
DEFAULT_ON = True  # measured on an H100 against MLX's own (scripts/matmul_rows.py): faster where it fits

_SOURCE = r"""
constexpr int WARPS = THREADS / 32;
__shared__ float dfm_partial[WARPS * NW * ROWS];
const int N = wgt_shape[0];
const int K4 = wgt_shape[1] / 4;
const int lane = threadIdx.x % 32;
const int warp = threadIdx.x / 32;
const int n0 = blockIdx.x * NW;
const float4* x4 = reinterpret_cast<const float4*>(act);
const float4* w4 = reinterpret_cast<const float4*>(wgt);
float acc[NW][ROWS];
#pragma unroll
for (int i = 0; i < NW; ++i) {
  #pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    acc[i][m] = 0.0f;
  }
}
for (int k = threadIdx.x; k < K4; k += THREADS) {
  float4 wv[NW];
  #pragma unroll
  for (int i = 0; i < NW; ++i) {
    wv[i] = n0 + i < N ? __ldg(w4 + (size_t)(n0 + i) * K4 + k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  #pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    const float4 xv = __ldg(x4 + (size_t)m * K4 + k);
    #pragma unroll
    for (int i = 0; i < NW; ++i) {
      float a = acc[i][m];
      a = fmaf(wv[i].x, xv.x, a);
      a = fmaf(wv[i].y, xv.y, a);
      a = fmaf(wv[i].z, xv.z, a);
      acc[i][m] = fmaf(wv[i].w, xv.w, a);
    }
  }
}
#pragma unroll
for (int i = 0; i < NW; ++i) {
  #pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    float s = acc[i][m];
    #pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      s += __shfl_down_sync(0xffffffffu, s, off);
    }
    if (lane == 0) {
      dfm_partial[warp * NW * ROWS + i * ROWS + m] = s;
    }
  }
}
__syncthreads();
for (int j = threadIdx.x; j < NW * ROWS; j += THREADS) {
  const int i = j / ROWS;
  const int m = j % ROWS;
  if (n0 + i < N) {
    float s = 0.0f;
    #pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      s += dfm_partial[w * NW * ROWS + j];
    }
    res[(size_t)m * N + n0 + i] = s;
  }
}
"""

_lock = threading.Lock()
_kernels = {}  # (rows, outputs per block) -> the mx.fast kernel
_state = {}  # "on": the switch as read at install; "checked": the self-check passed; "failed": why not


def on_cuda() -> bool:
    return mx.default_device().type == mx.DeviceType.gpu and hasattr(mx, "cuda") and mx.cuda.is_available()


def enabled() -> bool:
    """Whether install may swap layers: on MLX's CUDA backend as DEFAULT_ON or DFLASH_FEW_ROWS_MATMUL
    (0|1) says (never on the CPU or Metal), until a kernel failed to build or to match MLX."""
    flag = os.environ.get(ENV, "").strip()
    on = on_cuda() and (flag == "1" if flag in ("0", "1") else DEFAULT_ON)
    _state["on"] = on
    return on and "failed" not in _state


def outputs_per_block(n: int, k: int, rows: int) -> int:
    """Output columns a block owns. Every block reads all of x's rows, so more columns a block share
    each read of x among more sums; fewer columns give more blocks, whose reads of the weights keep
    the memory busy. Up to 8 rows: 4 for wide matrices, 2 for narrow ones. Above 8 rows the reads of
    x dominate: 4, and 8 where K is deep (by width on an H100 at 16 rows, ms, 2 / 4 / 8 columns:
    Qwen3-4B's down projection, 2560 x 9728, 0.099 / 0.081 / 0.065; its q, 4096 x 2560, 0.040 /
    0.035 / 0.036; at 8 rows 0.059 / 0.061 / 0.062 and 0.027 / 0.028 / 0.031;
    docs/results/h100-few-rows-matmul.json; on another H100 at 16 rows the down projection 0.122 /
    0.100 / 0.083, the o projection 0.054 / 0.053 / 0.039, the head 0.86 / 0.72 / 0.81:
    h100-few-rows-matmul-prefetch.json). Loading a step's weights ahead of its sums did not pay
    there: slower in 30 of 36 cases (shape, rows, width), by up to 32%, and at the best width
    never faster by more than 0.3%."""
    if rows > 8:
        return 8 if k >= 4096 else 4
    return 4 if n >= 8192 else 2


def _constants(rows: int, nw: int) -> str:
    """The kernel's template constants, ahead of _SOURCE (tests/test_kernel_emulation.py runs the same)."""
    return f"constexpr int ROWS = {rows};\nconstexpr int NW = {nw};\nconstexpr int THREADS = {THREADS};\n"


def _kernel(rows: int, nw: int):
    key = (rows, nw)
    with _lock:
        if key not in _kernels:
            _kernels[key] = mx.fast.cuda_kernel(
                name=f"dflash_few_rows_matmul_r{rows}_nw{nw}",
                input_names=["act", "wgt"],
                output_names=["res"],
                source=_constants(rows, nw) + _SOURCE,
            )
        return _kernels[key]


def fits(x: mx.array, w: mx.array) -> bool:
    """Whether matmul_t would take the kernel for x (..., K) and w (N, K). More than 8 rows of a
    wide, shallow matrix stay MLX's: there the kernel's sums outweigh its reads (16 rows of the
    default target's head, 49152 x 576, took it 0.118 ms against MLX's 0.076 on an H100)."""
    if w.ndim != 2 or x.dtype != mx.float32 or w.dtype != mx.float32:
        return False
    n, k = w.shape
    rows = x.size // k if k else 0
    return x.shape[-1] == k and k % 4 == 0 and MIN_ROWS <= rows <= MAX_ROWS and (rows <= 8 or k >= 1024 or n < 8192)


def few_rows_matmul(x: mx.array, w: mx.array, nw: int = None) -> mx.array:
    """x @ w.T through the kernel: x (..., K) with 2..16 rows in all, w (N, K), float32, CUDA."""
    n, k = w.shape
    rows = x.size // k
    nw = nw or outputs_per_block(n, k, rows)
    (y,) = _kernel(rows, nw)(
        inputs=[x.reshape(rows, k), w],
        grid=(-(-n // nw) * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(rows, n)],
        output_dtypes=[mx.float32],
    )
    return y.reshape(*x.shape[:-1], n)


def self_check() -> bool:
    """The kernel against MLX's matmul on one random case (once per process: at the first install)."""
    if "checked" in _state or "failed" in _state:
        return "failed" not in _state
    try:
        x = mx.random.normal((5, 264), key=mx.random.key(1))
        w = mx.random.normal((77, 264), key=mx.random.key(2))
        diff = mx.abs(few_rows_matmul(x, w) - x @ w.T).max().item()
    except Exception as err:  # a build failure (NVRTC) turns the path off, never the run
        _state["failed"] = f"build: {err}"
        return False
    if not diff < 1e-3:
        _state["failed"] = f"self-check: max difference {diff}"
        return False
    _state["checked"] = True
    return True


def matmul_t(x: mx.array, w: mx.array) -> mx.array:
    """x @ w.T: through the kernel where it fits and is on, else MLX's own."""
    if _state.get("on") and "failed" not in _state and fits(x, w):
        return few_rows_matmul(x, w)
    return x @ w.T


class FewRowsLinear(nn.Linear):
    """nn.Linear whose few-row float32 products take the kernel (same parameters, same output)."""

    def __call__(self, x: mx.array) -> mx.array:
        y = matmul_t(x, self["weight"])
        return y + self["bias"] if "bias" in self else y


def install(model) -> bool:
    """Swap `model`'s nn.Linear layers for FewRowsLinear (their arrays shared, not copied) where
    the kernel is on and passes its self-check; returns whether it did."""
    if not enabled() or not self_check():
        return False
    swaps = []
    for name, module in model.named_modules():
        if type(module) is nn.Linear:
            swapped = FewRowsLinear.__new__(FewRowsLinear)
            nn.Module.__init__(swapped)
            for key, value in module.items():  # weight (and bias): the same arrays
                swapped[key] = value
            swaps.append((name, swapped))
    if swaps:
        model.update_modules(tree_unflatten(swaps))
    return bool(swaps)
