// Every decoder layer of a CPU int4 step in one call: see cpu_decode.py.
// Compiled in the same unit as int4_cpu.cpp (its int4_matmul). Per layer, for each token row t:
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
#include <vector>

namespace {

constexpr int64_t kShortSpan = 16;  // attention.SHORT_SPAN: decodes and speculative verification

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

void rms_norm(const float* x, const float* weight, float eps, int64_t T, int64_t H, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    const float* row = x + t * H;
    float sum = 0.f;
    for (int64_t i = 0; i < H; ++i) sum += row[i] * row[i];
    const float inv = 1.f / std::sqrt(sum / static_cast<float>(H) + eps);
    for (int64_t i = 0; i < H; ++i) out[t * H + i] = row[i] * inv * weight[i];
  }
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
  for (int64_t t = 0; t < T; ++t) {
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
  }
}

// Rows whose span has at most `short_span` rows: one row and KV head at a time, keys read in place.
template <typename P>
void attend(const float* qkv, int64_t T, const P* pool, int64_t slot_count, const int64_t* tables,
            const int64_t* context_lens, const int64_t* span_lens, int64_t num_spans, const Shape& s, float* out,
            int64_t short_span) {
  const int64_t D = s.head_dim, width = (s.heads + 2 * s.kv_heads) * D, kv = s.kv_heads * D;
  const int64_t group = s.heads / s.kv_heads;
  std::vector<int64_t> rows;  // the short spans' rows
  for (int64_t i = 0, r0 = 0; i < num_spans; r0 += span_lens[i++])
    for (int64_t r = r0; span_lens[i] <= short_span && r < r0 + span_lens[i]; ++r) rows.push_back(r);
  at::parallel_for(0, static_cast<int64_t>(rows.size()) * s.kv_heads, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    std::vector<__m256> acc(D / 8);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = rows[i / s.kv_heads], h = i % s.kv_heads, n = context_lens[t];
      const int64_t* table = tables + t * s.max_blocks;
      scores.resize(group * n);
      for (int64_t p = 0; p < n; ++p) {
        const P* key = pool + (table[p / s.block_size] * s.block_size + p % s.block_size) * kv + h * D;
        for (int64_t g = 0; g < group; ++g) {
          const float* q = qkv + t * width + (h * group + g) * D;
          __m256 dot = _mm256_setzero_ps();
          for (int64_t d = 0; d < D; d += 8) dot = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(key + d), dot);
          scores[g * n + p] = hsum8(dot) * s.scale;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* row = scores.data() + g * n;
        float top = row[0];
        for (int64_t p = 1; p < n; ++p) top = std::max(top, row[p]);
        float total = 0.f;
        for (int64_t p = 0; p < n; ++p) total += (row[p] = std::exp(row[p] - top));
        for (auto& a : acc) a = _mm256_setzero_ps();
        for (int64_t p = 0; p < n; ++p) {
          const int64_t slot = table[p / s.block_size] * s.block_size + p % s.block_size;
          const P* value = pool + (slot_count + slot) * kv + h * D;
          const __m256 w = _mm256_set1_ps(row[p]);
          for (int64_t d = 0; d < D / 8; ++d) acc[d] = _mm256_fmadd_ps(w, load8(value + 8 * d), acc[d]);
        }
        float* dst = out + t * s.heads * D + (h * group + g) * D;
        const __m256 inv = _mm256_set1_ps(1.f / total);
        for (int64_t d = 0; d < D / 8; ++d) _mm256_storeu_ps(dst + 8 * d, _mm256_mul_ps(acc[d], inv));
      }
    }
  });
}

// A long span (prefill chunk): rows r0 .. r0 + n - 1 of one sequence. Per KV head, its context is gathered
// once to float32 and the span's queries attend through two matmuls (BLAS), the per-row loop above being
// ~2x slower than SDPA for 256-row chunks. Causal by context_lens.
template <typename P>
void attend_span(const float* qkv, int64_t r0, int64_t n, const P* pool, int64_t slot_count, const int64_t* tables,
                 const int64_t* context_lens, const Shape& s, float* out) {
  const int64_t D = s.head_dim, width = (s.heads + 2 * s.kv_heads) * D, kv = s.kv_heads * D;
  const int64_t group = s.heads / s.kv_heads, ctx = context_lens[r0 + n - 1];
  const int64_t* table = tables + r0 * s.max_blocks;
  const auto options = torch::TensorOptions().dtype(torch::kFloat32);
  auto keys = torch::empty({ctx, D}, options), values = torch::empty({ctx, D}, options);
  auto queries = torch::empty({n * group, D}, options);
  auto mask = torch::zeros({n * group, ctx}, options);
  float* m = mask.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t g = 0; g < group; ++g)
      for (int64_t p = context_lens[r0 + i]; p < ctx; ++p) m[(i * group + g) * ctx + p] = -INFINITY;
  for (int64_t h = 0; h < s.kv_heads; ++h) {
    float *k = keys.data_ptr<float>(), *v = values.data_ptr<float>(), *q = queries.data_ptr<float>();
    for (int64_t p = 0; p < ctx; ++p) {
      const int64_t slot = table[p / s.block_size] * s.block_size + p % s.block_size;
      const P* key = pool + slot * kv + h * D;
      const P* value = pool + (slot_count + slot) * kv + h * D;
      for (int64_t d = 0; d < D; d += 8) {
        _mm256_storeu_ps(k + p * D + d, load8(key + d));
        _mm256_storeu_ps(v + p * D + d, load8(value + d));
      }
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t g = 0; g < group; ++g)
        std::copy_n(qkv + (r0 + i) * width + (h * group + g) * D, D, q + (i * group + g) * D);
    const auto probs = at::softmax(at::addmm(mask, queries, keys.t(), 1.0, s.scale), 1);
    const auto result = at::mm(probs, values);
    const float* o = result.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t g = 0; g < group; ++g)
        std::copy_n(o + (i * group + g) * D, D, out + (r0 + i) * s.heads * D + (h * group + g) * D);
  }
}

template <typename P>
void layer_attention(float* qkv, int64_t T, const float* rotations, const int64_t* slots, P* pool,
                     int64_t slot_count, const int64_t* tables, const int64_t* context_lens, const int64_t* span_lens,
                     int64_t num_spans, const Shape& s, float* out) {
  rope_and_store(qkv, T, rotations, slots, pool, slot_count, s);
  for (int64_t i = 0, r0 = 0; i < num_spans; r0 += span_lens[i++])  // long spans: BLAS
    if (span_lens[i] > kShortSpan) attend_span(qkv, r0, span_lens[i], pool, slot_count, tables, context_lens, s, out);
  attend(qkv, T, pool, slot_count, tables, context_lens, span_lens, num_spans, s, out, kShortSpan);
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
  TORCH_CHECK(residual.scalar_type() == torch::kFloat32 && residual.is_contiguous() && residual.dim() == 2,
              "residual must be a contiguous float32 [T, H] tensor");
  TORCH_CHECK(pool.is_contiguous() && pool.dim() == 5, "pool must be a contiguous [L, 2, S, KVH, D] tensor");
  const int64_t L = pool.size(0), T = residual.size(0), H = residual.size(1);
  TORCH_CHECK(norms.size() == 2 * L && linears.size() == 8 * L && (qkv_bias.empty() || qkv_bias.size() == L),
              "decode_layers: 2 norms, 4 (codes, scales) pairs and 0 or 1 bias per layer");
  const int64_t slot_count = pool.size(2);
  Shape s{heads, pool.size(3), pool.size(4), block_size, tables.size(1), 0.f};
  s.scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
  TORCH_CHECK(s.head_dim % 8 == 0 && heads % s.kv_heads == 0, "head_dim % 8 and heads % kv_heads must be 0");
  const int64_t width = (heads + 2 * s.kv_heads) * s.head_dim, inter = linears[4].size(0) * 8 / 2;
  std::vector<float> normed(T * H), qkv(T * width), attn(T * heads * s.head_dim), gate_up(T * 2 * inter),
      act(T * inter), delta(T * H);
  float* x = residual.data_ptr<float>();
  const float* rot = rotations.data_ptr<float>();
  const int64_t *slot = slots.data_ptr<int64_t>(), *table = tables.data_ptr<int64_t>(),
                *lens = context_lens.data_ptr<int64_t>(), *spans = span_lens.data_ptr<int64_t>();
  const int64_t num_spans = span_lens.numel();
  const int64_t layer_elems = 2 * slot_count * s.kv_heads * s.head_dim;
  auto add = [&](const std::vector<float>& d) {
    for (int64_t i = 0; i < T * H; ++i) x[i] += d[i];
  };
  for (int64_t l = 0; l < L; ++l) {
    const torch::Tensor* lin = linears.data() + 8 * l;
    rms_norm(x, norms[2 * l].data_ptr<float>(), eps, T, H, normed.data());
    int4_matmul(normed.data(), T, H, lin[0], lin[1], qkv.data());
    if (!qkv_bias.empty()) {
      const float* b = qkv_bias[l].data_ptr<float>();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < width; ++i) qkv[t * width + i] += b[i];
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
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < inter; ++i) {
        const float g = gate_up[t * 2 * inter + i], u = gate_up[t * 2 * inter + inter + i];
        act[t * inter + i] = g / (1.f + std::exp(-g)) * u;
      }
    int4_matmul(act.data(), T, inter, lin[6], lin[7], delta.data());
    add(delta);
  }
  return residual;
}
