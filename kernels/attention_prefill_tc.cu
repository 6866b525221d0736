/* attention_prefill_tc.cu - causal grouped-query prefill attention on the tensor cores
 * (speed mode; attention_prefill.cu stays the F32 parity kernel). Semantics of
 * mk_kernel_attention_prefill_kv: query row r sits at position past + r and attends to the keys
 * of positions [0, past + r], each read at its pool row through the block table; query head h reads KV head h / (n_heads / n_kv_heads).
 *
 * Block = one query head x TC_BQ (64) query rows; 4 warps of 16 rows each. Q is converted to
 * BF16 once and held in wmma matrix_a fragments. Per key tile of BK keys (staged in shared
 * memory as BF16, converted from the cache's F32 / F16 / BF16 as they are loaded):
 *   S = Q K^T       wmma 16x16x16, F32 accumulation, stored to the warp's S tile;
 *   online softmax  two lanes per query row: causal mask, tile max, running max and sum,
 *                   P = exp(S - max) rounded to BF16 (the sum adds the rounded values so
 *                   the normalisation matches the numerator), the row of O rescaled;
 *   O += P V        wmma into F32 accumulator fragments that stay in registers across
 *                   tiles (head_dim <= 128). The accumulator layout is unspecified, so a
 *                   per-row rescale goes through shared memory (store, scale, reload), and
 *                   only when some row's running max moved in this tile (after the first
 *                   tiles it rarely does). Wider heads keep O in shared memory.
 * Causal: the block stops at its last row's diagonal; a warp skips tiles that lie entirely
 * above its own diagonal; the diagonal tile is masked element-wise.
 *
 * Fragment pointers must be 32-byte aligned: every region size below is a multiple of 32
 * bytes and the dynamic shared memory base is rounded up (32 bytes of slack requested).
 * Tile loads: BF16 caches at 16-byte aligned addresses are copied as they are, 16 bytes at a
 * time, with cp.async on sm_80+ (tc_copy16); F32 and F16 caches (and unaligned ones) need a
 * conversion on the way, so they take coalesced element loads. */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"

namespace wmma = nvcuda::wmma;

extern "C" mk_status mk_attention_check_shape(const char *what, size_t n_heads, size_t n_kv_heads, size_t head_dim);

#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)
#define TC_BQ (TC_WARPS * 16)
#define TC_PAD 8 /* BF16 elements added to each Q/K/V/P row (16 bytes): fewer bank conflicts */
#define TC_FPAD 4 /* floats added to each S/O row */

typedef __nv_bfloat16 tc_t;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> tc_acc;

static __device__ __forceinline__ tc_t tc_load_kv(const void *p, int dtype, size_t i) {
  if (dtype == MK_DTYPE_F32) return __float2bfloat16(static_cast<const float *>(p)[i]);
  const uint16_t bits = static_cast<const uint16_t *>(p)[i];
  if (dtype == MK_DTYPE_F16) return __float2bfloat16(mk_dev_f16_to_f32(bits));
  return __float2bfloat16(mk_dev_bf16_to_f32(bits)); /* exact */
}

/* 16 bytes from global to shared memory, or 16 zero bytes (!valid; src must still be a
 * mapped address). sm_80+: cp.async (no register staging; src-size 0 zero-fills), completed
 * by tc_copy_wait(); elsewhere (and under cudasim) the same copy through registers. */
static __device__ __forceinline__ void tc_copy16(void *dst, const void *src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
#else
  *static_cast<uint4 *>(dst) = valid ? *static_cast<const uint4 *>(src) : make_uint4(0u, 0u, 0u, 0u);
#endif
}

static __device__ __forceinline__ void tc_copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/* NF = head_dim / 16 (EXACT) or its upper bound (generic path, any multiple of 16). */
template <int NF, bool EXACT, int BK, bool OREG = (NF <= 8)>
static __global__ void __launch_bounds__(TC_THREADS, 2) /* 2 blocks an SM: up to 255 registers, no spills */
    attention_prefill_tc_kernel(float *__restrict__ out, const float *__restrict__ q, const void *__restrict__ k_cache,
                                const void *__restrict__ v_cache, const int32_t *__restrict__ kv_table, uint32_t kv_shift, int kv_dtype, int direct, size_t rows, size_t past,
                                int n_heads, int n_kv_heads, int head_dim, float scale) {
  static_assert(TC_BQ <= 2 * BK, "the Q staging area overlays the K and V tiles");
  const int hd = EXACT ? NF * 16 : head_dim;
  const int nf = EXACT ? NF : head_dim / 16;
  const int ldk = hd + TC_PAD, lds = BK + TC_FPAD, ldp = BK + TC_PAD, ldo = hd + TC_FPAD;
  MK_DYNAMIC_SHARED(unsigned char, smem_raw);
  unsigned char *smem =
      reinterpret_cast<unsigned char *>((reinterpret_cast<uintptr_t>(smem_raw) + 31) & ~static_cast<uintptr_t>(31));
  tc_t *k_s = reinterpret_cast<tc_t *>(smem);                    /* [BK][ldk] */
  tc_t *v_s = k_s + BK * ldk;                                    /* [BK][ldk] */
  float *s_all = reinterpret_cast<float *>(v_s + BK * ldk);      /* [warps][16][lds] */
  tc_t *p_all = reinterpret_cast<tc_t *>(s_all + TC_WARPS * 16 * lds); /* [warps][16][ldp] */
  float *o_all = reinterpret_cast<float *>(p_all + TC_WARPS * 16 * ldp); /* [warps][16][ldo] */
  float *l_all = o_all + TC_WARPS * 16 * ldo;                    /* [warps][16] */
  tc_t *q_stage = k_s;                                           /* [BQ][ldk], before the first tile */

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.y;
  const int kvh = h / (n_heads / n_kv_heads);
  const size_t q0 = static_cast<size_t>(blockIdx.x) * TC_BQ;
  const size_t q_stride = static_cast<size_t>(n_heads) * hd, kv_stride = static_cast<size_t>(n_kv_heads) * hd;
  float *s_w = s_all + warp * 16 * lds, *o_w = o_all + warp * 16 * ldo, *l_w = l_all + warp * 16;
  tc_t *p_w = p_all + warp * 16 * ldp;

  for (int i = tid; i < TC_BQ * hd; i += TC_THREADS) {
    const int r = i / hd, d = i - r * hd;
    const size_t qr = q0 + r;
    q_stage[r * ldk + d] = __float2bfloat16(qr < rows ? q[qr * q_stride + static_cast<size_t>(h) * hd + d] : 0.0f);
  }
  for (int i = lane; i < 16 * ldo; i += 32) o_w[i] = 0.0f;
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, tc_t, wmma::row_major> qf[NF];
  /* O in accumulator fragments across tiles (head_dim <= 128), or in o_w only (wider heads:
   * the fragments would not fit in registers beside Q's) */
  tc_acc oacc[OREG ? NF : 1];
MK_UNROLL
  for (int f = 0; f < (OREG ? NF : 1); ++f) wmma::fill_fragment(oacc[f], 0.0f);
MK_UNROLL
  for (int f = 0; f < NF; ++f)
    if (EXACT || f < nf) wmma::load_matrix_sync(qf[f], q_stage + warp * 16 * ldk + f * 16, ldk);

  /* two lanes per query row: row my_r, columns [half * BK / 2, (half + 1) * BK / 2) */
  const int my_r = lane >> 1, half = lane & 1;
  const size_t my_q = q0 + warp * 16 + my_r;
  float m_run = -INFINITY, l_run = 0.0f;
  const size_t last_q = (q0 + TC_BQ < rows ? q0 + TC_BQ : rows) - 1;
  const size_t key_end = past + last_q + 1; /* keys the block sees */
  const size_t w_first = q0 + warp * 16;
  const size_t w_last = w_first + 15 < rows ? w_first + 15 : rows - 1;
  const size_t w_key_end = w_first < rows ? past + w_last + 1 : 0; /* keys this warp's rows see */

  for (size_t k0 = 0; k0 < key_end; k0 += BK) {
    __syncthreads(); /* the previous tile (or the Q staging) is consumed */
    if (direct) { /* BF16 caches, 16-byte aligned: the bytes as they are, 8 elements a copy */
      const int chunks = hd / 8;
      for (int i = tid; i < BK * chunks; i += TC_THREADS) {
        const int kk = i / chunks, d = (i - kk * chunks) * 8;
        const size_t t = k0 + kk;
        const size_t g = t < key_end ? mk_kv_page_row(kv_table, kv_shift, t) * kv_stride + static_cast<size_t>(kvh) * hd + d : 0;
        tc_copy16(k_s + kk * ldk + d, static_cast<const tc_t *>(k_cache) + g, t < key_end);
        tc_copy16(v_s + kk * ldk + d, static_cast<const tc_t *>(v_cache) + g, t < key_end);
      }
      tc_copy_wait();
    } else {
      for (int i = tid; i < BK * hd; i += TC_THREADS) {
        const int kk = i / hd, d = i - kk * hd;
        const size_t t = k0 + kk;
        tc_t kv = __float2bfloat16(0.0f), vv = kv;
        if (t < key_end) {
          const size_t g = mk_kv_page_row(kv_table, kv_shift, t) * kv_stride + static_cast<size_t>(kvh) * hd + d;
          kv = tc_load_kv(k_cache, kv_dtype, g);
          vv = tc_load_kv(v_cache, kv_dtype, g);
        }
        k_s[kk * ldk + d] = kv;
        v_s[kk * ldk + d] = vv;
      }
    }
    __syncthreads();
    if (k0 >= w_key_end) continue; /* the whole tile lies above this warp's diagonal */

    /* S = Q K^T (K^T is K read column-major) */
MK_UNROLL
    for (int n = 0; n < BK / 16; ++n) {
      tc_acc sacc;
      wmma::fill_fragment(sacc, 0.0f);
MK_UNROLL
      for (int f = 0; f < NF; ++f) {
        if (!EXACT && f >= nf) break;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, tc_t, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, k_s + n * 16 * ldk + f * 16, ldk);
        wmma::mma_sync(sacc, qf[f], kf, sacc);
      }
      wmma::store_matrix_sync(s_w + n * 16, sacc, lds, wmma::mem_row_major);
    }
    __syncwarp();

    /* online softmax over the row's half tile */
    const int c0 = half * (BK / 2);
    float *srow = s_w + my_r * lds;
    float mx = -INFINITY;
    for (int c = c0; c < c0 + BK / 2; ++c) {
      const float sc = k0 + c <= past + my_q ? srow[c] * scale : -INFINITY;
      srow[c] = sc;
      mx = fmaxf(mx, sc);
    }
    mx = fmaxf(mx, __shfl_xor_sync(MK_FULL_MASK, mx, 1));
    const float m_new = fmaxf(m_run, mx); /* finite: key 0 is in every row's first tile */
    const float alpha = expf(m_run - m_new);
    float sum = 0.0f;
    for (int c = c0; c < c0 + BK / 2; ++c) {
      const tc_t p = __float2bfloat16(expf(srow[c] - m_new));
      p_w[my_r * ldp + c] = p;
      sum += __bfloat162float(p);
    }
    sum += __shfl_xor_sync(MK_FULL_MASK, sum, 1);
    const float l_prev = l_run;
    l_run = l_run * alpha + sum;
    m_run = m_new;
    if constexpr (OREG) {
      /* O lives in fragments: rescale through o_w only when a row's max moved (rows whose
       * O is still zero need none); once the maxima settle, most tiles skip this */
      if (__any_sync(MK_FULL_MASK, alpha != 1.0f && l_prev != 0.0f)) {
MK_UNROLL
        for (int f = 0; f < NF; ++f)
          if (EXACT || f < nf) wmma::store_matrix_sync(o_w + f * 16, oacc[f], ldo, wmma::mem_row_major);
        __syncwarp();
        for (int d = half * (hd / 2); d < (half + 1) * (hd / 2); ++d) o_w[my_r * ldo + d] *= alpha;
        __syncwarp();
MK_UNROLL
        for (int f = 0; f < NF; ++f)
          if (EXACT || f < nf) wmma::load_matrix_sync(oacc[f], o_w + f * 16, ldo, wmma::mem_row_major);
      }
    } else {
      for (int d = half * (hd / 2); d < (half + 1) * (hd / 2); ++d) o_w[my_r * ldo + d] *= alpha;
    }
    __syncwarp();

    /* O += P V */
    wmma::fragment<wmma::matrix_a, 16, 16, 16, tc_t, wmma::row_major> pf[BK / 16];
MK_UNROLL
    for (int kk = 0; kk < BK / 16; ++kk) wmma::load_matrix_sync(pf[kk], p_w + kk * 16, ldp);
MK_UNROLL
    for (int f = 0; f < NF; ++f) {
      if (!EXACT && f >= nf) break;
      tc_acc &o = oacc[OREG ? f : 0];
      if (!OREG) wmma::load_matrix_sync(o, o_w + f * 16, ldo, wmma::mem_row_major);
MK_UNROLL
      for (int kk = 0; kk < BK / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, tc_t, wmma::row_major> vf;
        wmma::load_matrix_sync(vf, v_s + kk * 16 * ldk + f * 16, ldk);
        wmma::mma_sync(o, pf[kk], vf, o);
      }
      if (!OREG) wmma::store_matrix_sync(o_w + f * 16, o, ldo, wmma::mem_row_major);
    }
  }
  if constexpr (OREG) {
MK_UNROLL
    for (int f = 0; f < NF; ++f)
      if (EXACT || f < nf) wmma::store_matrix_sync(o_w + f * 16, oacc[f], ldo, wmma::mem_row_major);
  }

  if (half == 0) l_w[my_r] = l_run;
  __syncwarp();
  for (int i = lane; i < 16 * hd; i += 32) { /* coalesced: consecutive lanes, consecutive dims */
    const int r = i / hd, d = i - r * hd;
    const size_t qi = w_first + r;
    if (qi < rows) out[qi * q_stride + static_cast<size_t>(h) * hd + d] = o_w[r * ldo + d] / l_w[r];
  }
}

static size_t tc_smem_bytes(size_t hd, size_t bk) {
  return 32 /* alignment slack */ + sizeof(tc_t) * 2 * bk * (hd + TC_PAD) +
         sizeof(float) * TC_WARPS * 16 * (bk + TC_FPAD) + sizeof(tc_t) * TC_WARPS * 16 * (bk + TC_PAD) +
         sizeof(float) * TC_WARPS * 16 * (hd + TC_FPAD) + sizeof(float) * TC_WARPS * 16;
}

template <int NF, bool EXACT, int BK>
static mk_status launch_tc(float *out, const float *q, const void *k, const void *v, mk_kv_pages pages, mk_dtype kv_dtype, size_t rows,
                           size_t past, size_t n_heads, size_t n_kv_heads, size_t hd, cudaStream_t stream) {
  const size_t smem = tc_smem_bytes(hd, BK);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(attention_prefill_tc_kernel<NF, EXACT, BK>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
      return mk_fail(MK_ERR_KERNEL_LAUNCH, "mk_kernel_attention_prefill_tc: %zu bytes of shared memory: %s", smem,
                     cudaGetErrorString(e));
  }
  const float scale = (float)(1.0 / sqrt((double)hd));
  const bool direct = kv_dtype == MK_DTYPE_BF16 && (uintptr_t)k % 16 == 0 && (uintptr_t)v % 16 == 0;
  const dim3 grid(mk_ceil_div_u(rows, TC_BQ), (unsigned)n_heads);
  MK_LAUNCH((attention_prefill_tc_kernel<NF, EXACT, BK>), grid, dim3(TC_THREADS), smem, stream, out, q, k, v, pages.table, pages.block_shift,
            (int)kv_dtype, (int)direct, rows, past, (int)n_heads, (int)n_kv_heads, (int)hd, scale);
  return mk_check_launch("mk_kernel_attention_prefill_tc");
}

extern "C" bool mk_kernel_attention_prefill_tc_supports(size_t head_dim) {
  return head_dim > 0 && head_dim % 16 == 0 && head_dim <= MK_MAX_HEAD_DIM;
}

extern "C" mk_status mk_kernel_attention_prefill_tc(float *out, const float *q, const void *k_cache,
                                                    const void *v_cache, mk_kv_pages pages, mk_dtype kv_dtype, size_t rows, size_t past,
                                                    size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                                    cudaStream_t stream) {
  MK_TRY(mk_attention_check_shape("mk_kernel_attention_prefill_tc", n_heads, n_kv_heads, head_dim));
  if (!mk_kernel_attention_prefill_tc_supports(head_dim))
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_attention_prefill_tc: head_dim %zu must be a multiple of 16", head_dim);
  if (kv_dtype != MK_DTYPE_F32 && kv_dtype != MK_DTYPE_F16 && kv_dtype != MK_DTYPE_BF16)
    return mk_fail(MK_ERR_DTYPE, "mk_kernel_attention_prefill_tc: KV cache dtype %d (F32, F16 or BF16)",
                   (int)kv_dtype);
  if (rows == 0) return MK_OK;
  if (rows / TC_BQ >= 2147483647u) return mk_fail(MK_ERR_SHAPE, "mk_kernel_attention_prefill_tc: %zu rows", rows);
  if (!out || !q || !k_cache || !v_cache)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_prefill_tc: null pointer");
  if (!pages.table) /* the caches are read through a table, never as contiguous rows */
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_prefill_tc: no block table");
  if (pages.row_stride) /* its rows are one sequence's, at past + r */
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_prefill_tc: rows of many sequences (a row stride) are decode rows");
  const size_t hd = head_dim;
  if (hd == 64) return launch_tc<4, true, 64>(out, q, k_cache, v_cache, pages, kv_dtype, rows, past, n_heads, n_kv_heads, hd, stream);
  if (hd == 128)
    return launch_tc<8, true, 64>(out, q, k_cache, v_cache, pages, kv_dtype, rows, past, n_heads, n_kv_heads, hd, stream);
  if (hd < 128) return launch_tc<8, false, 64>(out, q, k_cache, v_cache, pages, kv_dtype, rows, past, n_heads, n_kv_heads, hd, stream);
  return launch_tc<16, false, 32>(out, q, k_cache, v_cache, pages, kv_dtype, rows, past, n_heads, n_kv_heads, hd, stream);
}
