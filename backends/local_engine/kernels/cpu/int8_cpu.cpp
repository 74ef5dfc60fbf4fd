// int8 weight x int8 activation matmul for x86-64 CPUs with AVX2 (the int4 format's output layer): see
// cpu_kernels.py. Compiled in the same unit as int4_cpu.cpp (quantize_rows, NB).
//
// Weights: int8 codes, one float scale per row (symmetric), in tiles of 8 rows: codes [N/8, K/4, 32], byte
// 4 r + c of (t, k4) = code (8 t + r, 4 k4 + c): one row per int32 lane against 4 activation bytes broadcast.
// Activations: int8 per group of 32 with its own d (quantize_rows). Per step of 4 inputs: vpmaddubsw of |w|
// and sign(x, w) (llama.cpp's Q8_0 x Q8_0 on AVX2; |pair sum| <= 2 * 127 * 127 < 2^15), vpmaddwd to int32;
// per group the int32 sums become floats scaled by d; at the end by the rows' scales. With AVX-512 VNNI (set_isa)
// vpdpbusd does the multiply-adds straight into int32.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// Each tile's epilogue: the rows' sums times the weight rows' scales.
template <int MR>
inline void store_scaled(const __m256* acc, const float* row_scales, float* out, int64_t t, int64_t m0, int64_t N) {
  const __m256 scale = _mm256_loadu_ps(row_scales + t * 8);
  for (int j = 0; j < MR; ++j) _mm256_storeu_ps(out + (m0 + j) * N + t * 8, _mm256_mul_ps(acc[j], scale));
}

template <int MR>
void int8_tile(const int8_t* codes, const float* row_scales, const QuantizedRows& x, float* out, int64_t t,
               int64_t m0, int64_t N, int64_t K) {
  const int64_t G = K / 32;
  const int8_t* tc = codes + t * (K / 4) * 32;
  __m256 acc[MR] = {};
  for (int64_t g = 0; g < G; ++g) {
    __m256i sums[MR] = {};
    for (int step = 0; step < 8; ++step) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tc + (g * 8 + step) * 32));
      const __m256i aw = _mm256_abs_epi8(w);
      for (int j = 0; j < MR; ++j) {
        const __m256i sx = _mm256_sign_epi8(x4(x, m0 + j, K, g * 32 + step * 4), w);
        sums[j] = _mm256_add_epi32(sums[j], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1)));
      }
    }
    for (int j = 0; j < MR; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[j]), _mm256_broadcast_ss(x.d + (m0 + j) * G + g), acc[j]);
  }
  store_scaled<MR>(acc, row_scales, out, t, m0, N);
}

// int8_tile with vpdpbusd (|w| x sign(x, w) summed straight into int32): the same sums, so the same results.
template <int MR>
LLMGW_VNNI void int8_tile_vnni(const int8_t* codes, const float* row_scales, const QuantizedRows& x, float* out,
                               int64_t t, int64_t m0, int64_t N, int64_t K) {
  const int64_t G = K / 32;
  const int8_t* tc = codes + t * (K / 4) * 32;
  __m256 acc[MR] = {};
  for (int64_t g = 0; g < G; ++g) {
    __m256i sums[MR][2] = {};  // even and odd steps: two dependency chains per row
    for (int step = 0; step < 8; ++step) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tc + (g * 8 + step) * 32));
      const __m256i aw = _mm256_abs_epi8(w);
      for (int j = 0; j < MR; ++j) {
        const __m256i sx = _mm256_sign_epi8(x4(x, m0 + j, K, g * 32 + step * 4), w);
        sums[j][step & 1] = _mm256_dpbusd_epi32(sums[j][step & 1], aw, sx);
      }
    }
    for (int j = 0; j < MR; ++j) {
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_add_epi32(sums[j][0], sums[j][1]));
      acc[j] = _mm256_fmadd_ps(dot, _mm256_broadcast_ss(x.d + (m0 + j) * G + g), acc[j]);
    }
  }
  store_scaled<MR>(acc, row_scales, out, t, m0, N);
}

}  // namespace

// x [M, K] float32 or bfloat16 -> float32 [M, N].
torch::Tensor int8_linear_cpu(torch::Tensor x, torch::Tensor codes, torch::Tensor row_scales) {
  const GilRelease no_gil;
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "x must be a 2-D CPU tensor");
  TORCH_CHECK(codes.scalar_type() == torch::kInt8 && codes.is_contiguous() && codes.dim() == 3 && codes.size(2) == 32,
              "codes must be contiguous int8 [N/8, K/4, 32]");
  TORCH_CHECK(row_scales.scalar_type() == torch::kFloat32 && row_scales.is_contiguous(), "scales must be float32");
  const int64_t M = x.size(0), K = x.size(1), tiles = codes.size(0), N = tiles * 8;
  TORCH_CHECK(K % 32 == 0 && codes.size(1) == K / 4 && row_scales.numel() == N, "int8_cpu: shapes do not match");
  const torch::Tensor xf = x.to(torch::kFloat32).contiguous();
  const QuantizedRows xq = quantize_rows(xf.data_ptr<float>(), M, K);
  auto out = torch::empty({M, N}, xf.options());
  const int8_t* c = codes.data_ptr<int8_t>();
  const float* s = row_scales.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const bool vnni = use_vnni.load(std::memory_order_relaxed);
  at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      row_blocks(M, [&](auto rows, int64_t m0) {
        constexpr int R = decltype(rows)::value;
        vnni ? int8_tile_vnni<R>(c, s, xq, o, t, m0, N, K) : int8_tile<R>(c, s, xq, o, t, m0, N, K);
      });
    }
  });
  return out;
}
