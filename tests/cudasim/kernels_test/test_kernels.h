/* test_kernels.h - launchers of the cudasim self-test kernels (each returns the launch status). */
#ifndef CUDASIM_TEST_KERNELS_H
#define CUDASIM_TEST_KERNELS_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

/* ---- correct kernels (good_kernels.cu) ---- */
cudaError_t tk_block_sum(float *out, const float *x, int n, int blocks, cudaStream_t s);     /* out[blocks] */
cudaError_t tk_warp_sum(float *out, const float *x, int n_warps, cudaStream_t s);           /* out[n_warps] */
cudaError_t tk_atomic_count(int *count, float *fsum, unsigned long long *umax, int blocks, cudaStream_t s);
cudaError_t tk_dynamic_reverse(float *y, const float *x, int block, int blocks, cudaStream_t s);
cudaError_t tk_grid2d(int *out, int w, int h, cudaStream_t s);                              /* out[h][w] */
cudaError_t tk_template_sum(double *out, const double *x, int n, int block_size, cudaStream_t s);
cudaError_t tk_warp_votes(unsigned *out, const int *pred, cudaStream_t s);                  /* out[4*32] */
cudaError_t tk_scan_up(int *out, const int *x, cudaStream_t s);                              /* 64 values */
cudaError_t tk_sync_count(int *out, const int *pred, int n, cudaStream_t s);                /* out[3] */
cudaError_t tk_half_roundtrip(float *out, const float *x, int n, cudaStream_t s);           /* out[2n] */
cudaError_t tk_big_dynamic(float *out, int n_floats, cudaStream_t s);
cudaError_t tk_no_args(int *flag, cudaStream_t s);
cudaError_t tk_half_then_full_shfl(int *out, cudaStream_t s);                              /* out[128] */

/* ---- broken kernels (broken_kernels.cu) ---- */
cudaError_t tk_sum_missing_sync(float *out, const float *x, int n, cudaStream_t s);   /* out[1] */
cudaError_t tk_warp_lockstep(float *out, const float *x, cudaStream_t s);             /* out[1] */
/* x[64*blocks], out[32*blocks]; sync=false: the cross-warp race, sync=true: fixed */
cudaError_t tk_cross_warp_shfl(float *out, const float *x, int blocks, bool sync, cudaStream_t s);
cudaError_t tk_divergent_barrier(cudaStream_t s);
cudaError_t tk_barrier_after_exit(cudaStream_t s);
void tk_divergent_barrier_no_check(cudaStream_t s); /* leaves the error for the caller */
cudaError_t tk_shfl_exited_lane(float *out, cudaStream_t s);
cudaError_t tk_mask_exited(float *out, cudaStream_t s);
cudaError_t tk_warp_vs_barrier(cudaStream_t s);
cudaError_t tk_mask_mismatch(cudaStream_t s);
cudaError_t tk_stack_overflow(int *out, int limit, cudaStream_t s);
/* out_u/out_f[32*blocks]: odd blocks read static shared memory no thread of theirs wrote */
cudaError_t tk_stale_static_shared(unsigned *out_u, float *out_f, int blocks, cudaStream_t s);

/* ---- nvcuda::wmma stand-in (wmma_kernels.cu) ---- */
/* each of `warps` warps: d[w * 16 * ldc ...] = post_scale * (A B + C), A 16 x 16k, B 16k x 16 in
 * the given layouts and leading dimensions; C loaded (c, layout c_col) or filled (c == nullptr). */
cudaError_t tk_wmma_gemm_bf16(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *c, float c_fill,
                              int ktiles, bool a_row, bool b_row, unsigned lda, unsigned ldb, unsigned ldc, bool c_col,
                              bool d_col, float post_scale, int warps, cudaStream_t s);
cudaError_t tk_wmma_gemm_f16(float *d, const __half *a, const __half *b, const float *c, float c_fill, int ktiles,
                             bool a_row, bool b_row, unsigned lda, unsigned ldb, unsigned ldc, bool c_col, bool d_col,
                             float post_scale, int warps, cudaStream_t s);
cudaError_t tk_wmma_staged_load(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *eye, bool sync, cudaStream_t s);
cudaError_t tk_wmma_store_then_read(float *out, bool sync, cudaStream_t s); /* out[32] */
cudaError_t tk_wmma_half_warp(float *out, cudaStream_t s);
cudaError_t tk_wmma_misaligned(float *out, const __half *a, unsigned offset, unsigned ldm, cudaStream_t s);

/* ---- rmsnorm (rmsnorm_kernel.cu) ---- */
cudaError_t tk_rmsnorm(float *y, const float *x, const float *w, int rows, int cols, float eps,
                       cudaStream_t s);

#endif
