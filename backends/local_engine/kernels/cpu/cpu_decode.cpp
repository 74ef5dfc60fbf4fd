// Every decoder layer of a CPU int4 step in one call: see cpu_decode.py.
// Compiled in the same unit as int4_cpu.cpp (its int4_matmul, hmax, bf16x8). Per layer, for each token row t:
//   RMSNorm -> qkv (int4, + bias) -> RoPE on q and k (adjacent pairs) -> K/V written to the pool at slot[t]
//   -> attention of each query head over the row's first context_lens[t] positions of its block table
//   -> o (int4) + residual -> RMSNorm -> gate_up (int4) -> SiLU(gate) * up -> down (int4) + residual.
// All in float32; the pool holds bf16 (round to nearest even, as torch's conversion) or float32.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kChunkRows = 32;  // rows of a span per attention task (a task converts its context once)

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) { return bf16x8(p); }

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// r[i] (8 floats) <- column i of the 8 x 8 matrix whose rows were r[0..7].
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// All-ones lanes for keys 8 b + i < n.
inline __m256 valid_lanes(int64_t b, int64_t n) {
  const __m256i index = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(8 * b)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), index));
}

// e^x (clamped to [-87, 88]): 2^n e^r with r = x - n ln 2 in two parts (Cody-Waite) and Cephes' expf polynomial,
// ~1 ulp; std::exp per score was most of a long prompt's attention time.
// SiLU too, so that no row depends on the library's scalar exp.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

// fn(t) for every row t < T: on the OpenMP threads once there are rows enough to share (rows are independent,
// so a row's result does not depend on which thread or batch computed it).
template <typename Fn>
void for_rows(int64_t T, Fn&& fn) {
  at::parallel_for(0, T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) fn(t);
  });
}

void rms_norm(const float* x, const float* weight, float eps, int64_t T, int64_t H, float* out) {
  for_rows(T, [&](int64_t t) {
    const float* row = x + t * H;
    float sum = 0.f;
    for (int64_t i = 0; i < H; ++i) sum += row[i] * row[i];
    const float inv = 1.f / std::sqrt(sum / static_cast<float>(H) + eps);
    for (int64_t i = 0; i < H; ++i) out[t * H + i] = row[i] * inv * weight[i];
  });
}

struct Shape {
  int64_t heads, kv_heads, head_dim, block_size, max_blocks;
  float scale;
};

// RoPE on q and k of every row, then K/V into the pool (rows [q | k | v] of width (heads + 2 kv_heads) D).
template <typename P>
void rope_and_store(float* qkv, int64_t T, const float* rotations, const int64_t* slots, P* pool, int64_t slot_count,
                    const Shape& s) {
  const int64_t D = s.head_dim, width = (s.heads + 2 * s.kv_heads) * D, kv = s.kv_heads * D;
  for_rows(T, [&](int64_t t) {
    float* row = qkv + t * width;
    const float* rot = rotations + t * D;  // (cos, sin) per pair
    for (int64_t h = 0; h < s.heads + s.kv_heads; ++h)
      for (int64_t j = 0; j < D / 2; ++j) {
        float* pair = row + h * D + 2 * j;
        const float c = rot[2 * j], sn = rot[2 * j + 1], x0 = pair[0], x1 = pair[1];
        pair[0] = x0 * c - x1 * sn;
        pair[1] = x0 * sn + x1 * c;
      }
    P* keys = pool + slots[t] * kv;
    P* values = pool + (slot_count + slots[t]) * kv;
    for (int64_t i = 0; i < kv; ++i) {
      keys[i] = static_cast<P>(row[s.heads * D + i]);
      values[i] = static_cast<P>(row[(s.heads + s.kv_heads) * D + i]);
    }
  });
}

// For each of NQ queries i: dst[i][0 .. 8 NV) = sum over p < n of w[i][p] v[p, 0 .. 8 NV) / total[i], v's rows
// `stride` apart, summed in order of p. The queries share each load of v; the NQ x NV accumulators stay in
// registers (a runtime-sized array of them went through the stack on every add).
template <int NQ, int NV>
inline void weighted_sums(const float* const* w, const float* v, int64_t n, int64_t stride, const float* total,
                          float* const* dst) {
  __m256 acc[NQ][NV];
  for (int i = 0; i < NQ; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t p = 0; p < n; ++p) {
    __m256 row[NV];
    for (int j = 0; j < NV; ++j) row[j] = _mm256_loadu_ps(v + p * stride + 8 * j);
    for (int i = 0; i < NQ; ++i) {
      const __m256 wp = _mm256_set1_ps(w[i][p]);
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(wp, row[j], acc[i][j]);
    }
  }
  for (int i = 0; i < NQ; ++i) {
    const __m256 inv = _mm256_set1_ps(1.f / total[i]);
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(dst[i] + 8 * j, _mm256_mul_ps(acc[i][j], inv));
  }
}

// The first ctx positions of a sequence's context for KV heads h0 .. h1 - 1, converted to float32: keys[hh] in
// blocks of 8 positions transposed ([blocks, D, 8]: scores of 8 keys per FMA chain over the head dimension),
// values[hh] as rows [ctx, D]. One pass over the slots in order, each slot's heads together, so that the pool
// streams from memory in whole cache lines.
template <typename P>
void gather_context(const P* pool, int64_t slot_count, const int64_t* table, int64_t ctx, int64_t h0, int64_t h1,
                    const Shape& s, float* keys, float* values) {
  const int64_t D = s.head_dim, kv = s.kv_heads * D, blocks = (ctx + 7) / 8;
  for (int64_t b = 0; b < blocks; ++b) {
    // the 8 positions of a group share one block (block_size % 8 == 0, checked)
    const int64_t base = table[8 * b / s.block_size] * s.block_size + 8 * b % s.block_size;
    const int64_t n = std::min<int64_t>(8, ctx - 8 * b);
    for (int64_t i = 0; i < n; ++i) {
      const P* v = pool + (slot_count + base + i) * kv;
      for (int64_t hh = 0; hh < h1 - h0; ++hh)
        for (int64_t d = 0; d < D; d += 8)
          _mm256_storeu_ps(values + (hh * ctx + 8 * b + i) * D + d, load8(v + (h0 + hh) * D + d));
    }
    for (int64_t hh = 0; hh < h1 - h0; ++hh)
      for (int64_t d0 = 0; d0 < D; d0 += 8) {  // 8 keys x 8 dims, transposed in registers; zeros past ctx
        __m256 rows[8];
        for (int i = 0; i < 8; ++i)
          rows[i] = i < n ? load8(pool + (base + i) * kv + (h0 + hh) * D + d0) : _mm256_setzero_ps();
        transpose8(rows);
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(keys + ((hh * blocks + b) * D + d0 + j) * 8, rows[j]);
      }
  }
}

// NQ query heads' attention (q[i], all of one KV head) over the first n positions of their context (keys,
// values: gather_context's layout for that KV head), softmax-weighted into dst[i] [D]. The queries share each
// load of a key or value; each query's arithmetic is the same whatever NQ. `scores`: room for NQ (n + 7) / 8 * 8.
template <int NQ>
void attend_queries(const float* const* q, const float* keys, const float* values, int64_t n, const Shape& s,
                    float* scores, float* const* dst) {
  const int64_t D = s.head_dim, nb = (n + 7) / 8;
  const float* w[NQ];
  float total[NQ];
  __m256 top8[NQ];
  for (int i = 0; i < NQ; ++i) top8[i] = _mm256_set1_ps(-INFINITY);
  for (int64_t b = 0; b < nb; ++b) {  // per query, four FMA chains over the head dimension, added in a fixed order
    const float* block = keys + b * D * 8;
    __m256 dot[NQ][4];
    for (int i = 0; i < NQ; ++i)
      for (int k = 0; k < 4; ++k) dot[i][k] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 4)
      for (int k = 0; k < 4; ++k) {
        const __m256 key = _mm256_loadu_ps(block + (d + k) * 8);
        for (int i = 0; i < NQ; ++i) dot[i][k] = _mm256_fmadd_ps(_mm256_broadcast_ss(q[i] + d + k), key, dot[i][k]);
      }
    for (int i = 0; i < NQ; ++i) {
      __m256 score = _mm256_mul_ps(_mm256_add_ps(_mm256_add_ps(dot[i][0], dot[i][1]), _mm256_add_ps(dot[i][2], dot[i][3])),
                                   _mm256_set1_ps(s.scale));
      score = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), score, valid_lanes(b, n));
      _mm256_storeu_ps(scores + (i * nb + b) * 8, score);
      top8[i] = _mm256_max_ps(top8[i], score);
    }
  }
  for (int i = 0; i < NQ; ++i) {
    float* si = scores + i * nb * 8;
    const __m256 top = _mm256_set1_ps(hmax(top8[i]));
    __m256 total8 = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(si + b * 8), top)), valid_lanes(b, n));
      _mm256_storeu_ps(si + b * 8, e);
      total8 = _mm256_add_ps(total8, e);
    }
    total[i] = hsum8(total8);
    w[i] = si;
  }
  constexpr int NV = NQ >= 3 ? 3 : 4;  // NQ x NV accumulators + NV rows of v within the 16 registers
  float* out[NQ];
  int64_t d = 0;
  for (; d + 8 * NV <= D; d += 8 * NV) {
    for (int i = 0; i < NQ; ++i) out[i] = dst[i] + d;
    weighted_sums<NQ, NV>(w, values + d, n, D, total, out);
  }
  for (; d < D; d += 8) {
    for (int i = 0; i < NQ; ++i) out[i] = dst[i] + d;
    weighted_sums<NQ, 1>(w, values + d, n, D, total, out);
  }
}

// Attention of rows r0 .. r1 - 1 of one span (one sequence, consecutive positions) for KV heads h0 .. h1 - 1.
// Each row's arithmetic is fixed whatever rows it is computed with (span length, chunk, batch, heads per
// call): a decode row, a speculative verification row and a prefill row of the same token give the same
// output, bit for bit. The rows' context is converted to float32 once (gather_context).
template <typename P>
void attend_rows(const float* qkv, int64_t r0, int64_t r1, int64_t h0, int64_t h1, const P* pool,
                 int64_t slot_count, const int64_t* table, const int64_t* context_lens, const Shape& s, float* out) {
  const int64_t D = s.head_dim, width = (s.heads + 2 * s.kv_heads) * D;
  const int64_t group = s.heads / s.kv_heads, ctx = context_lens[r1 - 1], blocks = (ctx + 7) / 8;
  thread_local std::vector<float> keys, values, scores;
  keys.resize((h1 - h0) * blocks * D * 8);
  values.resize((h1 - h0) * ctx * D);
  gather_context(pool, slot_count, table, ctx, h0, h1, s, keys.data(), values.data());
  scores.resize(3 * blocks * 8);
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t g = 0; g < group; g += 3) {  // the row's query heads of KV head h, up to 3 at a time
        const float* q[3];
        float* dst[3];
        const int nq = static_cast<int>(std::min<int64_t>(3, group - g));
        for (int i = 0; i < nq; ++i) {
          q[i] = qkv + r * width + (h * group + g + i) * D;
          dst[i] = out + r * s.heads * D + (h * group + g + i) * D;
        }
        const float *k = keys.data() + (h - h0) * blocks * D * 8, *v = values.data() + (h - h0) * ctx * D;
        const int64_t n = context_lens[r];
        switch (nq) {
          case 3: attend_queries<3>(q, k, v, n, s, scores.data(), dst); break;
          case 2: attend_queries<2>(q, k, v, n, s, scores.data(), dst); break;
          default: attend_queries<1>(q, k, v, n, s, scores.data(), dst); break;
        }
      }
}

template <typename P>
void layer_attention(float* qkv, int64_t T, const float* rotations, const int64_t* slots, P* pool,
                     int64_t slot_count, const int64_t* tables, const int64_t* context_lens, const int64_t* span_lens,
                     int64_t num_spans, const Shape& s, float* out) {
  rope_and_store(qkv, T, rotations, slots, pool, slot_count, s);
  std::vector<std::pair<int64_t, int64_t>> chunks;  // row ranges of at most kChunkRows rows within a span
  for (int64_t i = 0, r0 = 0; i < num_spans; r0 += span_lens[i++])
    for (int64_t c = r0; c < r0 + span_lens[i]; c += kChunkRows) chunks.emplace_back(c, std::min(c + kChunkRows, r0 + span_lens[i]));
  // A task is a chunk and all its KV heads (the pool streams in whole slots) where there are chunks enough
  // to keep the threads busy, else a chunk and one head.
  const int64_t per_task = static_cast<int64_t>(chunks.size()) >= 4 * at::get_num_threads() ? s.kv_heads : 1;
  const int64_t splits = s.kv_heads / per_task, tasks = static_cast<int64_t>(chunks.size()) * splits;
  at::parallel_for(0, tasks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const auto [r0, r1] = chunks[i / splits];
      const int64_t h0 = i % splits * per_task;
      attend_rows(qkv, r0, r1, h0, h0 + per_task, pool, slot_count, tables + r0 * s.max_blocks, context_lens, s, out);
    }
  });
}

}  // namespace

// residual [T, H] float32 in, the residual stream after every layer out (in place).
// linears: per layer qkv, o, gate_up, down as (codes, scales) pairs -> 8 tensors a layer; norms: 2 a layer;
// qkv_bias: one a layer or none. pool [L, 2, S, KVH, D]; rotations [T, D/2, 2]; tables [T, max_blocks] int64;
// span_lens: the rows of each sequence, in order (rows of one span share its table, positions consecutive).
torch::Tensor decode_layers(torch::Tensor residual, std::vector<torch::Tensor> norms,
                            std::vector<torch::Tensor> linears, std::vector<torch::Tensor> qkv_bias,
                            torch::Tensor pool, torch::Tensor rotations, torch::Tensor slots, torch::Tensor tables,
                            torch::Tensor context_lens, torch::Tensor span_lens, int64_t heads, int64_t block_size,
                            double eps) {
  const GilRelease no_gil;  // the server's event loop runs while a step computes
  TORCH_CHECK(residual.scalar_type() == torch::kFloat32 && residual.is_contiguous() && residual.dim() == 2,
              "residual must be a contiguous float32 [T, H] tensor");
  TORCH_CHECK(pool.is_contiguous() && pool.dim() == 5, "pool must be a contiguous [L, 2, S, KVH, D] tensor");
  const int64_t L = pool.size(0), T = residual.size(0), H = residual.size(1);
  TORCH_CHECK(norms.size() == 2 * L && linears.size() == 8 * L && (qkv_bias.empty() || qkv_bias.size() == L),
              "decode_layers: 2 norms, 4 (codes, scales) pairs and 0 or 1 bias per layer");
  const int64_t slot_count = pool.size(2);
  Shape s{heads, pool.size(3), pool.size(4), block_size, tables.size(1), 0.f};
  s.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
  TORCH_CHECK(block_size % 8 == 0, "block_size must be a multiple of 8");
  TORCH_CHECK(s.head_dim % 8 == 0 && s.head_dim <= 256 && heads % s.kv_heads == 0,
              "head_dim must be a multiple of 8 up to 256, heads a multiple of kv_heads");
  const int64_t width = (heads + 2 * s.kv_heads) * s.head_dim, inter = linears[4].size(0) * 8 / 2;
  TORCH_CHECK(inter % 8 == 0, "intermediate size must be a multiple of 8");
  std::vector<float> normed(T * H), qkv(T * width), attn(T * heads * s.head_dim), gate_up(T * 2 * inter),
      act(T * inter), delta(T * H);
  float* x = residual.data_ptr<float>();
  const float* rot = rotations.data_ptr<float>();
  const int64_t *slot = slots.data_ptr<int64_t>(), *table = tables.data_ptr<int64_t>(),
                *lens = context_lens.data_ptr<int64_t>(), *spans = span_lens.data_ptr<int64_t>();
  const int64_t num_spans = span_lens.numel();
  const int64_t layer_elems = 2 * slot_count * s.kv_heads * s.head_dim;
  auto add = [&](const std::vector<float>& d) {
    for_rows(T, [&](int64_t t) {
      for (int64_t i = t * H; i < (t + 1) * H; ++i) x[i] += d[i];
    });
  };
  for (int64_t l = 0; l < L; ++l) {
    const torch::Tensor* lin = linears.data() + 8 * l;
    rms_norm(x, norms[2 * l].data_ptr<float>(), eps, T, H, normed.data());
    int4_matmul(normed.data(), T, H, lin[0], lin[1], qkv.data());
    if (!qkv_bias.empty()) {
      const float* b = qkv_bias[l].data_ptr<float>();
      for_rows(T, [&](int64_t t) {
        for (int64_t i = 0; i < width; ++i) qkv[t * width + i] += b[i];
      });
    }
    if (pool.scalar_type() == torch::kBFloat16)
      layer_attention(qkv.data(), T, rot, slot, pool.data_ptr<c10::BFloat16>() + l * layer_elems, slot_count, table,
                      lens, spans, num_spans, s, attn.data());
    else
      layer_attention(qkv.data(), T, rot, slot, pool.data_ptr<float>() + l * layer_elems, slot_count, table, lens,
                      spans, num_spans, s, attn.data());
    int4_matmul(attn.data(), T, heads * s.head_dim, lin[2], lin[3], delta.data());
    add(delta);
    rms_norm(x, norms[2 * l + 1].data_ptr<float>(), eps, T, H, normed.data());
    int4_matmul(normed.data(), T, H, lin[4], lin[5], gate_up.data());
    for_rows(T, [&](int64_t t) {
      for (int64_t i = 0; i < inter; i += 8) {  // SiLU(gate) * up; inter % 8 == 0 (checked)
        const __m256 g = _mm256_loadu_ps(gate_up.data() + t * 2 * inter + i);
        const __m256 u = _mm256_loadu_ps(gate_up.data() + t * 2 * inter + inter + i);
        const __m256 sig = _mm256_add_ps(_mm256_set1_ps(1.f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
        _mm256_storeu_ps(act.data() + t * inter + i, _mm256_mul_ps(_mm256_div_ps(g, sig), u));
      }
    });
    int4_matmul(act.data(), T, inter, lin[6], lin[7], delta.data());
    add(delta);
  }
  return residual;
}
