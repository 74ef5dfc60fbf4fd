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
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

namespace {

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t dequant_pair(uint32_t word, int p, uint32_t scale2, uint32_t zero2) {
  uint32_t v = ((word >> (4 * p)) & 0x000F000Fu) | 0x43004300u;  // bf16x2 (128 + q_even, 128 + q_odd)
  __nv_bfloat162 q = *reinterpret_cast<__nv_bfloat162*>(&v);
  const uint32_t offset_bits = 0x43084308u;  // 136 = 128 + 8
  q = __hsub2(q, *reinterpret_cast<const __nv_bfloat162*>(&offset_bits));
  q = __hfma2(q, *reinterpret_cast<__nv_bfloat162*>(&scale2), *reinterpret_cast<__nv_bfloat162*>(&zero2));
  return *reinterpret_cast<uint32_t*>(&q);
}

template <int MCHUNKS, int UNROLL, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
int4_mma_kernel(const uint4* __restrict__ codes, const uint32_t* __restrict__ scales,
                const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out, int M, int N, int K) {
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
#pragma unroll
  for (int c = 0; c < MCHUNKS; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;

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
#pragma unroll
  for (int c = 0; c < MCHUNKS; ++c) {
    partial[warp][c * 8 + 2 * t][g] = acc[c][0];
    partial[warp][c * 8 + 2 * t + 1][g] = acc[c][1];
    partial[warp][c * 8 + 2 * t][g + 8] = acc[c][2];
    partial[warp][c * 8 + 2 * t + 1][g + 8] = acc[c][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < min(M, MCHUNKS * 8) * 16; i += blockDim.x) {
    const int m = i / 16, r = i % 16;
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < WARPS; ++v) sum += partial[v][m][r];
    out[static_cast<size_t>(m) * N + tile * 16 + r] = __float2bfloat16(sum);
  }
}

template <int MCHUNKS, int UNROLL, int WARPS>
void launch(const torch::Tensor& codes, const torch::Tensor& scales, const __nv_bfloat16* x,
            __nv_bfloat16* out, int M, int N, int K, cudaStream_t stream) {
  int4_mma_kernel<MCHUNKS, UNROLL, WARPS><<<N / 16, WARPS * 32, 0, stream>>>(
      reinterpret_cast<const uint4*>(codes.data_ptr<int32_t>()),
      reinterpret_cast<const uint32_t*>(scales.data_ptr<int32_t>()), x, out, M, N, K);
}

// One 8-row chunk: (warps, unroll) = (8, 4), (16, 4), (8, 8), (16, 2), (4, 8) for config 0..4 (32 warps with
// 1 or 2 loads in flight were slower on every 8B shape).
void launch_one_chunk(int config, const torch::Tensor& codes, const torch::Tensor& scales,
                      const __nv_bfloat16* x, __nv_bfloat16* out, int M, int N, int K, cudaStream_t stream) {
  switch (config) {
    case 1: launch<1, 4, 16>(codes, scales, x, out, M, N, K, stream); break;
    case 2: launch<1, 8, 8>(codes, scales, x, out, M, N, K, stream); break;
    case 3: launch<1, 2, 16>(codes, scales, x, out, M, N, K, stream); break;
    case 4: launch<1, 8, 4>(codes, scales, x, out, M, N, K, stream); break;
    default: launch<1, 4, 8>(codes, scales, x, out, M, N, K, stream);
  }
}

}  // namespace

torch::Tensor int4_mma_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, int64_t n,
                              int64_t config) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous 2-D bf16 CUDA tensor");
  TORCH_CHECK(codes.scalar_type() == torch::kInt32 && scales.scalar_type() == torch::kInt32,
              "codes and scales must be int32");
  const int M = x.size(0), K = x.size(1), N = static_cast<int>(n);
  TORCH_CHECK(N % 16 == 0 && K % 64 == 0, "int4_mma needs N % 16 == 0 and K % 64 == 0");
  TORCH_CHECK(codes.numel() == static_cast<int64_t>(N) * K / 8 && scales.numel() == static_cast<int64_t>(N) * K / 32,
              "codes / scales do not match the shape");
  TORCH_CHECK(codes.device() == x.device() && scales.device() == x.device(), "x, codes and scales on one device");
  const c10::cuda::CUDAGuard device_guard(x.device());
  auto out = torch::empty({M, N}, x.options());
  auto stream = at::cuda::getCurrentCUDAStream();
  const auto* xp = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<__nv_bfloat16*>(out.data_ptr<at::BFloat16>());
  for (int start = 0; start < M; start += 64) {  // x rows in chunks of at most 64: one weight pass each
    const int rows = std::min(64, M - start);
    const auto* xs = xp + static_cast<size_t>(start) * K;
    auto* os = op + static_cast<size_t>(start) * N;
    if (rows <= 8) launch_one_chunk(static_cast<int>(config), codes, scales, xs, os, rows, N, K, stream);
    else if (rows <= 16) launch<2, 2, 8>(codes, scales, xs, os, rows, N, K, stream);
    else if (rows <= 32) launch<4, 2, 8>(codes, scales, xs, os, rows, N, K, stream);
    else launch<8, 2, 8>(codes, scales, xs, os, rows, N, K, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
