/* The cuda backend: the hand-written kernels (kernels/) and cuBLAS on one device, one
 * non-blocking stream and one cuBLAS handle per range.
 *
 * This host code is compiled once against the real CUDA headers and linked either with
 * the real cudart/cuBLAS (meshkern_gpu) or with tests/cudasim's stand-ins (meshkern_sim).
 *
 * Weights live on the device in the range's dtype. F32 weights multiply in F32 with no
 * TF32 (parity mode) or with TF32 tensor cores (speed mode); F16/BF16 weights multiply
 * with the activations converted to the same dtype and F32 accumulation (cuBLAS, more than
 * MK_GEMV_MAX_ROWS rows) or with F32 activations in the decode GEMV kernel (up to that).
 *
 * Native weight mode (MK_DTYPE_NATIVE): a matrix whose GGUF source is a format the kernels
 * read (mk_kernel_gemv_q_supports: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ4_NL, IQ4_XS) stays in its blocks on the device (decode: mk_kernel_gemv_q dequantizes in registers;
 * prefill: slices of rows expanded to BF16 in a scratch buffer, then cuBLAS); any other
 * source is stored as BF16. Each weight's mk_weight says which (its format).
 *
 * 16-bit products on cuBLAS (more than MK_GEMV_MAX_ROWS rows) take their activations in the
 * weight dtype (BF16 in native mode): the range passes a buffer for that copy, filled by the
 * norm that wrote the activations or converted here first (mk_gemm_input).
 *
 * Errors: every runtime and cuBLAS call and every kernel launch is checked. A failed
 * runtime call also leaves the runtime's per-thread "last error" set; it is consumed once
 * the failure is recorded, so the next kernel's launch check does not report it again as
 * its own (and a failed range creation leaves nothing behind for the next range). */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/half.h"
#include "model/gguf.h"
#include "kernels.h"
#include "core/mk_check.h"
#include "core/mk_size.h"

typedef struct mk_cuda_backend {
    mk_backend base;
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *decode_ws;       /* dev: flash-decoding partials */
    size_t decode_ws_bytes;
    size_t max_context;    /* KV cache rows (reserve): decode attention's fixed grid */
    void *cublas_ws;       /* dev: cuBLAS's workspace, fixed at reserve (a captured GEMM allocates nothing) */
    size_t cublas_ws_bytes;
    bool capturing;        /* a decode step is being recorded (step_begin .. step_end) */
    mk_backend_counters capture_start; /* the counters when the capture began */
    size_t capture_keys;               /* the key count of the recorded step */
    void *pinned;          /* host pinned staging for downloads / uploads */
    size_t pinned_bytes;
    size_t pinned_used;    /* uploads staged since the host last waited for the stream */
    cudaEvent_t seam_event; /* orders a peer copy against this range's stream */
    /* Held by this backend's own thread while it records a step, and by another range's
     * thread while it posts a peer copy's event record and wait on this stream: work another
     * thread posts on a stream that is recording would join (or break) the recording, so a
     * peer copy waits for the recording to end (a placed pipeline's stages record their steps
     * while their neighbours copy boundaries). Also serialises the users of seam_event. */
    pthread_mutex_t stream_mu;
    bool stream_mu_ready;
    /* native mode: the BF16 scratch a prefill product expands weight rows into */
    void *deq_scratch; /* dev BF16 [deq_elems] */
    size_t deq_elems;
} mk_cuda_backend;

/* A captured decode step: the instantiated graph and the launches it replays. */
typedef struct mk_cuda_step {
    cudaGraphExec_t exec;
    mk_backend_counters recorded; /* what the recorded ops counted (launches, bytes read) */
    size_t keys;                  /* the key count attention read when it was recorded */
} mk_cuda_step;

/* Elements of the BF16 scratch a prefill product expands weight rows into (16 MiB). */
#define MK_CUDA_DEQ_ELEMS ((size_t)8 << 20)

static mk_cuda_backend *cuda_of(mk_backend *b) { return (mk_cuda_backend *)b; }

/* Every entry point selects the range's device (ranges on different devices share the
 * calling thread) and gives the caller's current device back on every return path (the
 * cleanup attribute), so the caller's own CUDA work never lands on a range's device. */
typedef struct mk_device_scope {
    int caller; /* the caller's current device, to restore */
    bool entered;
} mk_device_scope;

static void mk_device_scope_exit(mk_device_scope *scope) {
    if (scope->entered && cudaSetDevice(scope->caller) != cudaSuccess) (void)cudaGetLastError();
}

/* Enter `device` for the rest of the enclosing block; false (nothing changed) on failure. */
static bool mk_device_scope_enter(mk_device_scope *scope, int device) {
    if (cudaGetDevice(&scope->caller) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    scope->entered = true;
    return cudaSetDevice(device) == cudaSuccess;
}

#define MK_DEVICE_SCOPE(name) mk_device_scope name __attribute__((cleanup(mk_device_scope_exit))) = {0, false}

#define MK_ON_DEVICE(cb)                                                   \
    MK_DEVICE_SCOPE(mk_device_scope_);                                     \
    MK_CUDA_CHECK(cudaGetDevice(&mk_device_scope_.caller));                \
    mk_device_scope_.entered = true;                                       \
    MK_CUDA_CHECK(cudaSetDevice((cb)->device))

/* After a kernel entry: a debug build waits for the stream, so an asynchronous fault is
 * reported by the op that caused it rather than by a later copy. */
static mk_status mk_cuda_after_launch(mk_cuda_backend *cb, mk_status s) {
    if (s == MK_OK) cb->base.counters.launches++;
#ifndef NDEBUG
    /* not while a step is recorded: nothing ran, and a wait would invalidate the capture */
    if (s == MK_OK && !cb->capturing) MK_CUDA_CHECK(cudaStreamSynchronize(cb->stream));
#else
    (void)cb;
#endif
    return s;
}

/* Device bytes the enqueued work must read (mk_backend_counters.bytes_read), from a model of
 * each kernel: weights at their stored size, KV-cache rows read by attention, and the rest
 * (activations, ids, positions, scratch). */
static void mk_cuda_reads(mk_cuda_backend *cb, size_t weights, size_t kv, size_t other) {
    cb->base.counters.weight_bytes_read += weights;
    cb->base.counters.kv_bytes_read += kv;
    cb->base.counters.bytes_read += weights + kv + other;
}

/* The dtype a product of `rows` rows takes its activations in: the weight dtype (BF16 in
 * native mode) where cuBLAS multiplies 16-bit weights (more rows than the GEMV kernel
 * takes); F32 for F32 weights and for the GEMV kernels, which read F32 activations. */
static mk_dtype cuda_gemm_input(mk_backend *b, size_t rows) {
    const mk_dtype d = b->config.weight_dtype;
    if (rows <= MK_GEMV_MAX_ROWS) return MK_DTYPE_F32;
    return d == MK_DTYPE_NATIVE ? MK_DTYPE_BF16 : d == MK_DTYPE_F16 || d == MK_DTYPE_BF16 ? d : MK_DTYPE_F32;
}

/* The host waits for the range's stream: counted (mk_backend_counters.host_syncs). */
static cudaError_t mk_cuda_wait(mk_cuda_backend *cb) {
    cb->base.counters.host_syncs++;
    return cudaStreamSynchronize(cb->stream);
}

static void cuda_destroy(mk_backend *b) {
    mk_cuda_backend *cb = cuda_of(b);
    /* Only touch the device if something was created on it: a backend that failed on a
     * missing device index must not leave cudaSetDevice's error behind. */
    const bool created = cb->stream || cb->cublas || cb->decode_ws || cb->pinned || cb->seam_event ||
                         cb->deq_scratch || cb->cublas_ws;
    MK_DEVICE_SCOPE(scope);
    if (created && mk_device_scope_enter(&scope, cb->device)) {
        if (cb->stream) cudaStreamSynchronize(cb->stream);
        if (cb->seam_event) cudaEventDestroy(cb->seam_event);
        if (cb->decode_ws) cudaFree(cb->decode_ws);
        if (cb->pinned) cudaFreeHost(cb->pinned);
        if (cb->deq_scratch) cudaFree(cb->deq_scratch);
        if (cb->cublas) cublasDestroy(cb->cublas);
        if (cb->cublas_ws) cudaFree(cb->cublas_ws); /* after the handle that used it */
        if (cb->stream) cudaStreamDestroy(cb->stream);
    }
    (void)cudaGetLastError(); /* teardown reports nothing: leave no stale error */
    if (cb->stream_mu_ready) pthread_mutex_destroy(&cb->stream_mu);
    free(cb);
}

/* ================================================================= memory == */

static mk_status cuda_alloc(mk_backend *b, size_t bytes, void **out) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    *out = NULL;
    const cudaError_t err = cudaMalloc(out, bytes ? bytes : 1);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* out of memory is not sticky: consume it */
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return mk_fail(MK_ERR_DEVICE_MEMORY, "does not fit in device memory: %zu bytes requested on device %d (%zu of %zu free)",
                       bytes, cb->device, free_b, total_b);
    }
    MK_CUDA_CHECK(err);
    return MK_OK;
}

static void cuda_release(mk_backend *b, void *ptr) {
    if (!ptr) return;
    MK_DEVICE_SCOPE(scope);
    if (mk_device_scope_enter(&scope, cuda_of(b)->device)) cudaFree(ptr);
    (void)cudaGetLastError(); /* release reports nothing: leave no stale error */
}

static mk_status cuda_upload(mk_backend *b, void *dst, const void *src, size_t bytes) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    if (!bytes) return MK_OK;
    cb->base.counters.bytes_uploaded += bytes;
    /* Through the pinned buffer when it fits: the copy is truly async and the caller's
     * pageable buffer is free as soon as we return. */
    if (bytes <= cb->pinned_bytes) {
        /* Each upload takes the next free slice, so the copies in flight keep their bytes;
         * the host waits only when the buffer is full (a wait, or a download, frees it). */
        const size_t slice = (bytes + 15) & ~(size_t)15;
        if (cb->pinned_used + bytes > cb->pinned_bytes) {
            MK_CUDA_CHECK(mk_cuda_wait(cb));
            cb->pinned_used = 0;
        }
        void *stage = (char *)cb->pinned + cb->pinned_used;
        memcpy(stage, src, bytes);
        MK_CUDA_CHECK(cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, cb->stream));
        cb->pinned_used += slice;
        return MK_OK;
    }
    MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->stream));
    MK_CUDA_CHECK(mk_cuda_wait(cb));
    return MK_OK;
}

static mk_status cuda_download(mk_backend *b, void *dst, const void *src, size_t bytes) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    if (!bytes) return MK_OK;
    cb->base.counters.bytes_downloaded += bytes;
    if (bytes <= cb->pinned_bytes) {
        /* Stream order: the staged uploads still in flight read their slices before this
         * copy writes over them. After the wait the whole buffer is free again. */
        MK_CUDA_CHECK(cudaMemcpyAsync(cb->pinned, src, bytes, cudaMemcpyDeviceToHost, cb->stream));
        MK_CUDA_CHECK(mk_cuda_wait(cb));
        cb->pinned_used = 0;
        memcpy(dst, cb->pinned, bytes);
        return MK_OK;
    }
    MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream));
    MK_CUDA_CHECK(mk_cuda_wait(cb));
    cb->pinned_used = 0;
    return MK_OK;
}

static mk_status cuda_copy(mk_backend *b, void *dst, const void *src, size_t bytes) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    if (!bytes) return MK_OK;
    MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cb->stream));
    cb->base.counters.launches++;
    mk_cuda_reads(cb, 0, 0, bytes);
    return MK_OK;
}

/* ================================================================== seams == */

static mk_status cuda_host_alloc(mk_backend *b, size_t bytes, void **out) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    *out = NULL;
    MK_CUDA_CHECK(cudaMallocHost(out, bytes ? bytes : 1));
    return MK_OK;
}

static void cuda_host_release(mk_backend *b, void *ptr) {
    if (ptr) cudaFreeHost(ptr);
    (void)cudaGetLastError();
}

static mk_status cuda_download_async(mk_backend *b, void *dst, const void *src, size_t bytes) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    if (bytes) MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream));
    cb->base.counters.bytes_downloaded += bytes;
    return MK_OK;
}

static mk_status cuda_upload_async(mk_backend *b, void *dst, const void *src, size_t bytes) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    if (bytes) MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->stream));
    cb->base.counters.bytes_uploaded += bytes;
    return MK_OK;
}

/* The copy runs on this range's stream after the peer's queued work (its event), and
 * the peer's stream waits for the copy before it may overwrite the source. */
static void *cuda_native_stream(mk_backend *b) { return cuda_of(b)->stream; }

/* The ordered copy itself, both streams' locks held. */
static cudaError_t mk_cuda_peer_copy_locked(mk_cuda_backend *cb, void *dst, mk_cuda_backend *pb, const void *src,
                                            size_t bytes) {
    cudaError_t e = cudaSetDevice(pb->device);
    if (e == cudaSuccess) e = cudaEventRecord(pb->seam_event, pb->stream);
    if (e == cudaSuccess) e = cudaSetDevice(cb->device);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(cb->stream, pb->seam_event, 0);
    if (e == cudaSuccess)
        e = pb->device == cb->device ? cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cb->stream)
                                     : cudaMemcpyPeerAsync(dst, cb->device, src, pb->device, bytes, cb->stream);
    if (e == cudaSuccess) e = cudaEventRecord(cb->seam_event, cb->stream);
    if (e == cudaSuccess) e = cudaSetDevice(pb->device);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(pb->stream, cb->seam_event, 0);
    return e;
}

static mk_status cuda_copy_from_peer(mk_backend *b, void *dst, mk_backend *peer, const void *src, size_t bytes) {
    mk_cuda_backend *cb = cuda_of(b), *pb = cuda_of(peer);
    if (peer->ops != b->ops) return mk_fail(MK_ERR_INVALID_ARGUMENT, "cuda backend: peer copy from a %s backend", peer->ops->name);
    if (!bytes) return MK_OK;
    /* One scope restores the caller's device on every return; inside it, each call runs
     * on the device that owns its stream or event. Both streams' locks, the lower address
     * first (no two copiers wait on each other): neither stream is recording meanwhile. */
    MK_ON_DEVICE(pb);
    pthread_mutex_t *first = cb < pb ? &cb->stream_mu : &pb->stream_mu, *second = cb < pb ? &pb->stream_mu : &cb->stream_mu;
    pthread_mutex_lock(first);
    if (second != first) pthread_mutex_lock(second);
    const cudaError_t mk_cuda_peer_copy = mk_cuda_peer_copy_locked(cb, dst, pb, src, bytes);
    if (second != first) pthread_mutex_unlock(second);
    pthread_mutex_unlock(first);
    MK_CUDA_CHECK(mk_cuda_peer_copy);
    return MK_OK;
}

static mk_status cuda_synchronize(mk_backend *b) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    MK_CUDA_CHECK(mk_cuda_wait(cb));
    cb->pinned_used = 0;
    return MK_OK;
}

static mk_status cuda_reserve(mk_backend *b, size_t max_rows, size_t max_decode_rows, size_t max_context,
                            const mk_hparams *hp) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    /* cuBLAS's workspace, fixed for the range's life (cuBLAS's recommended size: 32 MiB on
     * sm_90 and newer, 4 MiB before): a GEMM recorded in a decode step then allocates
     * nothing, and nothing is allocated per token. */
    int major = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cb->device));
    cb->cublas_ws_bytes = (size_t)(major >= 9 ? 32 : 4) << 20;
    MK_TRY(cuda_alloc(b, cb->cublas_ws_bytes, &cb->cublas_ws));
    MK_CUBLAS_CHECK(cublasSetWorkspace(cb->cublas, cb->cublas_ws, cb->cublas_ws_bytes));
    cb->max_context = max_context;
    /* a slice per decode row of the largest batch (a batch's decode rows share one launch) */
    cb->decode_ws_bytes = mk_kernel_attention_decode_workspace_bytes(max_context, hp->n_heads, hp->head_dim);
    if (!mk_size_mul(cb->decode_ws_bytes, max_decode_rows ? max_decode_rows : 1, &cb->decode_ws_bytes))
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "decode workspace for %zu rows overflows", max_decode_rows);
    MK_TRY(cuda_alloc(b, cb->decode_ws_bytes, &cb->decode_ws));
    /* Pinned staging for what crosses a seam (a residual of max_rows) and the logits. */
    cb->pinned_bytes = max_rows * hp->hidden * sizeof(float);
    if (hp->vocab * sizeof(float) > cb->pinned_bytes) cb->pinned_bytes = hp->vocab * sizeof(float);
    MK_CUDA_CHECK(cudaMallocHost(&cb->pinned, cb->pinned_bytes));
    if (cb->base.config.weight_dtype == MK_DTYPE_NATIVE) {
        cb->deq_elems = MK_CUDA_DEQ_ELEMS;
        MK_TRY(cuda_alloc(b, cb->deq_elems * 2, &cb->deq_scratch));
    }
    return MK_OK;
}

static mk_status mk_cuda_upload_weight_as(mk_cuda_backend *cb, void *dst, const float *src, size_t n, mk_dtype dtype) {
    MK_ON_DEVICE(cb);
    if (dtype == MK_DTYPE_F32) {
        MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, cb->stream));
        MK_CUDA_CHECK(mk_cuda_wait(cb));
        return MK_OK;
    }
    /* Load time only: convert on the host, then copy. */
    uint16_t *half = malloc(n * sizeof(uint16_t));
    if (!half) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cuda backend: out of memory converting %zu weights", n);
    for (size_t i = 0; i < n; i++) half[i] = dtype == MK_DTYPE_BF16 ? mk_f32_to_bf16(src[i]) : mk_f32_to_f16(src[i]);
    cudaError_t err = cudaMemcpyAsync(dst, half, n * sizeof(uint16_t), cudaMemcpyHostToDevice, cb->stream);
    if (err == cudaSuccess) err = mk_cuda_wait(cb);
    free(half);
    MK_CUDA_CHECK(err);
    return MK_OK;
}

/* The ggml format a dense weight dtype stores (F32, F16, BF16). */
static uint32_t mk_cuda_format_of(mk_dtype dtype) {
    return dtype == MK_DTYPE_F16 ? MK_GGML_TYPE_F16 : dtype == MK_DTYPE_BF16 ? MK_GGML_TYPE_BF16 : MK_GGML_TYPE_F32;
}

/* The dense dtype of a stored format, or 0 for a block format (Q8_0, Q4_1, Q4_K ...). */
static mk_dtype mk_cuda_dense_dtype(uint32_t format) {
    return format == MK_GGML_TYPE_F32    ? MK_DTYPE_F32
           : format == MK_GGML_TYPE_F16  ? MK_DTYPE_F16
           : format == MK_GGML_TYPE_BF16 ? MK_DTYPE_BF16
                                         : (mk_dtype)0;
}

static mk_status cuda_upload_weight(mk_backend *b, mk_weight *w, const float *src) {
    const mk_dtype dtype = b->config.weight_dtype;
    w->format = mk_cuda_format_of(dtype);
    return mk_cuda_upload_weight_as(cuda_of(b), (void *)(uintptr_t)w->data, src, w->rows * w->cols, dtype);
}

/* ============================================================ native mode == */

static bool mk_cuda_keeps(uint32_t type, size_t cols) {
    size_t be = 0, bb = 0;
    return mk_kernel_gemv_q_supports(type) && mk_ggml_type_layout(type, &be, &bb) && cols % be == 0;
}

static size_t cuda_native_weight_bytes(mk_backend *b, uint32_t ggml_type, size_t rows, size_t cols) {
    (void)b;
    size_t be = 0, bb = 0;
    if (mk_cuda_keeps(ggml_type, cols) && mk_ggml_type_layout(ggml_type, &be, &bb)) return rows * (cols / be) * bb;
    return rows * cols * 2; /* BF16 */
}

/* Bytes of one stored row of a weight. */
static size_t mk_cuda_row_bytes(const mk_weight *w) {
    size_t be = 1, bb = 4;
    (void)mk_ggml_type_layout(w->format, &be, &bb);
    return w->cols / be * bb;
}

static mk_status cuda_upload_native_weight(mk_backend *b, mk_weight *w, uint32_t ggml_type, const void *src,
                                           size_t src_bytes) {
    mk_cuda_backend *cb = cuda_of(b);
    const size_t rows = w->rows, cols = w->cols;
    void *dst = (void *)(uintptr_t)w->data; /* the weight's memory, handed over to be filled */
    if (mk_cuda_keeps(ggml_type, cols)) {
        MK_ON_DEVICE(cb);
        if (src_bytes != cuda_native_weight_bytes(b, ggml_type, rows, cols))
            return mk_fail(MK_ERR_SHAPE, "native weight [%zu, %zu] of ggml type %u: %zu bytes, want %zu", rows, cols,
                           ggml_type, src_bytes, cuda_native_weight_bytes(b, ggml_type, rows, cols));
        MK_CUDA_CHECK(cudaMemcpyAsync(dst, src, src_bytes, cudaMemcpyHostToDevice, cb->stream));
        MK_CUDA_CHECK(mk_cuda_wait(cb));
        w->format = ggml_type;
        return MK_OK;
    }
    /* Any other source: F32 on the host (dequantized once), then BF16 on the device. */
    const size_t n = rows * cols;
    float *f = ggml_type == MK_GGML_TYPE_F32 ? NULL : malloc(n * sizeof(float));
    if (ggml_type != MK_GGML_TYPE_F32 && !f)
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "cuda backend: out of memory dequantizing %zu weights", n);
    mk_status s = f ? mk_gguf_dequantize(ggml_type, src, src_bytes, f, n) : MK_OK;
    if (s == MK_OK) s = mk_cuda_upload_weight_as(cb, dst, f ? f : (const float *)src, n, MK_DTYPE_BF16);
    free(f);
    if (s == MK_OK) w->format = MK_GGML_TYPE_BF16;
    return s;
}

/* ================================================================ compute == */

static mk_status cuda_embed(mk_backend *b, float *out, const mk_weight *table, const int32_t *ids, size_t n) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    const size_t hidden = table->cols, vocab = table->rows;
    const mk_dtype dense = mk_cuda_dense_dtype(table->format);
    mk_cuda_reads(cb, n * mk_cuda_row_bytes(table), 0, n * sizeof(int32_t));
    if (!dense)
        return mk_cuda_after_launch(cb, mk_kernel_dequant_q(out, MK_DTYPE_F32, table->data, table->format, ids, 0, n,
                                                            vocab, hidden, cb->stream));
    return mk_cuda_after_launch(cb, mk_kernel_embed(out, table->data, dense, ids, n, hidden, vocab, cb->stream));
}

/* A norm writes its output in F32 and, when the range passes out_lowp (the products that
 * read it take 16-bit activations), in that dtype too, in the same pass. */
static mk_status cuda_rmsnorm(mk_backend *b, float *out, void *out_lowp, const float *x, const float *w, size_t rows,
                              size_t cols, float eps) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    mk_cuda_reads(cb, cols * sizeof(float), 0, rows * cols * sizeof(float));
    return mk_cuda_after_launch(
        cb, mk_kernel_rmsnorm_lowp(out, out_lowp, cuda_gemm_input(b, rows), x, w, rows, cols, eps, cb->stream));
}

static mk_status cuda_add_rmsnorm(mk_backend *b, float *residual, float *out, void *out_lowp, const float *delta,
                                  const float *w, size_t rows, size_t cols, float eps) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    mk_cuda_reads(cb, cols * sizeof(float), 0, 2 * rows * cols * sizeof(float));
    return mk_cuda_after_launch(cb, mk_kernel_add_rmsnorm_lowp(residual, out, out_lowp, cuda_gemm_input(b, rows), delta,
                                                               w, rows, cols, eps, cb->stream));
}

/* A product's activations in `dtype` (F16/BF16) for cuBLAS: the range's buffer, as the norm
 * left it (ready) or converted into it here (one launch). */
static mk_status mk_cuda_lowp_input(mk_cuda_backend *cb, const mk_gemm_input *x, size_t n, mk_dtype dtype,
                                    const void **xin) {
    if (!x->lowp)
        return mk_fail(MK_ERR_INTERNAL, "cuda backend: a %s product of %zu inputs has no 16-bit activation buffer",
                       mk_dtype_name(dtype), n);
    if (!x->ready) {
        mk_cuda_reads(cb, 0, 0, n * sizeof(float));
        MK_TRY(mk_cuda_after_launch(cb, mk_kernel_convert(x->lowp, dtype, x->x, MK_DTYPE_F32, n, cb->stream)));
    }
    *xin = x->lowp;
    return MK_OK;
}

static cudaDataType mk_cuda_type(mk_dtype dtype) {
    return dtype == MK_DTYPE_BF16 ? CUDA_R_16BF : dtype == MK_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* y[rows, out] = x[rows, in] @ w[out, in]^T, all row-major. In cuBLAS's column-major view
 * w is an (in x out) matrix A = w^T and x is (in x rows), so y^T = A^T x^T. w dense in
 * `dtype` (F32, F16, BF16). */
static mk_status mk_cuda_matmul_dense(mk_cuda_backend *cb, float *y, const mk_gemm_input *x, const mk_weight *w,
                                      mk_dtype dtype, size_t rows) {
    const size_t in_dim = w->cols, out_dim = w->rows;
    /* Decode (a few rows) is bound by reading the weights: the GEMV kernel reads each
     * 16-bit weight once, in its stored dtype, with F32 activations (no conversion launch,
     * no cuBLAS). F32 weights keep cuBLAS in pure F32: the parity mode's one code path. */
    const size_t es = mk_dtype_size(dtype);
    if (dtype != MK_DTYPE_F32 && rows <= MK_GEMV_MAX_ROWS) {
        mk_cuda_reads(cb, out_dim * in_dim * es, 0, rows * in_dim * sizeof(float));
        return mk_cuda_after_launch(cb, mk_kernel_gemv(y, x->x, w->data, dtype, rows, in_dim, out_dim, cb->stream));
    }
    const void *xin = x->x;
    if (dtype != MK_DTYPE_F32) MK_TRY(mk_cuda_lowp_input(cb, x, rows * in_dim, dtype, &xin));
    mk_cuda_reads(cb, out_dim * in_dim * es, 0, rows * in_dim * es);
    const cublasComputeType_t compute = dtype == MK_DTYPE_F32 && cb->base.config.speed_mode
                                            ? CUBLAS_COMPUTE_32F_FAST_TF32
                                            : CUBLAS_COMPUTE_32F;
    const float alpha = 1.0f, beta = 0.0f;
    MK_CUBLAS_CHECK(cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out_dim, (int)rows, (int)in_dim, &alpha,
                                 w->data, mk_cuda_type(dtype), (int)in_dim, xin, mk_cuda_type(dtype), (int)in_dim, &beta,
                                 y, CUDA_R_32F, (int)out_dim, compute, CUBLAS_GEMM_DEFAULT));
    return mk_cuda_after_launch(cb, MK_OK);
}

/* A matrix in a block format: decode rows through the block GEMV; prefill expands slices of
 * the weight's rows to BF16 in the scratch and multiplies each slice on cuBLAS into its
 * columns of y (stream order keeps a slice's GEMM before the next expansion overwrites the
 * scratch). */
static mk_status mk_cuda_matmul_blocks(mk_cuda_backend *cb, float *y, const mk_gemm_input *x, const mk_weight *w,
                                       size_t rows) {
    const size_t in_dim = w->cols, out_dim = w->rows;
    mk_cuda_reads(cb, out_dim * mk_cuda_row_bytes(w), 0, 0); /* the blocks, once */
    if (rows <= MK_GEMV_MAX_ROWS) {
        mk_cuda_reads(cb, 0, 0, rows * in_dim * sizeof(float));
        return mk_cuda_after_launch(cb, mk_kernel_gemv_q(y, x->x, w->data, w->format, rows, in_dim, out_dim, cb->stream));
    }
    if (in_dim > cb->deq_elems)
        return mk_fail(MK_ERR_INTERNAL, "native matmul [%zu x %zu] exceeds the reserved scratch", rows, in_dim);
    const void *xin = NULL;
    MK_TRY(mk_cuda_lowp_input(cb, x, rows * in_dim, MK_DTYPE_BF16, &xin));
    size_t slice = cb->deq_elems / in_dim;
    if (slice > 65535) slice = 65535;
    const float alpha = 1.0f, beta = 0.0f;
    for (size_t r0 = 0; r0 < out_dim; r0 += slice) {
        const size_t n = out_dim - r0 < slice ? out_dim - r0 : slice;
        mk_cuda_reads(cb, 0, 0, (n + rows) * in_dim * 2); /* the GEMM: expanded slice and activations */
        MK_TRY(mk_cuda_after_launch(cb, mk_kernel_dequant_q(cb->deq_scratch, MK_DTYPE_BF16, w->data, w->format, NULL, r0,
                                                            n, out_dim, in_dim, cb->stream)));
        MK_CUBLAS_CHECK(cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)rows, (int)in_dim, &alpha,
                                     cb->deq_scratch, CUDA_R_16BF, (int)in_dim, xin, CUDA_R_16BF, (int)in_dim, &beta,
                                     y + r0, CUDA_R_32F, (int)out_dim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        MK_TRY(mk_cuda_after_launch(cb, MK_OK));
    }
    return MK_OK;
}

/* The GEMV kernels (16-bit and block weights, up to MK_GEMV_MAX_ROWS rows) compute each row
 * alone; cuBLAS (F32 weights, more rows) picks its algorithm by the shape: one at a time. */
static size_t cuda_gemm_rows_alone(mk_backend *b, const mk_weight *w) {
    (void)b;
    return mk_cuda_dense_dtype(w->format) == MK_DTYPE_F32 ? 1 : MK_GEMV_MAX_ROWS;
}

static mk_status cuda_matmul(mk_backend *b, float *y, const mk_gemm_input *x, const mk_weight *w, size_t rows) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    if (rows > INT32_MAX || w->cols > INT32_MAX || w->rows > INT32_MAX)
        return mk_fail(MK_ERR_SHAPE, "matmul [%zu x %zu] x [%zu x %zu]^T exceeds cuBLAS int dimensions", rows, w->cols,
                       w->rows, w->cols);
    const mk_dtype dense = mk_cuda_dense_dtype(w->format);
    if (!dense) return mk_cuda_matmul_blocks(cb, y, x, w, rows);
    return mk_cuda_matmul_dense(cb, y, x, w, dense, rows);
}

/* The weights of a fused GEMV set (n <= 3): the format each is read in (BF16 for a matrix
 * stored that way) and their stored bytes; false when one has a format the fused kernels do
 * not read or another input width (the caller then takes the separate launches). */
static bool mk_cuda_gemv_set(size_t n, const mk_weight *const *w, uint32_t *types, size_t *bytes) {
    *bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (w[i]->cols != w[0]->cols || !mk_kernel_gemv_q_set_supports(w[i]->format)) return false;
        types[i] = w[i]->format;
        *bytes += w[i]->rows * mk_cuda_row_bytes(w[i]);
    }
    return true;
}

/* Q, K and V (decode, 16-bit or native weights): one GEMV launch; otherwise one product each.
 * Either way each product has the bits cuda_matmul gives it. */
static mk_status cuda_matmul_shared(mk_backend *b, size_t n, float *const *y, const mk_weight *const *w,
                                    const mk_gemm_input *x, size_t rows) {
    mk_cuda_backend *cb = cuda_of(b);
    const mk_dtype dtype = cb->base.config.weight_dtype;
    const size_t in_dim = w[0]->cols;
    if ((dtype == MK_DTYPE_F16 || dtype == MK_DTYPE_BF16) && rows <= MK_GEMV_MAX_ROWS && n <= 3) {
        MK_ON_DEVICE(cb);
        const void *data[3];
        size_t out_dim[3], total = 0;
        for (size_t i = 0; i < n; i++) {
            data[i] = w[i]->data;
            out_dim[i] = w[i]->rows;
            total += out_dim[i];
        }
        mk_cuda_reads(cb, total * in_dim * 2, 0, rows * in_dim * sizeof(float));
        return mk_cuda_after_launch(cb, mk_kernel_gemv_multi(n, y, data, out_dim, dtype, x->x, rows, in_dim, cb->stream));
    }
    uint32_t types[3];
    size_t wbytes = 0;
    if (dtype == MK_DTYPE_NATIVE && rows <= MK_GEMV_MAX_ROWS && n <= 3 && mk_cuda_gemv_set(n, w, types, &wbytes)) {
        MK_ON_DEVICE(cb);
        const void *data[3];
        size_t out_dim[3];
        for (size_t i = 0; i < n; i++) {
            data[i] = w[i]->data;
            out_dim[i] = w[i]->rows;
        }
        mk_cuda_reads(cb, wbytes, 0, rows * in_dim * sizeof(float));
        return mk_cuda_after_launch(
            cb, mk_kernel_gemv_q_multi(n, y, data, types, out_dim, x->x, rows, in_dim, cb->stream));
    }
    for (size_t i = 0; i < n; i++) MK_TRY(cuda_matmul(b, y[i], x, w[i], rows));
    return MK_OK;
}

static mk_status cuda_swiglu(mk_backend *b, float *out, const float *gate, const float *up, size_t n);

/* gate = silu(x w_gate^T) * (x w_up^T): one launch for decode rows with 16-bit or native
 * weights (the same bits as the three launches it replaces). */
static mk_status cuda_matmul_swiglu(mk_backend *b, float *gate, float *up, const mk_gemm_input *x,
                                    const mk_weight *w_gate, const mk_weight *w_up, size_t rows) {
    mk_cuda_backend *cb = cuda_of(b);
    const mk_dtype dtype = cb->base.config.weight_dtype;
    const size_t in_dim = w_gate->cols, out_dim = w_gate->rows;
    if (w_up->rows != out_dim || w_up->cols != in_dim)
        return mk_fail(MK_ERR_SHAPE, "swiglu: gate [%zu, %zu] and up [%zu, %zu] differ", out_dim, in_dim, w_up->rows,
                       w_up->cols);
    if ((dtype == MK_DTYPE_F16 || dtype == MK_DTYPE_BF16) && rows <= MK_GEMV_MAX_ROWS) {
        MK_ON_DEVICE(cb);
        mk_cuda_reads(cb, 2 * out_dim * in_dim * 2, 0, rows * in_dim * sizeof(float));
        return mk_cuda_after_launch(
            cb, mk_kernel_gemv_swiglu(gate, x->x, w_gate->data, w_up->data, dtype, rows, in_dim, out_dim, cb->stream));
    }
    const mk_weight *const wgu[2] = {w_gate, w_up};
    uint32_t types[2];
    size_t wbytes = 0;
    if (dtype == MK_DTYPE_NATIVE && rows <= MK_GEMV_MAX_ROWS && mk_cuda_gemv_set(2, wgu, types, &wbytes)) {
        MK_ON_DEVICE(cb);
        mk_cuda_reads(cb, wbytes, 0, rows * in_dim * sizeof(float));
        return mk_cuda_after_launch(cb, mk_kernel_gemv_q_swiglu(gate, x->x, w_gate->data, types[0], w_up->data, types[1],
                                                                rows, in_dim, out_dim, cb->stream));
    }
    MK_TRY(cuda_matmul(b, gate, x, w_gate, rows));
    MK_TRY(cuda_matmul(b, up, x, w_up, rows));
    return cuda_swiglu(b, gate, gate, up, rows * out_dim);
}

static mk_status cuda_rope(mk_backend *b, float *x, const int32_t *positions, size_t rows, size_t heads,
                           size_t head_dim, float theta, mk_rope_layout layout) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    mk_cuda_reads(cb, 0, 0, rows * heads * head_dim * sizeof(float) + rows * sizeof(int32_t));
    return mk_cuda_after_launch(cb, mk_kernel_rope(x, positions, rows, heads, head_dim, theta, layout, cb->stream));
}

static mk_status cuda_rope_kv(mk_backend *b, float *q, float *k, const float *v, void *k_cache, void *v_cache,
                              mk_kv_pages pages, const int32_t *positions, size_t past, size_t rows, size_t n_heads, size_t n_kv_heads,
                              size_t head_dim, float theta, mk_rope_layout layout) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    mk_cuda_reads(cb, 0, 0, rows * (n_heads + 2 * n_kv_heads) * head_dim * sizeof(float) + rows * sizeof(int32_t));
    (void)past; /* the slots are positions[r], read on the device: the same launch every token */
    return mk_cuda_after_launch(cb, mk_kernel_rope_kv(q, k, v, k_cache, v_cache, pages, mk_backend_kv_dtype(b), positions,
                                                      cb->max_context, rows, n_heads, n_kv_heads, head_dim, theta,
                                                      layout, cb->stream));
}

static mk_status cuda_attention(mk_backend *b, float *out, const float *q, const void *k_cache, const void *v_cache,
                                mk_kv_pages pages, const int32_t *positions, size_t rows, size_t past, size_t n_heads, size_t n_kv_heads,
                                size_t head_dim) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    mk_cuda_reads(cb, 0, 2 * (past + rows) * n_kv_heads * head_dim * mk_dtype_size(mk_backend_kv_dtype(b)),
                  rows * n_heads * head_dim * sizeof(float)); /* the cache rows once; q */
    /* Every one-row forward (decode), and a batch's decode rows of many sequences (a row
     * stride), take the flash-decoding kernel: each row's key count comes from positions on
     * the device and the grid from the cache capacity, so the choice and the launch never
     * depend on `past` (a captured decode step replays unchanged). */
    if (rows == 1 || pages.row_stride)
        return mk_cuda_after_launch(cb, mk_kernel_attention_decode(out, q, k_cache, v_cache, pages, mk_backend_kv_dtype(b),
                                                                   positions, rows, cb->max_context, n_heads, n_kv_heads,
                                                                   head_dim, cb->decode_ws, cb->decode_ws_bytes,
                                                                   cb->stream));
    /* Prefill in speed mode: the tensor cores (BF16 inputs, F32 accumulation). Parity mode,
     * and a head_dim the tensor-core kernel cannot tile, keep the F32 kernel. */
    if ((cb->base.config.speed_mode || cb->base.config.weight_dtype != MK_DTYPE_F32) &&
        mk_kernel_attention_prefill_tc_supports(head_dim))
        return mk_cuda_after_launch(cb, mk_kernel_attention_prefill_tc(out, q, k_cache, v_cache, pages, mk_backend_kv_dtype(b),
                                                                       rows, past, n_heads, n_kv_heads, head_dim,
                                                                       cb->stream));
    return mk_cuda_after_launch(cb, mk_kernel_attention_prefill_kv(out, q, k_cache, v_cache, pages, mk_backend_kv_dtype(b), rows,
                                                                   past, n_heads, n_kv_heads, head_dim, cb->stream));
}

static mk_status cuda_swiglu(mk_backend *b, float *out, const float *gate, const float *up, size_t n) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    mk_cuda_reads(cb, 0, 0, 2 * n * sizeof(float));
    return mk_cuda_after_launch(cb, mk_kernel_swiglu(out, gate, up, MK_DTYPE_F32, n, cb->stream));
}

static mk_status cuda_add(mk_backend *b, float *y, const float *x, size_t n) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    mk_cuda_reads(cb, 0, 0, 2 * n * sizeof(float));
    return mk_cuda_after_launch(cb, mk_kernel_add(y, x, n, cb->stream));
}

static mk_status cuda_argmax(mk_backend *b, int32_t *out, const float *x, size_t rows, size_t n) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    mk_cuda_reads(cb, 0, 0, rows * n * sizeof(float));
    return mk_cuda_after_launch(cb, mk_kernel_argmax(out, x, rows, n, cb->stream));
}

/* =========================================================== decode steps == */

/* Records the ops issued from here to step_end on the range's stream (thread-local mode:
 * other threads' ranges may allocate meanwhile; this thread may not, nor wait). The
 * launches counted while recording are given back at step_end: nothing ran. */
static mk_status cuda_step_begin(mk_backend *b, size_t keys) {
    mk_cuda_backend *cb = cuda_of(b);
    MK_ON_DEVICE(cb);
    if (cb->capturing) return mk_fail(MK_ERR_INTERNAL, "cuda backend: a step is already being recorded");
    pthread_mutex_lock(&cb->stream_mu); /* no other thread's peer copy on this stream until step_end */
    const cudaError_t cudaStreamBeginCapture_ = cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal);
    if (cudaStreamBeginCapture_ != cudaSuccess) pthread_mutex_unlock(&cb->stream_mu);
    MK_CUDA_CHECK(cudaStreamBeginCapture_);
    cb->capturing = true;
    cb->capture_start = cb->base.counters;
    cb->capture_keys = keys;
    return MK_OK;
}

static mk_status cuda_step_end(mk_backend *b, void **out) {
    mk_cuda_backend *cb = cuda_of(b);
    *out = NULL;
    MK_ON_DEVICE(cb);
    if (!cb->capturing) return mk_fail(MK_ERR_INTERNAL, "cuda backend: no step is being recorded");
    cb->capturing = false;
    mk_backend_counters recorded = cb->base.counters; /* the counts of ops that did not run yet */
    recorded.launches -= cb->capture_start.launches;
    recorded.bytes_read -= cb->capture_start.bytes_read;
    recorded.weight_bytes_read -= cb->capture_start.weight_bytes_read;
    recorded.kv_bytes_read -= cb->capture_start.kv_bytes_read;
    cb->base.counters.launches = cb->capture_start.launches;
    cb->base.counters.bytes_read = cb->capture_start.bytes_read;
    cb->base.counters.weight_bytes_read = cb->capture_start.weight_bytes_read;
    cb->base.counters.kv_bytes_read = cb->capture_start.kv_bytes_read;
    cudaGraph_t graph = NULL;
    const cudaError_t cudaStreamEndCapture_ = cudaStreamEndCapture(cb->stream, &graph); /* an invalidated capture ends here */
    pthread_mutex_unlock(&cb->stream_mu);
    MK_CUDA_CHECK(cudaStreamEndCapture_);
    mk_cuda_step *step = calloc(1, sizeof *step);
    cudaError_t err = step ? cudaGraphInstantiate(&step->exec, graph, 0) : cudaSuccess;
    cudaGraphDestroy(graph); /* the executable form stands alone */
    if (!step) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cuda backend: out of memory for a decode step");
    if (err != cudaSuccess) {
        free(step);
        MK_CUDA_CHECK(err);
    }
    step->recorded = recorded;
    step->keys = cb->capture_keys;
    cb->base.counters.graph_captures++;
    *out = step;
    return MK_OK;
}

static mk_status cuda_step_launch(mk_backend *b, void *step, size_t keys) {
    mk_cuda_backend *cb = cuda_of(b);
    const mk_cuda_step *st = step;
    MK_ON_DEVICE(cb);
    MK_CUDA_CHECK(cudaGraphLaunch(st->exec, cb->stream));
    /* The recorded counts; the KV rows attention reads grow with the key count (linearly:
     * 2 * keys * kv_dim * element size per layer), the rest is the same every token. */
    const uint64_t kv = st->keys ? st->recorded.kv_bytes_read / st->keys * keys : 0;
    cb->base.counters.launches += st->recorded.launches;
    cb->base.counters.weight_bytes_read += st->recorded.weight_bytes_read;
    cb->base.counters.kv_bytes_read += kv;
    cb->base.counters.bytes_read += st->recorded.bytes_read - st->recorded.kv_bytes_read + kv;
    cb->base.counters.graph_launches++;
#ifndef NDEBUG
    MK_CUDA_CHECK(cudaStreamSynchronize(cb->stream)); /* a fault reported at its step */
#endif
    return MK_OK;
}

static void cuda_step_destroy(mk_backend *b, void *step) {
    mk_cuda_step *st = step;
    if (!st) return;
    MK_DEVICE_SCOPE(scope);
    if (mk_device_scope_enter(&scope, cuda_of(b)->device)) cudaGraphExecDestroy(st->exec);
    (void)cudaGetLastError(); /* teardown reports nothing */
    free(st);
}

static const mk_backend_ops mk_cuda_ops = {
    .name = "cuda",
    .decode_rows = true,
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .synchronize = cuda_synchronize,
    .reserve = cuda_reserve,
    .upload_weight = cuda_upload_weight,
    .host_alloc = cuda_host_alloc,
    .host_release = cuda_host_release,
    .download_async = cuda_download_async,
    .upload_async = cuda_upload_async,
    .copy_from_peer = cuda_copy_from_peer,
    .native_stream = cuda_native_stream,
    .native_weight_bytes = cuda_native_weight_bytes,
    .upload_native_weight = cuda_upload_native_weight,
    .embed = cuda_embed,
    .gemm_input = cuda_gemm_input,
    .rmsnorm = cuda_rmsnorm,
    .add_rmsnorm = cuda_add_rmsnorm,
    .matmul = cuda_matmul,
    .gemm_rows_alone = cuda_gemm_rows_alone,
    .matmul_shared = cuda_matmul_shared,
    .matmul_swiglu = cuda_matmul_swiglu,
    .rope = cuda_rope,
    .rope_kv = cuda_rope_kv,
    .attention = cuda_attention,
    .swiglu = cuda_swiglu,
    .add = cuda_add,
    .argmax = cuda_argmax,
    .step_begin = cuda_step_begin,
    .step_end = cuda_step_end,
    .step_launch = cuda_step_launch,
    .step_destroy = cuda_step_destroy,
};

static mk_status mk_cuda_backend_init(mk_cuda_backend *cb) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return mk_fail(MK_ERR_NO_DEVICE, "no CUDA device is available (%s); use --backend cpu",
                       err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
    }
    if (cb->device < 0 || cb->device >= count)
        return mk_fail(MK_ERR_DEVICE_INDEX, "CUDA device %d does not exist (this machine has %d)", cb->device, count);
    if (pthread_mutex_init(&cb->stream_mu, NULL) != 0) return mk_fail(MK_ERR_INTERNAL, "cuda backend: stream lock");
    cb->stream_mu_ready = true;
    MK_ON_DEVICE(cb);
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
    MK_CUDA_CHECK(cudaEventCreateWithFlags(&cb->seam_event, cudaEventDisableTiming));
    MK_CUBLAS_CHECK(cublasCreate(&cb->cublas));
    MK_CUBLAS_CHECK(cublasSetStream(cb->cublas, cb->stream));
    /* Parity mode must never down-convert F32 inputs to TF32 behind our back. */
    MK_CUBLAS_CHECK(cublasSetMathMode(cb->cublas, cb->base.config.speed_mode ? CUBLAS_DEFAULT_MATH
                                                                             : CUBLAS_PEDANTIC_MATH));
    return MK_OK;
}

mk_status mk_backend_cuda_create(const mk_backend_config *config, mk_backend **out) {
    if (config->weight_dtype != MK_DTYPE_F32 && config->weight_dtype != MK_DTYPE_F16 &&
        config->weight_dtype != MK_DTYPE_BF16 && config->weight_dtype != MK_DTYPE_NATIVE)
        return mk_fail(MK_ERR_DTYPE, "cuda backend: weight dtype %s is not one of f32, f16, bf16, native",
                       mk_dtype_name(config->weight_dtype));
    /* The KV cache: F32 (parity), or F16/BF16 (speed: half the bytes decode attention reads). */
    if (config->kv_dtype != 0 && config->kv_dtype != MK_DTYPE_F32 && config->kv_dtype != MK_DTYPE_F16 &&
        config->kv_dtype != MK_DTYPE_BF16)
        return mk_fail(MK_ERR_DTYPE, "cuda backend: KV cache dtype %s is not f32, f16 or bf16",
                       mk_dtype_name(config->kv_dtype));
    mk_cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return mk_fail(MK_ERR_OUT_OF_MEMORY, "cuda backend: out of memory");
    cb->base.ops = &mk_cuda_ops;
    cb->base.config = *config;
    cb->device = config->device;
    const mk_status s = mk_cuda_backend_init(cb);
    if (s != MK_OK) {
        cuda_destroy(&cb->base);
        return s;
    }
    *out = &cb->base;
    return MK_OK;
}
