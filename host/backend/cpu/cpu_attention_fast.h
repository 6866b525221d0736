/* Causal grouped-query attention over an F32 KV cache for the native weight mode: the
 * semantics of mk_cpu_attention_heads (cpu_ops.h) with float instead of double
 * accumulation, vectorized. Each (row, head) pair is computed alone, so any partition of
 * the pairs across threads gives the same bits. The F32 parity mode keeps the reference. */
#ifndef MK_CPU_ATTENTION_FAST_H
#define MK_CPU_ATTENTION_FAST_H

#include <stddef.h>

#include "backend/cpu/cpu_quant.h"
#include "kv_pages.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*mk_attention_fast_fn)(float *out /* [rows, n_heads, head_dim] */,
                                     const float *q /* [rows, n_heads, head_dim] */,
                                     const float *k_cache /* [>= past + rows, n_kv_heads, head_dim] */,
                                     const float *v_cache /* [>= past + rows, n_kv_heads, head_dim] */,
                                     mk_kv_pages pages /* the pool row of each key */, size_t begin, size_t end, size_t past, size_t n_heads, size_t n_kv_heads,
                                     size_t head_dim);

/* The AVX2 copy when `kernels` is the AVX2 kernel set (the CPU has it), else portable. */
mk_attention_fast_fn mk_cpu_attention_fast_for(const mk_cpu_quant *kernels);

#ifdef __cplusplus
}
#endif
#endif
