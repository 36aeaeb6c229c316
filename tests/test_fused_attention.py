"""dflash_core.engine.fused_attention: the few-rows attention kernels and their dispatch.

On the CPU (CI): the float32 reference pins the contract to MLX's own sdpa, and `attention` /
`install` leave MLX's results untouched. On a GPU: the kernels against MLX's sdpa and the
reference over rows, cache lengths, GQA factors, head dims, masks and dtypes, and a random
qwen3 model's logits with and without `install`. Self-contained (no conftest fixtures), so that
`pytest --noconftest tests/test_fused_attention.py` runs on a machine with only MLX and mlx-lm.
"""

import os

# The GPU tests' float32 reference needs exact float32 matmuls: MLX's CUDA backend runs them in
# TF32 unless MLX_ENABLE_TF32=0 (read at its first matmul, so set before any runs).
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402
from mlx_lm.models import base, qwen3  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

import dflash_core  # noqa: E402,F401  (system BLAS before MLX)
from dflash_core.engine import fused_attention as fa  # noqa: E402

TF32 = os.environ["MLX_ENABLE_TF32"] != "0"

ON_GPU = fa.gpu_backend() is not None
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs an MLX GPU (CUDA or Metal); this machine runs MLX on the CPU")
needs_metal = pytest.mark.skipif(fa.gpu_backend() != "metal", reason="needs MLX's Metal backend (an Apple GPU)")


def _inputs(heads, kv_heads, rows, keys, head_dim, dtype=mx.float32, seed=0):
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    q = mx.random.normal((1, heads, rows, head_dim), key=kq).astype(dtype)
    k = mx.random.normal((1, kv_heads, keys, head_dim), key=kk).astype(dtype)
    v = mx.random.normal((1, kv_heads, keys, head_dim), key=kv).astype(dtype)
    return q, k, v


def _sdpa(q, k, v, scale, causal):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal" if causal else None)


def _sdpa_mask(q, k, v, scale, mask):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def _max_err(a, b) -> float:
    return mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item()


# (rows, keys, GQA factor, head dim, causal): L 1..16, N from L to ~600, GQA 1-4, all head dims
CPU_SHAPES = [
    (L, N, g, D, c)
    for i, (L, N) in enumerate(
        [(1, 1), (1, 37), (2, 2), (2, 300), (3, 17), (4, 64), (5, 33), (7, 97), (8, 8), (8, 600)]
        + [(9, 129), (11, 250), (12, 12), (13, 511), (15, 31), (16, 16), (16, 300), (16, 600)]
    )
    for g, D, c in [
        ((1, 2, 3, 4)[i % 4], (64, 128, 256)[i % 3], True),
        ((4, 3, 2, 1)[i % 4], (256, 64, 128)[i % 3], False),
    ]
]


@pytest.mark.parametrize("rows,keys,group,head_dim,causal", CPU_SHAPES)
def test_reference_is_mlx_sdpa(rows, keys, group, head_dim, causal):
    """The float32 reference is MLX's sdpa: GQA heads (query head h reads KV head h // group) and
    the causal mask aligned to the end of the cache (row i sees keys up to N - L + i)."""
    kv_heads = 2
    q, k, v = _inputs(group * kv_heads, kv_heads, rows, keys, head_dim, seed=rows * 1000 + keys)
    with mx.stream(mx.cpu):
        want = _sdpa(q, k, v, head_dim**-0.5, causal)
        got = fa.reference_attention(q, k, v, head_dim**-0.5, causal)
        assert got.shape == want.shape == (1, group * kv_heads, rows, head_dim) and got.dtype == mx.float32
        assert _max_err(got, want) < 1e-5


def test_reference_causal_mask_is_lower_right():
    """Row i of L sees exactly the first N - L + i + 1 keys: the last rows' outputs move when a
    key they see changes, and the first row's output does not move for the keys it must not see."""
    q, k, v = _inputs(2, 1, 4, 10, 64)
    with mx.stream(mx.cpu):
        out = fa.reference_attention(q, k, v, 0.125, True)
        v2 = mx.concatenate([v[:, :, :7], v[:, :, 7:] + 100.0], axis=2)  # keys 7..9 changed
        out2 = fa.reference_attention(q, k, v2, 0.125, True)
        same = mx.all(mx.abs(out - out2) < 1e-6, axis=(0, 1, 3)).tolist()
        assert same == [True, False, False, False]  # row 0 sees keys 0..6; row 1 sees key 7


def test_launch_plan_covers_every_row_and_key():
    """Blocks hold at most max_rows rows (shared-memory budget), row groups cover the H/KVH x L
    rows of a KV head, and the key chunks grow with the cache within their bounds."""
    for backend in ("cuda", "metal"):
        for heads, kv_heads, head_dim in [(9, 3, 64), (32, 8, 128), (16, 2, 256), (8, 8, 64), (24, 3, 256)]:
            for rows in (1, 2, 5, 16):
                for keys in (rows, 17, 300, 4096, 33000, 65536):
                    plan = fa.launch_plan(heads, kv_heads, rows, keys, head_dim, backend)
                    block_rows = plan["warps"] * fa.ROWS_PER_WARP
                    assert 4 * plan["max_rows"] * head_dim <= fa._QUERY_BYTES[backend]
                    assert 1 <= plan["warps"] and block_rows <= plan["max_rows"]
                    assert plan["row_groups"] * block_rows >= (heads // kv_heads) * rows
                    assert (plan["row_groups"] - 1) * block_rows < (heads // kv_heads) * rows
                    assert 1 <= plan["chunks"] <= min(-(-keys // fa.TILE), fa.MAX_CHUNKS)
    assert fa.launch_plan(9, 3, 16, 300, 64)["chunks"] == 10  # one tile a chunk at 300 keys
    assert fa.launch_plan(32, 8, 16, 32768, 128)["chunks"] == 32  # ~512 blocks at 32K keys


def test_fusable_calls():
    """What `attention` sends to the kernels (when enabled): 1 x H x 4..16 rows, mask None or
    "causal", supported head dims and dtypes, within the measured cache length x rows bounds."""

    def fusable(rows=8, keys=300, heads=6, kv_heads=2, head_dim=64, dtype=mx.float32, mask="causal", batch=1):
        q = mx.zeros((batch, heads, rows, head_dim), dtype=dtype)
        k = mx.zeros((batch, kv_heads, keys, head_dim), dtype=dtype)
        return fa._fusable(q, k, k, mask)

    assert fusable() and fusable(rows=4) and fusable(rows=16, mask=None) and fusable(head_dim=256)
    assert fusable(dtype=mx.bfloat16) and fusable(dtype=mx.float16, keys=1024, rows=16)
    assert not fusable(rows=3) and not fusable(rows=17) and not fusable(rows=8, keys=7)
    assert not fusable(head_dim=96) and not fusable(heads=5) and not fusable(batch=2)
    assert not fusable(mask=mx.ones((8, 300), dtype=mx.bool_)) and not fusable(dtype=mx.int32)
    assert fusable(keys=8192, rows=16) and not fusable(keys=8193, rows=16)  # float32 causal: 2^17
    assert fusable(keys=1024, rows=16, mask=None) and not fusable(keys=2048, rows=16, mask=None)
    assert not fusable(keys=2048, rows=16, dtype=mx.bfloat16) and not fusable(dtype=mx.bfloat16, mask=None)


@pytest.mark.skipif(ON_GPU, reason="checks the CPU's behaviour")
def test_off_on_the_cpu(monkeypatch):
    """Never on the CPU, whatever the environment says; attention() is MLX's sdpa bit for bit."""
    monkeypatch.setenv(fa.ENV, "1")
    assert not fa.enabled()
    for rows, keys, mask in [(4, 40, "causal"), (16, 300, None), (1, 9, None), (8, 8, "causal")]:
        q, k, v = _inputs(6, 2, rows, keys, 64, seed=keys)
        got = fa.attention(q, k, v, 0.125, mask)
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
        assert mx.array_equal(got, want).item()
    arr_mask = mx.arange(40)[None] <= mx.arange(36, 40)[:, None]
    q, k, v = _inputs(6, 2, 4, 40, 64)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=arr_mask)
    assert mx.array_equal(fa.attention(q, k, v, 0.125, arr_mask), want).item()


def _tiny_qwen3(seed=0, dtype=mx.float32, heads=6, kv_heads=2, head_dim=64, tied=False):
    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=96,
        num_hidden_layers=2,
        intermediate_size=192,
        num_attention_heads=heads,
        rms_norm_eps=1e-6,
        vocab_size=128,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        head_dim=head_dim,
        tie_word_embeddings=tied,
        rope_theta=10000.0,
    )
    mx.random.seed(seed)
    model = qwen3.Model(args)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def _cached_forward(model, prompt: list, block: list) -> mx.array:
    """Logits of a multi-row forward (the verify shape) over a cache holding `prompt`."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([prompt]), cache=cache))
    return model(mx.array([block]), cache=cache)


@pytest.mark.skipif(ON_GPU, reason="checks the CPU's behaviour")
def test_install_is_a_noop_on_the_cpu(monkeypatch):
    monkeypatch.setenv(fa.ENV, "1")
    model = _tiny_qwen3()
    prompt, block = list(range(3, 43)), [5, 9, 2, 77, 1, 0, 13, 8]
    before = _cached_forward(model, prompt, block)
    assert fa.install(model) is False
    assert qwen3.scaled_dot_product_attention is base.scaled_dot_product_attention
    assert mx.array_equal(_cached_forward(model, prompt, block), before).item()


def test_wrapper_sends_only_the_plain_case_to_attention(monkeypatch):
    """The patched module function: unquantized cache, mask None / "causal", no sinks -> attention();
    anything else -> mlx-lm's original with the same arguments."""
    calls = []
    monkeypatch.setattr(fa, "attention", lambda q, k, v, scale, mask: calls.append(("fused", mask)) or q)

    def original(q, k, v, cache, scale, mask, sinks=None):
        calls.append(("original", mask if isinstance(mask, str) or mask is None else "array", sinks))
        return q

    wrapped = fa._wrap(original)
    assert wrapped._dflash_original is original
    q = mx.zeros((1, 2, 3, 64))

    class Quantized:
        bits, group_size = 8, 64

    wrapped(q, q, q, cache=None, scale=0.1, mask="causal")
    wrapped(q, q, q, cache=object(), scale=0.1, mask=None)
    wrapped(q, q, q, cache=Quantized(), scale=0.1, mask="causal")
    wrapped(q, q, q, cache=None, scale=0.1, mask=mx.ones((3, 3), dtype=mx.bool_))
    wrapped(q, q, q, cache=None, scale=0.1, mask="causal", sinks="s")
    assert calls == [
        ("fused", "causal"),
        ("fused", None),
        ("original", "causal", None),
        ("original", "array", None),
        ("original", "causal", "s"),
    ]


def test_model_modules_finds_the_attention_layers_module():
    """qwen3's layers bind base.scaled_dot_product_attention in mlx_lm.models.qwen3."""
    assert fa._model_modules(_tiny_qwen3()) == ["mlx_lm.models.qwen3"]


# ---------------------------------------------------------------------------------------------
# GPU: the kernels themselves
# ---------------------------------------------------------------------------------------------

GPU_KEYS = (17, 300, 1000, 4099, 33000)
# max |kernel - float32 reference| allowed: float32 rounding; one rounding of the output in 16 bits
# (|outputs| < 4 here: a rounding is at most 2^-7 in bfloat16, 2^-10 in float16)
TOL_REF = {mx.float32: 3e-5, mx.bfloat16: 1.6e-2, mx.float16: 2.5e-3}
# max |kernel - MLX's sdpa|: MLX's unfused path rounds q * scale, the scores and the probabilities
# to 16 bits as well
TOL_SDPA = {mx.float32: 1e-3 if TF32 else 5e-5, mx.bfloat16: 6e-2, mx.float16: 1e-2}


def _kernels(monkeypatch, single: bool):
    """Every call takes the single pass (single) or the two passes."""
    if single and fa.gpu_backend() != "cuda":
        pytest.skip("the single pass is CUDA's")
    monkeypatch.setattr(fa, "one_pass", lambda backend, rows, keys: single)


@needs_gpu
@pytest.mark.parametrize("single", [True, False], ids=["one-pass", "two-pass"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_kernel_matches_mlx_sdpa(monkeypatch, dtype, head_dim, causal, single):
    _kernels(monkeypatch, single)
    worst_ref = worst_sdpa = 0.0
    for group in (1, 3, 4, 8):
        kv_heads = 2 if group < 8 else 1
        for keys in GPU_KEYS + (None,):
            for rows in range(1, 17):
                n = rows if keys is None else keys  # N == L: every row sees its own block only
                q, k, v = _inputs(group * kv_heads, kv_heads, rows, n, head_dim, dtype, seed=rows + 31 * n)
                scale = head_dim**-0.5
                got = fa.few_rows_attention(q, k, v, scale, causal)
                ref = fa.reference_attention(*(x.astype(mx.float32) for x in (q, k, v)), scale, causal)
                sdpa = _sdpa(q, k, v, scale, causal)
                assert got.shape == (1, group * kv_heads, rows, head_dim) and got.dtype == dtype
                e_ref, e_sdpa = _max_err(got, ref), _max_err(got, sdpa)
                where = f"G {group} KVH {kv_heads} L {rows} N {n}: ref {e_ref:.3g}, sdpa {e_sdpa:.3g}"
                assert e_ref <= TOL_REF[dtype], where
                assert e_sdpa <= TOL_SDPA[dtype], where
                worst_ref, worst_sdpa = max(worst_ref, e_ref), max(worst_sdpa, e_sdpa)
    print(f"worst: ref {worst_ref:.3g}, sdpa {worst_sdpa:.3g}")


@needs_gpu
@pytest.mark.parametrize("single", [True, False], ids=["one-pass", "two-pass"])
def test_kernel_reads_strided_cache_views(monkeypatch, single):
    """The cache hands out keys[..., :offset, :] of a longer buffer, and queries come transposed
    from (B, L, H, D): the kernel reads through strides, no copies."""
    _kernels(monkeypatch, single)
    buf_k = mx.random.normal((1, 3, 512, 64), key=mx.random.key(1))
    buf_v = mx.random.normal((1, 3, 512, 64), key=mx.random.key(2))
    q = mx.random.normal((1, 16, 9, 64), key=mx.random.key(3)).transpose(0, 2, 1, 3)  # (1, 9, 16, 64)
    k, v = buf_k[..., :300, :], buf_v[..., :300, :]
    got = fa.few_rows_attention(q, k, v, 0.125, True)
    want = fa.reference_attention(q, k, v, 0.125, True)
    assert _max_err(got, want) < 3e-5


@needs_gpu
@pytest.mark.parametrize("single", [True, False], ids=["one-pass", "two-pass"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_kernel_counts_only_the_valid_keys(monkeypatch, causal, single):
    """`valid`, an array on the device (a DeviceKVCache's length): the kernels read only the first
    `valid` keys of the buffer they are given (past them: rejected rows, or zeros)."""
    if fa.gpu_backend() != "cuda":
        pytest.skip("the device-side key count is CUDA's (Metal falls back to a mask)")
    _kernels(monkeypatch, single)
    for rows, n, valid in [(1, 512, 77), (4, 64, 40), (8, 300, 211), (16, 600, 16), (5, 33, 33)]:
        q, k, v = _inputs(9, 3, rows, n, 64, seed=n + valid)
        k = mx.concatenate([k[:, :, :valid], 50 * k[:, :, valid:]], axis=2)  # keys past valid: loud
        got = fa.few_rows_attention(q, k, v, 0.125, causal, mx.array([valid], dtype=mx.int32))
        want = fa.reference_attention(q, k[:, :, :valid], v[:, :, :valid], 0.125, causal)
        assert _max_err(got, want) < 3e-5, (rows, n, valid)


@needs_gpu
def test_attention_dispatch_on_the_gpu(monkeypatch):
    """Fused for 4..16 rows with mask None / "causal" when enabled; MLX's own for 1-3 rows, array
    masks, or DFLASH_FUSED_ATTENTION=0; the result matches either way."""
    fused = []
    kernel = fa._fused
    monkeypatch.setattr(fa, "_fused", lambda *a: fused.append(a[1].shape[2:3] + a[2].shape[2:3]) or kernel(*a))
    monkeypatch.setenv(fa.ENV, "1")
    assert fa.enabled()
    for rows, mask in [(8, "causal"), (16, None), (4, "causal"), (3, "causal"), (1, None)]:
        q, k, v = _inputs(6, 2, rows, 300, 128, seed=rows)
        got = fa.attention(q, k, v, 0.1, mask)
        assert _max_err(got, _sdpa(q, k, v, 0.1, mask == "causal")) < TOL_SDPA[mx.float32]
    q, k, v = _inputs(6, 2, 8, 40, 128)
    arr_mask = mx.arange(40)[None] <= mx.arange(32, 40)[:, None]
    assert mx.array_equal(fa.attention(q, k, v, 0.1, arr_mask), _sdpa_mask(q, k, v, 0.1, arr_mask)).item()
    calls = [rows for rows, keys in fused if keys == 300]  # not the self-checks' (45 keys)
    assert calls == [8, 16, 4]
    monkeypatch.setenv(fa.ENV, "0")
    assert not fa.enabled()
    n = len(fused)
    assert mx.array_equal(fa.attention(q, k, v, 0.1, None), _sdpa(q, k, v, 0.1, False)).item()
    assert len(fused) == n


@needs_gpu
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
def test_install_keeps_a_models_logits(monkeypatch, dtype):
    """A random qwen3 model's multi-row forward over a cache: the same logits (to tolerance) with
    install() as without; install is idempotent and uninstall restores mlx-lm's function."""
    monkeypatch.setenv(fa.ENV, "1")
    fused = []
    kernel = fa._fused
    monkeypatch.setattr(fa, "_fused", lambda *a: fused.append(a[1].shape) or kernel(*a))
    model = _tiny_qwen3(seed=3, dtype=dtype)
    prompt, block = [(7 * i) % 128 for i in range(300)], [5, 9, 2, 77, 1, 0, 13, 8, 100, 3, 4, 5, 6, 7, 8, 9]
    try:
        want = _cached_forward(model, prompt, block)
        assert fa.install(model) is True and fa.install(model) is True
        assert qwen3.scaled_dot_product_attention._dflash_original is base.scaled_dot_product_attention
        got = _cached_forward(model, prompt, block)
    finally:
        fa.uninstall(model)
    assert qwen3.scaled_dot_product_attention is base.scaled_dot_product_attention
    assert _max_err(got, want) < (1e-4 if dtype == mx.float32 else 0.15), _max_err(got, want)
    assert fused.count((1, 6, 16, 64)) == 2  # the 16-row forward's two layers took the kernels
    assert fa._failed is None


@needs_metal
def test_metal_kernel_runs():
    """The Metal version to the same contract (off by default on Metal; forced here)."""
    for causal in (True, False):
        q, k, v = _inputs(9, 3, 16, 300, 64)
        assert _max_err(fa.few_rows_attention(q, k, v, 0.125, causal), _sdpa(q, k, v, 0.125, causal)) < 5e-5


def test_launches_are_worked_out_once_per_shape():
    """Two launches (partials, then their combination), or on CUDA for a short cache one; the
    output has q's shape and dtype; the same shape asks for the same plan object (worked out once)."""
    for backend in ("cuda", "metal"):
        plan = fa._launches(backend, (9, 8, 64, 3, 300), mx.bfloat16, True, single=False)
        assert [which for which, *_ in plan] == ["pass1", "pass2"]
        assert plan[-1][-2:] == ([(1, 9, 8, 64)], [mx.bfloat16])
        assert plan[0][2][0] == 32 * fa.launch_plan(9, 3, 8, 300, 64, backend)["warps"] * 10  # 10 key chunks
        assert fa._launches(backend, (9, 8, 64, 3, 300), mx.bfloat16, True, single=False) is plan
    assert fa._launches("metal", (9, 8, 64, 3, 300), mx.bfloat16, True)[0][0] == "pass1"
    assert fa._launches("cuda", (9, 8, 64, 3, fa.ONE_PASS_MAX_KEYS + 1), mx.float32, True)[0][0] == "pass1"
    plan = fa._launches("cuda", (9, 8, 64, 3, 300), mx.bfloat16, True)
    assert [which for which, *_ in plan] == ["onepass"] and plan[0][-2:] == ([(1, 9, 8, 64)], [mx.bfloat16])


def test_one_pass_takes_few_rows_over_short_caches():
    """The single pass where it was measured faster: up to 4 rows over up to ONE_PASS_MAX_KEYS keys,
    more rows while rows x keys stays within ONE_PASS_MAX_ROW_KEYS; never off CUDA."""
    assert fa.one_pass("cuda", 1, 4096) and fa.one_pass("cuda", 4, 4096) and not fa.one_pass("cuda", 1, 4097)
    assert fa.one_pass("cuda", 8, 1024) and not fa.one_pass("cuda", 8, 2048)
    assert fa.one_pass("cuda", 16, 512) and not fa.one_pass("cuda", 16, 1024)
    assert not fa.one_pass("metal", 1, 300)
    assert fa._launches("cuda", (32, 16, 128, 8, 1024), mx.float32, True)[0][0] == "pass1"


def test_one_pass_grid_covers_every_row():
    """The single pass: a block per (KV head, group of RB rows), enough groups for every query row
    that reads the KV head (H / KVH heads times L rows), and its template's constants."""
    for heads, kv_heads in [(9, 3), (32, 8), (8, 1), (4, 4)]:
        for head_dim in fa.HEAD_DIMS:
            for rows in range(1, fa.MAX_ROWS + 1):
                ((which, template, grid, block, shapes, _),) = fa._launches(
                    "cuda", (heads, rows, head_dim, kv_heads, 300), mx.float32, True, single=True
                )
                constants = dict(template)
                rb, threads = constants["RB"], block[0]
                assert threads == 32 * constants["W"] and grid[0] == kv_heads * threads
                assert (grid[1] - 1) * rb < heads // kv_heads * rows <= grid[1] * rb
                assert shapes == [(1, heads, rows, head_dim)]
                assert rb * head_dim <= 1024  # RB x D floats of queries, and of outputs, in shared memory


def test_kernel_sources_are_compact_and_carry_their_constants():
    """Each kernel variant's source states its template constants as MLX's CUDA backend writes them
    (`using T = ...;`, `constexpr int D = ...;`) and drops comments and indentation (MLX copies and
    hashes the source at every call): the same code tokens, each `#pragma` still on its own line."""
    from dflash_core.engine import attention_kernels as ak
    from dflash_core.engine import metal_kernels as mk

    template = (("T", mx.bfloat16), ("D", 128), ("CAUSAL", False), ("MAXR", 32), ("RPW", 4))
    assert fa._constants("cuda", template).splitlines() == [
        "using T = __nv_bfloat16;",
        "constexpr int D = 128;",
        "constexpr bool CAUSAL = false;",
        "constexpr int MAXR = 32;",
        "constexpr int RPW = 4;",
    ]
    assert fa._constants("metal", template[:1]) == "using T = bfloat16_t;\n"
    for source in (ak.CUDA_HEADER, ak.CUDA_PASS1, ak.CUDA_PASS2, ak.CUDA_ONEPASS, mk.METAL_PASS1, mk.METAL_PASS2):
        compact = fa._compact(source)
        code = [line.split("//", 1)[0] for line in source.splitlines()]
        assert compact.split() == " ".join(code).split()
        assert len(compact) < len(source) and "//" not in compact
        pragmas = [line.strip() for line in code if line.strip().startswith("#")]
        assert pragmas == [line for line in compact.splitlines() if line.startswith("#")]


def test_attention_reads_the_environment_once_not_per_call(monkeypatch):
    """A forward calls attention once a layer: enabled() reads the switches (install asks it at
    load) and attention keeps the answer, reading no environment variable per call (on an H100
    those reads were ~5% of a small target's cycle)."""
    reads = []

    class Counting(dict):
        def get(self, key, default=None):
            reads.append(key)
            return super().get(key, default)

    monkeypatch.setattr(os, "environ", Counting(os.environ))
    fa.enabled()
    n = len(reads)
    q, k, v = _inputs(6, 2, 8, 40, 64, seed=1)
    for mask in ("causal", None):
        fa.attention(q, k, v, 0.125, mask)
    assert n > 0 and len(reads) == n
