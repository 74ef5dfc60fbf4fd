// int4 weight-only matmul for 1..64 activation rows on tensor cores (CUDA, sm_80+): see int4_mma.py.
//
// Weight layout (int4_mma.pack_codes): int32 words [N/16 tiles][K/64 steps][32 lanes][4 k16-tiles]. Lane
// (g = lane / 4, t = lane % 4) of a 16 x 16 tile holds exactly the A fragment of mma.m16n8k16 for that tile:
// nibble pair p = h + 2 kh (h: row g or g + 8; kh: MMA columns 2t.. or 2t + 8..) sits at bits 4p (even
// column) and 16 + 4p (odd column), so one shift and one and-or turn a pair into the bf16x2 (128 + q0,
// 128 + q1). MMA column 8 kh + 2t + e of k16-tile j of step s is input k = 64 s + 16 t + 4 j + 2 kh + e:
// a lane's B operands for the whole step are 16 consecutive inputs (two 16-byte loads per x row), and all
// its codes of a step lie in one group of 32 (2s + t / 2). Subtracting 136 is exact (q - 8); one bf16x2 FMA applies the group's scale and zero (the
// group's centre, tinygemm's format), rounded once to bf16 as a dequantized weight. Scales: int32
// [N/16][K/32 groups][16 rows], bf16 scale | bf16 zero << 16.
// x rows are the MMA's N side (8 per MMA, MCHUNKS MMAs share each dequantized A fragment); every warp of a
// block takes a slice of K for the block's 16 weight rows; partial sums meet in shared memory. Warps per
// block and loads in flight per thread are template parameters (`config` picks them for one-chunk calls).
//
// Fused forms for the decode layer (`Epilogue`, int4_mma.py's `fused`): an RMSNorm of x inside the main loop
// (NORM: each lane multiplies its x by the norm weight, bf16 x bf16 rounded once, and sums the squares of its
// raw x; the row's 1 / rms scales the sums at the end: W (x rstd w) = rstd W (x w)); a residual added after
// the one rounding of the product; and gate/up weights whose rows are interleaved per tile (rows 0-7 of tile T
// are gate rows 8T.., rows 8-15 the up rows 8T..), so that a block holds both halves of its eight outputs:
// stored de-interleaved (mode 1), or as silu(gate) * up (mode 2, width N / 2). Each step rounds to bf16 where
// the unfused kernels would (gemv_triton.py's `_finish` does the same).
// Built with -DLLMGW_KERNEL_ONLY the file is the kernels alone (no torch headers): for checking it compiles and
// reading ptxas' register report where no CUDA torch is installed.
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdint>
#ifndef LLMGW_KERNEL_ONLY
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>
#endif

namespace {

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t dequant_pair(uint32_t word, int p, uint32_t scale2, uint32_t zero2) {
  // bf16x2 (128 + q_even, 128 + q_odd): (word >> 4p) & 0x000F000F | 0x43004300 as one lop3 with the constants in
  // registers (with both as immediates the compiler emits two LOP3s: 177 against 113 in config 0's 1-row SASS)
  uint32_t v;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(v) : "r"(word >> (4 * p)), "r"(0x000F000Fu), "r"(0x43004300u));
  __nv_bfloat162 q = *reinterpret_cast<__nv_bfloat162*>(&v);
  const uint32_t offset_bits = 0x43084308u;  // 136 = 128 + 8
  q = __hsub2(q, *reinterpret_cast<const __nv_bfloat162*>(&offset_bits));
  q = __hfma2(q, *reinterpret_cast<__nv_bfloat162*>(&scale2), *reinterpret_cast<__nv_bfloat162*>(&zero2));
  return *reinterpret_cast<uint32_t*>(&q);
}

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// Sum of squares of the 8 bf16 values of a 16-byte word, then the word times the norm weight's word (bf16x2).
__device__ __forceinline__ uint4 norm_word(uint4 xv, uint4 wv, float& squares) {
  const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w}, ws[4] = {wv.x, wv.y, wv.z, wv.w};
  uint32_t prod[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    squares = fmaf(bf16_lo(xs[i]), bf16_lo(xs[i]), squares);
    squares = fmaf(bf16_hi(xs[i]), bf16_hi(xs[i]), squares);
    __nv_bfloat162 p = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&xs[i]),
                               *reinterpret_cast<const __nv_bfloat162*>(&ws[i]));
    prod[i] = *reinterpret_cast<uint32_t*>(&p);
  }
  return make_uint4(prod[0], prod[1], prod[2], prod[3]);
}

enum : int { STORE_PLAIN = 0, STORE_GATE_UP = 1, STORE_SWIGLU = 2 };

struct Epilogue {
  const __nv_bfloat16* norm;      // [K] RMSNorm weight applied to x (template NORM), else unused
  const __nv_bfloat16* residual;  // [M, N] added to the rounded product, or nullptr
  float eps;
  int mode;  // STORE_PLAIN: out [M, N]; STORE_GATE_UP: interleaved rows stored as [gate | up]; STORE_SWIGLU: [M, N/2]
  bool pdl;  // launched with programmatic stream serialization (sm_90+, the caller's check): wait in-kernel
};

template <int MCHUNKS, int UNROLL, int WARPS, bool NORM>
__global__ void __launch_bounds__(WARPS * 32)
int4_mma_kernel(const uint4* __restrict__ codes, const uint32_t* __restrict__ scales,
                const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out, int M, int N, int K,
                Epilogue epi) {
  const int tile = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int steps = K / 64;
  const int per_warp = (steps + WARPS - 1) / WARPS;
  const int begin = warp * per_warp;
  const int end = min(steps, begin + per_warp);
  const uint4* tile_codes = codes + static_cast<size_t>(tile) * steps * 32 + lane;
  const uint32_t* tile_scales = scales + static_cast<size_t>(tile) * (K / 32) * 16;

  float acc[MCHUNKS][4];
  float squares[MCHUNKS];  // NORM: this lane's share of x row c * 8 + g's sum of squares
#pragma unroll
  for (int c = 0; c < MCHUNKS; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = squares[c] = 0.f;

  // The weights depend on no earlier kernel: under programmatic dependent launch (epi.pdl) this lane's first
  // steps of codes are fetched into L2 while the kernel before this one finishes; x and the residual are read
  // only after the wait. Without it the kernel runs as before (the main loop is the same code).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (epi.pdl) {
    for (int s = begin; s < min(end, begin + 2 * UNROLL); ++s)
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(tile_codes + static_cast<size_t>(s) * 32));
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
  }
#endif

  for (int s0 = begin; s0 < end; s0 += UNROLL) {
    uint4 w[UNROLL];
    uint32_t sm[UNROLL][2];  // this lane's group 2s + t / 2: rows g and g + 8
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int s = s0 + u;
      if (s < end) {
        w[u] = load_stream(tile_codes + static_cast<size_t>(s) * 32);
        const uint32_t* group = tile_scales + (2 * s + (t >> 1)) * 16;
        sm[u][0] = __ldg(group + g);
        sm[u][1] = __ldg(group + g + 8);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int s = s0 + u;
      if (s >= end) break;
      const uint32_t s_lo = __byte_perm(sm[u][0], 0, 0x1010), z_lo = __byte_perm(sm[u][0], 0, 0x3232);
      const uint32_t s_hi = __byte_perm(sm[u][1], 0, 0x1010), z_hi = __byte_perm(sm[u][1], 0, 0x3232);
      const uint32_t words[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
      uint32_t a[4][4];  // A fragments of the step's four k16-tiles
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        a[j][0] = dequant_pair(words[j], 0, s_lo, z_lo);
        a[j][1] = dequant_pair(words[j], 1, s_hi, z_hi);
        a[j][2] = dequant_pair(words[j], 2, s_lo, z_lo);
        a[j][3] = dequant_pair(words[j], 3, s_hi, z_hi);
      }
#pragma unroll
      for (int c = 0; c < MCHUNKS; ++c) {
        const int row = c * 8 + g;
        uint4 xa = make_uint4(0, 0, 0, 0), xb = make_uint4(0, 0, 0, 0);
        if (row < M) {  // the lane's 16 inputs of the step: k = 64 s + 16 t .. + 15
          const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<size_t>(row) * K + s * 64 + 16 * t);
          xa = __ldg(xr);
          xb = __ldg(xr + 1);
          if constexpr (NORM) {
            const uint4* wr = reinterpret_cast<const uint4*>(epi.norm + s * 64 + 16 * t);
            xa = norm_word(xa, __ldg(wr), squares[c]);
            xb = norm_word(xb, __ldg(wr + 1), squares[c]);
          }
        }
        const uint32_t b[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          asm volatile(
              "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
              "{%0,%1,%2,%3};\n"
              : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
              : "r"(a[j][0]), "r"(a[j][1]), "r"(a[j][2]), "r"(a[j][3]), "r"(b[2 * j]), "r"(b[2 * j + 1]));
        }
      }
    }
  }

  // acc[c]: (weight row g, x row c*8 + 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
  __shared__ float partial[WARPS][MCHUNKS * 8][16];
  __shared__ float row_squares[NORM ? WARPS : 1][MCHUNKS * 8];
#pragma unroll
  for (int c = 0; c < MCHUNKS; ++c) {
    partial[warp][c * 8 + 2 * t][g] = acc[c][0];
    partial[warp][c * 8 + 2 * t + 1][g] = acc[c][1];
    partial[warp][c * 8 + 2 * t][g + 8] = acc[c][2];
    partial[warp][c * 8 + 2 * t + 1][g + 8] = acc[c][3];
    if constexpr (NORM) {  // the four lanes of x row c * 8 + g hold its four 16-input slices of each step
      float sq = squares[c];
      sq += __shfl_xor_sync(0xFFFFFFFFu, sq, 1);
      sq += __shfl_xor_sync(0xFFFFFFFFu, sq, 2);
      if (t == 0) row_squares[warp][c * 8 + g] = sq;
    }
  }
  __syncthreads();
  const int rows = min(M, MCHUNKS * 8);
  const int outputs = epi.mode == STORE_SWIGLU ? 8 : 16;  // per x row, from this block's 16 weight rows
  for (int i = threadIdx.x; i < rows * outputs; i += blockDim.x) {
    const int m = i / outputs, r = i % outputs;
    float scale = 1.f;
    if constexpr (NORM) {
      float sq = 0.f;
#pragma unroll
      for (int v = 0; v < WARPS; ++v) sq += row_squares[v][m];
      scale = rsqrtf(sq / K + epi.eps);
    }
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < WARPS; ++v) sum += partial[v][m][r];
    sum *= scale;
    if (epi.mode == STORE_SWIGLU) {
      float up = 0.f;
#pragma unroll
      for (int v = 0; v < WARPS; ++v) up += partial[v][m][r + 8];
      const float gate = round_bf16(sum);
      up = round_bf16(up * scale);
      out[static_cast<size_t>(m) * (N / 2) + tile * 8 + r] = __float2bfloat16(gate / (1.f + __expf(-gate)) * up);
      continue;
    }
    const int n = epi.mode == STORE_GATE_UP ? (r < 8 ? tile * 8 + r : N / 2 + tile * 8 + r - 8) : tile * 16 + r;
    if (epi.residual != nullptr) sum = round_bf16(sum) + __bfloat162float(epi.residual[static_cast<size_t>(m) * N + n]);
    out[static_cast<size_t>(m) * N + n] = __float2bfloat16(sum);
  }
}

template <int MCHUNKS, int UNROLL, int WARPS>
void launch(const int32_t* codes, const int32_t* scales, const __nv_bfloat16* x, __nv_bfloat16* out, int M,
            int N, int K, const Epilogue& epi, cudaStream_t stream) {
  const auto* c = reinterpret_cast<const uint4*>(codes);
  const auto* s = reinterpret_cast<const uint32_t*>(scales);
  auto kernel = epi.norm != nullptr ? int4_mma_kernel<MCHUNKS, UNROLL, WARPS, true>
                                    : int4_mma_kernel<MCHUNKS, UNROLL, WARPS, false>;
  if (!epi.pdl) {
    kernel<<<N / 16, WARPS * 32, 0, stream>>>(c, s, x, out, M, N, K, epi);
    return;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(N / 16);
  config.blockDim = dim3(WARPS * 32);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, kernel, c, s, x, out, M, N, K, epi);
}

// One 8-row chunk: (warps, unroll) = (8, 4), (16, 4), (8, 8), (16, 2), (4, 8) for config 0..4 (32 warps with
// 1 or 2 loads in flight were slower on every 8B shape).
void launch_one_chunk(int config, const int32_t* codes, const int32_t* scales, const __nv_bfloat16* x,
                      __nv_bfloat16* out, int M, int N, int K, const Epilogue& epi, cudaStream_t stream) {
  switch (config) {
    case 1: launch<1, 4, 16>(codes, scales, x, out, M, N, K, epi, stream); break;
    case 2: launch<1, 8, 8>(codes, scales, x, out, M, N, K, epi, stream); break;
    case 3: launch<1, 2, 16>(codes, scales, x, out, M, N, K, epi, stream); break;
    case 4: launch<1, 8, 4>(codes, scales, x, out, M, N, K, epi, stream); break;
    default: launch<1, 4, 8>(codes, scales, x, out, M, N, K, epi, stream);
  }
}

// x rows in chunks of at most 64 (one weight pass each); out [M, N] or, for STORE_SWIGLU, [M, N / 2].
void launch_rows(int config, const int32_t* codes, const int32_t* scales, const __nv_bfloat16* x,
                 __nv_bfloat16* out, int M, int N, int K, Epilogue epi, cudaStream_t stream) {
  const int out_width = epi.mode == STORE_SWIGLU ? N / 2 : N;
  const __nv_bfloat16* residual = epi.residual;
  for (int start = 0; start < M; start += 64) {
    const int rows = std::min(64, M - start);
    const auto* xs = x + static_cast<size_t>(start) * K;
    auto* os = out + static_cast<size_t>(start) * out_width;
    epi.residual = residual == nullptr ? nullptr : residual + static_cast<size_t>(start) * N;
    if (rows <= 8) launch_one_chunk(config, codes, scales, xs, os, rows, N, K, epi, stream);
    else if (rows <= 16) launch<2, 2, 8>(codes, scales, xs, os, rows, N, K, epi, stream);
    else if (rows <= 32) launch<4, 2, 8>(codes, scales, xs, os, rows, N, K, epi, stream);
    else launch<8, 2, 8>(codes, scales, xs, os, rows, N, K, epi, stream);
  }
}

}  // namespace

#ifdef LLMGW_KERNEL_ONLY
// Instantiate every launch shape for the compile check.
void llmgw_int4_mma_instantiate(const int32_t* c, const int32_t* s, const __nv_bfloat16* x, __nv_bfloat16* o,
                                const Epilogue& epi) {
  for (int config = 0; config < 5; ++config) launch_rows(config, c, s, x, o, 100, 4096, 4096, epi, nullptr);
}
#else
torch::Tensor int4_mma_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, int64_t n, int64_t config,
                              std::optional<torch::Tensor> norm, std::optional<torch::Tensor> residual, double eps,
                              int64_t mode, bool pdl) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous 2-D bf16 CUDA tensor");
  TORCH_CHECK(codes.scalar_type() == torch::kInt32 && scales.scalar_type() == torch::kInt32,
              "codes and scales must be int32");
  const int M = x.size(0), K = x.size(1), N = static_cast<int>(n);
  TORCH_CHECK(N % 16 == 0 && K % 64 == 0, "int4_mma needs N % 16 == 0 and K % 64 == 0");
  TORCH_CHECK(codes.numel() == static_cast<int64_t>(N) * K / 8 && scales.numel() == static_cast<int64_t>(N) * K / 32,
              "codes / scales do not match the shape");
  TORCH_CHECK(codes.device() == x.device() && scales.device() == x.device(), "x, codes and scales on one device");
  TORCH_CHECK(mode >= STORE_PLAIN && mode <= STORE_SWIGLU, "mode must be 0, 1 or 2");
  Epilogue epi{nullptr, nullptr, static_cast<float>(eps), static_cast<int>(mode), pdl};
  if (norm.has_value()) {
    TORCH_CHECK(norm->device() == x.device() && norm->scalar_type() == torch::kBFloat16 && norm->is_contiguous() &&
                    norm->numel() == K && reinterpret_cast<uintptr_t>(norm->data_ptr()) % 16 == 0,
                "norm must be a contiguous, 16-byte aligned bf16 [K] tensor on x's device");
    epi.norm = reinterpret_cast<const __nv_bfloat16*>(norm->data_ptr<at::BFloat16>());
  }
  if (residual.has_value()) {
    TORCH_CHECK(mode != STORE_SWIGLU, "a residual cannot be added to SwiGLU's output");
    TORCH_CHECK(residual->device() == x.device() && residual->scalar_type() == torch::kBFloat16 &&
                    residual->is_contiguous() && residual->numel() == static_cast<int64_t>(M) * N,
                "residual must be a contiguous bf16 [M, N] tensor on x's device");
    epi.residual = reinterpret_cast<const __nv_bfloat16*>(residual->data_ptr<at::BFloat16>());
  }
  const c10::cuda::CUDAGuard device_guard(x.device());
  auto out = torch::empty({M, mode == STORE_SWIGLU ? N / 2 : N}, x.options());
  launch_rows(static_cast<int>(config), codes.data_ptr<int32_t>(), scales.data_ptr<int32_t>(),
              reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>()),
              reinterpret_cast<__nv_bfloat16*>(out.data_ptr<at::BFloat16>()), M, N, K, epi,
              at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
#endif
