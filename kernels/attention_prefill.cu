/* attention_prefill.cu - causal grouped-query attention of `rows` new queries against
 * the KV cache (F32, F16 or BF16, widened exactly as a tile is staged), flash-attention
 * style, in F32 on the CUDA cores (parity mode).
 *
 * Block = one query head x a tile of PF_BQ query rows; 4 warps of PF_RPW rows each.
 * Loop over key tiles of PF_BK keys staged in shared memory (only tiles the causal mask
 * lets the block see). Per tile and row: lane j scores key j against the row (the dot
 * product runs over d in order, as the CPU backend), the warp takes the tile max, the
 * running (max, sum) is rescaled online, p goes to shared memory and every lane
 * accumulates its slice of head dims (d = lane + 32 j) over the tile's V rows.
 *
 * Shared memory (dynamic): Q [BQ][hd] | K [BK][hd + 1] (odd pitch: lanes read rows
 * without bank conflicts) | V [BK][hd] | P [BQ][BK]. hd 128: 43 KB; hd 256: 84 KB (the
 * launcher raises the block's dynamic shared memory limit above 48 KB). */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"


#define PF_BQ 16
#define PF_BK 32
#define PF_WARPS 4
#define PF_THREADS (PF_WARPS * 32)
#define PF_RPW (PF_BQ / PF_WARPS)

/* Stage key tile [k0, k0 + PF_BK) of K and V (rows past key_end as zeros) into shared memory,
 * each element widened exactly to F32 (LOAD: one cache dtype). */
struct PfF32 {
  static constexpr int pair = 0;
};
struct PfF16 { /* two elements per 32-bit word, widened exactly */
  static constexpr int pair = 1;
#if defined(__CUDA_ARCH__) /* the hardware widening: exact, and lighter than the bitwise twin */
  static __device__ __forceinline__ float lo(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu))); }
  static __device__ __forceinline__ float hi(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w >> 16))); }
#else
  static __device__ __forceinline__ float lo(uint32_t w) { return mk_dev_f16_to_f32((uint16_t)(w & 0xffffu)); }
  static __device__ __forceinline__ float hi(uint32_t w) { return mk_dev_f16_to_f32((uint16_t)(w >> 16)); }
#endif
};
struct PfBF16 {
  static constexpr int pair = 1;
  static __device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
  static __device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
};
template <typename LOAD>
/* row_s[kk]: where key k0 + kk of this head starts in the caches (elements), staged once per
 * tile from the block table (the per-element address math then stays 32-bit light). */
static __device__ __forceinline__ void pf_stage_tile(float *k_s, float *v_s, const void *k_cache, const void *v_cache,
                                                     const size_t *row_s, size_t k0, size_t key_end, int hd) {
  if constexpr (LOAD::pair) {
    /* 16-bit caches: element pairs (head_dim is even, so a pair never straddles a row) */
    const uint32_t *kc = static_cast<const uint32_t *>(k_cache), *vc = static_cast<const uint32_t *>(v_cache);
    for (int i = 2 * threadIdx.x; i < PF_BK * hd; i += 2 * PF_THREADS) {
      const int kk = i / hd, d = i - kk * hd;
      const size_t t = k0 + kk;
      uint32_t kw = 0u, vw = 0u; /* zero bits: 0.0f in F16 and BF16 */
      if (t < key_end) {
        const size_t g = (row_s[kk] + d) >> 1;
        kw = kc[g];
        vw = vc[g];
      }
      k_s[kk * (hd + 1) + d] = LOAD::lo(kw);
      k_s[kk * (hd + 1) + d + 1] = LOAD::hi(kw);
      v_s[i] = LOAD::lo(vw);
      v_s[i + 1] = LOAD::hi(vw);
    }
  } else {
    const float *kc = static_cast<const float *>(k_cache), *vc = static_cast<const float *>(v_cache);
    for (int i = threadIdx.x; i < PF_BK * hd; i += PF_THREADS) {
      const int kk = i / hd, d = i - kk * hd;
      const size_t t = k0 + kk;
      float kv = 0.0f, vv = 0.0f;
      if (t < key_end) {
        const size_t g = row_s[kk] + d;
        kv = kc[g];
        vv = vc[g];
      }
      k_s[kk * (hd + 1) + d] = kv;
      v_s[i] = vv;
    }
  }
}

/* DCH = head dims per lane (head_dim <= 32 * DCH); HD = head_dim when known at compile
 * time (64, 128, 256), 0 for the generic path (any even head_dim <= 32 * DCH). */
template <int DCH, int HD, typename LOAD>
static __global__ void __launch_bounds__(PF_THREADS, 4) /* 4 blocks an SM: up to 128 registers, no spills */
    attention_prefill_kernel(float *__restrict__ out, const float *__restrict__ q, const void *__restrict__ k_cache,
                             const void *__restrict__ v_cache, const int32_t *__restrict__ kv_table, uint32_t kv_shift, size_t rows, size_t past, int n_heads, int n_kv_heads,
                             int head_dim, float scale) {
  const int hd = HD > 0 ? HD : head_dim;
  MK_DYNAMIC_SHARED(float, smem);
  float *q_s = smem;                   /* [BQ][hd] */
  float *k_s = q_s + PF_BQ * hd;       /* [BK][hd + 1] */
  float *v_s = k_s + PF_BK * (hd + 1); /* [BK][hd] */
  float *p_s = v_s + PF_BK * hd;       /* [BQ][BK] */
  __shared__ size_t row_s[PF_BK];      /* the tile's keys' cache offsets */

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.y;
  const int kvh = h / (n_heads / n_kv_heads);
  const size_t q0 = (size_t)blockIdx.x * PF_BQ;
  const size_t q_stride = (size_t)n_heads * hd, kv_stride = (size_t)n_kv_heads * hd;

  for (int i = tid; i < PF_BQ * hd; i += PF_THREADS) {
    const int r = i / hd, d = i - r * hd;
    const size_t qr = q0 + r;
    q_s[i] = qr < rows ? q[qr * q_stride + (size_t)h * hd + d] : 0.0f;
  }

  float m[PF_RPW], l[PF_RPW], acc[PF_RPW][DCH];
MK_UNROLL
  for (int r = 0; r < PF_RPW; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
MK_UNROLL
    for (int j = 0; j < DCH; ++j) acc[r][j] = 0.0f;
  }

  /* keys visible to the block: [0, past + last query row] */
  const size_t last_q = (q0 + PF_BQ < rows ? q0 + PF_BQ : rows) - 1;
  const size_t key_end = past + last_q + 1;
  const float *qw = q_s + warp * PF_RPW * hd;

  for (size_t k0 = 0; k0 < key_end; k0 += PF_BK) {
    __syncthreads(); /* the previous tile is consumed (and q_s is complete) */
    if (tid < PF_BK) {
      const size_t t = k0 + tid;
      row_s[tid] = t < key_end ? mk_kv_page_row(kv_table, kv_shift, t) * kv_stride + (size_t)kvh * hd : 0;
    }
    __syncthreads();
    pf_stage_tile<LOAD>(k_s, v_s, k_cache, v_cache, row_s, k0, key_end, hd);
    __syncthreads();

    /* scores of key (k0 + lane) against the warp's rows */
    float s[PF_RPW];
MK_UNROLL
    for (int r = 0; r < PF_RPW; ++r) s[r] = 0.0f;
    const float *kr = k_s + lane * (hd + 1);
    for (int d = 0; d < hd; ++d) {
      const float kd = kr[d];
MK_UNROLL
      for (int r = 0; r < PF_RPW; ++r) s[r] += qw[r * hd + d] * kd;
    }
    const size_t t = k0 + lane;
MK_UNROLL
    for (int r = 0; r < PF_RPW; ++r) {
      const size_t qi = q0 + (size_t)(warp * PF_RPW + r);
      const bool valid = t < key_end && t <= past + qi;
      const float sc = valid ? s[r] * scale : -INFINITY;
      const float m_new = fmaxf(m[r], mk_warp_max(sc)); /* finite: key 0 is in every row's first tile */
      const float alpha = expf(m[r] - m_new);
      const float p = valid ? expf(sc - m_new) : 0.0f;
      l[r] = l[r] * alpha + p; /* per-lane partial sum, reduced once at the end */
      m[r] = m_new;
      p_s[(warp * PF_RPW + r) * PF_BK + lane] = p;
MK_UNROLL
      for (int j = 0; j < DCH; ++j) acc[r][j] *= alpha;
    }
    __syncwarp();
    const float *pw = p_s + warp * PF_RPW * PF_BK;
    for (int kk = 0; kk < PF_BK; ++kk) {
      float vd[DCH];
MK_UNROLL
      for (int j = 0; j < DCH; ++j) {
        const int d = lane + 32 * j;
        vd[j] = (HD > 0 || d < hd) ? v_s[kk * hd + d] : 0.0f;
      }
MK_UNROLL
      for (int r = 0; r < PF_RPW; ++r) {
        const float p = pw[r * PF_BK + kk];
MK_UNROLL
        for (int j = 0; j < DCH; ++j) acc[r][j] += p * vd[j];
      }
    }
  }

MK_UNROLL
  for (int r = 0; r < PF_RPW; ++r) {
    const float denom = mk_warp_sum(l[r]);
    const size_t qi = q0 + (size_t)(warp * PF_RPW + r);
    if (qi >= rows) continue;
    float *o = out + qi * q_stride + (size_t)h * hd;
MK_UNROLL
    for (int j = 0; j < DCH; ++j) {
      const int d = lane + 32 * j;
      if (HD > 0 || d < hd) o[d] = acc[r][j] / denom;
    }
  }
}

static size_t prefill_smem_bytes(size_t hd) {
  return sizeof(float) * (PF_BQ * hd + PF_BK * (hd + 1) + PF_BK * hd + PF_BQ * PF_BK);
}

template <int DCH, int HD, typename LOAD>
static mk_status launch_prefill_as(float *out, const float *q, const void *k, const void *v, mk_kv_pages pages, size_t rows, size_t past,
                                   size_t n_heads, size_t n_kv_heads, size_t hd, cudaStream_t stream) {
  const size_t smem = prefill_smem_bytes(hd);
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(attention_prefill_kernel<DCH, HD, LOAD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
      return mk_fail(MK_ERR_KERNEL_LAUNCH, "mk_kernel_attention_prefill: %zu bytes of shared memory: %s", smem,
                     cudaGetErrorString(e));
  }
  const float scale = (float)(1.0 / sqrt((double)hd));
  const dim3 grid(mk_ceil_div_u(rows, PF_BQ), (unsigned)n_heads);
  MK_LAUNCH((attention_prefill_kernel<DCH, HD, LOAD>), grid, dim3(PF_THREADS), smem, stream, out, q, k, v, pages.table, pages.block_shift, rows, past,
            (int)n_heads, (int)n_kv_heads, (int)hd, scale);
  return mk_check_launch("mk_kernel_attention_prefill");
}

/* The cache dtype picks the tile loader (a template argument: the F32 kernel is unchanged). */
template <int DCH, int HD>
static mk_status launch_prefill(float *out, const float *q, const void *k, const void *v, mk_kv_pages pages, mk_dtype kvd, size_t rows,
                                size_t past, size_t n_heads, size_t n_kv_heads, size_t hd, cudaStream_t stream) {
  if (kvd == MK_DTYPE_F16)
    return launch_prefill_as<DCH, HD, PfF16>(out, q, k, v, pages, rows, past, n_heads, n_kv_heads, hd, stream);
  if (kvd == MK_DTYPE_BF16)
    return launch_prefill_as<DCH, HD, PfBF16>(out, q, k, v, pages, rows, past, n_heads, n_kv_heads, hd, stream);
  return launch_prefill_as<DCH, HD, PfF32>(out, q, k, v, pages, rows, past, n_heads, n_kv_heads, hd, stream);
}

/* Shared by prefill and decode (declared in attention_decode.cu too). */
extern "C" mk_status mk_attention_check_shape(const char *what, size_t n_heads, size_t n_kv_heads, size_t head_dim) {
  if (head_dim == 0 || head_dim % 2 != 0 || head_dim > MK_MAX_HEAD_DIM)
    return mk_fail(MK_ERR_SHAPE, "%s: head_dim %zu must be even and <= %d", what, head_dim, MK_MAX_HEAD_DIM);
  if (n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 || n_heads > 65535)
    return mk_fail(MK_ERR_SHAPE, "%s: n_heads %zu must be a multiple of n_kv_heads %zu (and <= 65535)", what,
                   n_heads, n_kv_heads);
  return MK_OK;
}

extern "C" mk_status mk_kernel_attention_prefill_kv(float *out, const float *q, const void *k_cache,
                                                    const void *v_cache, mk_kv_pages pages, mk_dtype kv_dtype, size_t rows, size_t past,
                                                    size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                                    cudaStream_t stream) {
  MK_TRY(mk_attention_check_shape("mk_kernel_attention_prefill", n_heads, n_kv_heads, head_dim));
  if (kv_dtype != MK_DTYPE_F32 && kv_dtype != MK_DTYPE_F16 && kv_dtype != MK_DTYPE_BF16)
    return mk_fail(MK_ERR_DTYPE, "mk_kernel_attention_prefill: KV cache dtype %s is not f32, f16 or bf16",
                   mk_dtype_name(kv_dtype));
  if (rows == 0) return MK_OK;
  if (rows / PF_BQ >= 2147483647u) return mk_fail(MK_ERR_SHAPE, "mk_kernel_attention_prefill: %zu rows", rows);
  if (!out || !q || !k_cache || !v_cache)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_prefill: null pointer");
  if (!pages.table) /* the caches are read through a table, never as contiguous rows */
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_prefill: no block table");
  if (pages.row_stride) /* its rows are one sequence's, at past + r */
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_prefill: rows of many sequences (a row stride) are decode rows");
  /* 16-bit caches are read as element pairs (32-bit words): a GPU faults on a misaligned
   * word, where the CPU (and cudasim) would read it */
  if (((uintptr_t)k_cache | (uintptr_t)v_cache) % 4 != 0)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_prefill: KV cache not aligned to 4 bytes");
  const size_t hd = head_dim;
  const mk_dtype t = kv_dtype;
  if (hd == 64) return launch_prefill<2, 64>(out, q, k_cache, v_cache, pages, t, rows, past, n_heads, n_kv_heads, hd, stream);
  if (hd == 128) return launch_prefill<4, 128>(out, q, k_cache, v_cache, pages, t, rows, past, n_heads, n_kv_heads, hd, stream);
  if (hd <= 32) return launch_prefill<1, 0>(out, q, k_cache, v_cache, pages, t, rows, past, n_heads, n_kv_heads, hd, stream);
  if (hd <= 64) return launch_prefill<2, 0>(out, q, k_cache, v_cache, pages, t, rows, past, n_heads, n_kv_heads, hd, stream);
  if (hd <= 128) return launch_prefill<4, 0>(out, q, k_cache, v_cache, pages, t, rows, past, n_heads, n_kv_heads, hd, stream);
  return launch_prefill<8, 0>(out, q, k_cache, v_cache, pages, t, rows, past, n_heads, n_kv_heads, hd, stream);
}
