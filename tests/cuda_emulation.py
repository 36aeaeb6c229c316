"""CUDA kernels' sources run on the CPU: compiled by the C++ compiler inside a small emulation of
CUDA's execution model (a thread per GPU thread, a barrier for __syncthreads and __syncwarp, warp
shuffles and votes through shared slots, each block's threads at once and the blocks one after
another), so that a kernel's logic is checked where no GPU is. Float32 only: the 16-bit types are
device intrinsics, stubbed here so that their overloads compile. A program is PRELUDE, the kernels
as functions, and a main() that loads its inputs with `load`, calls `launch` per kernel and writes
its output with `save` (float32 files, see run)."""

import shutil
import subprocess
from pathlib import Path

import numpy as np

CXX = shutil.which("g++")

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
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
template <class T> T __ldg(const T* p) { return *p; }
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
inline float __shfl_down_sync(unsigned, float x, int offset) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  lane_floats[w][l] = x;
  __syncwarp();
  const float y = l + offset < 32 ? lane_floats[w][l + offset] : x;
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


def run(tmp_path: Path, program: str, inputs: dict, args: list = ()) -> Path:
    """Compile `program`, write `inputs` (name -> array) as float32 files in tmp_path, and run it
    with their paths, then `args`, then the output's path, which is returned."""
    src, exe = tmp_path / "kernel.cpp", tmp_path / "kernel"
    src.write_text(program)
    build = subprocess.run(
        [CXX, "-std=c++20", "-O1", "-pthread", "-Wno-unknown-pragmas", str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    paths = []
    for name, x in inputs.items():
        np.asarray(x, dtype=np.float32).tofile(tmp_path / name)
        paths.append(str(tmp_path / name))
    out = tmp_path / "out"
    subprocess.run([str(exe), *paths, *map(str, args), str(out)], check=True, timeout=300)
    return out
