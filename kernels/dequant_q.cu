/* dequant_q.cu - rows of a weight kept in a GGUF block format (gguf_blocks.cuh) expanded
 * to F32 or BF16 on the device, with the values the decode GEMV multiplies (gguf_blocks.cuh).
 *
 * Two uses in the cuda backend's native weight mode: prefill multiplies on cuBLAS, so a
 * slice of a weight's rows is expanded to BF16 in a scratch buffer just before its GEMM;
 * the embedding gathers the rows of the token ids (F32 out, an id outside [0, n_src_rows)
 * gives a zero row as mk_kernel_embed does). One thread per block part (2*H values);
 * consecutive threads take consecutive parts of a row, so the reads are coalesced. */
#include "mk_cuda_compat.h"

#include "gguf_blocks.cuh"

#define DEQ_THREADS 256

template <int T, int D>
static __global__ void dequant_q_kernel(void *__restrict__ out /* [n_rows, cols] F32 or BF16 */,
                                        const uint8_t *__restrict__ w /* [n_src_rows, cols / BE * BB] */,
                                        const int32_t *__restrict__ ids /* dev [n_rows] or NULL */, size_t row0,
                                        size_t n_src_rows, size_t cols) {
  typedef gemvq_fmt<T> F;
  const size_t n_blocks = cols / F::BE, units = n_blocks * F::PARTS;
  const size_t row = blockIdx.y;
  const size_t u = (size_t)blockIdx.x * DEQ_THREADS + threadIdx.x;
  if (u >= units) return;
  const int64_t src = ids ? (int64_t)ids[row] : (int64_t)(row0 + row);
  const size_t b = u / F::PARTS;
  float wa[F::H], wb[F::H];
  int ka, kb;
  if (src < 0 || (size_t)src >= n_src_rows) {
    const int p = (int)(u % F::PARTS);
    F::part(w, p, wa, wb, ka, kb); /* positions only: the values are replaced by zeros */
    MK_UNROLL
    for (int i = 0; i < F::H; i++) wa[i] = wb[i] = 0.0f;
  } else {
    F::part(w + ((size_t)src * n_blocks + b) * F::BB, (int)(u % F::PARTS), wa, wb, ka, kb);
  }
  const size_t base = row * cols + b * F::BE;
  MK_UNROLL
  for (int i = 0; i < F::H; i++) {
    if (D == MK_DTYPE_F32) {
      static_cast<float *>(out)[base + ka + i] = wa[i];
      static_cast<float *>(out)[base + kb + i] = wb[i];
    } else {
      static_cast<uint16_t *>(out)[base + ka + i] = mk_dev_f32_to_bf16(wa[i]);
      static_cast<uint16_t *>(out)[base + kb + i] = mk_dev_f32_to_bf16(wb[i]);
    }
  }
}

template <int T, int D>
static mk_status launch_dequant_q(void *out, const void *w, const int32_t *ids, size_t row0, size_t n_rows,
                                  size_t n_src_rows, size_t cols, cudaStream_t stream) {
  typedef gemvq_fmt<T> F;
  if (cols % F::BE != 0)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_dequant_q: width %zu is not a multiple of the block size %d", cols,
                   (int)F::BE);
  if (((uintptr_t)w % F::ALIGN) != 0)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_dequant_q: weights not %d-byte aligned", (int)F::ALIGN);
  const size_t units = cols / F::BE * F::PARTS;
  MK_LAUNCH((dequant_q_kernel<T, D>), dim3(mk_ceil_div_u(units, DEQ_THREADS), (unsigned)n_rows), dim3(DEQ_THREADS), 0,
            stream, out, static_cast<const uint8_t *>(w), ids, row0, n_src_rows, cols);
  return mk_check_launch("mk_kernel_dequant_q");
}

template <int T>
static mk_status dequant_q_dtype(void *out, mk_dtype out_dtype, const void *w, const int32_t *ids, size_t row0,
                                 size_t n_rows, size_t n_src_rows, size_t cols, cudaStream_t stream) {
  if (out_dtype == MK_DTYPE_F32)
    return launch_dequant_q<T, MK_DTYPE_F32>(out, w, ids, row0, n_rows, n_src_rows, cols, stream);
  return launch_dequant_q<T, MK_DTYPE_BF16>(out, w, ids, row0, n_rows, n_src_rows, cols, stream);
}

extern "C" mk_status mk_kernel_dequant_q(void *out, mk_dtype out_dtype, const void *w, uint32_t ggml_type,
                                         const int32_t *ids, size_t row0, size_t n_rows, size_t n_src_rows,
                                         size_t cols, cudaStream_t stream) {
  if (!mk_kernel_gemv_q_supports(ggml_type))
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_dequant_q: ggml type %u is not kept on the device", ggml_type);
  if (out_dtype != MK_DTYPE_F32 && out_dtype != MK_DTYPE_BF16)
    return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_dequant_q: output dtype %d is not F32/BF16", (int)out_dtype);
  if (cols == 0 || n_src_rows == 0)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_dequant_q: weight [%zu, %zu] is empty", n_src_rows, cols);
  if (n_rows > 65535) return mk_fail(MK_ERR_SHAPE, "mk_kernel_dequant_q: %zu rows exceed the grid (65535)", n_rows);
  if (!ids && row0 + n_rows > n_src_rows)
    return mk_fail(MK_ERR_SHAPE, "mk_kernel_dequant_q: rows [%zu, %zu) outside the weight's %zu", row0, row0 + n_rows,
                   n_src_rows);
  if (n_rows == 0) return MK_OK;
  if (!out || !w) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_kernel_dequant_q: null pointer");
#define DEQ_TYPE(T) \
  case T: return dequant_q_dtype<T>(out, out_dtype, w, ids, row0, n_rows, n_src_rows, cols, stream);
  switch (ggml_type) {
    MK_GEMVQ_FORMATS(DEQ_TYPE)
    default: return mk_fail(MK_ERR_INTERNAL, "mk_kernel_dequant_q: type %u", ggml_type);
  }
#undef DEQ_TYPE
}
