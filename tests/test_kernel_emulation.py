"""The GPU kernels' CUDA sources run on the CPU (tests/cuda_emulation.py): the fused attention's
(its single pass and its two) and the few-row matmul's, each over the whole grid the engine launches (fused_attention._launches,
few_rows_matmul's), against the float32 reference. So a change to a kernel is checked where no GPU
is; the GPU tests (tests/test_fused_attention.py, tests/test_few_rows_matmul.py) check them on the
device, with MLX's own launch."""

import mlx.core as mx
import numpy as np
import pytest
from cuda_emulation import CXX, PRELUDE, run

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.engine import attention_kernels as ak
from dflash_core.engine import few_rows_matmul as frm
from dflash_core.engine import fused_attention as fa

pytestmark = pytest.mark.skipif(CXX is None, reason="needs a C++ compiler (g++)")


def _body(which: str, template: tuple, length: bool) -> str:
    keys = "dfa_min(k_shape[2], valid[0])" if length else "k_shape[2]"
    source = {"onepass": ak.CUDA_ONEPASS, "pass1": ak.CUDA_PASS1, "pass2": ak.CUDA_PASS2}[which]
    return fa._constants("cuda", template) + f"#define DFA_KEYS {keys}\n" + source + "\n#undef DFA_KEYS\n"


def _program(plan: list, H: int, L: int, D: int, KVH: int, N: int, length: bool) -> str:
    """A C++ program that runs `plan` (fused_attention._launches') on q, k, v (and valid) read
    from files, and writes the output."""
    attention_in = (
        "const float* q, Shape q_shape, Strides q_strides, const float* k, Shape k_shape, Strides k_strides, "
        "const float* v, Shape v_shape, Strides v_strides, const float* scale, const int* valid"
    )
    functions, calls = [], []
    for i, (which, template, grid, block, shapes, _) in enumerate(plan):
        blocks = f"{{{-(-grid[0] // block[0])}, {grid[1]}, {grid[2]}}}"  # MLX sizes grids in threads
        if which == "pass1":
            (rows, nc, _), _, _ = shapes
            functions.append(
                f"void kernel{i}({attention_in}, float* po, float* pm, float* pl) {{\n{_body(which, template, length)}}}"
            )
            calls.append(
                f"std::vector<float> po({rows} * {nc} * D), pm({rows} * {nc}), pl({rows} * {nc});\n"
                f"launch({blocks}, {block[0]}, [&] {{ kernel{i}(q.data(), qs, qst, k.data(), ks, kst, v.data(), ks, "
                "kst, &scale, &valid, po.data(), pm.data(), pl.data()); });"
            )
        elif which == "pass2":
            functions.append(
                f"void kernel{i}(const float* po, Shape po_shape, const float* pm, Shape pm_shape, const float* pl, "
                f"Shape pl_shape, float* out) {{\n{_body(which, template, length)}}}"
            )
            calls.append(
                f"launch({blocks}, {block[0]}, [&] {{ kernel{i}(po.data(), shape3({rows}, {nc}, D), pm.data(), "
                f"shape2({rows}, {nc}), pl.data(), shape2({rows}, {nc}), out.data()); }});"
            )
        else:
            functions.append(f"void kernel{i}({attention_in}, float* out) {{\n{_body(which, template, length)}}}")
            calls.append(
                f"launch({blocks}, {block[0]}, [&] {{ kernel{i}(q.data(), qs, qst, k.data(), ks, kst, v.data(), ks, "
                "kst, &scale, &valid, out.data()); });"
            )
    main = f"""
int main(int argc, char** argv) {{
  const int H = {H}, L = {L}, D = {D}, KVH = {KVH}, N = {N};
  auto q = load(argv[1], H * L * D), k = load(argv[2], KVH * N * D), v = load(argv[3], KVH * N * D);
  const float scale = std::atof(argv[4]);
  const int valid = std::atoi(argv[5]);
  auto qs = shape4(1, H, L, D), ks = shape4(1, KVH, N, D);
  auto qst = strides4(1, H, L, D), kst = strides4(1, KVH, N, D);
  std::vector<float> out(H * L * D);
  {chr(10).join(calls)}
  save(argv[6], out);
}}
"""
    return PRELUDE + ak.CUDA_HEADER + "\n".join(functions) + main


def _run(tmp_path, single: bool, H, KVH, L, N, D, causal, valid=None) -> tuple:
    plan = fa._launches("cuda", (H, L, D, KVH, N), mx.float32, causal, valid is not None, single)
    rng = np.random.default_rng(H * 1000 + L * 10 + N)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, H, L, D), (1, KVH, N, D), (1, KVH, N, D)))
    scale = D**-0.5
    program = _program(plan, H, L, D, KVH, N, valid is not None)
    out = run(tmp_path, program, {"q": q, "k": k, "v": v}, [repr(scale), valid or N])
    got = np.fromfile(out, dtype=np.float32).reshape(1, H, L, D)
    n = valid or N
    want = fa.reference_attention(mx.array(q), mx.array(k[:, :, :n]), mx.array(v[:, :, :n]), scale, causal)
    return got, np.array(want)


# (heads, KV heads, rows, keys, head dim, causal, valid keys): GQA 1-4, one row to 16, padding rows
# (a group's rows not a multiple of the block's), partial tiles, all head dims, both masks
CASES = [
    (9, 3, 1, 45, 64, True, None),
    (9, 3, 8, 300, 64, True, None),
    (9, 3, 16, 100, 64, False, None),
    (4, 2, 3, 45, 128, True, 40),
    (32, 8, 5, 77, 128, True, 70),
    (4, 1, 16, 70, 256, True, None),
    (8, 8, 2, 33, 256, False, None),
]


@pytest.mark.parametrize("single", [True, False], ids=["one-pass", "two-pass"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "H{}-KVH{}-L{}-N{}-D{}-{}-valid{}".format(*c))
def test_cuda_kernel_matches_the_reference(tmp_path, single, case):
    H, KVH, L, N, D, causal, valid = case
    got, want = _run(tmp_path, single, H, KVH, L, N, D, causal, valid)
    assert np.max(np.abs(got - want)) < 3e-5


@pytest.mark.parametrize(
    "rows,n,k,nw",
    [(2, 40, 64, 2), (5, 33, 128, 4), (8, 257, 96, 2), (16, 70, 1056, 4), (12, 45, 64, 8), (16, 45, 544, 8)],
)
def test_few_rows_matmul_kernel_matches_the_product(tmp_path, rows, n, k, nw):
    """x @ w.T for 2..16 rows of x, every output column, at every width of a block (the 2, 4 and 8
    columns of frm.outputs_per_block), with column counts that leave the last block partial and
    shared dimensions that take a thread several steps (the last partial)."""
    program = (
        PRELUDE
        + "void kernel(const float* act, const float* wgt, Shape wgt_shape, float* res) {\n"
        + frm._constants(rows, nw)
        + frm._SOURCE
        + "}\nint main(int argc, char** argv) {\n"
        + f"  auto x = load(argv[1], {rows * k}), w = load(argv[2], {n * k});\n"
        + f"  std::vector<float> out({rows * n});\n"
        + f"  launch({{{-(-n // nw)}, 1, 1}}, {frm.THREADS}, [&] {{ kernel(x.data(), w.data(), shape2({n}, {k}), out.data()); }});\n"
        + "  save(argv[3], out);\n}\n"
    )
    rng = np.random.default_rng(rows + n)
    x, w = rng.standard_normal((rows, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    got = np.fromfile(run(tmp_path, program, {"x": x, "w": w}), dtype=np.float32).reshape(rows, n)
    assert np.max(np.abs(got - x.astype(np.float64) @ w.T.astype(np.float64))) < 1e-4 * np.sqrt(k)
