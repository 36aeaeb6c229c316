"""Fused attention for a few query rows (up to 16) over a KV cache, on MLX's GPU backends.

Why: on CUDA, mx.fast.scaled_dot_product_attention has fused kernels only for fewer than 4 query
rows (MLX 0.32.4); the target's verify forward (up to 16 rows, causal, over the cache) and the
draft's block attention (8..16 rows, bidirectional over [context ; block]) take MLX's unfused path
instead (scale, scores, mask, softmax, a second matmul: several launches and round trips through
memory). The kernels here do it in two launches, reading each key and value once per KV head:

  pass 1, one thread block per (key chunk, KV head, row group): the block scores each tile of 32
    keys against all of its query rows (the H / KVH query heads that share the KV head, times L
    rows), keeps a running max, sum and unnormalised output per row (online softmax, float32),
    and writes them per chunk;
  pass 2, one thread per output element: combines the chunks' partials.
  One launch instead (one key chunk per block, the output normalised in place) measured slower on
  an H200: a cycle of the default pair 12.1 ms against 8.2 (scripts/host_overlap.py).

On CUDA a call of few rows over a short cache takes a single pass instead (one_pass,
attention_kernels.CUDA_ONEPASS): there the two passes' second launch and their blocks of one or two
warps (a 1-row call's) cost more than the work. On an H100 the held-out requests read 1.84x median
with it against 1.52x with the two passes, one after the other (docs/benchmarks.md).

The chunk count grows with the cache (enough blocks at 300 keys and at 32K). Contract, like MLX's:
q (1, H, L, D), k and v (1, KVH, N, D); causal: row i sees keys j <= N - L + i (the block sits at
the end of the cache). `attention` is what the project calls: it takes the kernels only where they
were measured faster (4..16 rows, cache length x rows within max_keys_x_rows) and MLX's own for
anything else; `install(model)` routes an mlx-lm model's attention through it. Both are off on the
CPU, where MLX's path is unchanged bit for bit.

On an H100 (per call in a graph of 32, scripts/attention_rows.py), 4..16 rows, causal: 9 heads / 3 KV /
head dim 64 at 300 keys MLX 0.075-0.10 ms, fused 0.017-0.019; 32 / 8 / 128 at 4096 keys, float32,
MLX 0.13-0.17, fused 0.07-0.16. Each variant is compiled by NVRTC at its first use: about 2.5 s.

DFLASH_FUSED_ATTENTION=0|1 overrides the default (on for CUDA, off for Metal, never on the CPU);
DFLASH_FUSED_ATTENTION_VERBOSE=1 prints each kernel's generated source once.
"""

import math
import os
import sys
import threading

import mlx.core as mx

from .attention_kernels import CUDA_HEADER, CUDA_ONEPASS, CUDA_PASS1, CUDA_PASS2
from .device_cache import DeviceKVCache
from .metal_kernels import METAL_PASS1, METAL_PASS2

TILE = 32  # keys per tile: one per lane when scoring (kernels' TK)
ROWS_PER_WARP = 4  # query rows a warp (Metal: SIMD group) owns (kernels' RPW)
TARGET_BLOCKS = 512  # pass-1 blocks to aim for: ~4 per multiprocessor on an H200 (132)
MAX_CHUNKS = 1024
HEAD_DIMS = (64, 128, 256)
DTYPES = (mx.float32, mx.bfloat16, mx.float16)
MAX_ROWS = 16  # query rows per call that `attention` sends to the kernels
# ... and the fewest: MLX 0.32's CUDA sdpa has its own fused kernel for 1-3 rows, faster than ours
# (an H100, 300 keys, in a graph: 0.007-0.011 ms a call, the single pass 0.014-0.017), so they stay MLX's
MIN_ROWS = 4
# The single pass (CUDA): W warps a block, each block RB rows of one KV head (fewer at head dim 256,
# whose rows take twice the registers). In a graph on an H100 (docs/results/h100-attention-rows.json)
# it beats the two passes at 1-4 rows up to 4,096 keys (there 0.04-0.07 ms a call against 0.07-0.14)
# and at 8-16 rows up to about 8,192 rows x keys (16 rows over 1,024 keys: 0.087 against 0.071).
# Keys here are a compiled cycle's whole fixed-size cache.
ONE_PASS_WARPS = 8
ONE_PASS_ROWS = 8
ONE_PASS_MAX_KEYS = 4096
ONE_PASS_MAX_ROW_KEYS = 8192  # rows x keys, for more than 4 rows
ENV = "DFLASH_FUSED_ATTENTION"
ENV_VERBOSE = "DFLASH_FUSED_ATTENTION_VERBOSE"


# Shared memory for the queries, per block (this sets MAXR): CUDA's static limit is 48 KB (the K
# and V chunks and the probabilities take up to 20.9 KB more), Metal's threadgroup memory 32 KB
# (its K and V chunks take 16.6 KB).
_QUERY_BYTES = {"cuda": 16384, "metal": 15104}

_lock = threading.RLock()
_kernels = {}  # (backend, pass, template) -> the mx.fast kernel object (built once)
_plans = {}  # (backend, shape, dtype, causal) -> the kernel calls (_launches)
_scales = {}  # scale -> a (1,) float32 array (the kernels take the scale as an input)
_checked = {}  # (backend, dtype, head dim, causal) -> True once the self-check passed
_printed = set()  # kernel variants whose source was printed (verbose)
_failed = None  # why the fused path is off for the rest of the process, once something failed
# (backend, on, verbose) as enabled() last read them: `attention` runs once per layer and reading
# the environment there cost ~5% of a small target's cycle on an H100 (scripts/cycle_profile.py)
_switch = None


def gpu_backend():
    """'cuda' or 'metal' when MLX's default device is a GPU of that backend, else None."""
    if mx.default_device().type != mx.DeviceType.gpu:
        return None
    if hasattr(mx, "cuda") and mx.cuda.is_available():
        return "cuda"
    if mx.metal.is_available():
        return "metal"
    return None


def enabled() -> bool:
    """Whether `attention` may use the fused kernels: on by default on CUDA, off on Metal (not
    measured there yet), never on the CPU; DFLASH_FUSED_ATTENTION=0|1 overrides on a GPU. Off for
    the rest of the process once a kernel failed to build or its self-check failed. Reads the
    environment; `attention` keeps the answer (install() asks at load)."""
    global _switch
    backend = gpu_backend()
    flag = os.environ.get(ENV, "").strip()
    on = backend is not None and (flag == "1" if flag in ("0", "1") else backend == "cuda")
    _switch = (backend, on, os.environ.get(ENV_VERBOSE, "") == "1")
    return on and _failed is None


def _settings() -> tuple:
    """(backend, on, verbose) as enabled() last read them, read now if it never has."""
    if _switch is None:
        enabled()
    return _switch


_SOURCES = {
    ("cuda", "pass1"): CUDA_PASS1,
    ("cuda", "pass2"): CUDA_PASS2,
    ("cuda", "onepass"): CUDA_ONEPASS,
    ("metal", "pass1"): METAL_PASS1,
    ("metal", "pass2"): METAL_PASS2,
}
_OUTPUTS = {"pass1": ["po", "pm", "pl"], "pass2": ["out"], "onepass": ["out"]}


# MLX's names for the template types in each backend's kernel language
_TYPE_NAMES = {
    "cuda": {mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16"},
    "metal": {mx.float32: "float", mx.float16: "half", mx.bfloat16: "bfloat16_t"},
}


def _compact(source: str) -> str:
    """A kernel body without its comments and indentation (the lines kept: `#pragma`s need their
    own). MLX copies the whole source into each call's kernel and hashes it at every launch."""
    lines = (line.split("//", 1)[0].strip() for line in source.splitlines())
    return "\n".join(line for line in lines if line)


def _constants(backend: str, template: tuple) -> str:
    """`template` as the body's first lines, as MLX would write them from `template=`."""
    lines = []
    for name, value in template:
        if isinstance(value, mx.Dtype):
            lines.append(f"using {name} = {_TYPE_NAMES[backend][value]};")
        elif isinstance(value, bool):
            lines.append(f"constexpr bool {name} = {str(value).lower()};")
        else:
            lines.append(f"constexpr int {name} = {value};")
    return "\n".join(lines) + "\n"


def _kernel(backend: str, which: str, template: tuple):
    """The mx.fast kernel object for one pass and one set of template constants, made once. The
    constants are written into its source rather than passed as MLX's `template=`: a call then
    hands MLX less to convert and format (each of a verify's 60 calls costs the host; see
    scripts/kernel_host_cost.py), and MLX compiles one kernel per source all the same."""
    key = (backend, which, template)
    kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    with _lock:
        if key not in _kernels:
            make = mx.fast.cuda_kernel if backend == "cuda" else mx.fast.metal_kernel
            extra = {"header": _compact(CUDA_HEADER)} if backend == "cuda" else {}
            variant = "_".join(str(v).rsplit(".", 1)[-1].lower() for _, v in template)
            length = dict(template).get("LENGTH", False)
            inputs = ["po", "pm", "pl"] if which == "pass2" else ["q", "k", "v", "scale"] + ["valid"] * length
            keys = "dfa_min(k_shape[2], valid[0])" if length else "k_shape[2]"  # CUDA's kernels read DFA_KEYS
            _kernels[key] = make(
                name=f"dflash_rows_{which}_{variant}",
                input_names=inputs,
                output_names=_OUTPUTS[which],
                source=_constants(backend, template)
                + f"#define DFA_KEYS {keys}\n"
                + _compact(_SOURCES[(backend, which)]),
                ensure_row_contiguous=False,
                **extra,
            )
        return _kernels[key]


def _scale_array(scale: float) -> mx.array:
    arr = _scales.get(scale)
    if arr is None:  # a race makes two equal arrays, one of them kept: no lock needed
        arr = _scales[scale] = mx.array([float(scale)], dtype=mx.float32)
    return arr


def _first_print(key) -> bool:
    """Whether a kernel variant's source is yet to be printed (DFLASH_FUSED_ATTENTION_VERBOSE=1)."""
    with _lock:
        if key in _printed:
            return False
        _printed.add(key)
        return True


def launch_plan(heads: int, kv_heads: int, rows: int, keys: int, head_dim: int, backend: str = "cuda") -> dict:
    """How few_rows_attention splits the work: rows a block holds (max_rows, a template constant),
    warps per block, row groups, key chunks. Pure arithmetic, so the tests can check it anywhere."""
    group_rows = (heads // kv_heads) * rows  # query rows that share one KV head
    max_rows = min(32, _QUERY_BYTES[backend] // (4 * head_dim) // ROWS_PER_WARP * ROWS_PER_WARP)
    block_rows = min(max_rows, -(-group_rows // ROWS_PER_WARP) * ROWS_PER_WARP)
    row_groups = -(-group_rows // block_rows)
    tiles = -(-keys // TILE)
    per_chunk = kv_heads * row_groups  # blocks for one key chunk
    chunks = max(1, min(tiles, -(-TARGET_BLOCKS // per_chunk), MAX_CHUNKS))
    return {
        "max_rows": max_rows,
        "warps": block_rows // ROWS_PER_WARP,
        "row_groups": row_groups,
        "chunks": chunks,
    }


def one_pass(backend: str, rows: int, keys: int) -> bool:
    """Whether a call of `rows` query rows over a cache of `keys` takes the single pass (CUDA)."""
    return backend == "cuda" and keys <= ONE_PASS_MAX_KEYS and (rows <= 4 or rows * keys <= ONE_PASS_MAX_ROW_KEYS)


def _launches(backend: str, shape: tuple, dtype, causal: bool, length: bool = False, single: bool = None) -> list:
    """The kernel calls for one (q shape, KV heads, keys, dtype, mask) as (which, template, grid,
    threadgroup, output shapes, output dtypes), worked out once per shape: the verify asks for
    the same few shapes every cycle, and on a GPU bound by the host this arithmetic counts.
    `single`: the single pass or the two (None: as one_pass says)."""
    H, L, D, KVH, N = shape
    single = one_pass(backend, L, N) if single is None else single
    key = (backend, shape, dtype, causal, length, single)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    common = (("T", dtype), ("D", D), ("CAUSAL", bool(causal)))  # and LENGTH last, where given
    with_length = (("LENGTH", True),) if length else ()
    if single:
        rb = ONE_PASS_ROWS if D <= 128 else ONE_PASS_ROWS // 2
        template = (*common, ("RB", rb), ("W", ONE_PASS_WARPS), *with_length)
        threads, groups = 32 * ONE_PASS_WARPS, -(-(H // KVH) * L // rb)
        plan = [("onepass", template, (KVH * threads, groups, 1), (threads, 1, 1), [(1, H, L, D)], [dtype])]
    else:
        p = launch_plan(H, KVH, L, N, D, backend)
        rows, threads = H * L, 32 * p["warps"]
        template = (*common, ("MAXR", p["max_rows"]), ("RPW", ROWS_PER_WARP), *with_length)
        nc, f32 = p["chunks"], mx.float32
        total = rows * D
        pass1_shapes = [(rows, nc, D), (rows, nc), (rows, nc)]
        plan = [
            ("pass1", template, (nc * threads, KVH, p["row_groups"]), (threads, 1, 1), pass1_shapes, [f32] * 3),
            ("pass2", (("T", dtype), ("D", D)), (total, 1, 1), (min(256, total), 1, 1), [(1, H, L, D)], [dtype]),
        ]
    with _lock:
        if len(_plans) > 4096:  # one entry per cache length seen: start over now and then
            _plans.clear()
        _plans[key] = plan
    return plan


def few_rows_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool, valid: mx.array = None
) -> mx.array:
    """softmax(scale * q k^T [+ causal mask]) v on the GPU, in one or two fused launches.

    q (1, H, L, D), k and v (1, KVH, N, D), H % KVH == 0 (query head h reads KV head
    h // (H // KVH)), 1 <= L <= 16, L <= N, D in (64, 128, 256), one dtype of float32, bfloat16,
    float16. causal: row i sees keys j <= N - L + i. valid (CUDA): an int32 array of one
    element, the keys that count (the first valid of the N; N stands for it above), known only on
    the device (a DeviceKVCache's). Returns (1, H, L, D) in q's dtype; the softmax and sums are
    float32. Raises where MLX has no GPU kernel backend (the CPU)."""
    backend = gpu_backend()
    if backend is None:
        raise RuntimeError("few_rows_attention needs an MLX GPU (CUDA or Metal)")
    _, H, L, D = q.shape
    _, KVH, N, _ = k.shape
    if q.shape[0] != 1 or k.shape[0] != 1 or v.shape != k.shape or k.shape[3] != D:
        raise ValueError(f"few_rows_attention: q {q.shape}, k {k.shape}, v {v.shape}")
    if D not in HEAD_DIMS or H % KVH or not 1 <= L <= min(N, MAX_ROWS):
        raise ValueError(f"few_rows_attention: unsupported q {q.shape}, k {k.shape}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"few_rows_attention: dtypes {q.dtype}, {k.dtype}, {v.dtype}")
    if valid is not None and backend != "cuda":
        raise ValueError("few_rows_attention: a device-side key count needs CUDA")
    return _fused(backend, q, k, v, scale, causal, valid)


def _fused(backend: str, q, k, v, scale: float, causal: bool, valid: mx.array = None, single: bool = None) -> mx.array:
    """few_rows_attention's launches, its inputs already checked (by it, or by `attention`);
    `single`: as _launches'."""
    _, H, L, D = q.shape
    _, KVH, N, _ = k.shape
    verbose = _settings()[2]
    inputs = [q, k, v, _scale_array(scale)] + ([] if valid is None else [valid])  # valid: (1,) int32
    plan = _launches(backend, (H, L, D, KVH, N), q.dtype, causal, valid is not None, single)
    for which, template, grid, threadgroup, shapes, dtypes in plan:
        extra = {"verbose": True} if verbose and _first_print((backend, which, template)) else {}
        inputs = _kernel(backend, which, template)(
            inputs=inputs,
            grid=grid,
            threadgroup=threadgroup,
            output_shapes=shapes,
            output_dtypes=dtypes,
            **extra,
        )
    return inputs[0]


def reference_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool) -> mx.array:
    """The same contract in plain MLX ops, float32 throughout (runs on any device): explicit
    scores, the lower-right causal mask, softmax, P.V; the result in q's dtype. On CUDA its float32
    matmuls run in TF32 unless MLX_ENABLE_TF32=0 (errors ~1e-4): compare on the CPU, or with it off."""
    B, H, L, D = q.shape
    KVH, N = k.shape[1], k.shape[2]
    G = H // KVH
    qf = (q.astype(mx.float32) * scale).reshape(B, KVH, G, L, D)
    kf = k.astype(mx.float32)[:, :, None]
    vf = v.astype(mx.float32)[:, :, None]
    scores = qf @ kf.swapaxes(-1, -2)  # (B, KVH, G, L, N)
    if causal:
        visible = mx.arange(N - L, N)[:, None] >= mx.arange(N)[None]
        scores = mx.where(visible, scores, mx.array(-mx.inf, mx.float32))
    probs = mx.softmax(scores, axis=-1, precise=True)
    return (probs @ vf).reshape(B, H, L, D).astype(q.dtype)


def max_keys_x_rows(dtype, causal: bool) -> int:
    """Where the fused kernels pay, as cache length x rows, from per-call costs inside a graph on
    an H200 (scripts/attention_rows.py; MLX 0.32.4). float32 causal: 1.8-2.6x at 300 keys, 1.6x at
    4096 x 4..16 rows, 1.1x at 32768 x 4, 0.7x at 32768 x 16. 16-bit causal: 1.3-2.2x at 300 keys,
    1.3x at 4096 x 4, even at 4096 x 8, 0.7-0.8x at 4096 x 16, 0.3-0.4x at 32K (MLX's bf16 matmuls
    are fast there). No mask (the draft's; MLX then builds no mask either): 1.14x in float32 at 316
    x 16, 0.89x in bfloat16, so 16-bit without a mask stays with MLX."""
    if dtype == mx.float32:
        return 2**17 if causal else 2**14
    return 2**14 if causal else 0


def _fusable(q, k, v, mask, fewest_rows: int = MIN_ROWS) -> bool:
    """The calls the kernels cover; anything else goes to MLX's own sdpa."""
    if mask is not None and not (isinstance(mask, str) and mask == "causal"):
        return False
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape or q.shape[0] != 1 or k.shape[0] != 1:
        return False
    _, H, L, D = q.shape
    KVH, N = k.shape[1], k.shape[2]
    return (
        fewest_rows <= L <= MAX_ROWS
        and L <= N
        and N * L <= max_keys_x_rows(q.dtype, mask is not None)
        and D in HEAD_DIMS
        and k.shape[3] == D
        and H % KVH == 0
        and q.dtype in DTYPES
        and k.dtype == q.dtype
        and v.dtype == q.dtype
    )


def _fail(reason: str) -> None:
    global _failed
    with _lock:
        if _failed is None:
            _failed = reason
            print(f"dflash: fused attention disabled, using MLX's attention instead: {reason}", file=sys.stderr)


def _self_check(backend: str, dtype, head_dim: int, causal: bool, length: bool = False) -> bool:
    """Once per (backend, dtype, head dim, causal, length): the kernels (on CUDA both the single
    pass and the two) on small random inputs against the float32 reference (GQA 2, 3 rows, 45 keys: two chunks, the second partial; with
    `length`, the first 40 of them valid). A build error or a mismatch turns the fused path off for
    the process, with one warning line."""
    key = (backend, dtype, head_dim, bool(causal), length)
    ok = _checked.get(key)
    if ok is not None:  # every call after the first: no lock
        return ok
    with _lock:
        if key in _checked:
            return _checked[key]
        try:
            rk = mx.random.split(mx.random.key(20251203), 3)
            q = mx.random.normal((1, 4, 3, head_dim), key=rk[0]).astype(dtype)
            k = mx.random.normal((1, 2, 45, head_dim), key=rk[1]).astype(dtype)
            v = mx.random.normal((1, 2, 45, head_dim), key=rk[2]).astype(dtype)
            scale = head_dim**-0.5
            valid = mx.array([40], dtype=mx.int32) if length else None
            n = 40 if length else 45
            # the reference on the CPU: MLX's CUDA float32 matmuls run in TF32 unless
            # MLX_ENABLE_TF32=0 (errors ~1e-4, more than the kernel's own)
            with mx.stream(mx.cpu):
                want = reference_attention(
                    *(x.astype(mx.float32) for x in (q, k[:, :, :n], v[:, :, :n])), scale, causal
                )
            kinds = (True, False) if backend == "cuda" else (False,)  # whichever a call may take
            errs = [
                mx.max(mx.abs(_fused(backend, q, k, v, scale, causal, valid, single).astype(mx.float32) - want)).item()
                for single in kinds
            ]
            err = max(errs) if all(math.isfinite(e) for e in errs) else math.inf
            tol = 1e-4 if dtype == mx.float32 else 3e-2
            ok = math.isfinite(err) and err <= tol
            if not ok:
                _fail(f"self-check ({backend}, {dtype}, head dim {head_dim}, causal={causal}) max error {err:.3g}")
        except Exception as e:  # a compile error surfaces here, from the first eval
            ok = False
            msg = str(e).strip().splitlines()
            _fail(
                f"{type(e).__name__} in the self-check ({backend}, {dtype}, head dim {head_dim}): "
                f"{msg[0] if msg else ''}"
            )
        _checked[key] = ok
        return ok


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask=None, valid=None) -> mx.array:
    """mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask), through the fused
    kernels when they are enabled on this GPU and the call is one they cover and win on (1 x H x
    4..16 rows, mask None or "causal", head dim 64/128/256, float32/bfloat16/float16, cache length
    x rows within max_keys_x_rows); MLX's own otherwise. `valid`: only the first valid keys count
    (a (1,) int32 array: a DeviceLength.visible; few_rows_attention's contract)."""
    backend, on, _ = _settings()
    # with a device-side key count, MLX's own kernel for 1-3 rows would need an array mask, which
    # sends it to its unfused path: the fused one takes those rows too
    fewest = MIN_ROWS if valid is None else 1
    if on and _failed is None and _fusable(q, k, v, mask, fewest) and (valid is None or backend == "cuda"):
        causal = mask is not None
        if _self_check(backend, q.dtype, q.shape[3], causal, valid is not None):
            return _fused(backend, q, k, v, scale, causal, valid)
    if valid is not None:  # the same keys as a mask
        n, rows = k.shape[2], q.shape[2]
        mask = mx.arange(n)[None] <= (valid - rows + mx.arange(rows)[:, None]) if mask else mx.arange(n)[None] < valid
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


# ---------------------------------------------------------------------------------------------
# install: mlx-lm's attention layers call a module-level `scaled_dot_product_attention(queries,
# keys, values, cache, scale, mask, sinks=None)` imported from mlx_lm.models.base (qwen3_5's layers
# are qwen3_next's Qwen3NextAttention, so the name lives in qwen3_next). Rebinding that name in
# each attention layer's module sends the plain case here without editing mlx-lm.
# ---------------------------------------------------------------------------------------------


def _wrap(original):
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask=None, sinks=None, **kwargs):
        # a quantized cache (keys are (packed, scales, biases)), attention sinks, array masks or
        # arguments of a newer mlx-lm: the original
        if sinks is None and not kwargs and not hasattr(cache, "bits"):
            if isinstance(cache, DeviceKVCache):  # its mask is the causal one over its first keys
                return attention(queries, keys, values, scale, "causal", cache.length.visible(queries.shape[2]))
            if mask is None or (isinstance(mask, str) and mask == "causal"):
                return attention(queries, keys, values, scale, mask)
        if sinks is not None:
            kwargs["sinks"] = sinks
        return original(queries, keys, values, cache, scale=scale, mask=mask, **kwargs)

    scaled_dot_product_attention._dflash_original = original
    return scaled_dot_product_attention


def _model_modules(model) -> list:
    """Python modules of the model's layers that bound mlx-lm's base attention function (or our
    wrapper of it), in the order met."""
    from mlx_lm.models import base

    names = []
    for layer in model.modules():
        name = type(layer).__module__
        mod = sys.modules.get(name)
        fn = getattr(mod, "scaled_dot_product_attention", None)
        if name in names or fn is None:
            continue
        if fn is base.scaled_dot_product_attention or getattr(fn, "_dflash_original", None) is not None:
            names.append(name)
    return names


def install(model) -> bool:
    """Route the attention of `model`'s (mlx-lm) layers through `attention`: rebinds
    scaled_dot_product_attention in their modules, once (idempotent; it affects every model of
    those modules in the process). A no-op returning False where the fused path is not enabled
    (always on the CPU, so CPU results stay bit for bit MLX's); True once the modules are patched."""
    if not enabled():
        return False
    names = _model_modules(model)
    with _lock:
        for name in names:
            mod = sys.modules[name]
            if getattr(mod.scaled_dot_product_attention, "_dflash_original", None) is None:
                mod.scaled_dot_product_attention = _wrap(mod.scaled_dot_product_attention)
    return bool(names)


def uninstall(model) -> None:
    """Undo `install` for the modules of `model`'s layers (tests; comparing with MLX's path)."""
    with _lock:
        for name in _model_modules(model):
            mod = sys.modules[name]
            original = getattr(mod.scaled_dot_product_attention, "_dflash_original", None)
            if original is not None:
                mod.scaled_dot_product_attention = original
