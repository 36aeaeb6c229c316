"""The fused few-row attention's CUDA kernel sources (dflash_core.engine.fused_attention launches them):
a split-K pass 1 and a combining pass 2, and a single pass for short caches. Metal's, to the same
contract: dflash_core.engine.metal_kernels."""

# ---------------------------------------------------------------------------------------------
# CUDA (mx.fast.cuda_kernel). The source strings are function BODIES: MLX generates the signature
# (`const T* q, const __grid_constant__ Shape q_shape, const __grid_constant__ Strides q_strides,
# ..., float* po, ...`) inside namespace mlx::core::cu; fused_attention writes each variant's
# constants first (`using T = float | __half | __nv_bfloat16;`, `constexpr int D = ...;`,
# `constexpr bool CAUSAL = ...;`), as MLX would from `template=`, and drops the comments.
# Shape is cuda::std::array<int32_t, 10>, Strides cuda::std::array<int64_t, 10> (in elements).
# Inputs are read through their strides (ensure_row_contiguous=False), so the cache's views
# (keys[..., :offset, :] of a longer buffer) are not copied.
# ---------------------------------------------------------------------------------------------

CUDA_HEADER = r"""
// T -> float and float -> T by overload: T is float, __half or __nv_bfloat16 (MLX's CUDA types
// for float32, float16, bfloat16); the intrinsics come with cuda_fp16.h / cuda_bf16.h.
__device__ inline float dfa_to_float(float x) { return x; }
__device__ inline float dfa_to_float(__half x) { return __half2float(x); }
__device__ inline float dfa_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void dfa_store(float* p, float x) { *p = x; }
__device__ inline void dfa_store(__half* p, float x) { *p = __float2half(x); }
__device__ inline void dfa_store(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }

// Own helper, not min(): unqualified names inside MLX's namespace could find other overloads.
__device__ inline int dfa_min(int a, int b) { return a < b ? a : b; }

// Butterfly reductions over a full warp: every lane ends with the result.
__device__ inline float dfa_warp_max(float x) {
  for (int off = 16; off > 0; off /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  }
  return x;
}
__device__ inline float dfa_warp_sum(float x) {
  for (int off = 16; off > 0; off /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, off);
  }
  return x;
}
"""

# Pass 1. Grid: blockIdx.x = key chunk (gridDim.x chunks), blockIdx.y = KV head, blockIdx.z = row
# group; blockDim.x = 32 * warps, warps * RPW <= MAXR rows per block. Warp w owns the block's rows
# w*RPW .. w*RPW+RPW-1 (local row r of KV head kh = query head kh*G + r/L, row r%L). Scoring: lane
# j takes key t0+j of the tile and dots it with the warp's rows (K chunk and queries in shared
# memory, read 4 floats at a time). Softmax per row across the warp; the probabilities go to shared
# memory; P.V: in each 64-dim chunk lane j owns dims 2j and 2j+1 (float4 / float2 shared reads; a
# first version with scalar reads and shuffles measured the same on an H200, so shared-memory
# traffic is not what bounds it at long caches: not profiled yet). No thread returns early: every
# __syncthreads is reached by the whole block, and every warp-wide operation by the whole warp (the
# bounds around them are uniform).
CUDA_PASS1 = r"""
  constexpr int TK = 32;           // keys per tile (one per lane when scoring)
  constexpr int DC = 64;           // head dims staged in shared memory at a time (D % 64 == 0)
  constexpr int KP = DC + 4;       // K row stride: lane j's float4 reads fall in distinct banks
  constexpr int DPL = D / 32;      // output dims per lane: 2 per 64-dim chunk
  constexpr float NEG = -3.0e38f;  // finite "minus infinity": no inf arithmetic anywhere
  __shared__ float4 q_s4[MAXR * D / 4];   // the block's rows, scaled, q_s[row*D + d]
  __shared__ float4 k_s4[TK * KP / 4];    // K chunk, k_s[j*KP + d]
  __shared__ float2 v_s2[TK * DC / 2];    // V chunk, v_s[j*DC + d]
  __shared__ float4 p_s4[MAXR * TK / 4];  // each row's probabilities in the tile, p_s[row*TK + j]
  float* q_s = reinterpret_cast<float*>(q_s4);
  float* k_s = reinterpret_cast<float*>(k_s4);
  float* v_s = reinterpret_cast<float*>(v_s2);
  float* p_s = reinterpret_cast<float*>(p_s4);

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int rb = (blockDim.x / 32) * RPW;   // rows of this block
  if (rb > MAXR || (blockDim.x % 32) != 0) {
    return;  // never launched like this (the host sizes blocks); uniform, before any barrier
  }
  const int H = q_shape[1];
  const int L = q_shape[2];
  const int KVH = k_shape[1];
  const int N = DFA_KEYS;                  // the keys: k's length, or `valid` (see fused_attention)
  const int G = H / KVH;
  const int R = G * L;                      // query rows that read this KV head
  const int kh = blockIdx.y;
  const int row0 = blockIdx.z * rb;         // first local row of this block
  const int nc = gridDim.x;
  const int c = blockIdx.x;
  const int ck = ((N + nc - 1) / nc + TK - 1) / TK * TK;  // keys per chunk, whole tiles
  const int k_begin = dfa_min(N, c * ck);
  const int k_end = dfa_min(N, k_begin + ck);
  const float sc = scale[0];
  const long long qs1 = q_strides[1], qs2 = q_strides[2], qs3 = q_strides[3];
  const long long ks1 = k_strides[1], ks2 = k_strides[2], ks3 = k_strides[3];
  const long long vs1 = v_strides[1], vs2 = v_strides[2], vs3 = v_strides[3];
  const T* kh_k = k + kh * ks1;
  const T* kh_v = v + kh * vs1;
  const int wrow = warp * RPW;              // the warp's first row in the block

  // The block's query rows, times the scale; rows past R are zeros (computed, never written).
  for (int e = tid; e < rb * D; e += blockDim.x) {
    const int r = row0 + e / D;
    const int d = e % D;
    float x = 0.0f;
    if (r < R) {
      const int h = kh * G + r / L;
      const int i = r % L;
      x = dfa_to_float(q[h * qs1 + i * qs2 + d * qs3]) * sc;
    }
    q_s[e] = x;
  }

  // Per row of this warp: the last key it may see (-1: a padding row), running max, sum, output.
  // o[rr][2*ci + t] is dim ci*64 + 2*lane + t.
  int lim[RPW];
  float m[RPW], l[RPW], o[RPW][DPL];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = row0 + wrow + rr;
    lim[rr] = r < R ? (CAUSAL ? N - L + r % L : N - 1) : -1;
    m[rr] = NEG;
    l[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      o[rr][i] = 0.0f;
    }
  }

  for (int t0 = k_begin; t0 < k_end; t0 += TK) {
    const int nk = dfa_min(TK, k_end - t0);   // keys in this tile; the rest are zeros
    float s[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      s[rr] = 0.0f;
    }
    // Scores: lane j accumulates q_r . k_(t0+j) over D, one DC-wide chunk of K at a time.
#pragma unroll
    for (int d0 = 0; d0 < D; d0 += DC) {
      __syncthreads();  // the last readers of k_s / p_s are done (and, first time, q_s is written)
      for (int e = tid; e < TK * DC; e += blockDim.x) {
        const int j = e / DC;
        const int d = e % DC;
        k_s[j * KP + d] = j < nk ? dfa_to_float(kh_k[(long long)(t0 + j) * ks2 + (d0 + d) * ks3]) : 0.0f;
      }
      __syncthreads();
      const float4* kj = k_s4 + lane * (KP / 4);
#pragma unroll 4
      for (int d4 = 0; d4 < DC / 4; ++d4) {
        const float4 kv = kj[d4];
#pragma unroll
        for (int rr = 0; rr < RPW; ++rr) {
          const float4 qv = q_s4[((wrow + rr) * D + d0) / 4 + d4];
          s[rr] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
        }
      }
    }
    // Online softmax per row (warp-uniform branch: __any_sync gives every lane the same answer).
    const int key = t0 + lane;
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const bool vis = lane < nk && key <= lim[rr];
      float p = 0.0f;
      if (__any_sync(0xffffffffu, vis)) {
        const float m_new = fmaxf(m[rr], dfa_warp_max(vis ? s[rr] : NEG));
        const float alpha = l[rr] > 0.0f ? expf(m[rr] - m_new) : 0.0f;  // l == 0: nothing seen yet
        p = vis ? expf(s[rr] - m_new) : 0.0f;
        l[rr] = l[rr] * alpha + dfa_warp_sum(p);
        m[rr] = m_new;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          o[rr][i] *= alpha;
        }
      }
      p_s[(wrow + rr) * TK + lane] = p;  // 0 for keys the row does not see and past nk
    }
    __syncwarp();  // the warp's p_s rows are written before its lanes read them
    // o += P . V, one DC-wide chunk of V at a time, over all TK keys (p and V are 0 past nk).
#pragma unroll
    for (int d0 = 0; d0 < D; d0 += DC) {
      __syncthreads();  // the last readers of v_s are done
      for (int e = tid; e < TK * DC; e += blockDim.x) {
        const int j = e / DC;
        const int d = e % DC;
        v_s[e] = j < nk ? dfa_to_float(kh_v[(long long)(t0 + j) * vs2 + (d0 + d) * vs3]) : 0.0f;
      }
      __syncthreads();
#pragma unroll 2
      for (int j4 = 0; j4 < TK / 4; ++j4) {
        float4 pv[RPW];
#pragma unroll
        for (int rr = 0; rr < RPW; ++rr) {
          pv[rr] = p_s4[(wrow + rr) * (TK / 4) + j4];
        }
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const float2 vv = v_s2[(j4 * 4 + jj) * (DC / 2) + lane];
#pragma unroll
          for (int rr = 0; rr < RPW; ++rr) {
            const float pj = jj == 0 ? pv[rr].x : jj == 1 ? pv[rr].y : jj == 2 ? pv[rr].z : pv[rr].w;
            o[rr][2 * (d0 / DC)] += pj * vv.x;
            o[rr][2 * (d0 / DC) + 1] += pj * vv.y;
          }
        }
      }
    }
  }

  // This chunk's partials; global row kh*R + r is query head h, row i (h*L + i).
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = row0 + wrow + rr;
    if (r < R) {
      const long long slot = ((long long)kh * R + r) * nc + c;
      if (lane == 0) {
        pm[slot] = m[rr];
        pl[slot] = l[rr];
      }
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        po[slot * D + (i / 2) * DC + 2 * lane + i % 2] = o[rr][i];
      }
    }
  }
"""

# Pass 2: one thread per output element (global row, dim); chunks that saw no key (l == 0) are
# skipped. Every row sees at least one key (L <= N), so den > 0.
CUDA_PASS2 = r"""
  const int nc = pm_shape[1];
  const long long total = (long long)pm_shape[0] * D;
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total) {
    return;
  }
  const long long row = idx / D;
  const int d = (int)(idx % D);
  float mx = -3.0e38f;
  for (int c = 0; c < nc; ++c) {
    if (pl[row * nc + c] > 0.0f) {
      mx = fmaxf(mx, pm[row * nc + c]);
    }
  }
  float num = 0.0f, den = 0.0f;
  for (int c = 0; c < nc; ++c) {
    const float lc = pl[row * nc + c];
    if (lc > 0.0f) {
      const float w = expf(pm[row * nc + c] - mx);
      num += w * po[(row * nc + c) * D + d];
      den += w * lc;
    }
  }
  dfa_store(out + idx, den > 0.0f ? num / den : 0.0f);
"""


# One pass, for short caches (CUDA): one launch, no partials in global memory. Grid: blockIdx.x =
# KV head, blockIdx.y = row group of RB rows; W warps a block. Warp w takes the key tiles w, w + W,
# ...: lane j scores key t*32+j against the block's RB rows (queries in shared memory, read by all
# lanes at once), the warp keeps a running max, sum and output per row (lane j owns dims j, j + 32,
# ...), and P.V reads eight value rows before using them (independent loads in flight: with one
# warp per scheduler nothing else hides their latency). At the end the warps' partials are
# combined in shared memory and written normalised. The two passes above spread a long cache over
# hundreds of blocks; at a few hundred keys their second launch and their few-warp blocks cost more
# than the work (fused_attention.one_pass).
CUDA_ONEPASS = r"""
  constexpr int DPL = D / 32;       // output dims per lane: j, j + 32, ...
  constexpr float NEG = -3.0e38f;
  __shared__ float q_s[RB * D];     // the block's rows, scaled (zeros past R)
  __shared__ float p_s[W * RB * 32];  // each warp's probabilities of its tile's keys, per row
  __shared__ float o_s[RB * D];     // the combined output
  __shared__ float m_s[W * RB];     // each warp's running max and sum, per row
  __shared__ float l_s[W * RB];
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int H = q_shape[1];
  const int L = q_shape[2];
  const int KVH = k_shape[1];
  const int N = DFA_KEYS;
  const int G = H / KVH;
  const int R = G * L;
  const int kh = blockIdx.x;
  const int row0 = blockIdx.y * RB;
  const float sc = scale[0];
  const long long qs1 = q_strides[1], qs2 = q_strides[2], qs3 = q_strides[3];
  const long long ks2 = k_strides[2], ks3 = k_strides[3];
  const long long vs2 = v_strides[2], vs3 = v_strides[3];
  const T* kh_k = k + kh * k_strides[1];
  const T* kh_v = v + kh * v_strides[1];
  for (int e = tid; e < RB * D; e += blockDim.x) {
    const int r = row0 + e / D;
    const int d = e % D;
    float x = 0.0f;
    if (r < R) {
      x = dfa_to_float(q[(kh * G + r / L) * qs1 + (r % L) * qs2 + d * qs3]) * sc;
    }
    q_s[e] = x;
    o_s[e] = 0.0f;
  }
  // Per row: the last key it may see (-1: a padding row), running max, sum and output.
  int lim[RB];
  float m[RB], l[RB], o[RB][DPL];
#pragma unroll
  for (int rr = 0; rr < RB; ++rr) {
    const int r = row0 + rr;
    lim[rr] = r < R ? (CAUSAL ? N - L + r % L : N - 1) : -1;
    m[rr] = NEG;
    l[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      o[rr][i] = 0.0f;
    }
  }
  __syncthreads();
  // Warp w: tiles w, w + W, ... of 32 keys; lane j scores key t*32 + j against every row.
  float* p_w = p_s + warp * RB * 32;
  const int tiles = (N + 31) / 32;
  for (int t = warp; t < tiles; t += W) {
    const int key = t * 32 + lane;
    const bool in = key < N;
    float s[RB];
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
      s[rr] = 0.0f;
    }
    if (in) {
      const T* kr = kh_k + (long long)key * ks2;
#pragma unroll 8
      for (int d = 0; d < D; ++d) {
        const float kv = dfa_to_float(kr[d * ks3]);
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
          s[rr] += q_s[rr * D + d] * kv;
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
      const bool vis = in && key <= lim[rr];
      float p = 0.0f;
      if (__any_sync(0xffffffffu, vis)) {
        const float m_new = fmaxf(m[rr], dfa_warp_max(vis ? s[rr] : NEG));
        const float alpha = l[rr] > 0.0f ? expf(m[rr] - m_new) : 0.0f;
        p = vis ? expf(s[rr] - m_new) : 0.0f;
        l[rr] = l[rr] * alpha + dfa_warp_sum(p);
        m[rr] = m_new;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          o[rr][i] *= alpha;
        }
      }
      p_w[rr * 32 + lane] = p;
    }
    __syncwarp();
    // o += P . V: eight value rows loaded before any is used (their loads in flight together).
    const int nk = dfa_min(32, N - t * 32);
    for (int j0 = 0; j0 < nk; j0 += 8) {
      float vv[8][DPL];
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const T* vr = kh_v + (long long)(t * 32 + j0 + jj) * vs2;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          vv[jj][i] = j0 + jj < nk ? dfa_to_float(vr[(lane + 32 * i) * vs3]) : 0.0f;
        }
      }
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
          const float pj = p_w[rr * 32 + j0 + jj];
#pragma unroll
          for (int i = 0; i < DPL; ++i) {
            o[rr][i] += pj * vv[jj][i];
          }
        }
      }
    }
    __syncwarp();
  }
  // Combine the warps: each scales its output to the block's max and sum, then adds it in.
  if (lane == 0) {
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
      m_s[warp * RB + rr] = m[rr];
      l_s[warp * RB + rr] = l[rr];
    }
  }
  __syncthreads();
#pragma unroll
  for (int rr = 0; rr < RB; ++rr) {
    float top = NEG;
    for (int w = 0; w < W; ++w) {
      if (l_s[w * RB + rr] > 0.0f) {
        top = fmaxf(top, m_s[w * RB + rr]);
      }
    }
    float den = 0.0f;
    for (int w = 0; w < W; ++w) {
      const float lw = l_s[w * RB + rr];
      if (lw > 0.0f) {
        den += lw * expf(m_s[w * RB + rr] - top);
      }
    }
    if (l[rr] > 0.0f && den > 0.0f) {
      const float f = expf(m[rr] - top) / den;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        atomicAdd(&o_s[rr * D + lane + 32 * i], o[rr][i] * f);
      }
    }
  }
  __syncthreads();
  for (int e = tid; e < RB * D; e += blockDim.x) {
    const int r = row0 + e / D;
    if (r < R) {
      dfa_store(out + ((long long)(kh * G + r / L) * L + r % L) * D + e % D, o_s[e]);
    }
  }
"""
