/* embed.cu - token embedding gather: out[i, :] = table[ids[i], :] as F32.
 * One block per token row; threads stride over the hidden width (coalesced). */
#include "mk_cuda_compat.h"

#include "mk_kernels_common.cuh"

template <int D>
static __global__ void embed_kernel(float *__restrict__ out /* [n, hidden] */, const void *__restrict__ table,
                                    const int32_t *__restrict__ ids /* [n] */, size_t hidden, size_t vocab) {
  const size_t row = blockIdx.x;
  const int32_t id = ids[row];
  float *o = out + row * hidden;
  if (id < 0 || (size_t)id >= vocab) { /* contract: out-of-range ids give a zero row */
    for (size_t c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = 0.0f;
    return;
  }
  const size_t base = (size_t)id * hidden;
  for (size_t c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = mk_load_as_f32<D>(table, base + c);
}

static unsigned embed_threads(size_t hidden) { return hidden <= 32 ? 32u : hidden < 1024 ? 256u : 512u; }

template <int D>
static mk_status launch_embed(float *out, const void *table, const int32_t *ids, size_t n, size_t hidden,
                              size_t vocab, cudaStream_t stream) {
  MK_LAUNCH(embed_kernel<D>, dim3((unsigned)n), dim3(embed_threads(hidden)), 0, stream, out, table, ids, hidden,
            vocab);
  return mk_check_launch("mk_kernel_embed");
}

extern "C" mk_status mk_kernel_embed(float *out, const void *table, mk_dtype table_dtype, const int32_t *ids,
                                     size_t n, size_t hidden, size_t vocab, cudaStream_t stream) {
  if (!mk_float_dtype(table_dtype))
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_embed: table dtype %d is not F32/F16/BF16", (int)table_dtype);
  if (hidden == 0 || vocab == 0) return mk_fail(MK_ERR_SHAPE, "mk_kernel_embed: hidden %zu, vocab %zu", hidden, vocab);
  if (n == 0) return MK_OK;
  if (n > 2147483647u) return mk_fail(MK_ERR_SHAPE, "mk_kernel_embed: %zu rows exceed the grid", n);
  if (!out || !table || !ids) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_embed: null pointer");
  switch (table_dtype) {
    case MK_DTYPE_F32: return launch_embed<MK_DTYPE_F32>(out, table, ids, n, hidden, vocab, stream);
    case MK_DTYPE_F16: return launch_embed<MK_DTYPE_F16>(out, table, ids, n, hidden, vocab, stream);
    default: return launch_embed<MK_DTYPE_BF16>(out, table, ids, n, hidden, vocab, stream);
  }
}
