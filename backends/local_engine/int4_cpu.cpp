// int4 weight x int8 activation matmul on x86 CPUs with AVX-512 VNNI: see int4_cpu.py.
//
// Weights: codes uint8 [N, K/2], per 64 inputs 32 bytes: byte i holds code 64p + i (low nibble) and 64p + 32 + i
// (high nibble), so one and + one shift give the 64 codes in input order; (scale, zero) bf16 pairs [N, K/32, 2],
// w = (q - 8) * scale + zero (the tinygemm format the engine quantizes to). Activations: each row's groups of 32
// quantized to int8 with their own scale d = max|x| / 127 (llama.cpp's Q8_0), so a row's result does not depend on
// the rows batched with it. Per group: sum w x = s d sum(q xq) + (z - 8 s) d sum(xq); vpdpbusd does the integer
// dot of 64 codes at once (16 lanes: 8 per group), and lanes 0-7 / 8-15 carry the two groups' scales; the zero
// term is a dot over groups per (row, weight row) at the end. Register tiles of 4 weight rows x up to 4 rows of
// x share every unpacked code block and activation load; at::parallel_for splits the weight rows.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// x float [M, K] -> xq int8 [M, K]; per group: d spread over the 8 lanes of its half of a 16-lane vector per 64
// inputs [M, K/64, 16], and d * sum(xq) [M, K/32].
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* xq, float* dvec, float* sxd) {
  const int64_t pairs = K / 64;
  at::parallel_for(0, M, 4, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      for (int64_t p = 0; p < pairs; ++p) {
        float d2[2];
        for (int h = 0; h < 2; ++h) {
          const float* src = x + m * K + p * 64 + h * 32;
          const __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
          const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
          const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
          const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));
          const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
          int8_t* dst = xq + m * K + p * 64 + h * 32;
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(qa));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtsepi32_epi8(qb));
          d2[h] = amax / 127.f;
          sxd[m * (K / 32) + 2 * p + h] = d2[h] * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)));
        }
        float* dv = dvec + (m * pairs + p) * 16;
        for (int i = 0; i < 16; ++i) dv[i] = d2[i >> 3];
      }
    }
  });
}

inline float bf16_to_float(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

constexpr int NB = 4;  // weight rows per register tile

// One tile: NB weight rows (n0..) x MR activation rows (m0..); NB * MR accumulators of 16 lanes.
template <int MR>
void tile(const uint8_t* codes, const uint16_t* sz, const int8_t* xq, const float* dvec, const float* sxd,
          const float* low, float* out, int64_t n0, int64_t m0, int64_t N, int64_t K) {
  const int64_t pairs = K / 64, groups = K / 32;
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m512i pick_scale = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
  __m512 acc[NB][MR];
  for (int r = 0; r < NB; ++r)
    for (int j = 0; j < MR; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i q[NB];
    __m512 scale[NB];
    for (int r = 0; r < NB; ++r) {
      const int64_t n = n0 + r;
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + n * (K / 2) + p * 32));
      const __m256i lo = _mm256_and_si256(packed, low_mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask);
      q[r] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      // (s0, z0, s1, z1) bf16 -> fp32; lanes 0-7 take s0 (group 2p), lanes 8-15 s1
      const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sz + (n * groups + 2 * p) * 2));
      const __m512 f = _mm512_castps128_ps512(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(raw), 16)));
      scale[r] = _mm512_permutexvar_ps(pick_scale, f);
    }
    for (int j = 0; j < MR; ++j) {
      const __m512i xv = _mm512_loadu_si512(xq + (m0 + j) * K + p * 64);
      const __m512 dv = _mm512_loadu_ps(dvec + ((m0 + j) * pairs + p) * 16);
      for (int r = 0; r < NB; ++r) {
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r], xv));
        acc[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(dot, dv), scale[r], acc[r][j]);
      }
    }
  }
  for (int r = 0; r < NB; ++r) {
    for (int j = 0; j < MR; ++j) {  // + sum over groups of (z - 8 s) d sum(xq)
      __m512 lows = _mm512_setzero_ps();
      int64_t g = 0;
      for (; g + 16 <= groups; g += 16)
        lows = _mm512_fmadd_ps(_mm512_loadu_ps(low + r * groups + g), _mm512_loadu_ps(sxd + (m0 + j) * groups + g), lows);
      float tail = 0.f;
      for (; g < groups; ++g) tail += low[r * groups + g] * sxd[(m0 + j) * groups + g];
      out[(m0 + j) * N + n0 + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][j], lows)) + tail;
    }
  }
}

void matmul_rows(const uint8_t* codes, const uint16_t* sz, const int8_t* xq, const float* dvec, const float* sxd,
                 float* out, int64_t M, int64_t N, int64_t K) {
  const int64_t groups = K / 32;
  at::parallel_for(0, N / NB, 4, [&](int64_t b0, int64_t b1) {
    std::vector<float> low(NB * groups);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NB;
      for (int r = 0; r < NB; ++r)
        for (int64_t g = 0; g < groups; ++g) {
          const uint16_t* pair = sz + ((n0 + r) * groups + g) * 2;
          low[r * groups + g] = bf16_to_float(pair[1]) - 8.f * bf16_to_float(pair[0]);
        }
      int64_t m0 = 0;
      for (; m0 + 4 <= M; m0 += 4) tile<4>(codes, sz, xq, dvec, sxd, low.data(), out, n0, m0, N, K);
      switch (M - m0) {
        case 3: tile<3>(codes, sz, xq, dvec, sxd, low.data(), out, n0, m0, N, K); break;
        case 2: tile<2>(codes, sz, xq, dvec, sxd, low.data(), out, n0, m0, N, K); break;
        case 1: tile<1>(codes, sz, xq, dvec, sxd, low.data(), out, n0, m0, N, K); break;
        default: break;
      }
    }
  });
}

}  // namespace

torch::Tensor int4_linear_cpu(torch::Tensor x, torch::Tensor codes, torch::Tensor scales_and_zeros) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous 2-D float32 CPU tensor");
  TORCH_CHECK(codes.scalar_type() == torch::kUInt8 && codes.is_contiguous(), "codes must be contiguous uint8");
  TORCH_CHECK(scales_and_zeros.scalar_type() == torch::kBFloat16 && scales_and_zeros.is_contiguous(),
              "scales_and_zeros must be contiguous bf16");
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  TORCH_CHECK(K % 64 == 0 && N % 4 == 0 && codes.size(1) == K / 2 && scales_and_zeros.numel() == N * (K / 32) * 2,
              "int4_cpu needs K % 64 == 0, N % 4 == 0, codes [N, K/2], scales_and_zeros [N, K/32, 2]");
  auto xq = torch::empty({M, K}, x.options().dtype(torch::kInt8));
  auto dvec = torch::empty({M, K / 64, 16}, x.options());
  auto sxd = torch::empty({M, K / 32}, x.options());
  auto out = torch::empty({M, N}, x.options());
  quantize_rows(x.data_ptr<float>(), M, K, xq.data_ptr<int8_t>(), dvec.data_ptr<float>(), sxd.data_ptr<float>());
  matmul_rows(codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scales_and_zeros.data_ptr<at::BFloat16>()),
              xq.data_ptr<int8_t>(), dvec.data_ptr<float>(), sxd.data_ptr<float>(), out.data_ptr<float>(), M, N, K);
  return out;
}
