"""The fused few-row attention's Metal kernel sources (mx.fast.metal_kernel): the CUDA kernels' two
passes (dflash_core.engine.attention_kernels) written to the same contract."""

# ---------------------------------------------------------------------------------------------
# Metal (mx.fast.metal_kernel): the same two passes, pass 1 in the CUDA kernel's first form (scalar
# shared-memory reads, probabilities by simd_shuffle; that form measured the same on CUDA). MLX adds
# the inputs (`const device float* q`, ...), `const constant int* q_shape`, `const constant
# int64_t* q_strides` and the attributes the body names; fused_attention writes the constants
# first (`using T = float | half | bfloat16_t;`, `constexpr int D = ...;`, ...). Threadgroup
# memory is 32 KB at most, so MAXR is smaller there. Not run yet (no Apple GPU here): `enabled()`
# keeps it off by default on Metal.
# ---------------------------------------------------------------------------------------------

METAL_PASS1 = r"""
  constexpr int TK = 32;
  constexpr int DC = 64;
  constexpr int DPL = D / 32;
  constexpr float NEG = -3.0e38f;
  threadgroup float q_s[MAXR * D];
  threadgroup float kt_s[DC * (TK + 1)];
  threadgroup float v_s[TK * DC];

  const int tid = int(thread_position_in_threadgroup.x);
  const int nthreads = int(threads_per_threadgroup.x);
  const int lane = int(thread_index_in_simdgroup);
  const int warp = int(simdgroup_index_in_threadgroup);
  const int rb = (nthreads / 32) * RPW;
  if (rb > MAXR || (nthreads % 32) != 0) {
    return;
  }
  const int H = q_shape[1];
  const int L = q_shape[2];
  const int KVH = k_shape[1];
  const int N = k_shape[2];
  const int G = H / KVH;
  const int R = G * L;
  const int kh = int(threadgroup_position_in_grid.y);
  const int row0 = int(threadgroup_position_in_grid.z) * rb;
  const int nc = int(threadgroups_per_grid.x);
  const int c = int(threadgroup_position_in_grid.x);
  const int ck = ((N + nc - 1) / nc + TK - 1) / TK * TK;
  const int k_begin = min(N, c * ck);
  const int k_end = min(N, k_begin + ck);
  const float sc = scale[0];
  const int64_t qs1 = q_strides[1], qs2 = q_strides[2], qs3 = q_strides[3];
  const int64_t ks1 = k_strides[1], ks2 = k_strides[2], ks3 = k_strides[3];
  const int64_t vs1 = v_strides[1], vs2 = v_strides[2], vs3 = v_strides[3];

  for (int e = tid; e < rb * D; e += nthreads) {
    const int r = row0 + e / D;
    const int d = e % D;
    float x = 0.0f;
    if (r < R) {
      const int h = kh * G + r / L;
      const int i = r % L;
      x = static_cast<float>(q[h * qs1 + i * qs2 + d * qs3]) * sc;
    }
    q_s[e] = x;
  }

  int lim[RPW];
  float m[RPW], l[RPW], o[RPW][DPL];
  for (int rr = 0; rr < RPW; ++rr) {
    const int r = row0 + warp * RPW + rr;
    lim[rr] = r < R ? (CAUSAL ? N - L + r % L : N - 1) : -1;
    m[rr] = NEG;
    l[rr] = 0.0f;
    for (int i = 0; i < DPL; ++i) {
      o[rr][i] = 0.0f;
    }
  }

  for (int t0 = k_begin; t0 < k_end; t0 += TK) {
    const int nk = min(TK, k_end - t0);
    float s[RPW];
    for (int rr = 0; rr < RPW; ++rr) {
      s[rr] = 0.0f;
    }
    for (int d0 = 0; d0 < D; d0 += DC) {
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int e = tid; e < TK * DC; e += nthreads) {
        const int j = e / DC;
        const int d = e % DC;
        kt_s[d * (TK + 1) + j] =
            j < nk ? static_cast<float>(k[kh * ks1 + int64_t(t0 + j) * ks2 + (d0 + d) * ks3]) : 0.0f;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int d = 0; d < DC; ++d) {
        const float kv = kt_s[d * (TK + 1) + lane];
        for (int rr = 0; rr < RPW; ++rr) {
          s[rr] += q_s[(warp * RPW + rr) * D + d0 + d] * kv;
        }
      }
    }
    const int key = t0 + lane;
    float p[RPW];
    for (int rr = 0; rr < RPW; ++rr) {
      const bool vis = lane < nk && key <= lim[rr];
      p[rr] = 0.0f;
      if (simd_any(vis)) {
        const float m_new = max(m[rr], simd_max(vis ? s[rr] : NEG));
        const float alpha = l[rr] > 0.0f ? metal::exp(m[rr] - m_new) : 0.0f;
        p[rr] = vis ? metal::exp(s[rr] - m_new) : 0.0f;
        l[rr] = l[rr] * alpha + simd_sum(p[rr]);
        m[rr] = m_new;
        for (int i = 0; i < DPL; ++i) {
          o[rr][i] *= alpha;
        }
      }
    }
    for (int d0 = 0; d0 < D; d0 += DC) {
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int e = tid; e < TK * DC; e += nthreads) {
        const int j = e / DC;
        const int d = e % DC;
        v_s[e] = j < nk ? static_cast<float>(v[kh * vs1 + int64_t(t0 + j) * vs2 + (d0 + d) * vs3]) : 0.0f;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int j = 0; j < nk; ++j) {
        const float v0 = v_s[j * DC + lane];
        const float v1 = v_s[j * DC + 32 + lane];
        for (int rr = 0; rr < RPW; ++rr) {
          const float pj = simd_shuffle(p[rr], ushort(j));
          o[rr][d0 / 32] += pj * v0;
          o[rr][d0 / 32 + 1] += pj * v1;
        }
      }
    }
  }

  for (int rr = 0; rr < RPW; ++rr) {
    const int r = row0 + warp * RPW + rr;
    if (r < R) {
      const int64_t slot = (int64_t(kh) * R + r) * nc + c;
      if (lane == 0) {
        pm[slot] = m[rr];
        pl[slot] = l[rr];
      }
      for (int i = 0; i < DPL; ++i) {
        po[slot * D + lane + 32 * i] = o[rr][i];
      }
    }
  }
"""

METAL_PASS2 = r"""
  const int nc = pm_shape[1];
  const int64_t total = int64_t(pm_shape[0]) * D;
  const int64_t idx = int64_t(thread_position_in_grid.x);
  if (idx >= total) {
    return;
  }
  const int64_t row = idx / D;
  const int d = int(idx % D);
  float mx = -3.0e38f;
  for (int c = 0; c < nc; ++c) {
    if (pl[row * nc + c] > 0.0f) {
      mx = max(mx, pm[row * nc + c]);
    }
  }
  float num = 0.0f, den = 0.0f;
  for (int c = 0; c < nc; ++c) {
    const float lc = pl[row * nc + c];
    if (lc > 0.0f) {
      const float w = metal::exp(pm[row * nc + c] - mx);
      num += w * po[(row * nc + c) * D + d];
      den += w * lc;
    }
  }
  out[idx] = static_cast<T>(den > 0.0f ? num / den : 0.0f);
"""
