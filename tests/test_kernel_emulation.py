"""The fused attention's CUDA kernels run on the CPU: each kernel's source, compiled by the C++
compiler inside a small emulation of CUDA's execution model (a thread per GPU thread, a barrier for
__syncthreads and __syncwarp, warp shuffles and votes through shared slots), launched over its
whole grid, against the float32 reference. So a change to a kernel is checked where no GPU is;
the GPU tests (tests/test_fused_attention.py) check them on the device, with MLX's own launch.

Float32 only (the 16-bit types are device intrinsics); the grids and templates are those the
engine launches (fused_attention._launches)."""

import shutil
import subprocess

import mlx.core as mx
import numpy as np
import pytest

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.engine import attention_kernels as ak
from dflash_core.engine import fused_attention as fa

CXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs a C++ compiler (g++)")

# CUDA's built-ins, emulated: blocks run one after another, their threads at once.
PRELUDE = r"""
#include <array>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>
struct dim3_ { int x, y, z; };
thread_local dim3_ threadIdx;
dim3_ blockIdx, blockDim, gridDim;
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
#define __device__
#define __shared__ static
#define __grid_constant__
using Shape = std::array<int, 10>;
using Strides = std::array<long long, 10>;
struct __half {};
struct __nv_bfloat16 {};
inline float __half2float(__half) { return 0; }
inline float __bfloat162float(__nv_bfloat16) { return 0; }
inline __half __float2half(float) { return {}; }
inline __nv_bfloat16 __float2bfloat16(float) { return {}; }
std::barrier<>* block_barrier;
std::vector<std::barrier<>*> warp_barriers;
float lane_floats[32][32];
int lane_ints[32][32];
std::mutex atomic_mutex;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void __syncwarp() { warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float x, int offset) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  lane_floats[w][l] = x;
  __syncwarp();
  const float y = lane_floats[w][l ^ offset];
  __syncwarp();
  return y;
}
inline bool __any_sync(unsigned, bool b) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  lane_ints[w][l] = b;
  __syncwarp();
  bool any = false;
  for (int i = 0; i < 32; ++i) any |= lane_ints[w][i] != 0;
  __syncwarp();
  return any;
}
inline float atomicAdd(float* p, float v) {
  std::lock_guard<std::mutex> hold(atomic_mutex);
  const float old = *p;
  *p += v;
  return old;
}
template <class F>
void launch(dim3_ blocks, int threads, F kernel) {
  gridDim = blocks;
  blockDim = {threads, 1, 1};
  for (int z = 0; z < blocks.z; ++z)
    for (int y = 0; y < blocks.y; ++y)
      for (int x = 0; x < blocks.x; ++x) {
        blockIdx = {x, y, z};
        std::barrier<> block(threads);
        block_barrier = &block;
        warp_barriers.clear();
        std::vector<std::unique_ptr<std::barrier<>>> warps;
        for (int w = 0; w < threads / 32; ++w) {
          warps.emplace_back(new std::barrier<>(32));
          warp_barriers.push_back(warps.back().get());
        }
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
          pool.emplace_back([&, t] { threadIdx = {t, 0, 0}; kernel(); });
        for (auto& t : pool) t.join();
      }
}
std::vector<float> load(const char* path, size_t n) {
  std::vector<float> x(n);
  FILE* f = std::fopen(path, "rb");
  if (!f || std::fread(x.data(), sizeof(float), n, f) != n) std::exit(2);
  std::fclose(f);
  return x;
}
void save(const char* path, const std::vector<float>& x) {
  FILE* f = std::fopen(path, "wb");
  std::fwrite(x.data(), sizeof(float), x.size(), f);
  std::fclose(f);
}
Shape shape4(int a, int b, int c, int d) { return {a, b, c, d}; }
Strides strides4(int a, int b, int c, int d) { return {(long long)b * c * d, (long long)c * d, d, 1}; }
Shape shape2(int a, int b) { return {a, b}; }
Shape shape3(int a, int b, int c) { return {a, b, c}; }
"""


def _body(which: str, template: tuple, length: bool) -> str:
    keys = "dfa_min(k_shape[2], valid[0])" if length else "k_shape[2]"
    source = {"pass1": ak.CUDA_PASS1, "pass2": ak.CUDA_PASS2}[which]
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


def _run(tmp_path, H, KVH, L, N, D, causal, valid=None) -> tuple:
    plan = fa._launches("cuda", (H, L, D, KVH, N), mx.float32, causal, valid is not None)
    src = tmp_path / "kernel.cpp"
    src.write_text(_program(plan, H, L, D, KVH, N, valid is not None))
    exe = tmp_path / "kernel"
    build = subprocess.run(
        [CXX, "-std=c++20", "-O1", "-pthread", "-Wno-unknown-pragmas", str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    rng = np.random.default_rng(H * 1000 + L * 10 + N)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, H, L, D), (1, KVH, N, D), (1, KVH, N, D)))
    for name, x in (("q", q), ("k", k), ("v", v)):
        x.tofile(tmp_path / name)
    scale = D**-0.5
    args = [str(tmp_path / n) for n in ("q", "k", "v")] + [repr(scale), str(valid or N), str(tmp_path / "out")]
    subprocess.run([str(exe), *args], check=True, timeout=300)
    got = np.fromfile(tmp_path / "out", dtype=np.float32).reshape(1, H, L, D)
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


@pytest.mark.parametrize("case", CASES, ids=lambda c: "H{}-KVH{}-L{}-N{}-D{}-{}-valid{}".format(*c))
def test_cuda_kernel_matches_the_reference(tmp_path, case):
    H, KVH, L, N, D, causal, valid = case
    got, want = _run(tmp_path, H, KVH, L, N, D, causal, valid)
    assert np.max(np.abs(got - want)) < 3e-5
