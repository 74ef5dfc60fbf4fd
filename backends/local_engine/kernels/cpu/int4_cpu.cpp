// int4 weight x int8 activation matmul for x86-64 CPUs with AVX2 and FMA: see cpu_kernels.py.
//
// Weights, in tiles of 8 rows (n = 8 t + r) and groups of 32 inputs (k = 32 g + 8 p + 4 h + c):
//   codes uint8 [N/8, G, 4, 32]: byte 4 r + c of (t, g, p) holds code (r, k) for h = 0 in its low nibble and
//   h = 1 in its high one, so one and (or shift + and) gives 8 rows x 4 consecutive inputs, one row per
//   int32 lane, against 4 activation bytes broadcast to every lane;
//   scales bf16 [N/8, G, 2, 8] = the 8 rows' scales, then their zeros; w = (q - 8) * scale + zero
//   (tinygemm's format).
// Activations: each row's groups of 32 quantized to int8 with their own d = max|x| / 127 (llama.cpp's Q8_0),
// so a row's result depends on that row only. Per group: sum w x = s d sum(q xq) + (z - 8 s) d sum(xq).
// One register tile is 8 weight rows (the lanes) x up to 4 activation rows; at::parallel_for splits the tiles.
// On CPUs with AVX-512 VNNI (set_isa, chosen by cpu_kernels.py) the same tile runs with vpdpbusd, which does
// vpmaddubsw + vpmaddwd + the add in one instruction on the same layout: the integer sums, and so the results,
// are bit-identical to the AVX2 path's; it is faster where rows share the weights (issue 14, studies/README.md).
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr int NB = 8;  // weight rows per tile

inline float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

void quantize_into(const float* x, int64_t M, int64_t K, int8_t* xq, float* d, float* sxd) {
  const int64_t G = K / 32;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const float* src = x + m * K + g * 32;
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(src + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
      }
      const float a = hmax(amax);
      const __m256 inv = _mm256_set1_ps(a > 0.f ? 127.f / a : 0.f);
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // round to nearest
      const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      const __m256i q01 = _mm256_packs_epi32(q[0], q[1]), q23 = _mm256_packs_epi32(q[2], q[3]);
      __m256i bytes = _mm256_packs_epi16(q01, q23);  // lanes interleaved by the packs: put them in order
      bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + m * K + g * 32), bytes);
      const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      const int total = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
      d[m * G + g] = a / 127.f;
      sxd[m * G + g] = a / 127.f * static_cast<float>(total);
    }
  }
}

// Rows of x quantized per group of 32 (llama.cpp's Q8_0): codes, d and d * sum(codes) per group.
struct QuantizedRows {
  const int8_t* q;  // [M, K]
  const float* d;  // [M, K / 32]
  const float* sxd;  // [M, K / 32]
};

// x float [M, K] -> its QuantizedRows, in this thread's buffers (valid until its next call).
QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K) {
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d, sxd;
  q.resize(M * K);
  d.resize(M * (K / 32));
  sxd.resize(M * (K / 32));
  quantize_into(x, M, K, q.data(), d.data(), sxd.data());
  return {q.data(), d.data(), sxd.data()};
}

// 8 bf16 -> 8 float32 (exact: the bits move to the high half).
inline __m256 bf16x8(const void* p) {
  const __m128i raw = _mm_loadu_si128(static_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// The parts of a tile both instruction sets share (plain AVX2, inlined into either tile).

// Bytes k .. k + 3 of quantized activation row m, broadcast to every int32 lane.
inline __m256i x4(const QuantizedRows& x, int64_t m, int64_t K, int64_t k) {
  int32_t v;
  std::memcpy(&v, x.q + m * K + k, 4);
  return _mm256_set1_epi32(v);
}

// Codes of step p of a group: 8 weight rows (one per int32 lane) x inputs 8 p .. 8 p + 3 (lo), 8 p + 4 .. (hi).
struct Nibbles {
  __m256i lo, hi;
};
inline Nibbles nibbles(const uint8_t* packed32) {
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed32));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(packed, mask), _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask)};
}

// A group's 8 rows' scales and (zero - 8 scale), from bf16 [2, 8].
struct GroupScales {
  __m256 scale, low;
};
inline GroupScales group_scales(const uint16_t* sz) {
  const __m256 scale = bf16x8(sz), zero = bf16x8(sz + 8);
  return {scale, _mm256_fnmadd_ps(_mm256_set1_ps(8.f), scale, zero)};
}

// acc + one group of activation row m, from its integer dot (int32 per weight row): s d dot + low d sum(xq).
inline __m256 add_group(__m256 acc, __m256i dot, const GroupScales& w, const QuantizedRows& x, int64_t m, int64_t G,
                        int64_t g) {
  const __m256 sd = _mm256_mul_ps(w.scale, _mm256_broadcast_ss(x.d + m * G + g));
  const __m256 zeros = _mm256_fmadd_ps(w.low, _mm256_broadcast_ss(x.sxd + m * G + g), acc);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sd, zeros);
}

// One tile: weight rows 8 t .. 8 t + 7 (one per int32 lane) against activation rows m0 .. m0 + MR - 1.
// Per group: 8 vpmaddubsw (4 inputs x 8 rows each) summed in int16 (|sum| <= 8 * 2 * 15 * 127 < 2^15),
// one vpmaddwd to int32, then add_group.
template <int MR>
void tile(const uint8_t* codes, const uint16_t* sz, const QuantizedRows& x, float* out, int64_t t, int64_t m0,
          int64_t N, int64_t K) {
  const int64_t G = K / 32;
  const uint8_t* tc = codes + t * G * 128;
  __m256 acc[MR] = {};
  for (int64_t g = 0; g < G; ++g) {
    __m256i sums[MR] = {};
    for (int p = 0; p < 4; ++p) {
      const Nibbles w = nibbles(tc + g * 128 + p * 32);
      for (int j = 0; j < MR; ++j) {
        const int64_t k = g * 32 + p * 8;
        sums[j] = _mm256_add_epi16(sums[j], _mm256_maddubs_epi16(w.lo, x4(x, m0 + j, K, k)));
        sums[j] = _mm256_add_epi16(sums[j], _mm256_maddubs_epi16(w.hi, x4(x, m0 + j, K, k + 4)));
      }
    }
    const GroupScales scales = group_scales(sz + (t * G + g) * 16);
    for (int j = 0; j < MR; ++j)
      acc[j] = add_group(acc[j], _mm256_madd_epi16(sums[j], _mm256_set1_epi16(1)), scales, x, m0 + j, G, g);
  }
  for (int j = 0; j < MR; ++j) _mm256_storeu_ps(out + (m0 + j) * N + t * 8, acc[j]);
}

#define LLMGW_VNNI __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni")))

// tile() with vpdpbusd: the same integer sums straight into int32, two per activation row (low and high
// nibbles), so 8 dependency chains. A twin of tile() rather than one template: each needs its own target.
template <int MR>
LLMGW_VNNI void tile_vnni(const uint8_t* codes, const uint16_t* sz, const QuantizedRows& x, float* out, int64_t t,
                          int64_t m0, int64_t N, int64_t K) {
  const int64_t G = K / 32;
  const uint8_t* tc = codes + t * G * 128;
  __m256 acc[MR] = {};
  for (int64_t g = 0; g < G; ++g) {
    __m256i lo[MR] = {}, hi[MR] = {};
    for (int p = 0; p < 4; ++p) {
      const Nibbles w = nibbles(tc + g * 128 + p * 32);
      for (int j = 0; j < MR; ++j) {
        const int64_t k = g * 32 + p * 8;
        lo[j] = _mm256_dpbusd_epi32(lo[j], w.lo, x4(x, m0 + j, K, k));
        hi[j] = _mm256_dpbusd_epi32(hi[j], w.hi, x4(x, m0 + j, K, k + 4));
      }
    }
    const GroupScales scales = group_scales(sz + (t * G + g) * 16);
    for (int j = 0; j < MR; ++j) acc[j] = add_group(acc[j], _mm256_add_epi32(lo[j], hi[j]), scales, x, m0 + j, G, g);
  }
  for (int j = 0; j < MR; ++j) _mm256_storeu_ps(out + (m0 + j) * N + t * 8, acc[j]);
}

// Which tile the kernels run: false = AVX2 (vpmaddubsw), true = AVX-512 VNNI (vpdpbusd). Set by set_isa.
std::atomic<bool> use_vnni{false};

// Calls tile(std::integral_constant<int, R>, m0) over rows m0 .. m0 + R - 1 of M: blocks of 4, then the rest.
template <typename Tile>
void row_blocks(int64_t M, Tile&& tile) {
  int64_t m0 = 0;
  for (; m0 + 4 <= M; m0 += 4) tile(std::integral_constant<int, 4>{}, m0);
  switch (M - m0) {
    case 3: tile(std::integral_constant<int, 3>{}, m0); break;
    case 2: tile(std::integral_constant<int, 2>{}, m0); break;
    case 1: tile(std::integral_constant<int, 1>{}, m0); break;
    default: break;
  }
}

// out [M, N] = x [M, K] float32 times the int4 weight (codes, scales).
void int4_matmul(const float* x, int64_t M, int64_t K, const torch::Tensor& codes, const torch::Tensor& scales,
                 float* out) {
  const int64_t tiles = codes.size(0), N = tiles * NB;
  TORCH_CHECK(K % 32 == 0 && codes.size(1) == K / 32 && codes.size(2) == 4 && codes.size(3) == 32 &&
                  scales.numel() == N * (K / 32) * 2,
              "int4_cpu: codes [N/8, K/32, 4, 32] and scales [N/8, K/32, 2, 8] must match x [..., K]");
  const QuantizedRows xq = quantize_rows(x, M, K);
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const auto* s = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>());
  const bool vnni = use_vnni.load(std::memory_order_relaxed);
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      row_blocks(M, [&](auto rows, int64_t m0) {
        constexpr int R = decltype(rows)::value;
        vnni ? tile_vnni<R>(c, s, xq, out, t, m0, N, K) : tile<R>(c, s, xq, out, t, m0, N, K);
      });
  });
}

}  // namespace

// Releases the GIL for the scope. Holding it was measured slower with 1-32 clients (output tok/s 101-107 /
// 210-214 / 251-261 / 259-266 against 121-122 / 225-342 / 300-355 / 279-335; studies/README.md, "Released the
// GIL"), so that switch (LLMGW_CPU_KERNELS_HOLD_GIL) is gone.
struct GilRelease {
  pybind11::gil_scoped_release release;
  GilRelease() {}
};

// "avx2" or "avx512vnni": the instruction set of every later call (this CPU must have it). Returns the previous.
std::string set_isa(const std::string& isa) {
  TORCH_CHECK(isa == "avx2" || isa == "avx512vnni", "isa must be avx2 or avx512vnni, not ", isa);
  const bool vnni = isa == "avx512vnni";
  TORCH_CHECK(!vnni || (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512bw")),
              "this CPU has no AVX-512 VNNI");
  return use_vnni.exchange(vnni) ? "avx512vnni" : "avx2";
}

// x [..., K] float32 or bfloat16 -> [..., N] in x's dtype (+ bias float32 [N] if defined). One call does the
// whole layer: from Python, a layer costs one op dispatch (~5 us here) instead of five.
torch::Tensor int4_linear_cpu(torch::Tensor x, torch::Tensor codes, torch::Tensor scales,
                              c10::optional<torch::Tensor> bias) {
  const GilRelease no_gil;  // as torch's own ops: other Python threads run meanwhile
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16),
              "x must be a float32 or bfloat16 CPU tensor");
  TORCH_CHECK(codes.scalar_type() == torch::kUInt8 && codes.is_contiguous() && codes.dim() == 4,
              "codes must be contiguous uint8 [N/8, K/32, 4, 32]");
  TORCH_CHECK(scales.scalar_type() == torch::kBFloat16 && scales.is_contiguous(), "scales must be contiguous bf16");
  const int64_t K = x.size(-1), M = x.numel() / K;
  const torch::Tensor xf = x.to(torch::kFloat32).contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = codes.size(0) * NB;
  auto out = torch::empty(shape, x.options().dtype(torch::kFloat32));
  int4_matmul(xf.data_ptr<float>(), M, K, codes, scales, out.data_ptr<float>());
  if (bias.has_value() && bias->defined()) out.add_(*bias);
  return x.scalar_type() == torch::kFloat32 ? out : out.to(x.scalar_type());
}
