/* attention_decode.cu - decode rows over the KV cache, flash-decoding style: each row one
 * query (one sequence's next token) over its own keys.
 *
 * Launch-stable: row r's key count is positions[r] + 1, read on the device, its keys are
 * read through its own block table (pages.table + r * pages.row_stride: rows of different
 * sequences in one launch), and the grid is a function of the device's SM count, max_keys
 * (the cache capacity), the row count and the shape only, so the launch is identical every
 * step and a captured CUDA graph replays it unchanged. Each row is its own slice of the grid
 * (blockIdx.z in pass 1, blockIdx.y in pass 2) and of the workspace: a row's arithmetic
 * never depends on the other rows (a sequence decodes the same bits in any batch).
 *
 * Pass 1 (grid [splits, n_kv_heads * head_groups]): block (s, kvh) walks split s's share of
 * this step's keys, [s * share, (s + 1) * share) with share = ceil(n_keys / splits) rounded
 * up to DEC_SPLIT_KEYS, for every query head of KV head kvh (GQA: each K/V row is read from
 * memory once and used for all heads of the group; more than DEC_GB_MAX heads per group
 * take several head groups). The block's threads form slots of `tpk` lanes (a power of two
 * within a warp) that each own a K/V row: a lane loads 16-byte vectors of the row (F32 x4,
 * F16/BF16 x8), dot products are reduced over the slot's lanes by shuffles, and each slot
 * keeps a running (max, sum, acc[head_dim]) per head with an online softmax over its keys
 * (DEC_KI keys per step: independent loads in flight). The slots are combined in slot order
 * into the split's partial (max, sum, acc) per head; a split with no key this step returns
 * at once and writes nothing.
 * Pass 2 (grid [n_heads]): combines the partials of the splits that held keys (the first
 * decode_used_splits, computed from the same key count on the device) in split order
 * (weights exp(max_s - max)) and divides: it walks the live keys' splits, not the cache's.
 *
 * Every sum runs in a fixed order that depends only on (n_keys, splits, shape): results are
 * bit-reproducible from run to run. F32 accumulation for every cache dtype.
 *
 * Workspace: float [rows][n_heads][splits][head_dim + 2]; sized per row for the largest
 * split count any device gets (mk_kernel_attention_decode_workspace_bytes). */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"


#define DEC_THREADS 128
#define DEC_SPLIT_KEYS 64  /* the smallest share of keys a split walks */
#define DEC_MAX_SPLITS 256 /* bound of the split count (sizes the workspace) */
#define DEC_BLOCKS_PER_SM 4 /* target blocks per SM: enough loads in flight to hide latency */
#define DEC_GB_MAX 8        /* query heads one block serves at most */

extern "C" mk_status mk_attention_check_shape(const char *what, size_t n_heads, size_t n_kv_heads, size_t head_dim);

/* Keys of this step: positions[0] + 1, clamped to the cache (a bad position never reads
 * outside it; the executor validates positions before upload). */
static __device__ __forceinline__ size_t decode_keys(const int32_t *positions, size_t max_keys) {
  const int32_t p = positions[0];
  const size_t n = p < 0 ? 1 : (size_t)p + 1;
  return n < max_keys ? n : max_keys;
}

/* Keys per split this step (the same rule on host and device; tests mirror it). */
static __host__ __device__ __forceinline__ size_t decode_share(size_t n_keys, size_t splits) {
  const size_t s = (n_keys + splits - 1) / splits;
  return (s + DEC_SPLIT_KEYS - 1) / DEC_SPLIT_KEYS * DEC_SPLIT_KEYS;
}

/* Splits that hold keys this step: the first ceil(n_keys / share) (at least 1, at most
 * splits). The rest wrote nothing and are not read. */
static __host__ __device__ __forceinline__ int decode_used_splits(size_t n_keys, int splits) {
  const size_t share = decode_share(n_keys, (size_t)splits);
  const size_t used = (n_keys + share - 1) / share;
  return used < (size_t)splits ? (int)used : splits;
}

/* ------------------------------------------------------------ cache elements -- */
/* A cache dtype: its stored element and the exact widening to F32. */
struct DecF32 {
  typedef float elem;
  static __device__ __forceinline__ float word(uint32_t w, int) { return __uint_as_float(w); }
};
struct DecF16 {
  typedef uint16_t elem;
  static __device__ __forceinline__ float word(uint32_t w, int half) {
    const uint16_t h = (uint16_t)(half ? w >> 16 : w & 0xffffu);
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h)); /* exact widening, as mk_dev_f16_to_f32 */
#else
    return mk_dev_f16_to_f32(h);
#endif
  }
};
struct DecBF16 {
  typedef uint16_t elem;
  static __device__ __forceinline__ float word(uint32_t w, int half) { return __uint_as_float(half ? w & 0xffff0000u : w << 16); }
};

/* The raw vector one lane loads: 16, 8 or 4 bytes. */
template <int BYTES> struct DecRaw;
template <> struct DecRaw<16> {
  typedef uint4 type;
  static __device__ __forceinline__ uint32_t w(const uint4 &r, int i) { return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w; }
  static __device__ __forceinline__ uint4 zero() { return make_uint4(0u, 0u, 0u, 0u); }
};
template <> struct DecRaw<8> {
  typedef uint2 type;
  static __device__ __forceinline__ uint32_t w(const uint2 &r, int i) { return i == 0 ? r.x : r.y; }
  static __device__ __forceinline__ uint2 zero() { return make_uint2(0u, 0u); }
};
template <> struct DecRaw<4> {
  typedef uint32_t type;
  static __device__ __forceinline__ uint32_t w(const uint32_t &r, int) { return r; }
  static __device__ __forceinline__ uint32_t zero() { return 0u; }
};

/* Element e of a raw vector of VEC elements of dtype KV, widened to F32. */
template <typename KV, int VEC, typename R>
static __device__ __forceinline__ float dec_elem(const R &raw, int e) {
  typedef DecRaw<(int)sizeof(typename KV::elem) * VEC> Raw;
  if (sizeof(typename KV::elem) == 4) return KV::word(Raw::w(raw, e), 0);
  return KV::word(Raw::w(raw, e >> 1), e & 1);
}

/* ------------------------------------------------------------------- pass 1 -- */
/* KV: cache dtype; VEC: elements per load; VPL: vectors per lane (head_dim <= 32 * VEC * VPL);
 * GB: query heads per block (register arrays; G may be smaller). */
template <typename KV, int VEC, int VPL, int GB>
static __global__ void __launch_bounds__(DEC_THREADS, 2) /* 2 blocks an SM: up to 255 registers, no spills */
    attention_decode_split_kernel(float *__restrict__ ws, const float *__restrict__ q,
                                  const typename KV::elem *__restrict__ k_cache,
                                  const typename KV::elem *__restrict__ v_cache, const int32_t *__restrict__ kv_table,
                                  uint32_t kv_shift, uint32_t kv_row_stride, const int32_t *__restrict__ positions,
                                  size_t max_keys, size_t row_ws, int n_heads, int n_kv_heads, int hd, int head_groups,
                                  float scale) {
  typedef DecRaw<(int)sizeof(typename KV::elem) * VEC> Raw;
  typedef typename Raw::type R;
  constexpr int KI = VPL >= 2 ? 2 : 4; /* keys per slot per step */
  MK_DYNAMIC_SHARED(float, smem);

  const int group = n_heads / n_kv_heads;
  const int kvh = (int)blockIdx.y / head_groups;
  const int g0 = ((int)blockIdx.y - kvh * head_groups) * GB;
  const int gc = group - g0 < GB ? group - g0 : GB; /* heads this block serves */
  const int h0 = kvh * group + g0;                  /* its first query head */
  const int nv = hd / VEC;                          /* vectors per row */
  int tpk = 1;                                      /* lanes per K/V row (slot) */
  while (tpk * VPL < nv) tpk <<= 1;
  const int kpb = DEC_THREADS / tpk; /* slots per block */
  const int tid = threadIdx.x, j = tid & (tpk - 1), slot = tid / tpk;
  const int splits = (int)gridDim.x;

  /* this block's row: its query, key count, block table and workspace slice */
  const size_t row = blockIdx.z;
  q += row * (size_t)n_heads * hd;
  positions += row;
  kv_table += row * kv_row_stride;
  ws += row * row_ws;

  float *q_s = smem;           /* [GB][hd] */
  float *c_s = q_s + GB * hd;  /* [kpb][GB][hd + 2]: each slot's (max, sum, acc) */
  const size_t n_keys = decode_keys(positions, max_keys);
  const size_t share = decode_share(n_keys, (size_t)splits);
  const size_t k0 = (size_t)blockIdx.x * share;
  const size_t k1 = k0 + share < n_keys ? k0 + share : n_keys;

  if (k0 >= n_keys) return; /* no key for this split this step: pass 2 never reads its slot */

  for (int i = tid; i < gc * hd; i += DEC_THREADS) q_s[i] = q[(size_t)h0 * hd + i] * scale;
  __syncthreads();

  float m[GB], l[GB], acc[GB][VPL][VEC];
MK_UNROLL
  for (int g = 0; g < GB; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
MK_UNROLL
    for (int v = 0; v < VPL; ++v)
MK_UNROLL
      for (int e = 0; e < VEC; ++e) acc[g][v][e] = 0.0f;
  }

  const size_t kv_stride = (size_t)n_kv_heads * hd;
  const typename KV::elem *kh = k_cache + (size_t)kvh * hd, *vh = v_cache + (size_t)kvh * hd;
  /* The loop bound is the warp's first slot's, so every lane of a warp takes every step (the
   * shuffles name the full warp); keys past k1 are masked. */
  const int warp_slot0 = (tid & ~31) / tpk;
  const size_t step = (size_t)kpb * KI;
  for (size_t base = k0; base + (size_t)warp_slot0 < k1; base += step) {
    R kr[KI][VPL], vr[KI][VPL];
    bool valid[KI];
MK_UNROLL
    for (int u = 0; u < KI; ++u) {
      const size_t key = base + (size_t)slot + (size_t)u * kpb;
      valid[u] = key < k1;
      /* its pool row (a masked key reads the split's first key's entry: the load stays unconditional) */
      const size_t row = mk_kv_page_row(kv_table, kv_shift, valid[u] ? key : k0) * kv_stride;
MK_UNROLL
      for (int v = 0; v < VPL; ++v) {
        const int vi = j + v * tpk;
        const bool in = valid[u] && vi < nv;
        const size_t off = row + (size_t)vi * VEC;
        kr[u][v] = in ? *reinterpret_cast<const R *>(kh + off) : Raw::zero();
        vr[u][v] = in ? *reinterpret_cast<const R *>(vh + off) : Raw::zero();
      }
    }
    /* scores of the KI keys against the block's heads, summed over the slot's lanes */
    float s[KI][GB];
MK_UNROLL
    for (int u = 0; u < KI; ++u)
MK_UNROLL
      for (int g = 0; g < GB; ++g) {
        float d = 0.0f;
        if (g < gc) { /* uniform over the block: the shuffles see the whole warp */
MK_UNROLL
          for (int v = 0; v < VPL; ++v) {
            const int vi = j + v * tpk;
            if (vi < nv) {
              const float *qv = q_s + g * hd + vi * VEC;
              if constexpr (VEC % 4 == 0) { /* 16-byte shared loads (hd % VEC == 0: aligned) */
MK_UNROLL
                for (int e = 0; e < VEC; e += 4) {
                  const float4 qq = *reinterpret_cast<const float4 *>(qv + e);
                  d += qq.x * dec_elem<KV, VEC>(kr[u][v], e);
                  d += qq.y * dec_elem<KV, VEC>(kr[u][v], e + 1);
                  d += qq.z * dec_elem<KV, VEC>(kr[u][v], e + 2);
                  d += qq.w * dec_elem<KV, VEC>(kr[u][v], e + 3);
                }
              } else {
MK_UNROLL
                for (int e = 0; e < VEC; ++e) d += qv[e] * dec_elem<KV, VEC>(kr[u][v], e);
              }
            }
          }
          for (int o = tpk >> 1; o > 0; o >>= 1) d += __shfl_xor_sync(MK_FULL_MASK, d, o);
        }
        s[u][g] = valid[u] ? d : -INFINITY;
      }
    /* online softmax per head over this step's keys (key u = 0 is valid or none is) */
    if (valid[0]) {
MK_UNROLL
      for (int g = 0; g < GB; ++g) {
        if (g >= gc) continue;
        float mc = s[0][g];
MK_UNROLL
        for (int u = 1; u < KI; ++u) mc = fmaxf(mc, s[u][g]);
        const float m_new = fmaxf(m[g], mc);
        const float alpha = expf(m[g] - m_new); /* 0 on the slot's first step */
        float p[KI], ps = 0.0f;
MK_UNROLL
        for (int u = 0; u < KI; ++u) {
          p[u] = valid[u] ? expf(s[u][g] - m_new) : 0.0f;
          ps += p[u];
        }
        l[g] = l[g] * alpha + ps;
        m[g] = m_new;
MK_UNROLL
        for (int v = 0; v < VPL; ++v)
MK_UNROLL
          for (int e = 0; e < VEC; ++e) {
            float a = acc[g][v][e] * alpha;
MK_UNROLL
            for (int u = 0; u < KI; ++u) a += p[u] * dec_elem<KV, VEC>(vr[u][v], e);
            acc[g][v][e] = a;
          }
      }
    }
  }

  /* each slot's state to shared memory, then the slots combined in slot order */
  float *cs = c_s + (size_t)slot * GB * (hd + 2);
MK_UNROLL
  for (int g = 0; g < GB; ++g) {
    if (g >= gc) continue;
    float *c = cs + g * (hd + 2);
    if (j == 0) {
      c[0] = m[g];
      c[1] = l[g];
    }
MK_UNROLL
    for (int v = 0; v < VPL; ++v) {
      const int vi = j + v * tpk;
      if (vi < nv)
MK_UNROLL
        for (int e = 0; e < VEC; ++e) c[2 + vi * VEC + e] = acc[g][v][e];
    }
  }
  __syncthreads();
  float *part0 = ws + ((size_t)h0 * splits + blockIdx.x) * (size_t)(hd + 2);
  const size_t part_stride = (size_t)splits * (hd + 2); /* next head */
  for (int g = tid; g < gc; g += DEC_THREADS) {
    /* slot 0 holds key k0: the max is finite; a slot without keys weighs exp(-inf) = 0 */
    float mx = -INFINITY;
    for (int t = 0; t < kpb; ++t) mx = fmaxf(mx, c_s[((size_t)t * GB + g) * (hd + 2)]);
    float sum = 0.0f;
    for (int t = 0; t < kpb; ++t) {
      float *c = c_s + ((size_t)t * GB + g) * (hd + 2);
      const float w = expf(c[0] - mx);
      sum += c[1] * w;
      c[0] = w; /* the slot's weight, for the acc combine below */
    }
    part0[g * part_stride] = mx;
    part0[g * part_stride + 1] = sum;
  }
  __syncthreads();
  for (int i = tid; i < gc * hd; i += DEC_THREADS) {
    const int g = i / hd, d = i - g * hd;
    float a = 0.0f;
    for (int t = 0; t < kpb; ++t) {
      const float *c = c_s + ((size_t)t * GB + g) * (hd + 2);
      a += c[0] * c[2 + d];
    }
    part0[g * part_stride + 2 + d] = a;
  }
}

/* ------------------------------------------------------------------- pass 2 -- */
static __global__ void __launch_bounds__(DEC_THREADS)
    attention_decode_combine_kernel(float *__restrict__ out, const float *__restrict__ ws,
                                    const int32_t *__restrict__ positions, size_t max_keys, size_t row_ws, int splits,
                                    int hd) {
  __shared__ float w_s[DEC_MAX_SPLITS];
  __shared__ float scratch[32];
  const int h = blockIdx.x, tid = threadIdx.x;
  const size_t row = blockIdx.y;
  out += row * (size_t)gridDim.x * hd;
  ws += row * row_ws;
  positions += row;
  /* only the splits that walked keys this step (at 200 keys in a 4096-key cache, 4 of 64) */
  const int used = decode_used_splits(decode_keys(positions, max_keys), splits);
  const float *parts = ws + (size_t)h * splits * (size_t)(hd + 2);
  float mx = -INFINITY;
  for (int s = tid; s < used; s += DEC_THREADS) mx = fmaxf(mx, parts[(size_t)s * (hd + 2)]);
  mx = mk_block_max(mx, scratch); /* split 0 holds key 0: finite */
  for (int s = tid; s < used; s += DEC_THREADS) w_s[s] = expf(parts[(size_t)s * (hd + 2)] - mx);
  __syncthreads();
  float denom = 0.0f; /* every thread sums in split order: the same bits everywhere */
  for (int s = 0; s < used; ++s) denom += parts[(size_t)s * (hd + 2) + 1] * w_s[s];
  for (int d = tid; d < hd; d += DEC_THREADS) {
    float a = 0.0f;
    for (int s = 0; s < used; ++s) a += parts[(size_t)s * (hd + 2) + 2 + d] * w_s[s];
    out[(size_t)h * hd + d] = a / denom;
  }
}

/* -------------------------------------------------------------------- host -- */
static size_t decode_max_splits(size_t max_keys) {
  const size_t by_keys = (max_keys + DEC_SPLIT_KEYS - 1) / DEC_SPLIT_KEYS;
  return by_keys < DEC_MAX_SPLITS ? (by_keys ? by_keys : 1) : DEC_MAX_SPLITS;
}

static size_t decode_heads_per_block(size_t group) { return group == 1 ? 1 : group <= 4 ? 4 : DEC_GB_MAX; }

/* Floats of one row's workspace slice. */
static size_t decode_row_ws(size_t max_keys, size_t n_heads, size_t head_dim) {
  return decode_max_splits(max_keys) * n_heads * (head_dim + 2);
}

extern "C" size_t mk_kernel_attention_decode_workspace_bytes(size_t max_keys, size_t n_heads, size_t head_dim) {
  return decode_row_ws(max_keys, n_heads, head_dim) * sizeof(float);
}

extern "C" mk_status mk_kernel_attention_decode_splits(size_t *splits, size_t max_keys, size_t n_heads,
                                                       size_t n_kv_heads) {
  if (!splits) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode_splits: null pointer");
  *splits = 0;
  if (n_kv_heads == 0 || n_heads % n_kv_heads != 0)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_attention_decode_splits: n_heads %zu must be a multiple of n_kv_heads %zu",
                   n_heads, n_kv_heads);
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess || sms <= 0) {
    (void)cudaGetLastError();
    return mk_fail(MK_ERR_KERNEL_LAUNCH, "mk_kernel_attention_decode: SM count: %s", cudaGetErrorString(e));
  }
  const size_t group = n_heads / n_kv_heads, gb = decode_heads_per_block(group);
  const size_t blocks_per_split = n_kv_heads * ((group + gb - 1) / gb);
  size_t s = ((size_t)sms * DEC_BLOCKS_PER_SM + blocks_per_split - 1) / blocks_per_split;
  const size_t cap = decode_max_splits(max_keys);
  *splits = s < cap ? (s ? s : 1) : cap;
  return MK_OK;
}

template <typename KV, int VEC, int VPL, int GB>
static mk_status launch_decode_split(float *ws, const float *q, const void *k, const void *v, mk_kv_pages pages,
                                     const int32_t *positions, size_t rows,
                                     size_t max_keys, size_t splits, size_t n_heads, size_t n_kv_heads, size_t hd,
                                     size_t head_groups, cudaStream_t stream) {
  const int nv = (int)(hd / VEC);
  int tpk = 1;
  while (tpk * VPL < nv) tpk <<= 1;
  const size_t kpb = DEC_THREADS / (size_t)tpk;
  const size_t smem = sizeof(float) * (GB * hd + kpb * GB * (hd + 2));
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(attention_decode_split_kernel<KV, VEC, VPL, GB>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return mk_fail(MK_ERR_KERNEL_LAUNCH, "mk_kernel_attention_decode: %zu bytes of shared memory: %s", smem,
                     cudaGetErrorString(e));
    }
  }
  const float scale = (float)(1.0 / sqrt((double)hd));
  typedef typename KV::elem E;
  MK_LAUNCH((attention_decode_split_kernel<KV, VEC, VPL, GB>),
            dim3((unsigned)splits, (unsigned)(n_kv_heads * head_groups), (unsigned)rows), dim3(DEC_THREADS), smem, stream,
            ws, q, static_cast<const E *>(k), static_cast<const E *>(v), pages.table, pages.block_shift, pages.row_stride,
            positions, max_keys, decode_row_ws(max_keys, n_heads, hd), (int)n_heads, (int)n_kv_heads, (int)hd,
            (int)head_groups, scale);
  return mk_check_launch("mk_kernel_attention_decode (split)");
}

/* The vector width and heads per block for this shape and alignment. */
template <typename KV, int VEC_MAX>
static mk_status launch_decode_dtype(float *ws, const float *q, const void *k, const void *v, mk_kv_pages pages,
                                     const int32_t *positions, size_t rows,
                                     size_t max_keys, size_t splits, size_t n_heads, size_t n_kv_heads, size_t hd,
                                     cudaStream_t stream) {
  const size_t group = n_heads / n_kv_heads, gb = decode_heads_per_block(group), hg = (group + gb - 1) / gb;
  const size_t esz = sizeof(typename KV::elem);
  const bool wide = hd % VEC_MAX == 0 && ((uintptr_t)k | (uintptr_t)v) % (esz * VEC_MAX) == 0;
  if (!wide && ((uintptr_t)k | (uintptr_t)v) % (esz * 2) != 0)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode: KV cache not aligned to %zu bytes", esz * 2);
#define MK_DEC_GB(VEC, VPL)                                                                                           \
  (gb == 1   ? launch_decode_split<KV, VEC, VPL, 1>(ws, q, k, v, pages, positions, rows, max_keys, splits, n_heads, n_kv_heads, hd, \
                                                    hg, stream)                                                      \
   : gb == 4 ? launch_decode_split<KV, VEC, VPL, 4>(ws, q, k, v, pages, positions, rows, max_keys, splits, n_heads, n_kv_heads, hd, \
                                                    hg, stream)                                                      \
             : launch_decode_split<KV, VEC, VPL, DEC_GB_MAX>(ws, q, k, v, pages, positions, rows, max_keys, splits, n_heads,       \
                                                             n_kv_heads, hd, hg, stream))
  if (wide && hd <= 32 * (size_t)VEC_MAX) return MK_DEC_GB(VEC_MAX, 1);
  if constexpr (VEC_MAX == 4)
    if (wide) return MK_DEC_GB(4, 2); /* F32, head_dim up to 256 */
  return MK_DEC_GB(2, 4);             /* head_dim not a multiple of the vector: 2-element loads */
#undef MK_DEC_GB
}

extern "C" mk_status mk_kernel_attention_decode(float *out, const float *q, const void *k_cache, const void *v_cache,
                                                mk_kv_pages pages, mk_dtype kv_dtype, const int32_t *positions, size_t rows,
                                                size_t max_keys,
                                                size_t n_heads, size_t n_kv_heads, size_t head_dim, void *workspace,
                                                size_t workspace_bytes, cudaStream_t stream) {
  MK_TRY(mk_attention_check_shape("mk_kernel_attention_decode", n_heads, n_kv_heads, head_dim));
  if (kv_dtype != MK_DTYPE_F32 && kv_dtype != MK_DTYPE_F16 && kv_dtype != MK_DTYPE_BF16)
    return mk_fail(MK_ERR_DTYPE, "mk_kernel_attention_decode: KV cache dtype %s is not f32, f16 or bf16",
                   mk_dtype_name(kv_dtype));
  if (!out || !q || !k_cache || !v_cache || !positions || !workspace)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode: null pointer");
  if (!pages.table) /* the caches are read through a table, never as contiguous rows */
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode: no block table");
  if (max_keys == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_attention_decode: max_keys is 0");
  if (rows == 0) return MK_OK;
  if (rows > 65535u) return mk_fail(MK_ERR_SHAPE, "mk_kernel_attention_decode: %zu rows exceed the grid", rows);
  const size_t per_row = mk_kernel_attention_decode_workspace_bytes(max_keys, n_heads, head_dim);
  if (workspace_bytes / rows < per_row)
    return mk_fail(MK_ERR_INVALID_ARGUMENT,
                   "mk_kernel_attention_decode: workspace %zu bytes < %zu needed for %zu rows of %zu keys",
                   workspace_bytes, per_row * rows, rows, max_keys);
  size_t splits = 0;
  MK_TRY(mk_kernel_attention_decode_splits(&splits, max_keys, n_heads, n_kv_heads));
  const size_t group = n_heads / n_kv_heads, gb = decode_heads_per_block(group);
  if (n_kv_heads * ((group + gb - 1) / gb) > 65535u)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_attention_decode: %zu kv heads exceed the grid", n_kv_heads);
  float *ws = static_cast<float *>(workspace);
  mk_status s;
  if (kv_dtype == MK_DTYPE_F32)
    s = launch_decode_dtype<DecF32, 4>(ws, q, k_cache, v_cache, pages, positions, rows, max_keys, splits, n_heads, n_kv_heads,
                                       head_dim, stream);
  else if (kv_dtype == MK_DTYPE_F16)
    s = launch_decode_dtype<DecF16, 8>(ws, q, k_cache, v_cache, pages, positions, rows, max_keys, splits, n_heads, n_kv_heads,
                                       head_dim, stream);
  else
    s = launch_decode_dtype<DecBF16, 8>(ws, q, k_cache, v_cache, pages, positions, rows, max_keys, splits, n_heads, n_kv_heads,
                                        head_dim, stream);
  MK_TRY(s);
  MK_LAUNCH(attention_decode_combine_kernel, dim3((unsigned)n_heads, (unsigned)rows), dim3(DEC_THREADS), 0, stream, out,
            (const float *)ws, positions, max_keys, decode_row_ws(max_keys, n_heads, head_dim), (int)splits,
            (int)head_dim);
  return mk_check_launch("mk_kernel_attention_decode (combine)");
}
