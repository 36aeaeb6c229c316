"""dflash_core.engine.few_rows_matmul: the few-row float32 matrix product and its install.

On the CPU (CI): install leaves a model alone and matmul_t is MLX's product. On CUDA: the kernel
against MLX's float32 matmul over rows, shapes and outputs per warp, the swap keeps a model's
logits and parameters, and the path stays with MLX wherever the kernel does not fit.
"""

import os

os.environ.setdefault("MLX_ENABLE_TF32", "0")  # MLX's float32 reference in full float32

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402
from test_fused_attention import _cached_forward, _tiny_qwen3  # noqa: E402  (a tiny qwen3 over a cache)

import dflash_core  # noqa: E402,F401  (system BLAS before MLX)
from dflash_core.engine import few_rows_matmul as frm  # noqa: E402

ON_CUDA = frm.on_cuda()
needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="needs MLX's CUDA backend; this machine runs MLX on the CPU")


def _rel_err(a, b) -> float:
    return (mx.abs(a - b).max() / mx.abs(b).max()).item()


def test_fits_only_few_float32_rows():
    w = mx.zeros((64, 32))
    assert frm.fits(mx.zeros((1, 8, 32)), w) and frm.fits(mx.zeros((2, 32)), w) and frm.fits(mx.zeros((16, 32)), w)
    assert not frm.fits(mx.zeros((1, 1, 32)), w)  # a plain step: MLX's own, as the baseline runs it
    assert not frm.fits(mx.zeros((17, 32)), w)  # prefill
    assert not frm.fits(mx.zeros((4, 32), dtype=mx.bfloat16), w.astype(mx.bfloat16))
    assert not frm.fits(mx.zeros((4, 30)), mx.zeros((64, 30)))  # rows not in whole float4s
    head = mx.zeros((49152, 576))  # wide and shallow: 8 rows take the kernel, 16 MLX's (faster there)
    assert frm.fits(mx.zeros((8, 576)), head) and not frm.fits(mx.zeros((16, 576)), head)
    assert frm.fits(mx.zeros((16, 1024)), mx.zeros((49152, 1024)))


@pytest.mark.skipif(ON_CUDA, reason="checks the CPU's behaviour")
def test_install_is_a_noop_on_the_cpu(monkeypatch):
    monkeypatch.setenv(frm.ENV, "1")
    model = _tiny_qwen3()
    before = _cached_forward(model, list(range(3, 43)), [5, 9, 2, 77])
    assert frm.install(model) is False
    assert all(type(m) is not frm.FewRowsLinear for m in model.modules())
    assert mx.array_equal(_cached_forward(model, list(range(3, 43)), [5, 9, 2, 77]), before).item()
    x, w = mx.random.normal((4, 32)), mx.random.normal((8, 32))
    assert mx.array_equal(frm.matmul_t(x, w), x @ w.T).item()


@needs_cuda
@pytest.mark.parametrize("rows", [2, 5, 8, 16])
@pytest.mark.parametrize("n,k", [(77, 264), (576, 576), (1536, 576), (130, 1540), (4099, 128)])
@pytest.mark.parametrize("nw", [2, 4, 8])
def test_kernel_matches_mlx(rows, n, k, nw):
    x = mx.random.normal((rows, k), key=mx.random.key(rows))
    w = mx.random.normal((n, k), key=mx.random.key(n + k))
    got, want = frm.few_rows_matmul(x, w, nw), x @ w.T
    one_row = mx.concatenate([x[i : i + 1] @ w.T for i in range(rows)])
    # as close as MLX's many-row product is to its one-row product, with a floor for exact ties
    assert _rel_err(got, want) <= max(2 * _rel_err(one_row, want), 1e-5)


@needs_cuda
def test_kernel_keeps_leading_dims():
    x, w = mx.random.normal((1, 8, 128)), mx.random.normal((40, 128))
    got = frm.few_rows_matmul(x, w)
    assert got.shape == (1, 8, 40) and _rel_err(got, x @ w.T) < 1e-5


@needs_cuda
@pytest.mark.parametrize("tied", [False, True])
def test_install_keeps_a_models_logits(monkeypatch, tied):
    monkeypatch.setenv(frm.ENV, "1")
    model = _tiny_qwen3(seed=3, tied=tied)
    prompt, block = [(7 * i) % 128 for i in range(120)], [5, 9, 2, 77, 1, 0, 13, 8]
    want = _cached_forward(model, prompt, block)
    weight = model.layers[0].mlp.down_proj.weight
    calls = []
    kernel = frm.few_rows_matmul
    monkeypatch.setattr(frm, "few_rows_matmul", lambda x, w, nw=None: calls.append(x.shape) or kernel(x, w, nw))
    assert frm.install(model) is True  # its first call in a process also checks itself: one product
    swapped = model.layers[0].mlp.down_proj
    assert type(swapped) is frm.FewRowsLinear and swapped.weight is weight
    calls.clear()
    got = _cached_forward(model, prompt, block)
    assert _rel_err(got, want) < 1e-5
    assert len(calls) == 2 * 7 + (0 if tied else 1)  # q k v o gate up down a layer, the head untied
    calls.clear()
    _cached_forward(model, prompt, block[:1])  # prefill and a one-row step: MLX's own
    assert calls == []
