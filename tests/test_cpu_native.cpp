// The cpu backend's native-format kernels: every format's matrix product against the F32
// dequantize-then-multiply reference over odd shapes (tolerance from the format), the
// SIMD kernels against the portable ones, and thread-count invariance bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/cpu_attention_fast.h"
#include "backend/cpu/cpu_native.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_pool.h"
#include "backend/cpu/cpu_quant.h"
#include "model/gguf.h"
#include "mk_test_util.h"

namespace {

struct Format {
    uint32_t type;
    const char *name;
};

const Format kFormats[] = {{MK_GGML_TYPE_Q4_0, "Q4_0"}, {MK_GGML_TYPE_Q4_1, "Q4_1"}, {MK_GGML_TYPE_Q5_0, "Q5_0"},
                           {MK_GGML_TYPE_Q5_1, "Q5_1"}, {MK_GGML_TYPE_Q8_0, "Q8_0"}, {MK_GGML_TYPE_Q2_K, "Q2_K"},
                           {MK_GGML_TYPE_Q3_K, "Q3_K"}, {MK_GGML_TYPE_Q4_K, "Q4_K"},
                           {MK_GGML_TYPE_Q5_K, "Q5_K"}, {MK_GGML_TYPE_Q6_K, "Q6_K"}, {MK_GGML_TYPE_IQ4_NL, "IQ4_NL"},
                           {MK_GGML_TYPE_IQ4_XS, "IQ4_XS"}, {MK_GGML_TYPE_F16, "F16"},   {MK_GGML_TYPE_BF16, "BF16"}};

// The quantized formats with a kernel: the blocks of 32 (eight weight rows per call in the
// SIMD tables), then the K-quants and IQ4_XS (one weight row per call).
const uint32_t kBlocksOf32[] = {MK_GGML_TYPE_Q4_0, MK_GGML_TYPE_Q4_1, MK_GGML_TYPE_Q5_0, MK_GGML_TYPE_Q5_1,
                                MK_GGML_TYPE_Q8_0, MK_GGML_TYPE_IQ4_NL};
const uint32_t kQuantized[] = {MK_GGML_TYPE_Q4_0, MK_GGML_TYPE_Q4_1, MK_GGML_TYPE_Q5_0, MK_GGML_TYPE_Q5_1,
                               MK_GGML_TYPE_Q8_0, MK_GGML_TYPE_IQ4_NL, MK_GGML_TYPE_Q2_K, MK_GGML_TYPE_Q3_K,
                               MK_GGML_TYPE_Q4_K, MK_GGML_TYPE_Q5_K, MK_GGML_TYPE_Q6_K, MK_GGML_TYPE_IQ4_XS};
// The one stored format without a quantized kernel: F32 (a file's F32 matrices; every
// quantized format the loader reads has a kernel, so none is widened to F32 at load).
const uint32_t kStoredAsF32 = MK_GGML_TYPE_F32;

size_t block_elems(uint32_t type) {
    size_t be = 0, bb = 0;
    mk_ggml_type_layout(type, &be, &bb);
    return be;
}

size_t row_bytes(uint32_t type, size_t cols) {
    size_t be = 0, bb = 0;
    mk_ggml_type_layout(type, &be, &bb);
    return cols / be * bb;
}

void put_f16(uint8_t *p, float v) {
    const uint16_t h = mk_f32_to_f16(v);
    std::memcpy(p, &h, 2);
}

// Random stored rows of a format: random quant bytes with finite, small scales in the
// places the format keeps its f16 fields.
std::vector<uint8_t> random_rows(uint32_t type, size_t rows, size_t cols, std::mt19937 &rng) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.002f, 0.05f), shift(-0.2f, 0.2f), value(-1.0f, 1.0f);
    const size_t rb = row_bytes(type, cols);
    std::vector<uint8_t> w(rows * rb);
    if (type == MK_GGML_TYPE_F32) {
        for (size_t i = 0; i < rows * cols; i++) {
            const float v = value(rng);
            std::memcpy(&w[4 * i], &v, 4);
        }
        return w;
    }
    if (type == MK_GGML_TYPE_F16 || type == MK_GGML_TYPE_BF16) {
        for (size_t i = 0; i < rows * cols; i++) {
            const uint16_t h = type == MK_GGML_TYPE_F16 ? mk_f32_to_f16(value(rng)) : mk_f32_to_bf16(value(rng));
            std::memcpy(&w[2 * i], &h, 2);
        }
        return w;
    }
    for (auto &b : w) b = (uint8_t)byte(rng);
    size_t be = 0, bb = 0;
    mk_ggml_type_layout(type, &be, &bb);
    for (size_t blk = 0; blk < rows * cols / be; blk++) {
        uint8_t *p = &w[blk * bb];
        switch (type) {
            case MK_GGML_TYPE_Q4_0: case MK_GGML_TYPE_Q5_0: case MK_GGML_TYPE_Q8_0: case MK_GGML_TYPE_IQ4_NL:
                put_f16(p, scale(rng));
                break;
            case MK_GGML_TYPE_IQ4_XS: put_f16(p, scale(rng) * 0.1f); break;
            case MK_GGML_TYPE_Q4_1: case MK_GGML_TYPE_Q5_1: put_f16(p, scale(rng)); put_f16(p + 2, shift(rng)); break;
            case MK_GGML_TYPE_Q4_K: case MK_GGML_TYPE_Q5_K:
                put_f16(p, scale(rng) * 0.1f);
                put_f16(p + 2, scale(rng) * 0.1f);
                break;
            case MK_GGML_TYPE_Q6_K: put_f16(p + 208, scale(rng) * 0.1f); break;
            case MK_GGML_TYPE_Q2_K: put_f16(p + 80, scale(rng) * 0.1f); put_f16(p + 82, scale(rng) * 0.1f); break;
            case MK_GGML_TYPE_Q3_K: put_f16(p + 108, scale(rng) * 0.1f); break;
        }
    }
    return w;
}

std::vector<float> random_floats(size_t n, std::mt19937 &rng) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto &x : v) x = d(rng);
    return v;
}

// A native weight as the backend stores it (its rows, and the mk_weight describing them).
struct NativeWeight {
    std::vector<uint8_t> bytes;
    mk_weight w{};
    NativeWeight(uint32_t type, const std::vector<uint8_t> &rows_data, size_t rows, size_t cols) {
        const size_t n = mk_cpu_native_weight_bytes(type, rows, cols);
        EXPECT_GT(n, 0u);
        bytes.resize(n + 64);
        w = {data(), 0, rows, cols};
        MK_ASSERT_OK_VOID(mk_cpu_native_store(&w, type, rows_data.data(), rows_data.size()));
    }
    // 64-byte aligned view inside the vector.
    void *data() {
        const uintptr_t p = (uintptr_t)bytes.data();
        return (void *)((p + 63) & ~(uintptr_t)63);
    }
    const mk_weight *weight() const { return &w; }
    static void MK_ASSERT_OK_VOID(mk_status s) { ASSERT_EQ(s, MK_OK) << mk_last_error(); }
};

// Owns a pool and the scratch of a native product (activation blocks, one weight tile
// of up to max_in columns for products of many rows).
struct NativeCtx {
    mk_cpu_native ctx{};
    std::vector<mk_q8_block> xq;
    std::vector<mk_q8k_block> xk;
    std::vector<float> wtile;
    NativeCtx(size_t threads, const mk_cpu_quant *kernels, size_t max_blocks, size_t max_in = 1024)
        : xq(max_blocks), xk(max_blocks / 8 + 1), wtile((size_t)MK_NATIVE_GEMM_TILE * max_in * threads) {
        EXPECT_EQ(mk_cpu_pool_create(threads, &ctx.pool), MK_OK) << mk_last_error();
        ctx.kernels = kernels;
        ctx.xq = xq.data();
        ctx.xq_blocks = xq.size();
        ctx.xk = xk.data();
        ctx.xk_blocks = xk.size();
        ctx.wtile = wtile.data();
        ctx.wtile_elems = wtile.size();
    }
    ~NativeCtx() { mk_cpu_pool_free(ctx.pool); }
};

// One activation row quantized the way a weight type's dots read it: blocks of 32, or
// blocks of 256 for the K-quants.
struct QuantRow {
    bool k = false;
    std::vector<mk_q8_block> q;
    std::vector<mk_q8k_block> kq;
    // The value the dots multiply in place of x[i].
    double value(size_t i) const {
        return k ? (double)kq[i / 256].d * kq[i / 256].q[i % 256] : (double)q[i / 32].d * q[i / 32].q[i % 32];
    }
};

bool k_quant(uint32_t type) { return block_elems(type) == 256; }

QuantRow quantize_for(const mk_cpu_quant *t, uint32_t type, const float *x, size_t in) {
    QuantRow r;
    r.k = k_quant(type);
    if (r.k) {
        r.kq.resize(in / 256);
        t->quantize_row_k(r.kq.data(), x, in);
    } else {
        r.q.resize(in / 32);
        t->quantize_row(r.q.data(), x, in);
    }
    return r;
}

// Table t's one-row dot of weight row w (of `type`) with x.
float dot_one(const mk_cpu_quant *t, uint32_t type, const uint8_t *w, const QuantRow &x, size_t in) {
    if (x.k) return mk_cpu_quant_kdot_for(t, type)(w, x.kq.data(), in);
    return mk_cpu_quant_dot_for(t, type)(w, x.q.data(), in);
}

// Table t's n-row dot of one weight row with `rows` activation rows: the K-quants' n-row
// dot, the blocks of 32's eight-row dot with the row given eight times (row_bytes 0, the
// eight lanes checked equal); false where the table has none.
bool dot_rows(const mk_cpu_quant *t, uint32_t type, const uint8_t *w, const QuantRow *const *x, size_t rows,
              size_t in, float *out) {
    const mk_q8_block *xq[MK_QDOTN_MAX_ROWS];
    const mk_q8k_block *xk[MK_QDOTN_MAX_ROWS];
    for (size_t i = 0; i < rows; i++) xq[i] = x[i]->q.data(), xk[i] = x[i]->kq.data();
    if (k_quant(type)) {
        if (!mk_cpu_quant_kdotn_for(t, type)) return false;
        mk_cpu_quant_kdotn_for(t, type)(w, xk, rows, in, out);
        return true;
    }
    if (!mk_cpu_quant_dot8_for(t, type)) return false;
    float v[8 * MK_QDOTN_MAX_ROWS];
    mk_cpu_quant_dot8_for(t, type)(w, 0, xq, rows, in, v);
    for (size_t r = 0; r < rows; r++) {
        for (size_t i = 1; i < 8; i++) EXPECT_EQ(std::memcmp(&v[8 * r], &v[8 * r + i], sizeof(float)), 0) << "lane " << i;
        out[r] = v[8 * r];
    }
    return true;
}

// Weight rows at the ends of their formats' ranges (extreme 1 or 2; 0 leaves them):
// Q4_0 and Q4_1 nibbles all 15 or all 0, Q5_0 and Q5_1 values (nibbles and fifth bits) all 31
// or all 0, Q8_0 bytes -128 or alternating 127/-128, Q4_K scales and
// mins 63 with nibbles 15 or 0 (Q5_K: values 31 or 0), Q3_K values 3 with scales 31 or -4 with -32, Q6_K values all -32 with scales -128 or all 31 with scales
// alternating -128/127, IQ4_NL values all 113 or all -127 (IQ4_XS: with scales 31 or -32).
// The f16 scales stay as random_rows made them.
void set_extreme(uint32_t type, std::vector<uint8_t> &w, size_t rows, size_t in, int extreme) {
    if (!extreme) return;
    if (block_elems(type) == 32) { // the value bytes after the f16 scale(s)
        const size_t bb = row_bytes(type, 32);
        const size_t head = type == MK_GGML_TYPE_Q4_1 || type == MK_GGML_TYPE_Q5_1 ? 4 : 2;
        for (size_t blk = 0; blk < rows * in / 32; blk++)
            for (size_t i = head; i < bb; i++)
                w[blk * bb + i] = type != MK_GGML_TYPE_Q8_0 ? (extreme == 1 ? 0xff : 0x00)
                                                            : (extreme == 1 ? 0x80 : (i % 2 ? 0x7f : 0x80));
    }
    if (type == MK_GGML_TYPE_Q3_K)
        for (size_t blk = 0; blk < rows * in / 256; blk++)
            for (size_t i = 0; i < 108; i++) w[blk * 110 + i] = extreme == 1 ? 0xff : 0x00;
    if (type == MK_GGML_TYPE_Q4_K || type == MK_GGML_TYPE_Q5_K) {
        const size_t bb = row_bytes(type, 256);
        for (size_t blk = 0; blk < rows * in / 256; blk++)
            for (size_t i = 4; i < bb; i++) w[blk * bb + i] = i < 16 || extreme == 1 ? 0xff : 0x00;
    }
    if (type == MK_GGML_TYPE_Q2_K) // scales and mins 15, values 3 (or all 0)
        for (size_t blk = 0; blk < rows * in / 256; blk++)
            for (size_t i = 0; i < 80; i++) w[blk * 84 + i] = extreme == 1 ? 0xff : 0x00;
    if (type == MK_GGML_TYPE_IQ4_XS)
        for (size_t blk = 0; blk < rows * in / 256; blk++)
            for (size_t i = 2; i < 136; i++) w[blk * 136 + i] = extreme == 1 ? 0xff : 0x00;
    if (type == MK_GGML_TYPE_Q6_K)
        for (size_t blk = 0; blk < rows * in / 256; blk++)
            for (size_t i = 0; i < 208; i++)
                w[blk * 210 + i] = i < 192 ? (extreme == 1 ? 0x00 : 0xff) : (extreme == 1 || i % 2 ? 0x80 : 0x7f);
}

// Activations that quantize to +-127 everywhere (extreme 1 and 2: two sign patterns).
std::vector<float> extreme_floats(size_t n, int extreme) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = (i * 7 + extreme) % 3 ? 1.5f : -1.5f;
    return x;
}

const float kSentinel = -12345.5f;

// y = x @ w^T through the native product; sentinels after y must survive.
std::vector<float> native_product(NativeCtx &c, NativeWeight &w, const std::vector<float> &x, size_t rows,
                                  size_t in, size_t out) {
    std::vector<float> y(rows * out + 8, kSentinel);
    EXPECT_EQ(w.weight()->rows, out);
    EXPECT_EQ(w.weight()->cols, in);
    const mk_status s = mk_cpu_native_matmul(&c.ctx, y.data(), x.data(), w.weight(), rows, false);
    EXPECT_EQ(s, MK_OK) << mk_last_error();
    for (size_t i = rows * out; i < y.size(); i++) EXPECT_EQ(y[i], kSentinel) << "wrote past the output";
    y.resize(rows * out);
    return y;
}

std::vector<size_t> cols_for(uint32_t type) {
    if (block_elems(type) == 256) return {256, 768};
    if (block_elems(type) == 32) return {32, 96, 544};
    return {1, 13, 45, 100}; // F16/BF16: any width
}

// Whether /proc/cpuinfo lists the flag (the kernel's own cpuid reading, independent of ours).
bool cpu_flag(const std::string &flag) {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
    return false;
}

// The SIMD tables this CPU runs (AVX2, AVX-VNNI, AVX512-VNNI).
std::vector<const mk_cpu_quant *> simd_tables() {
    std::vector<const mk_cpu_quant *> t;
    for (const mk_cpu_quant *k : {mk_cpu_quant_avx2(), mk_cpu_quant_vnni(), mk_cpu_quant_avx512_vnni()})
        if (k && std::find(t.begin(), t.end(), k) == t.end()) t.push_back(k);
    return t;
}

// Every format, odd shapes, every kernel set this CPU has: the product matches the F32
// dequantize-then-multiply reference within the error the 8-bit activations can cause
// (|x - d q| <= d/2 per value) plus float rounding.
TEST(NativeMatmul, EveryFormatMatchesTheDequantizedReference) {
    std::mt19937 rng(1234);
    std::vector<const mk_cpu_quant *> kernel_sets = simd_tables();
    kernel_sets.insert(kernel_sets.begin(), mk_cpu_quant_portable());
    for (const Format &f : kFormats) {
        for (size_t in : cols_for(f.type)) {
            for (size_t out : {1u, 7u, 33u, 300u}) {
                // 1 and 3 rows: the dot kernels; 40 rows: dequantized tiles and SGEMM for a format
                // without an n-row dot in the table (all in the portable one), else the dots.
                for (size_t rows : {1u, 3u, 40u}) {
                    if ((out == 300) != (rows == 40)) continue; // keep the grid small
                    SCOPED_TRACE(std::string(f.name) + " in " + std::to_string(in) + " out " + std::to_string(out) +
                                 " rows " + std::to_string(rows));
                    const std::vector<uint8_t> wq = random_rows(f.type, out, in, rng);
                    std::vector<float> wf(out * in);
                    MK_ASSERT_OK(mk_gguf_dequantize(f.type, wq.data(), wq.size(), wf.data(), wf.size()));
                    const std::vector<float> x = random_floats(rows * in, rng);
                    NativeWeight w(f.type, wq, out, in);
                    for (const mk_cpu_quant *k : kernel_sets) {
                        SCOPED_TRACE(k->name);
                        NativeCtx c(1, k, rows * in / 32 + 1);
                        const std::vector<float> y = native_product(c, w, x, rows, in, out);
                        const bool quantized = f.type != MK_GGML_TYPE_F16 && f.type != MK_GGML_TYPE_BF16;
                        int shown = 0;
                        for (size_t r = 0; r < rows; r++) {
                            for (size_t o = 0; o < out; o++) {
                                double ref = 0.0, mag = 0.0, act_err = 0.0;
                                // one activation scale per 32 values, per 256 for the K-quants
                                const size_t group = block_elems(f.type) == 256 ? 256 : 32;
                                for (size_t i = 0; i < in; i += group) {
                                    double amax = 0.0, wabs = 0.0;
                                    const size_t end = std::min(in, i + group);
                                    for (size_t j = i; j < end; j++) {
                                        const double wv = wf[o * in + j], xv = x[r * in + j];
                                        ref += wv * xv;
                                        mag += std::fabs(wv * xv);
                                        amax = std::max(amax, std::fabs(xv));
                                        wabs += std::fabs(wv);
                                    }
                                    if (quantized) act_err += amax / 127.0 / 2.0 * wabs * (1 + 1e-6);
                                }
                                const double tol = act_err + (4.8e-7 * (double)in + 1e-6) * (mag + act_err) + 1e-6;
                                const double err = std::fabs((double)y[r * out + o] - ref);
                                EXPECT_TRUE(std::isfinite(y[r * out + o]));
                                if (err > tol && shown++ < 10)
                                    ADD_FAILURE() << "row " << r << " out " << o << ": " << y[r * out + o]
                                                  << " vs reference " << ref << " (tolerance " << tol << ")";
                            }
                        }
                    }
                }
            }
        }
    }
}

// Activation quantization is integer math after one float multiply: SIMD and portable
// agree bit for bit, and every value is within half a step of the input. quantize_row takes
// a scale per block of 32 and keeps s = d * sum(q); quantize_row_k (the K-quants' rows) one
// scale per 256 values, the largest magnitude of the 256 at +-127, and the exact sums of q
// per 16.
TEST(NativeKernels, SimdQuantizationIsBitIdenticalToPortable) {
    if (simd_tables().empty()) GTEST_SKIP() << "this CPU has no AVX2";
    const mk_cpu_quant *portable = mk_cpu_quant_portable();
    std::mt19937 rng(99);
    for (const mk_cpu_quant *simd : simd_tables())
    for (bool k : {false, true})
    for (size_t n : k ? std::vector<size_t>{256, 512, 1536} : std::vector<size_t>{32, 64, 1536}) {
        SCOPED_TRACE(std::string(simd->name) + (k ? " quantize_row_k " : " quantize_row ") + std::to_string(n));
        const size_t group = k ? 256 : 32;
        std::vector<float> x = random_floats(n, rng);
        x[5] = 0.0f;
        if (n >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f); // an all-zero block
        if (n >= 512) std::fill(x.begin() + 256, x.begin() + 512, 0.0f); // an all-zero group of 256
        if (n >= 1536) x[1000] = 1e30f;                                   // one huge value
        if (n >= 1536) x[1300] = -3.0f; // a group's largest magnitude negative, in its fifth block
        if (n >= 1536) std::fill(x.begin() + 1024, x.begin() + 1040, 0.9f); // a group of 16 at +127
        std::vector<float> d(n / group);
        std::vector<int> q(n);
        if (k) {
            std::vector<mk_q8k_block> a(n / 256), b(n / 256);
            portable->quantize_row_k(a.data(), x.data(), n);
            simd->quantize_row_k(b.data(), x.data(), n);
            ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(mk_q8k_block)), 0);
            for (size_t blk = 0; blk < n / 256; blk++) {
                d[blk] = a[blk].d;
                for (size_t g = 0; g < 16; g++) {
                    int sum = 0;
                    for (size_t i = 16 * g; i < 16 * g + 16; i++) sum += a[blk].q[i];
                    EXPECT_EQ(a[blk].sums[g], sum) << "block " << blk << " group " << g;
                }
                for (size_t i = 0; i < 256; i++) q[256 * blk + i] = a[blk].q[i];
            }
        } else {
            std::vector<mk_q8_block> a(n / 32), b(n / 32);
            portable->quantize_row(a.data(), x.data(), n);
            simd->quantize_row(b.data(), x.data(), n);
            ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(mk_q8_block)), 0);
            for (size_t blk = 0; blk < n / 32; blk++) {
                d[blk] = a[blk].d;
                int sum = 0;
                for (int i = 0; i < 32; i++) sum += a[blk].q[i], q[32 * blk + i] = a[blk].q[i];
                EXPECT_EQ(a[blk].s, a[blk].d * (float)sum);
            }
        }
        for (size_t g = 0; g < n / group; g++) {
            float amax = 0.0f;
            for (size_t i = g * group; i < (g + 1) * group; i++) amax = std::max(amax, std::fabs(x[i]));
            EXPECT_EQ(d[g], amax / 127.0f) << "group " << g;
        }
        for (size_t i = 0; i < n; i++)
            ASSERT_LE(std::fabs(x[i] - d[i / group] * q[i]), d[i / group] * 0.5f * (1 + 1e-5f) + 1e-30f) << i;
    }
}

// Blocks holding NaN or Inf (first, last or middle value, either sign, with huge finite
// values beside them) quantize to d = NaN with q and sums 0, and blocks too small for a
// normal d (subnormals, and normal values whose amax / 127 is under FLT_MIN) to d = 0 with q 0,
// in every table alike (the max is taken on the bits, so where a NaN sits cannot matter).
// A dot over a NaN block is NaN in every format, one-row and n-row, and the other rows of
// the same n-row call keep their bits; through the product only the NaN row's outputs are NaN.
TEST(NativeKernels, NonFiniteAndTinyBlocksQuantizeAlikeAndPoisonOnlyTheirRow) {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const float tiny_d = 127.0f * FLT_MIN * 0.999f, normal_d = 127.0f * FLT_MIN * 1.001f;
    std::vector<const mk_cpu_quant *> tables = simd_tables();
    tables.insert(tables.begin(), mk_cpu_quant_portable());
    std::mt19937 rng(1234);
    for (bool k : {false, true}) {
        const size_t group = k ? 256 : 32, n = 9 * group;
        std::vector<float> x = random_floats(n, rng);
        auto block = [&](size_t b) { return x.begin() + b * group; };
        block(0)[0] = nan;                                   // first value
        block(1)[group - 1] = -nan;                           // last value, sign bit set
        block(2)[group / 2] = inf, block(2)[1] = 3e38f;       // Inf beside a huge finite value
        block(3)[7] = -inf, block(3)[9] = nan;                // both
        std::fill(block(4), block(5), 1e-40f);                // subnormals
        block(4)[3] = -2e-45f;
        std::fill(block(5), block(6), 0.5f * tiny_d);         // normal values, d would be subnormal
        block(5)[group - 2] = -tiny_d;
        std::fill(block(6), block(7), 0.25f * normal_d);      // the smallest normal d
        block(6)[11] = normal_d;
        block(7)[group - 1] = 3e38f;                          // a huge finite value: normal block
        // block 8: random
        std::vector<std::vector<uint8_t>> bytes;
        for (const mk_cpu_quant *t : tables) {
            SCOPED_TRACE(std::string(t->name) + (k ? " quantize_row_k" : " quantize_row"));
            const QuantRow q = quantize_for(t, k ? MK_GGML_TYPE_Q4_K : MK_GGML_TYPE_Q4_0, x.data(), n);
            const uint8_t *raw = k ? (const uint8_t *)q.kq.data() : (const uint8_t *)q.q.data();
            bytes.emplace_back(raw, raw + (k ? q.kq.size() * sizeof(mk_q8k_block) : q.q.size() * sizeof(mk_q8_block)));
            for (size_t b = 0; b < 9; b++) {
                const float d = k ? q.kq[b].d : q.q[b].d;
                const int8_t *qs = k ? q.kq[b].q : q.q[b].q;
                const bool zero_q = std::all_of(qs, qs + group, [](int8_t v) { return v == 0; });
                if (b < 4) {
                    EXPECT_TRUE(std::isnan(d)) << "block " << b << " d " << d;
                    EXPECT_TRUE(zero_q) << "block " << b;
                } else if (b < 6) {
                    EXPECT_EQ(d, 0.0f) << "block " << b;
                    EXPECT_TRUE(zero_q) << "block " << b;
                } else {
                    EXPECT_GE(d, FLT_MIN) << "block " << b;
                    EXPECT_TRUE(std::isfinite(d)) << "block " << b;
                    EXPECT_FALSE(zero_q) << "block " << b;
                    for (size_t i = 0; i < group; i++)
                        ASSERT_LE(std::fabs((double)block(b)[i] - (double)d * qs[i]), 0.5001 * d) << "block " << b << " value " << i;
                }
                if (k) {
                    for (int g = 0; g < 16; g++) EXPECT_EQ(q.kq[b].sums[g], b < 6 ? 0 : std::accumulate(qs + 16 * g, qs + 16 * g + 16, 0));
                } else if (b < 4) {
                    EXPECT_TRUE(std::isnan(q.q[b].s)) << "block " << b;
                } else if (b < 6) {
                    EXPECT_EQ(q.q[b].s, 0.0f) << "block " << b;
                }
            }
        }
        for (size_t i = 1; i < bytes.size(); i++)
            EXPECT_EQ(bytes[i], bytes[0]) << tables[i]->name << " quantizes differently from portable";
    }
    // Dots: activation rows with one NaN (or Inf) block among random ones, next to clean rows.
    for (const mk_cpu_quant *t : tables)
    for (uint32_t type : kQuantized) {
        SCOPED_TRACE(std::string(t->name) + " " + mk_ggml_type_name(type));
        // 19 outputs: the eight-row dots' full groups and their tail
        const size_t in = block_elems(type) == 256 ? 768 : 96, out = 19;
        const size_t rows = std::max<size_t>(t->dotn_rows, 3);
        NativeWeight w(type, random_rows(type, out, in, rng), out, in);
        std::vector<float> x = random_floats(rows * in, rng);
        x[1 * in + in / 2] = nan;      // row 1: a NaN in its middle block
        x[2 * in + in - 1] = -inf;      // row 2: an Inf in its last block
        NativeCtx c(2, t, rows * in / 32);
        const std::vector<float> y = native_product(c, w, x, rows, in, out);
        for (size_t r = 0; r < rows; r++) {
            const std::vector<float> xr(x.begin() + r * in, x.begin() + (r + 1) * in);
            const std::vector<float> alone = native_product(c, w, xr, 1, in, out);
            for (size_t o = 0; o < out; o++) {
                if (r == 1 || r == 2) {
                    EXPECT_TRUE(std::isnan(y[r * out + o])) << "row " << r << " output " << o << " " << y[r * out + o];
                    EXPECT_TRUE(std::isnan(alone[o])) << "row " << r << " alone, output " << o;
                } else {
                    EXPECT_TRUE(std::isfinite(y[r * out + o])) << "row " << r << " output " << o;
                }
            }
            if (r != 1 && r != 2) {
                EXPECT_EQ(std::memcmp(alone.data(), y.data() + r * out, out * sizeof(float)), 0) << "row " << r;
            }
        }
    }
}

// The SIMD dots compute the same integer block sums as the portable ones and add the
// per-block terms in a different order: equal up to float rounding of those sums.
TEST(NativeKernels, SimdDotsMatchPortable) {
    if (simd_tables().empty()) GTEST_SKIP() << "this CPU has no AVX2";
    const mk_cpu_quant *ref = mk_cpu_quant_portable();
    std::mt19937 rng(7);
    for (const mk_cpu_quant *simd : simd_tables())
    for (const Format &f : kFormats) {
        for (size_t in : cols_for(f.type)) {
            SCOPED_TRACE(std::string(simd->name) + " " + f.name + " in " + std::to_string(in));
            const std::vector<uint8_t> w = random_rows(f.type, 5, in, rng);
            const std::vector<float> x = random_floats(in, rng);
            const size_t rb = row_bytes(f.type, in);
            const bool half = f.type == MK_GGML_TYPE_F16 || f.type == MK_GGML_TYPE_BF16;
            const QuantRow xq = half ? QuantRow{} : quantize_for(ref, f.type, x.data(), in);
            for (size_t r = 0; r < 5; r++) {
                float a, b, mag = 0.0f;
                std::vector<float> wf(in);
                MK_ASSERT_OK(mk_gguf_dequantize(f.type, &w[r * rb], rb, wf.data(), in));
                if (half) {
                    mk_hdot_fn pa = f.type == MK_GGML_TYPE_F16 ? ref->dot_f16 : ref->dot_bf16;
                    mk_hdot_fn pb = f.type == MK_GGML_TYPE_F16 ? simd->dot_f16 : simd->dot_bf16;
                    a = pa((const uint16_t *)&w[r * rb], x.data(), in);
                    b = pb((const uint16_t *)&w[r * rb], x.data(), in);
                    for (size_t i = 0; i < in; i++) mag += std::fabs(wf[i] * x[i]);
                } else {
                    a = dot_one(ref, f.type, &w[r * rb], xq, in);
                    b = dot_one(simd, f.type, &w[r * rb], xq, in);
                    for (size_t i = 0; i < in; i++) mag += std::fabs(wf[i] * (float)xq.value(i));
                    for (size_t blk = 0; blk < xq.q.size(); blk++) mag += std::fabs(xq.q[blk].s) * 0.25f;
                }
                EXPECT_LE(std::fabs(a - b), 1e-6f * (float)in * mag / 8.0f + 1e-7f) << "row " << r << ": " << a << " vs " << b;
            }
        }
    }
}

// One output element is one dot product computed by one thread: 1, 2 and 3 threads give
// the same bits, for decode (one row) and prefill (several rows), in every format.
TEST(NativeMatmul, ThreadCountDoesNotChangeOneBit) {
    std::mt19937 rng(5);
    const size_t out = 333;
    for (const Format &f : kFormats) {
        const size_t in = block_elems(f.type) == 256 ? 512 : 96;
        SCOPED_TRACE(f.name);
        const std::vector<uint8_t> wq = random_rows(f.type, out, in, rng);
        NativeWeight w(f.type, wq, out, in);
        for (size_t rows : {1u, 4u, 37u}) { // 37 rows: the tiled SGEMM (300 = 256 + a partial tile) where no n-row dot
            const std::vector<float> x = random_floats(rows * in, rng);
            NativeCtx one(1, mk_cpu_quant_best(), rows * in / 32);
            const std::vector<float> y1 = native_product(one, w, x, rows, in, out);
            for (size_t threads : {2u, 3u}) {
                NativeCtx many(threads, mk_cpu_quant_best(), rows * in / 32);
                for (int rep = 0; rep < 3; rep++) // the pool is reused across products
                    EXPECT_TRUE(bit_identical(y1, native_product(many, w, x, rows, in, out)))
                        << threads << " threads, rows " << rows << ", repetition " << rep;
            }
        }
    }
}

// Q, K and V in one job (one quantization, one pass of the pool) and gate/up with SwiGLU
// fused into theirs give the bits of the separate products (and of mk_cpu_swiglu on
// them), for parts of different formats and odd sizes, one or several rows, any threads;
// from MK_NATIVE_GEMM_MIN_ROWS rows on (exactly at it, and 40), the separate products (tiled
// for a part without an n-row dot).
TEST(NativeMatmul, SharedAndSwigluJobsEqualSeparateProducts) {
    std::mt19937 rng(77);
    // Blocks of 32, pairs and 16-bit floats in one job; K-quants (blocks of 256) beside a
    // format of blocks of 32, the K-quants first (a job quantizes both ways).
    struct Mix {
        size_t in;
        uint32_t types[3], gate, up;
    };
    for (const Mix &mix : {Mix{96, {MK_GGML_TYPE_Q4_1, MK_GGML_TYPE_Q8_0, MK_GGML_TYPE_F16}, MK_GGML_TYPE_Q4_0,
                               MK_GGML_TYPE_Q4_1},
                           Mix{512, {MK_GGML_TYPE_Q4_K, MK_GGML_TYPE_Q6_K, MK_GGML_TYPE_Q8_0}, MK_GGML_TYPE_Q6_K,
                               MK_GGML_TYPE_Q4_1}}) {
    SCOPED_TRACE("in " + std::to_string(mix.in));
    const size_t in = mix.in;
    const size_t outs[3] = {37, 16, 5};
    const uint32_t *types = mix.types;
    std::vector<NativeWeight> w;
    w.reserve(3); // data() points into each weight's own buffer
    for (int i = 0; i < 3; i++) w.emplace_back(types[i], random_rows(types[i], outs[i], in, rng), outs[i], in);
    NativeWeight gate_w(mix.gate, random_rows(mix.gate, 45, in, rng), 45, in);
    NativeWeight up_w(mix.up, random_rows(mix.up, 45, in, rng), 45, in);
    for (size_t rows : {(size_t)1, (size_t)3, (size_t)MK_NATIVE_GEMM_MIN_ROWS - 1, (size_t)MK_NATIVE_GEMM_MIN_ROWS,
                        (size_t)40}) {
        const std::vector<float> x = random_floats(rows * in, rng);
        for (size_t threads : {1u, 2u, 3u}) {
            SCOPED_TRACE(std::to_string(rows) + " rows, " + std::to_string(threads) + " threads");
            NativeCtx c(threads, mk_cpu_quant_best(), rows * in / 32);
            std::vector<std::vector<float>> y(3);
            float *yp[3];
            const mk_weight *wp[3];
            for (int i = 0; i < 3; i++) {
                y[i].assign(rows * outs[i] + 8, kSentinel);
                yp[i] = y[i].data();
                wp[i] = w[i].weight();
            }
            MK_ASSERT_OK(mk_cpu_native_matmul_shared(&c.ctx, 3, yp, wp, x.data(), rows, false));
            for (int i = 0; i < 3; i++) {
                for (size_t k = rows * outs[i]; k < y[i].size(); k++) ASSERT_EQ(y[i][k], kSentinel) << "part " << i;
                y[i].resize(rows * outs[i]);
                EXPECT_TRUE(bit_identical(y[i], native_product(c, w[i], x, rows, in, outs[i]))) << "part " << i;
            }
            std::vector<float> gate(rows * 45 + 8, kSentinel), up(rows * 45 + 8, kSentinel);
            MK_ASSERT_OK(mk_cpu_native_matmul_swiglu(&c.ctx, gate.data(), up.data(), x.data(), gate_w.weight(),
                                                     up_w.weight(), rows, false));
            for (size_t k = rows * 45; k < gate.size(); k++) ASSERT_EQ(gate[k], kSentinel);
            gate.resize(rows * 45);
            std::vector<float> g = native_product(c, gate_w, x, rows, in, 45);
            const std::vector<float> u = native_product(c, up_w, x, rows, in, 45);
            mk_cpu_swiglu(g.data(), g.data(), u.data(), g.size());
            EXPECT_TRUE(bit_identical(gate, g));
        }
    }
    }
}

// The path of a product depends on its row count alone: below MK_NATIVE_GEMM_MIN_ROWS every
// row goes through the dot kernels (the bits of that row computed alone, activations
// quantized); from exactly MK_NATIVE_GEMM_MIN_ROWS on, the dequantized tiles and SGEMM
// (the bits of one SGEMM over the dequantized weight), unless the table has an n-row dot for
// the format (then the dots at any count); without tile scratch, the dots.
// A weight stored as F32 (an F32 matrix of the file) beside quantized
// ones in a shared product and in SwiGLU: it takes the F32 product, the others their dot
// kernels, and every output equals its separate product.
TEST(NativeMatmul, F32StoredWeightInASharedJobTakesTheF32Product) {
    std::mt19937 rng(23);
    const size_t in = 256, out = 40;
    NativeWeight f32w(kStoredAsF32, random_rows(kStoredAsF32, out, in, rng), out, in);
    ASSERT_EQ(f32w.weight()->format, (uint32_t)MK_GGML_TYPE_F32);
    NativeWeight q8w(MK_GGML_TYPE_Q8_0, random_rows(MK_GGML_TYPE_Q8_0, out, in, rng), out, in);
    for (size_t rows : {(size_t)1, (size_t)5}) {
        SCOPED_TRACE(rows);
        const std::vector<float> x = random_floats(rows * in, rng);
        NativeCtx c(2, mk_cpu_quant_best(), rows * in / 32);
        std::vector<float> y0(rows * out), y1(rows * out);
        float *yp[2] = {y0.data(), y1.data()};
        const mk_weight *wp[2] = {q8w.weight(), f32w.weight()};
        MK_ASSERT_OK(mk_cpu_native_matmul_shared(&c.ctx, 2, yp, wp, x.data(), rows, false));
        EXPECT_TRUE(bit_identical(y0, native_product(c, q8w, x, rows, in, out)));
        EXPECT_TRUE(bit_identical(y1, native_product(c, f32w, x, rows, in, out)));
        std::vector<float> gate(rows * out), up(rows * out);
        MK_ASSERT_OK(mk_cpu_native_matmul_swiglu(&c.ctx, gate.data(), up.data(), x.data(), f32w.weight(), q8w.weight(),
                                                 rows, false));
        std::vector<float> g = native_product(c, f32w, x, rows, in, out);
        const std::vector<float> u = native_product(c, q8w, x, rows, in, out);
        mk_cpu_swiglu(g.data(), g.data(), u.data(), g.size());
        EXPECT_TRUE(bit_identical(gate, g));
    }
}

// The n-row dots give every output the bits of the one-row dot: the K-quants' (one weight
// row against 1 to the table's dotn_rows activation rows) at every position of the group,
// and the blocks of 32's eight-row dots (eight consecutive weight rows, row_bytes apart,
// against 1 to dotn_rows activation rows) in every lane and position, for odd and even
// block counts, in every SIMD table. A table takes 4 activation rows per call on 16 vector
// registers and 8 on AVX-512's 32.
TEST(NativeDot, NRowDotsAreOneRowDots) {
    if (simd_tables().empty()) GTEST_SKIP() << "no AVX2 on this CPU (the portable table has no n-row dot)";
    EXPECT_EQ(mk_cpu_quant_portable()->dotn_rows, 0u);
    for (uint32_t type : kQuantized) {
        EXPECT_EQ(mk_cpu_quant_dot8_for(mk_cpu_quant_portable(), type), nullptr);
        EXPECT_EQ(mk_cpu_quant_kdotn_for(mk_cpu_quant_portable(), type), nullptr);
    }
    std::mt19937 rng(41);
    constexpr size_t kRows = MK_QDOTN_MAX_ROWS;
    for (const mk_cpu_quant *k : simd_tables()) {
        EXPECT_EQ(k->dotn_rows, std::string(k->name) == "avx512-vnni" ? 8u : 4u) << k->name;
        ASSERT_LE(k->dotn_rows, kRows) << k->name;
    }
    for (const mk_cpu_quant *k : simd_tables())
    for (uint32_t type : kQuantized)
    for (size_t in : block_elems(type) == 256 ? std::vector<size_t>{256, 768, 2048}
                                              : std::vector<size_t>{32, 64, 96, 576, 1536}) {
        SCOPED_TRACE(std::string(k->name) + " " + mk_ggml_type_name(type) + " in " + std::to_string(in));
        ASSERT_NE(k->dot8_q4_0, nullptr);
        ASSERT_NE(k->dot8_q4_1, nullptr);
        ASSERT_NE(k->dot8_q5_0, nullptr);
        ASSERT_NE(k->dot8_q5_1, nullptr);
        ASSERT_NE(k->dot8_q8_0, nullptr);
        ASSERT_NE(k->dotn_q3_k, nullptr);
        ASSERT_NE(k->dotn_q4_k, nullptr);
        ASSERT_NE(k->dotn_q5_k, nullptr);
        ASSERT_NE(k->dotn_q6_k, nullptr);
        EXPECT_EQ(mk_cpu_quant_dot8_for(k, MK_GGML_TYPE_Q4_0), k->dot8_q4_0);
        EXPECT_EQ(mk_cpu_quant_dot8_for(k, MK_GGML_TYPE_Q4_1), k->dot8_q4_1);
        EXPECT_EQ(mk_cpu_quant_dot8_for(k, MK_GGML_TYPE_Q5_0), k->dot8_q5_0);
        EXPECT_EQ(mk_cpu_quant_dot8_for(k, MK_GGML_TYPE_Q5_1), k->dot8_q5_1);
        EXPECT_EQ(mk_cpu_quant_dot8_for(k, MK_GGML_TYPE_Q8_0), k->dot8_q8_0);
        EXPECT_EQ(mk_cpu_quant_dot8_for(k, MK_GGML_TYPE_IQ4_NL), k->dot8_iq4_nl);
        EXPECT_EQ(mk_cpu_quant_kdotn_for(k, MK_GGML_TYPE_IQ4_XS), k->dotn_iq4_xs);
        EXPECT_EQ(mk_cpu_quant_kdotn_for(k, MK_GGML_TYPE_Q2_K), k->dotn_q2_k);
        EXPECT_EQ(mk_cpu_quant_kdotn_for(k, MK_GGML_TYPE_Q3_K), k->dotn_q3_k);
        EXPECT_EQ(mk_cpu_quant_kdotn_for(k, MK_GGML_TYPE_Q4_K), k->dotn_q4_k);
        EXPECT_EQ(mk_cpu_quant_kdotn_for(k, MK_GGML_TYPE_Q5_K), k->dotn_q5_k);
        EXPECT_EQ(mk_cpu_quant_kdotn_for(k, MK_GGML_TYPE_Q6_K), k->dotn_q6_k);
        EXPECT_EQ(mk_cpu_quant_kdotn_for(k, MK_GGML_TYPE_Q8_0), nullptr);
        EXPECT_EQ(mk_cpu_quant_dot8_for(k, MK_GGML_TYPE_Q4_K), nullptr);
        const size_t weight_rows = 11; // eight from row 0 and from row 3
        const std::vector<uint8_t> w = random_rows(type, weight_rows, in, rng);
        const size_t rb = w.size() / weight_rows;
        std::vector<QuantRow> xq;
        for (size_t r = 0; r < kRows; r++) xq.push_back(quantize_for(k, type, random_floats(in, rng).data(), in));
        for (size_t rows = 1; rows <= k->dotn_rows; rows++)
        for (size_t first : {(size_t)0, (size_t)3}) {
            // The activation rows in a rotating order: each position of the group sees each row.
            const QuantRow *bs[kRows];
            const mk_q8_block *qs[kRows];
            for (size_t i = 0; i < rows; i++) bs[i] = &xq[(i + first) % kRows], qs[i] = bs[i]->q.data();
            if (k_quant(type)) {
                const uint8_t *row = w.data() + first * rb;
                float got[kRows];
                ASSERT_TRUE(dot_rows(k, type, row, bs, rows, in, got));
                for (size_t i = 0; i < rows; i++) {
                    const float one = dot_one(k, type, row, *bs[i], in);
                    EXPECT_EQ(std::memcmp(&one, &got[i], sizeof one), 0)
                        << rows << " rows, position " << i << ": " << one << " vs " << got[i];
                }
                continue;
            }
            float got[8 * kRows];
            mk_cpu_quant_dot8_for(k, type)(w.data() + first * rb, rb, qs, rows, in, got);
            for (size_t i = 0; i < rows; i++)
                for (size_t lane = 0; lane < 8; lane++) {
                    const float one = dot_one(k, type, w.data() + (first + lane) * rb, *bs[i], in);
                    EXPECT_EQ(std::memcmp(&one, &got[8 * i + lane], sizeof one), 0)
                        << rows << " rows from weight row " << first << ", position " << i << ", lane " << lane
                        << ": " << one << " vs " << got[8 * i + lane];
                }
        }
    }
}

// The blocks of 32's dots in every SIMD table follow the order cpu_quant_avx2.c documents:
// per block the exact integer sum of its 32 products, then acc = fma(d * x.d, isum, acc)
// (Q4_1, Q5_1: then acc = fma(m, x.s, acc)), block after block from 0. Computed here in plain
// C++ with std::fma and compared bit for bit, one-row and eight-row dots, with weights and
// activations at the ends of their ranges too.
TEST(NativeDot, BlocksOf32FollowTheDocumentedOrder) {
    if (simd_tables().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
    std::mt19937 rng(77);
    for (const mk_cpu_quant *k : simd_tables())
    for (uint32_t type : kBlocksOf32)
    for (size_t in : {(size_t)32, (size_t)96, (size_t)576})
    for (int extreme = 0; extreme < 4; extreme++) { // 3: the largest sums, every product of one sign
        SCOPED_TRACE(std::string(k->name) + " " + mk_ggml_type_name(type) + " in " + std::to_string(in) + " extreme " +
                     std::to_string(extreme));
        const size_t rb = row_bytes(type, in), bb = rb / (in / 32);
        std::vector<uint8_t> w = random_rows(type, 8, in, rng);
        set_extreme(type, w, 8, in, extreme == 3 ? 1 : extreme);
        std::vector<float> xf = extreme ? extreme_floats(in, extreme) : random_floats(in, rng);
        if (extreme == 3) xf.assign(in, type == MK_GGML_TYPE_Q8_0 ? -1.5f : 1.5f); // 15 or 31 x 127, -128 x -127
        const QuantRow x = quantize_for(k, type, xf.data(), in);
        const mk_q8_block *xs[MK_QDOTN_MAX_ROWS];
        for (auto &p : xs) p = x.q.data();
        float got[8 * MK_QDOTN_MAX_ROWS];
        mk_cpu_quant_dot8_for(k, type)(w.data(), rb, xs, k->dotn_rows, in, got);
        for (size_t row = 0; row < 8; row++) {
            float acc = 0.0f;
            for (size_t b = 0; b < in / 32; b++) {
                const uint8_t *blk = &w[row * rb + b * bb];
                const mk_q8_block &xb = x.q[b];
                const bool five = type == MK_GGML_TYPE_Q5_0 || type == MK_GGML_TYPE_Q5_1;
                const bool min = type == MK_GGML_TYPE_Q4_1 || type == MK_GGML_TYPE_Q5_1;
                uint32_t qh = 0;
                if (five) std::memcpy(&qh, blk + (min ? 4 : 2), 4);
                int isum = 0;
                for (int j = 0; j < 32; j++) {
                    int v;
                    if (type == MK_GGML_TYPE_Q8_0) v = (int8_t)blk[2 + j];
                    else {
                        const uint8_t byte = blk[(min ? 4 : 2) + (five ? 4 : 0) + j % 16];
                        v = j < 16 ? byte & 0x0f : byte >> 4;
                        if (five) v |= (int)((qh >> j) & 1) << 4;
                        v -= type == MK_GGML_TYPE_Q4_0 ? 8 : type == MK_GGML_TYPE_Q5_0 ? 16 : 0;
                        if (type == MK_GGML_TYPE_IQ4_NL) v = mk_iq4_values[v];
                    }
                    isum += v * xb.q[j];
                }
                uint16_t d, m;
                std::memcpy(&d, blk, 2);
                std::memcpy(&m, blk + 2, 2);
                acc = std::fma(mk_f16_to_f32(d) * xb.d, (float)isum, acc);
                if (min) acc = std::fma(mk_f16_to_f32(m), xb.s, acc);
            }
            const float one = dot_one(k, type, &w[row * rb], x, in);
            EXPECT_EQ(std::memcmp(&one, &acc, sizeof acc), 0) << "row " << row << ": " << one << " vs " << acc;
            for (size_t r = 0; r < k->dotn_rows; r++)
                EXPECT_EQ(std::memcmp(&got[8 * r + row], &acc, sizeof acc), 0)
                    << "eight-row dot, row " << row << ", position " << r << ": " << got[8 * r + row] << " vs " << acc;
        }
    }
}

// Through the product: a batch of decode rows (up to MK_NATIVE_GEMM_MIN_ROWS - 1, in groups of
// the table's dotn_rows and a shorter last group) gives every row the bits of that row alone,
// in every SIMD table, over several threads.
TEST(NativeMatmul, BatchRowsEqualEachRowAloneInEveryTable) {
    if (simd_tables().empty()) GTEST_SKIP() << "no AVX2 on this CPU (the portable table has no n-row dot)";
    std::mt19937 rng(808);
    for (uint32_t type : kQuantized)
    for (size_t in : block_elems(type) == 256 ? std::vector<size_t>{256, 768} : std::vector<size_t>{96, 576}) {
        const size_t out = 37;
        NativeWeight w(type, random_rows(type, out, in, rng), out, in);
        for (size_t rows : {(size_t)5, (size_t)8, (size_t)9, (size_t)13, (size_t)MK_NATIVE_GEMM_MIN_ROWS - 1}) {
            const std::vector<float> x = random_floats(rows * in, rng);
            for (const mk_cpu_quant *k : simd_tables()) {
                SCOPED_TRACE(std::string(k->name) + " " + mk_ggml_type_name(type) + " in " + std::to_string(in) +
                             ", " + std::to_string(rows) + " rows");
                NativeCtx c(2, k, rows * in / 32);
                const std::vector<float> y = native_product(c, w, x, rows, in, out);
                for (size_t r = 0; r < rows; r++) {
                    const std::vector<float> xr(x.begin() + r * in, x.begin() + (r + 1) * in);
                    const std::vector<float> alone = native_product(c, w, xr, 1, in, out);
                    EXPECT_EQ(std::memcmp(alone.data(), y.data() + r * out, out * sizeof(float)), 0) << "row " << r;
                }
            }
        }
    }
}

// The VNNI tables (AVX-VNNI, AVX512-VNNI) sum each block's products with vpdpbusd where AVX2
// uses maddubs + madd: the same integers, then the same float operations, so every dot (one
// row, eight weight rows and n rows, every format) has the AVX2 bits. Weights at the extremes (all nibbles 15 or 0,
// Q8_0 bytes of -128 and 127) and activations at +-127 included, odd and even block counts.
TEST(NativeKernels, VnniDotsAreBitIdenticalToAvx2) {
    const mk_cpu_quant *vnni = mk_cpu_quant_vnni(), *avx2 = mk_cpu_quant_avx2();
    if (cpu_flag("avx_vnni")) {
        ASSERT_NE(vnni, nullptr) << "/proc/cpuinfo lists avx_vnni but the cpuid check missed it";
        EXPECT_STREQ(vnni->name, "avx-vnni");
    } else if (cpu_flag("avx512_vnni") && cpu_flag("avx512vl")) {
        ASSERT_NE(vnni, nullptr) << "/proc/cpuinfo lists avx512_vnni and avx512vl but the cpuid check missed them";
        EXPECT_STREQ(vnni->name, "avx512-vnni");
    }
    if (!vnni) GTEST_SKIP() << "this CPU has no AVX-VNNI or AVX512-VNNI";
    ASSERT_NE(avx2, nullptr);
    EXPECT_EQ(mk_cpu_quant_best(), vnni);
    if (cpu_flag("avx512_vnni") && cpu_flag("avx512vl")) {
        ASSERT_NE(mk_cpu_quant_avx512_vnni(), nullptr);
    }
    std::vector<const mk_cpu_quant *> vnnis{vnni};
    if (mk_cpu_quant_avx512_vnni() && mk_cpu_quant_avx512_vnni() != vnni) vnnis.push_back(mk_cpu_quant_avx512_vnni());
    for (const mk_cpu_quant *v : vnnis) // the AVX2 attention goes with every VNNI table
        EXPECT_EQ(mk_cpu_attention_fast_for(v), mk_cpu_attention_fast_for(avx2)) << v->name;
    std::mt19937 rng(2026);
    for (const mk_cpu_quant *vnni : vnnis)
    for (const Format &f : kFormats) {
        if (f.type == MK_GGML_TYPE_F16 || f.type == MK_GGML_TYPE_BF16) continue;
        for (size_t in : block_elems(f.type) == 256 ? std::vector<size_t>{256, 768, 1280}
                                                    : std::vector<size_t>{32, 64, 96, 576, 1536}) {
            for (int extreme = 0; extreme < 3; extreme++) {
                SCOPED_TRACE(std::string(vnni->name) + " " + f.name + " in " + std::to_string(in) + " extreme " +
                             std::to_string(extreme));
                const size_t rows = 8, rb = row_bytes(f.type, in); // the eight rows of an eight-row dot
                std::vector<uint8_t> w = random_rows(f.type, rows, in, rng);
                set_extreme(f.type, w, rows, in, extreme);
                std::vector<QuantRow> xq;
                for (int r = 0; r < 4; r++) {
                    std::vector<float> xf = random_floats(in, rng);
                    if (extreme) xf = extreme_floats(in, extreme);
                    xq.push_back(quantize_for(avx2, f.type, xf.data(), in));
                }
                const QuantRow *const xs[4] = {&xq[0], &xq[1], &xq[2], &xq[3]};
                const size_t n = vnni->dotn_rows;
                ASSERT_LE(n, (size_t)MK_QDOTN_MAX_ROWS);
                const QuantRow *xn[MK_QDOTN_MAX_ROWS];
                const mk_q8_block *q4[4], *qn[MK_QDOTN_MAX_ROWS];
                for (size_t i = 0; i < 4; i++) q4[i] = xs[i]->q.data();
                for (size_t i = 0; i < n; i++) xn[i] = xs[i % 4], qn[i] = xs[i % 4]->q.data();
                if (!k_quant(f.type)) {
                    // AVX2's four-row eight-row dot against the VNNI table's widest call (its
                    // dotn_rows, the four rows repeated).
                    float a8[8 * 4], b8[8 * MK_QDOTN_MAX_ROWS];
                    mk_cpu_quant_dot8_for(avx2, f.type)(w.data(), rb, q4, 4, in, a8);
                    mk_cpu_quant_dot8_for(vnni, f.type)(w.data(), rb, qn, n, in, b8);
                    for (size_t i = 0; i < n; i++)
                        for (size_t lane = 0; lane < 8; lane++)
                            EXPECT_EQ(std::memcmp(&a8[8 * (i % 4) + lane], &b8[8 * i + lane], sizeof(float)), 0)
                                << n << "-row eight-row dot, row " << lane << " position " << i;
                }
                for (size_t o = 0; o < rows; o++) {
                    const uint8_t *row = &w[o * rb];
                    for (int r = 0; r < 4; r++) {
                        const float a = dot_one(avx2, f.type, row, xq[r], in);
                        const float b = dot_one(vnni, f.type, row, xq[r], in);
                        EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "row " << o << " x " << r << ": " << a << " vs " << b;
                    }
                    if (!k_quant(f.type)) continue;
                    // AVX2's four-row dot against the VNNI table's widest call.
                    float a4[4], bn[MK_QDOTN_MAX_ROWS];
                    ASSERT_TRUE(dot_rows(avx2, f.type, row, xs, 4, in, a4));
                    ASSERT_TRUE(dot_rows(vnni, f.type, row, xn, n, in, bn));
                    for (size_t i = 0; i < n; i++)
                        EXPECT_EQ(std::memcmp(&a4[i % 4], &bn[i], sizeof bn[i]), 0)
                            << n << "-row dot, row " << o << " position " << i;
                }
            }
        }
    }
}

// Every table's integer paths at the ends of the ranges (the largest i16 pair sums and i32
// lanes the kernels form): the one-row and n-row dots equal the exact sum of dequantized
// weights times quantized activations up to float rounding, so nothing saturated or
// wrapped. Random activations with extreme weights too.
TEST(NativeKernels, ExtremeBlocksGiveTheExactSum) {
    std::vector<const mk_cpu_quant *> tables = simd_tables();
    tables.insert(tables.begin(), mk_cpu_quant_portable());
    std::mt19937 rng(4242);
    for (const mk_cpu_quant *t : tables)
    for (uint32_t type : kQuantized)
    for (int extreme : {1, 2})
    for (bool random_x : {false, true}) {
        const size_t in = block_elems(type) == 256 ? 768 : 96, rb = row_bytes(type, in);
        SCOPED_TRACE(std::string(t->name) + " " + mk_ggml_type_name(type) + " extreme " + std::to_string(extreme) +
                     (random_x ? ", random activations" : ""));
        std::vector<uint8_t> w = random_rows(type, 2, in, rng);
        set_extreme(type, w, 2, in, extreme);
        const std::vector<float> xf = random_x ? random_floats(in, rng) : extreme_floats(in, extreme);
        const QuantRow x = quantize_for(t, type, xf.data(), in);
        const QuantRow *xs[MK_QDOTN_MAX_ROWS];
        for (auto &p : xs) p = &x;
        for (size_t o = 0; o < 2; o++) {
            std::vector<float> wf(in);
            MK_ASSERT_OK(mk_gguf_dequantize(type, &w[o * rb], rb, wf.data(), in));
            double exact = 0.0, mag = 0.0;
            for (size_t i = 0; i < in; i++) exact += wf[i] * x.value(i), mag += std::fabs(wf[i] * x.value(i));
            const double tol = 1e-5 * mag + 1e-6;
            EXPECT_NEAR(dot_one(t, type, &w[o * rb], x, in), exact, tol) << "row " << o;
            float got[MK_QDOTN_MAX_ROWS];
            if (t->dotn_rows && dot_rows(t, type, &w[o * rb], xs, t->dotn_rows, in, got)) {
                for (size_t i = 0; i < t->dotn_rows; i++) EXPECT_NEAR(got[i], exact, tol) << "row " << o << " position " << i;
            }
        }
    }
}

TEST(NativeMatmul, GemmRowThresholdIsExactlyMinRows) {
    std::mt19937 rng(31);
    const size_t out = 40;
    // F16 has no n-row dot: the tiles from MK_NATIVE_GEMM_MIN_ROWS rows on; Q4_0, Q4_1, Q5_0,
    // Q5_1, Q8_0 and the K-quants have one in the SIMD tables (the dots at any count there), none
    // in the portable one.
    std::vector<const mk_cpu_quant *> tables{mk_cpu_quant_portable()};
    if (mk_cpu_quant_best() != mk_cpu_quant_portable()) tables.push_back(mk_cpu_quant_best());
    for (uint32_t type : {MK_GGML_TYPE_F16, MK_GGML_TYPE_Q4_0, MK_GGML_TYPE_Q4_1, MK_GGML_TYPE_Q5_0, MK_GGML_TYPE_Q5_1,
                          MK_GGML_TYPE_Q8_0, MK_GGML_TYPE_IQ4_NL, MK_GGML_TYPE_Q2_K, MK_GGML_TYPE_Q3_K,
                          MK_GGML_TYPE_Q4_K, MK_GGML_TYPE_Q5_K, MK_GGML_TYPE_Q6_K, MK_GGML_TYPE_IQ4_XS})
    for (const mk_cpu_quant *k : tables) {
    const size_t in = block_elems(type) == 256 ? 512 : 64;
    const bool rows_dot = type != MK_GGML_TYPE_F16 && k->dotn_rows > 0;
    const std::vector<uint8_t> wq = random_rows(type, out, in, rng);
    std::vector<float> wf(out * in);
    MK_ASSERT_OK(mk_gguf_dequantize(type, wq.data(), wq.size(), wf.data(), wf.size()));
    NativeWeight w(type, wq, out, in);
    for (size_t rows : {(size_t)MK_NATIVE_GEMM_MIN_ROWS - 1, (size_t)MK_NATIVE_GEMM_MIN_ROWS, (size_t)64}) {
        for (const bool tiles : {true, false}) {
            SCOPED_TRACE(std::string(mk_ggml_type_name(type)) + " " + k->name + ", " + std::to_string(rows) + " rows" +
                         (tiles ? "" : ", no tile scratch"));
            const std::vector<float> x = random_floats(rows * in, rng);
            NativeCtx c(2, k, rows * in / 32);
            if (!tiles) {
                c.ctx.wtile = nullptr;
                c.ctx.wtile_elems = 0;
            }
            const std::vector<float> y = native_product(c, w, x, rows, in, out);
            std::vector<float> sgemm(rows * out);
            mk_cpu_sgemm_strided(sgemm.data(), out, x.data(), wf.data(), rows, in, out);
            size_t rows_as_alone = 0, asked_alone = 0;
            std::vector<float> ya(rows * out); // asked for rows alone (a batch's decode rows): the dots at any count
            MK_ASSERT_OK(mk_cpu_native_matmul(&c.ctx, ya.data(), x.data(), w.weight(), rows, true));
            for (size_t r = 0; r < rows; r++) {
                const std::vector<float> xr(x.begin() + (long)(r * in), x.begin() + (long)((r + 1) * in));
                const std::vector<float> alone = native_product(c, w, xr, 1, in, out);
                rows_as_alone += std::memcmp(alone.data(), &y[r * out], out * sizeof(float)) == 0;
                asked_alone += std::memcmp(alone.data(), &ya[r * out], out * sizeof(float)) == 0;
            }
            EXPECT_EQ(asked_alone, rows) << "a product asked for rows alone must give every row its dot bits";
            const bool gemm = tiles && rows >= MK_NATIVE_GEMM_MIN_ROWS && !rows_dot;
            if (gemm) {
                EXPECT_TRUE(bit_identical(y, sgemm)) << "not the tiled SGEMM";
                EXPECT_LT(rows_as_alone, rows) << "the dot kernels' bits";
            } else {
                EXPECT_EQ(rows_as_alone, rows) << "every row must be the dot kernels' row";
                EXPECT_FALSE(bit_identical(y, sgemm)) << "the SGEMM's bits";
            }
        }
    }
    }
}

// The cpu backend plans the per-thread weight tiles (threads x 256 x the widest input) at
// reserve and allocates them only when a stored weight takes them (F16/BF16 here; every
// format with the portable table): a model of formats with n-row dots never holds them,
// whether its weights are stored before or after the reserve, and a reserve of fewer rows
// than the tiles' threshold plans none. Once held, a product of many F16 rows goes through
// them: its bits are the tiles' (a NativeCtx with tiles), not the dots'.
TEST(NativeBackend, WeightTilesAreHeldOnlyOnceAStoredWeightTakesThem) {
    if (mk_cpu_quant_best() == mk_cpu_quant_portable())
        GTEST_SKIP() << "the backend's table is the portable one here: every format takes the tiles";
    mk_hparams hp = mk_hparams_seed_default();
    hp.hidden = 256, hp.intermediate = 768, hp.n_heads = 4, hp.head_dim = 64;
    const size_t threads = 2, width = 768;
    std::mt19937 rng(5);
    for (size_t max_rows : {(size_t)MK_NATIVE_GEMM_MIN_ROWS - 1, (size_t)MK_NATIVE_GEMM_MIN_ROWS, (size_t)96}) {
        SCOPED_TRACE("max_rows " + std::to_string(max_rows));
        mk_backend_config cfg = mk_backend_config_default(MK_BACKEND_CPU);
        cfg.weight_dtype = MK_DTYPE_NATIVE;
        cfg.threads = threads;
        mk_backend *b = nullptr;
        MK_ASSERT_OK(mk_backend_create(&cfg, &b));
        std::vector<void *> held;
        auto store = [&](uint32_t type, size_t rows, size_t cols, const std::vector<uint8_t> &src) {
            void *mem = nullptr;
            EXPECT_EQ(b->ops->alloc(b, b->ops->native_weight_bytes(b, type, rows, cols), &mem), MK_OK);
            held.push_back(mem);
            mk_weight w = {mem, 0, rows, cols};
            EXPECT_EQ(b->ops->upload_native_weight(b, &w, type, src.data(), src.size()), MK_OK) << mk_last_error();
            return w;
        };
        store(MK_GGML_TYPE_Q4_1, 64, 768, random_rows(MK_GGML_TYPE_Q4_1, 64, 768, rng)); // before the reserve
        MK_ASSERT_OK(b->ops->reserve(b, max_rows, 8, 64, &hp));
        const size_t base = mk_cpu_backend_scratch_bytes(b);
        EXPECT_GT(base, 0u); // the activation rows
        for (uint32_t type : kQuantized) store(type, 64, 768, random_rows(type, 64, 768, rng));
        store(kStoredAsF32, 64, 768, random_rows(kStoredAsF32, 64, 768, rng));
        EXPECT_EQ(mk_cpu_backend_scratch_bytes(b), base) << "tiles held for formats with n-row dots";
        const std::vector<uint8_t> f16 = random_rows(MK_GGML_TYPE_F16, 300, 256, rng);
        const mk_weight wf = store(MK_GGML_TYPE_F16, 300, 256, f16);
        const size_t tiles = max_rows >= MK_NATIVE_GEMM_MIN_ROWS ? threads * MK_NATIVE_GEMM_TILE * width * sizeof(float) : 0;
        EXPECT_EQ(mk_cpu_backend_scratch_bytes(b), base + tiles) << "after an F16 weight";
        store(MK_GGML_TYPE_BF16, 64, 768, random_rows(MK_GGML_TYPE_BF16, 64, 768, rng));
        EXPECT_EQ(mk_cpu_backend_scratch_bytes(b), base + tiles) << "the tiles are held once";
        MK_ASSERT_OK(b->ops->reserve(b, max_rows, 8, 64, &hp)); // a second reserve keeps them
        EXPECT_EQ(mk_cpu_backend_scratch_bytes(b), base + tiles) << "after a second reserve";
        // The product of max_rows F16 rows: the tiles' bits where they are held, else the dots'.
        const std::vector<float> x = random_floats(max_rows * 256, rng);
        std::vector<float> y(max_rows * 300);
        const mk_gemm_input in = {x.data(), nullptr, false, false};
        MK_ASSERT_OK(b->ops->matmul(b, y.data(), &in, &wf, max_rows));
        NativeWeight ref_w(MK_GGML_TYPE_F16, f16, 300, 256);
        NativeCtx tiled(threads, mk_cpu_quant_best(), max_rows * 256 / 32, 256);
        NativeCtx dots(threads, mk_cpu_quant_best(), max_rows * 256 / 32, 256);
        dots.ctx.wtile = nullptr, dots.ctx.wtile_elems = 0;
        const std::vector<float> want = native_product(tiles ? tiled : dots, ref_w, x, max_rows, 256, 300);
        const std::vector<float> other = native_product(tiles ? dots : tiled, ref_w, x, max_rows, 256, 300);
        EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0) << "not the expected path's bits";
        if (tiles) {
            EXPECT_NE(std::memcmp(want.data(), other.data(), y.size() * sizeof(float)), 0) << "paths agree: no test";
        }
        for (void *m : held) b->ops->release(b, m);
        b->ops->destroy(b);
    }
}

// The pool runs every item exactly once, for chunk sizes that do and do not divide n.
TEST(CpuPool, EveryItemRunsExactlyOnce) {
    for (size_t threads : {1u, 2u, 3u, 5u}) {
        mk_cpu_pool *p = nullptr;
        MK_ASSERT_OK(mk_cpu_pool_create(threads, &p));
        for (size_t n : {1u, 7u, 64u, 1001u}) {
            for (size_t chunk : {1u, 3u, 16u}) {
                std::vector<int> hits(n, 0);
                mk_cpu_pool_run(p, n, chunk, [](void *arg, size_t b, size_t e, size_t) {
                    int *h = static_cast<int *>(arg);
                    for (size_t i = b; i < e; i++) __atomic_fetch_add(&h[i], 1, __ATOMIC_RELAXED);
                }, hits.data());
                for (size_t i = 0; i < n; i++) ASSERT_EQ(hits[i], 1) << threads << " threads, n " << n << ", chunk " << chunk;
            }
        }
        mk_cpu_pool_free(p);
    }
    // Back-to-back jobs (workers still spinning) and jobs after a pause (workers asleep).
    mk_cpu_pool *p = nullptr;
    MK_ASSERT_OK(mk_cpu_pool_create(3, &p));
    std::vector<int> hits(50, 0);
    for (int job = 0; job < 300; job++) {
        if (job % 50 == 49) usleep(2000);
        mk_cpu_pool_run(p, hits.size(), 2, [](void *arg, size_t b, size_t e, size_t) {
            int *h = static_cast<int *>(arg);
            for (size_t i = b; i < e; i++) __atomic_fetch_add(&h[i], 1, __ATOMIC_RELAXED);
        }, hits.data());
    }
    for (int h : hits) ASSERT_EQ(h, 300);
    mk_cpu_pool_free(p);
    p = nullptr;
    EXPECT_EQ(mk_cpu_pool_create(0, &p), MK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(p, nullptr);
}

// F32 matrices are kept as F32 and every quantized format (each has a kernel)
// in its own blocks; the embedding of a native table is the dequantized row.
TEST(NativeWeightStore, F32StaysF32AndEveryQuantizedFormatKeepsItsBlocks) {
    std::mt19937 rng(11);
    const size_t rows = 5, cols = 256;
    const std::vector<uint8_t> q5 = random_rows(kStoredAsF32, rows, cols, rng);
    NativeWeight w(kStoredAsF32, q5, rows, cols);
    EXPECT_EQ(w.weight()->format, (uint32_t)MK_GGML_TYPE_F32);
    EXPECT_EQ(mk_cpu_native_weight_bytes(kStoredAsF32, rows, cols), rows * cols * 4);
    for (const Format &f : kFormats) { // the formats with a kernel keep their blocks
        NativeWeight kept(f.type, random_rows(f.type, rows, cols, rng), rows, cols);
        EXPECT_EQ(kept.weight()->format, f.type) << f.name;
        EXPECT_EQ(mk_cpu_native_weight_bytes(f.type, rows, cols), rows * row_bytes(f.type, cols)) << f.name;
    }
    std::vector<float> ref(rows * cols);
    MK_ASSERT_OK(mk_gguf_dequantize(kStoredAsF32, q5.data(), q5.size(), ref.data(), ref.size()));
    const int32_t ids[] = {4, 0, 4};
    std::vector<float> out(3 * cols);
    MK_ASSERT_OK(mk_cpu_native_embed(out.data(), w.weight(), ids, 3));
    for (size_t i = 0; i < 3; i++)
        EXPECT_EQ(std::memcmp(&out[i * cols], &ref[ids[i] * cols], cols * sizeof(float)), 0) << i;

    // Every kept format: the embedding rows are the loader's dequantized rows, bit for bit
    // (a row gathered from the wrong offset or decoded by another rule differs).
    for (const Format &f : kFormats) {
        const std::vector<uint8_t> q = random_rows(f.type, rows, cols, rng);
        NativeWeight kept(f.type, q, rows, cols);
        std::vector<float> refq(rows * cols);
        MK_ASSERT_OK(mk_gguf_dequantize(f.type, q.data(), q.size(), refq.data(), refq.size()));
        const int32_t mixed[] = {3, 0, 4, 3, 1};
        std::vector<float> got(5 * cols + 3, kSentinel);
        MK_ASSERT_OK(mk_cpu_native_embed(got.data(), kept.weight(), mixed, 5));
        for (size_t i = 0; i < 5; i++)
            EXPECT_EQ(std::memcmp(&got[i * cols], &refq[mixed[i] * cols], cols * sizeof(float)), 0) << f.name << " row " << i;
        for (size_t i = 5 * cols; i < got.size(); i++) EXPECT_EQ(got[i], kSentinel) << f.name;
    }
    const std::vector<uint8_t> q8 = random_rows(MK_GGML_TYPE_Q8_0, rows, cols, rng);
    // A stored tensor of the wrong size is refused.
    std::vector<uint8_t> buf(mk_cpu_native_weight_bytes(MK_GGML_TYPE_Q8_0, rows, cols) + 64);
    mk_weight short_w = {buf.data(), 0, rows, cols};
    EXPECT_EQ(mk_cpu_native_store(&short_w, MK_GGML_TYPE_Q8_0, q8.data(), q8.size() - 1), MK_ERR_DATA_LENGTH);
    EXPECT_EQ(mk_cpu_native_weight_bytes(MK_GGML_TYPE_Q8_0, rows, 33), 0u); // not whole blocks
}

// The native mode's float attention agrees with the double-accumulating reference, in
// both compiled copies, for head widths with and without a tail past the 8 lanes.
TEST(NativeAttention, FloatAttentionMatchesTheReference) {
    std::mt19937 rng(21);
    std::vector<mk_attention_fast_fn> fns = {mk_cpu_attention_fast_for(mk_cpu_quant_portable())};
    if (mk_cpu_quant_avx2()) fns.push_back(mk_cpu_attention_fast_for(mk_cpu_quant_avx2()));
    for (size_t head_dim : {8u, 20u, 64u, 128u}) {
        const size_t rows = 3, past = 37, heads = 6, kv_heads = 2, ctx = past + rows;
        const std::vector<float> q = random_floats(rows * heads * head_dim, rng);
        const std::vector<float> k = random_floats(ctx * kv_heads * head_dim, rng);
        const std::vector<float> v = random_floats(ctx * kv_heads * head_dim, rng);
        std::vector<float> ref(rows * heads * head_dim);
        mk_cpu_attention(ref.data(), q.data(), k.data(), v.data(), rows, past, heads, kv_heads, head_dim);
        for (mk_attention_fast_fn fn : fns) {
            std::vector<float> got(ref.size() + 4, kSentinel);
            fn(got.data(), q.data(), k.data(), v.data(), mk_kv_pages{}, 0, rows * heads, past, heads, kv_heads, head_dim);
            for (size_t i = ref.size(); i < got.size(); i++) EXPECT_EQ(got[i], kSentinel);
            std::vector<float> parts(ref.size());
            fn(parts.data(), q.data(), k.data(), v.data(), mk_kv_pages{}, 0, 5, past, heads, kv_heads, head_dim);
            fn(parts.data(), q.data(), k.data(), v.data(), mk_kv_pages{}, 5, rows * heads, past, heads, kv_heads, head_dim);
            got.resize(ref.size());
            EXPECT_TRUE(bit_identical(got, parts)) << "a split of the (row, head) pairs changed the result";
            for (size_t i = 0; i < ref.size(); i++)
                ASSERT_NEAR(got[i], ref[i], 2e-5f * (1.0f + std::fabs(ref[i]))) << "head_dim " << head_dim << " at " << i;
        }
        // Through a block table (blocks of 2, 4 and 16 positions, out of order, the unnamed
        // rows NaN): the bits of the contiguous cache, for the fast copies and the references.
        for (uint32_t shift : {1u, 2u, 4u}) {
            const size_t block = (size_t)1 << shift, logical = (ctx + block - 1) / block, kv_row = kv_heads * head_dim;
            std::vector<int32_t> table(logical);
            for (size_t i = 0; i < logical; i++) table[i] = (int32_t)(logical - i); // reversed; block 0 unnamed
            const mk_kv_pages pages{table.data(), shift, 0};
            std::vector<float> pk((logical + 1) * block * kv_row, std::nanf("")), pv(pk.size(), std::nanf(""));
            for (size_t t = 0; t < ctx; t++) {
                std::memcpy(pk.data() + mk_kv_row(pages, t) * kv_row, k.data() + t * kv_row, kv_row * sizeof(float));
                std::memcpy(pv.data() + mk_kv_row(pages, t) * kv_row, v.data() + t * kv_row, kv_row * sizeof(float));
            }
            for (mk_attention_fast_fn fn : fns) {
                std::vector<float> flat(ref.size()), paged(ref.size());
                fn(flat.data(), q.data(), k.data(), v.data(), mk_kv_pages{}, 0, rows * heads, past, heads, kv_heads,
                   head_dim);
                fn(paged.data(), q.data(), pk.data(), pv.data(), pages, 0, rows * heads, past, heads, kv_heads, head_dim);
                EXPECT_TRUE(bit_identical(flat, paged)) << "fast, block " << block << ", head_dim " << head_dim;
            }
            std::vector<float> paged(ref.size());
            mk_cpu_attention_heads(paged.data(), q.data(), pk.data(), pv.data(), pages, 0, rows * heads, past, heads,
                                   kv_heads, head_dim);
            EXPECT_TRUE(bit_identical(ref, paged)) << "reference, block " << block << ", head_dim " << head_dim;
        }
    }
}

} // namespace
