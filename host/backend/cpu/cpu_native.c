/* Native-format weights on the cpu backend (see cpu_native.h). */
#include "backend/cpu/cpu_native.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "model/gguf.h"
#include "mk_error.h"

/* Output features per chunk handed to a thread: enough work to amortize the hand-out,
 * small enough that two threads finish a 192-row product together. */
enum { MK_NATIVE_ROWS_PER_CHUNK = 16 };

static uint32_t mk_native_stored_type(uint32_t type) { return mk_cpu_quant_keeps(type) ? type : MK_GGML_TYPE_F32; }

static size_t mk_native_row_bytes(uint32_t stored, size_t cols) {
    size_t be, bb;
    if (!mk_ggml_type_layout(stored, &be, &bb) || cols % be != 0) return 0;
    return cols / be * bb;
}

size_t mk_cpu_native_weight_bytes(uint32_t type, size_t rows, size_t cols) {
    if (!mk_ggml_type_layout(type, NULL, NULL) || !mk_ggml_type_can_dequantize(type)) return 0;
    const size_t row_bytes = mk_native_row_bytes(mk_native_stored_type(type), cols);
    if (!row_bytes || rows > SIZE_MAX / row_bytes) return 0;
    return rows * row_bytes;
}

mk_status mk_cpu_native_store(mk_weight *w, uint32_t type, const void *src, size_t src_bytes) {
    const size_t rows = w->rows, cols = w->cols;
    if (!mk_cpu_native_weight_bytes(type, rows, cols))
        return mk_fail(MK_ERR_DTYPE, "native weight [%zu, %zu] of ggml type %s cannot be stored", rows, cols,
                       mk_ggml_type_name(type) ? mk_ggml_type_name(type) : "unknown");
    const uint32_t stored = mk_native_stored_type(type);
    const size_t row_bytes = mk_native_row_bytes(stored, cols);
    uint8_t *data = (uint8_t *)(uintptr_t)w->data; /* the caller's memory, handed over to be filled */
    w->format = stored;
    if (stored == type) {
        if (src_bytes != rows * row_bytes)
            return mk_fail(MK_ERR_DATA_LENGTH, "native weight [%zu, %zu] %s: %zu bytes given, %zu expected", rows, cols,
                           mk_ggml_type_name(type), src_bytes, rows * row_bytes);
        memcpy(data, src, src_bytes);
        return MK_OK;
    }
    /* A format without a native kernel: dequantized once, kept as F32. */
    return mk_gguf_dequantize(type, src, src_bytes, (float *)data, rows * cols);
}

/* ================================================================ matmul == */

/* One weight of a decode product: its rows, the kernel and where its outputs go. */
typedef struct mk_native_part {
    const mk_weight *w;
    const uint8_t *data;
    size_t row_bytes;
    mk_qdot_fn qdot;               /* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (over xq) */
    mk_qdot8_fn qdot8;             /* eight weight rows x up to dotn_rows activation rows (same formats) */
    mk_kdot_fn kdot;               /* Q3_K, Q4_K, Q5_K, Q6_K (over xk) */
    mk_kdotn_fn kdotn;             /* the same, up to dotn_rows rows at a time */
    mk_hdot_fn hdot;               /* F16 / BF16 */
    float *y;                      /* [rows, w->rows] */
} mk_native_part;

/* A decode product of up to MK_NATIVE_MAX_PARTS weights sharing one input: the output
 * features of all parts, one after the other, form the job's items. */
enum { MK_NATIVE_MAX_PARTS = 3 };

typedef struct mk_native_job {
    const mk_cpu_native *ctx;
    size_t n_parts;
    mk_native_part part[MK_NATIVE_MAX_PARTS];
    const float *x; /* [rows, in] */
    size_t rows, in;
    bool swiglu;    /* parts gate and up: gate = silu(gate) * up, per item */
    bool blocks;    /* a part reads the rows of quantize_row (xq) */
    bool k_blocks;  /* a part reads the rows of quantize_row_k (xk) */
} mk_native_job;

/* Quantize activation rows [begin, end) the ways the parts read them: blocks of 32, blocks
 * of 256 for the K-quants. */
static void mk_native_quantize(void *arg, size_t begin, size_t end, size_t thread) {
    const mk_native_job *j = arg;
    const size_t per_row = j->in / MK_Q8_BLOCK, k_per_row = j->in / MK_Q8K_BLOCK;
    for (size_t r = begin; r < end; r++) {
        if (j->blocks) j->ctx->kernels->quantize_row(j->ctx->xq + r * per_row, j->x + r * j->in, j->in);
        if (j->k_blocks) j->ctx->kernels->quantize_row_k(j->ctx->xk + r * k_per_row, j->x + r * j->in, j->in);
    }
}

/* Weight rows [o0, o1) of a part with an eight-row dot against activation rows r..r+n-1
 * (xq): eight at a time; a last group of fewer takes the part's eight rows that end where
 * it ends (the rows before it computed again, not written: every output's bits depend only
 * on its two rows), and a part of fewer than eight rows goes row by row (row_bytes 0: the
 * row in every lane). */
static void mk_native_rows8(const mk_native_part *p, const mk_q8_block *const *xq, size_t n, size_t in, size_t r,
                            size_t o0, size_t o1) {
    const size_t out = p->w->rows;
    float v[8 * MK_QDOTN_MAX_ROWS];
    for (size_t o = o0; o < o1;) {
        const size_t take = o1 - o < 8 ? o1 - o : 8;
        if (out < 8) {
            p->qdot8(p->data + o * p->row_bytes, 0, xq, n, in, v);
            for (size_t k = 0; k < n; k++) p->y[(r + k) * out + o] = v[8 * k];
            o++;
            continue;
        }
        const size_t first = o + 8 <= out ? o : out - 8;
        p->qdot8(p->data + first * p->row_bytes, p->row_bytes, xq, n, in, v);
        for (size_t k = 0; k < n; k++)
            for (size_t i = o - first; i < o - first + take; i++) p->y[(r + k) * out + first + i] = v[8 * k + i];
        o += take;
    }
}

/* Output features [begin, end) of one part for every activation row: each weight row is
 * read from memory once and stays in L1 while it meets every activation row. */
static void mk_native_part_rows(const mk_native_job *j, const mk_native_part *p, size_t begin, size_t end) {
    const size_t in = j->in, out = p->w->rows, per_row = in / MK_Q8_BLOCK, k_per_row = in / MK_Q8K_BLOCK;
    if (p->qdot8 || p->kdotn) {
        /* Up to the table's dotn_rows activation rows per call (the weight rows are unpacked once
         * for them: eight at a time for the blocks of 32, one for the K-quants), over a tile of
         * weight rows: the tile stays in L1 for every group of activation rows, and each group's
         * activations are read once per tile rather than once per weight row (64 rows of a
         * 1536-wide input are 120 KiB: L2, not L1). Every output's bits depend only on its
         * weight row and activation row, so the grouping changes none. */
        enum { MK_WEIGHT_TILE = 16 };
        const size_t group = j->ctx->kernels->dotn_rows;
        for (size_t o0 = begin; o0 < end; o0 += MK_WEIGHT_TILE) {
            const size_t o1 = end - o0 < MK_WEIGHT_TILE ? end : o0 + MK_WEIGHT_TILE;
            for (size_t r = 0; r < j->rows; r += group) {
                const size_t n = j->rows - r < group ? j->rows - r : group;
                if (p->qdot8) {
                    const mk_q8_block *xq[MK_QDOTN_MAX_ROWS];
                    for (size_t k = 0; k < n; k++) xq[k] = j->ctx->xq + (r + k) * per_row;
                    mk_native_rows8(p, xq, n, in, r, o0, o1);
                    continue;
                }
                const mk_q8k_block *xk[MK_QDOTN_MAX_ROWS];
                for (size_t k = 0; k < n; k++) xk[k] = j->ctx->xk + (r + k) * k_per_row;
                for (size_t o = o0; o < o1; o++) {
                    const uint8_t *wr = p->data + o * p->row_bytes;
                    float v[MK_QDOTN_MAX_ROWS];
                    p->kdotn(wr, xk, n, in, v);
                    for (size_t k = 0; k < n; k++) p->y[(r + k) * out + o] = v[k];
                }
            }
        }
        return;
    }
    for (size_t o = begin; o < end; o++) {
        const uint8_t *wr = p->data + o * p->row_bytes;
        if (p->qdot) {
            for (size_t r = 0; r < j->rows; r++) p->y[r * out + o] = p->qdot(wr, j->ctx->xq + r * per_row, in);
        } else if (p->kdot) {
            for (size_t r = 0; r < j->rows; r++) p->y[r * out + o] = p->kdot(wr, j->ctx->xk + r * k_per_row, in);
        } else {
            for (size_t r = 0; r < j->rows; r++) p->y[r * out + o] = p->hdot((const uint16_t *)wr, j->x + r * in, in);
        }
    }
}

/* Items [begin, end) of the job: the part(s) they fall in; SwiGLU on the same items. */
static void mk_native_rows(void *arg, size_t begin, size_t end, size_t thread) {
    const mk_native_job *j = arg;
    if (j->swiglu) {
        const size_t out = j->part[0].w->rows;
        mk_native_part_rows(j, &j->part[0], begin, end);
        mk_native_part_rows(j, &j->part[1], begin, end);
        for (size_t r = 0; r < j->rows; r++)
            mk_cpu_swiglu(j->part[0].y + r * out + begin, j->part[0].y + r * out + begin,
                          j->part[1].y + r * out + begin, end - begin);
        return;
    }
    size_t first = 0;
    for (size_t i = 0; i < j->n_parts && begin < end; i++) {
        const size_t n = j->part[i].w->rows;
        if (begin < first + n) {
            const size_t stop = end < first + n ? end : first + n;
            mk_native_part_rows(j, &j->part[i], begin - first, stop - first);
            begin = stop;
        }
        first += n;
    }
}

/* The part for weight w writing y; MK_ERR_INTERNAL without a kernel. */
static mk_status mk_native_part_of(const mk_cpu_native *ctx, const mk_weight *w, float *y, mk_native_part *p) {
    *p = (mk_native_part){.w = w, .data = w->data, .row_bytes = mk_native_row_bytes(w->format, w->cols), .y = y};
    if (w->format == MK_GGML_TYPE_F16) p->hdot = ctx->kernels->dot_f16;
    else if (w->format == MK_GGML_TYPE_BF16) p->hdot = ctx->kernels->dot_bf16;
    else {
        p->qdot = mk_cpu_quant_dot_for(ctx->kernels, w->format);
        p->kdot = mk_cpu_quant_kdot_for(ctx->kernels, w->format);
        p->kdotn = mk_cpu_quant_kdotn_for(ctx->kernels, w->format);
    }
    p->qdot8 = mk_cpu_quant_dot8_for(ctx->kernels, w->format);
    if (!p->qdot && !p->kdot && !p->hdot)
        return mk_fail(MK_ERR_INTERNAL, "native matmul: no kernel for %s", mk_ggml_type_name(w->format));
    return MK_OK;
}

/* The job's activations quantized once (when a part needs them), then every item in one
 * pass of the pool. */
static mk_status mk_native_run(mk_native_job *j) {
    bool quantized = false;
    size_t items = 0;
    for (size_t i = 0; i < j->n_parts; i++) {
        const mk_native_part *p = &j->part[i];
        j->blocks = j->blocks || p->qdot || p->qdot8;
        j->k_blocks = j->k_blocks || p->kdot || p->kdotn;
        quantized = quantized || j->blocks || j->k_blocks;
        items += p->w->rows;
    }
    if (j->swiglu) items = j->part[0].w->rows;
    if (quantized) {
        const size_t blocks = j->rows * (j->in / MK_Q8_BLOCK);
        const size_t k_blocks = j->k_blocks ? j->rows * (j->in / MK_Q8K_BLOCK) : 0;
        if (j->in % MK_Q8_BLOCK != 0 || blocks > j->ctx->xq_blocks ||
            (j->k_blocks && j->in % MK_Q8K_BLOCK != 0) || k_blocks > j->ctx->xk_blocks)
            return mk_fail(MK_ERR_INTERNAL, "native matmul: %zu x %zu activations exceed the reserved scratch",
                           j->rows, j->in);
        mk_cpu_pool_run(j->ctx->pool, j->rows, 1, mk_native_quantize, j);
    }
    mk_cpu_pool_run(j->ctx->pool, items, MK_NATIVE_ROWS_PER_CHUNK, mk_native_rows, j);
    return MK_OK;
}

/* True when the kernel table multiplies weight rows of `format` with several activation rows
 * per call (an n-row dot: the blocks of 32 and the K-quants in the SIMD tables). */
static bool mk_native_has_rows_dot(const mk_cpu_native *ctx, uint32_t format) {
    return mk_cpu_quant_dot8_for(ctx->kernels, format) || mk_cpu_quant_kdotn_for(ctx->kernels, format);
}

bool mk_cpu_native_takes_tiles(const mk_cpu_native *ctx, uint32_t format) {
    if (!ctx->kernels || format == MK_GGML_TYPE_F32) return false;
    return !mk_native_has_rows_dot(ctx, format);
}

/* True when a product of `rows` rows over weight w goes through the dot kernels (the
 * choice depends on the rows, the stored type and the table alone, never on the threads).
 * A format with an n-row dot takes the dots at any count: a 288-token prefill ran 1.4-1.5x
 * faster through them than through dequantized tiles and SGEMM (SmolLM2 Q4_1 and a Q4_K_M
 * file, Zen 4, both tables), and a prompt's rows then have the bits they have alone. */
static bool mk_native_uses_dots(const mk_cpu_native *ctx, const mk_weight *w, size_t rows, bool alone) {
    return w->format != MK_GGML_TYPE_F32 && (alone || rows < MK_NATIVE_GEMM_MIN_ROWS || !ctx->wtile ||
                                             mk_native_has_rows_dot(ctx, w->format));
}

/* Products of many rows: tiles of MK_NATIVE_GEMM_TILE output features, each dequantized
 * by one thread into its own scratch and multiplied by one SGEMM call from that thread. */
typedef struct mk_tile_job {
    const mk_cpu_native *ctx;
    const mk_weight *w;
    const uint8_t *data;
    size_t row_bytes;
    float *y;       /* [rows, out] */
    const float *x; /* [rows, in] */
    size_t rows;
    bool failed;
} mk_tile_job;

static void mk_native_tiles(void *arg, size_t begin, size_t end, size_t thread) {
    mk_tile_job *j = arg;
    const size_t in = j->w->cols, out = j->w->rows;
    float *tile = j->ctx->wtile + thread * (size_t)MK_NATIVE_GEMM_TILE * in; /* [tile rows, in] */
    for (size_t t = begin; t < end; t++) {
        const size_t first = t * MK_NATIVE_GEMM_TILE;
        const size_t n = out - first < MK_NATIVE_GEMM_TILE ? out - first : MK_NATIVE_GEMM_TILE;
        for (size_t r = 0; r < n; r++)
            if (mk_gguf_dequantize(j->w->format, j->data + (first + r) * j->row_bytes, j->row_bytes, tile + r * in,
                                   in) != MK_OK)
                j->failed = true; /* cannot happen: the layout was checked at load */
        mk_cpu_sgemm_strided(j->y + first, out, j->x, tile, j->rows, in, n);
    }
}

size_t mk_cpu_native_rows_alone(const mk_cpu_native *ctx) {
    (void)ctx; /* the dot path at any count, asked for by `alone` */
    return SIZE_MAX;
}

mk_status mk_cpu_native_matmul(const mk_cpu_native *ctx, float *y, const float *x, const mk_weight *w, size_t rows,
                               bool alone) {
    const size_t in_dim = w->cols, out_dim = w->rows;
    const uint8_t *data = w->data;
    if (w->format == MK_GGML_TYPE_F32) {
        mk_cpu_matmul(y, x, (const float *)data, rows, in_dim, out_dim);
        return MK_OK;
    }
    /* The path depends on the row count and `alone` (never on the threads), so results do too. */
    if (!mk_native_uses_dots(ctx, w, rows, alone)) {
        if (in_dim * MK_NATIVE_GEMM_TILE * mk_cpu_pool_threads(ctx->pool) > ctx->wtile_elems)
            return mk_fail(MK_ERR_INTERNAL, "native matmul: weight tiles of width %zu exceed the reserved scratch",
                           in_dim);
        mk_tile_job tiles = {.ctx = ctx, .w = w, .data = data, .row_bytes = mk_native_row_bytes(w->format, in_dim),
                             .y = y, .x = x, .rows = rows, .failed = false};
        const size_t n_tiles = (out_dim + MK_NATIVE_GEMM_TILE - 1) / MK_NATIVE_GEMM_TILE;
        /* A multi-threaded OpenBLAS gets the tiles one after the other (its threads split
         * each one); tiles from several of our threads at once would oversubscribe. */
        if (mk_cpu_blas_threads() > 1) mk_native_tiles(&tiles, 0, n_tiles, 0);
        else mk_cpu_pool_run(ctx->pool, n_tiles, 1, mk_native_tiles, &tiles);
        if (tiles.failed) return mk_fail(MK_ERR_INTERNAL, "native matmul: a weight tile did not dequantize");
        return MK_OK;
    }
    mk_native_job job = {.ctx = ctx, .n_parts = 1, .x = x, .rows = rows, .in = in_dim};
    MK_TRY(mk_native_part_of(ctx, w, y, &job.part[0]));
    return mk_native_run(&job);
}

mk_status mk_cpu_native_matmul_shared(const mk_cpu_native *ctx, size_t n, float *const *y, const mk_weight *const *w,
                                      const float *x, size_t rows, bool alone) {
    bool dots = n <= MK_NATIVE_MAX_PARTS;
    for (size_t i = 0; i < n; i++) {
        if (w[i]->cols != w[0]->cols)
            return mk_fail(MK_ERR_SHAPE, "native matmul: weights sharing an input are %zu and %zu wide", w[0]->cols,
                           w[i]->cols);
        dots = dots && mk_native_uses_dots(ctx, w[i], rows, alone);
    }
    if (!dots) {
        for (size_t i = 0; i < n; i++) MK_TRY(mk_cpu_native_matmul(ctx, y[i], x, w[i], rows, alone));
        return MK_OK;
    }
    mk_native_job job = {.ctx = ctx, .n_parts = n, .x = x, .rows = rows, .in = w[0]->cols};
    for (size_t i = 0; i < n; i++) MK_TRY(mk_native_part_of(ctx, w[i], y[i], &job.part[i]));
    return mk_native_run(&job);
}

mk_status mk_cpu_native_matmul_swiglu(const mk_cpu_native *ctx, float *gate, float *up, const float *x,
                                      const mk_weight *w_gate, const mk_weight *w_up, size_t rows, bool alone) {
    if (w_gate->rows != w_up->rows || w_gate->cols != w_up->cols)
        return mk_fail(MK_ERR_SHAPE, "native swiglu: gate [%zu, %zu] and up [%zu, %zu] differ", w_gate->rows,
                       w_gate->cols, w_up->rows, w_up->cols);
    if (!mk_native_uses_dots(ctx, w_gate, rows, alone) || !mk_native_uses_dots(ctx, w_up, rows, alone)) {
        MK_TRY(mk_cpu_native_matmul(ctx, gate, x, w_gate, rows, alone));
        MK_TRY(mk_cpu_native_matmul(ctx, up, x, w_up, rows, alone));
        mk_cpu_swiglu(gate, gate, up, rows * w_gate->rows);
        return MK_OK;
    }
    mk_native_job job = {.ctx = ctx, .n_parts = 2, .x = x, .rows = rows, .in = w_gate->cols, .swiglu = true};
    MK_TRY(mk_native_part_of(ctx, w_gate, gate, &job.part[0]));
    MK_TRY(mk_native_part_of(ctx, w_up, up, &job.part[1]));
    return mk_native_run(&job);
}

/* ================================================================= embed == */

mk_status mk_cpu_native_embed(float *out, const mk_weight *w, const int32_t *ids, size_t n) {
    const size_t hidden = w->cols, row_bytes = mk_native_row_bytes(w->format, hidden);
    const uint8_t *data = w->data;
    for (size_t i = 0; i < n; i++)
        MK_TRY(mk_gguf_dequantize(w->format, data + (size_t)ids[i] * row_bytes, row_bytes, out + i * hidden, hidden));
    return MK_OK;
}
