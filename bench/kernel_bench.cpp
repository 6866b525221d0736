// kernel_bench: bandwidth of the meshkern CUDA kernels on a real GPU.
//
// The cases are the op grid's (tests/ops/op_cases.cpp, the table tests/ops/test_ops.cpp checks
// case by case): kernel_bench times those marked for perf, as llama.cpp's test-backend-ops
// runs its case list in perf mode. For each case: inputs are random and non-zero; the kernel is run once and
// validated against the CPU backend's op (host/backend/cpu/cpu_ops.h) before anything is timed; then
// it is timed with CUDA events (warm-up, median of N), rotating among several input sets
// when one set would fit in L2. Bytes are the fewest a kernel must move (each input read
// once, each output written once); the ceiling is a measured device-to-device cudaMemcpy
// (bytes read + written). Prints a compact table and writes <outdir>/kernel_bench.csv.
//
// usage: kernel_bench [outdir]      exit 2: no CUDA device; exit 1: a validation failed
// env (sizes selectable, so the same binary also runs under tests/cudasim with small shapes):
//   MK_KBENCH_ONLY=a,b        run only the named case groups (copy, rmsnorm,
//                             embed, rope, swiglu, argmax, convert, kv_append, gemv, decode,
//                             prefill, prefill_tc, gemm)
//   MK_KBENCH_GEMV_SCALE=n    divide the GEMV shapes by n (the cudasim smoke test)
//   MK_KBENCH_PREFILL=r:p:h:kv:d[,...]  prefill shapes (rows, past, heads, kv heads, head_dim)
//                             instead of the table's perf cases (prefill; prefill_tc with F32
//                             and BF16 caches)
//   MK_KBENCH_GEMM_N=n        the square cuBLAS BF16 GEMM the tensor-core prefill is compared with
//   MK_KBENCH_ITERS=n         timed runs per case (median; default 50)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "kernels.h"
#include "model/gguf.h"
#include "ops/op_cases.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace {

using namespace mk_ops;

#define CK(expr)                                                                                    \
    do {                                                                                            \
        const cudaError_t e_ = (expr);                                                              \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "kernel_bench: %s: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

#define MK(expr)                                                                                    \
    do {                                                                                            \
        const mk_status s_ = (expr);                                                                \
        if (s_ != MK_OK) {                                                                          \
            fprintf(stderr, "kernel_bench: %s: %s: %s\n", #expr, mk_status_name(s_), mk_last_error()); \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

std::vector<float> rnd(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<float> u(1.0f / 64, 1.0f);
    std::vector<float> v(n);
    for (auto &x : v) x = (g() & 1 ? 1.0f : -1.0f) * u(g) * scale;
    return v;
}

// Uploads, poison and downloads go on the stream the kernels run on: the legacy default
// stream does not order against a non-blocking stream, so on a GPU a poison memset there
// could land after the kernel's writes (and cudasim interleaves the two at random).
void *dev_upload(cudaStream_t s, const void *h, size_t bytes) {
    void *d = nullptr;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s)); // h may be a temporary of the caller
    return d;
}

void *dev_alloc(cudaStream_t s, size_t bytes) {
    void *d = nullptr;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemsetAsync(d, 0xFF, bytes, s)); // poison
    return d;
}

template <class T>
std::vector<T> dev_download(cudaStream_t s, const void *d, size_t n) {
    std::vector<T> h(n);
    CK(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    return h;
}

// max |got - ref| / (atol + rtol |ref|) <= 1 ?
bool close(const char *what, const std::vector<float> &got, const std::vector<float> &ref, double atol, double rtol) {
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double g = got[i], r = ref[i];
        if (!(std::fabs(g - r) <= atol + rtol * std::fabs(r))) {
            if (bad < 5) fprintf(stderr, "  %s [%zu] got %g ref %g\n", what, i, g, r);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "kernel_bench: %s: %zu mismatches\n", what, bad);
    return bad == 0;
}

float maxabs(const std::vector<float> &v) {
    float m = 0;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}

struct Result {
    std::string kernel, shape;
    double us, bytes, flops;
    bool valid;
};

struct Bench {
    cudaStream_t stream{};
    cudaEvent_t e0{}, e1{};
    size_t l2 = 0;
    double copy_gbs = 0;
    double gemm_tflops = 0; // cuBLAS BF16 GEMM rate of this run (bench_gemm_bf16)
    std::string gemm_shape;
    std::vector<Result> results;
    int iters = 50;

    // Median time (us) of `run(set)` over iters, after warm-up; `sets` input sets rotated.
    double time_us(int sets, const std::function<void(int)> &run) {
        for (int i = 0; i < 5; i++) run(i % sets);
        CK(cudaStreamSynchronize(stream));
        std::vector<float> t;
        for (int i = 0; i < iters; i++) {
            CK(cudaEventRecord(e0, stream));
            run(i % sets);
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms * 1000.0f);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
    // How many input sets of `bytes` keep the working set above 3x L2.
    int sets_for(double bytes) const {
        const double want = 3.0 * (double)l2 / std::max(bytes, 1.0);
        return (int)std::min(8.0, std::max(1.0, std::ceil(want)));
    }
    void add(const std::string &k, const std::string &shape, double us, double bytes, double flops, bool valid) {
        results.push_back({k, shape, us, bytes, flops, valid});
    }
    // A block table mapping each block of 16 positions to itself (up to 2^20 positions): the
    // attention kernels read every cache through one, and this one reads a contiguous cache.
    mk_kv_pages identity_pages() {
        if (!ident) {
            std::vector<int32_t> id((1u << 20) / 16);
            for (size_t i = 0; i < id.size(); i++) id[i] = (int32_t)i;
            ident = (int32_t *)dev_upload(stream, id.data(), id.size() * sizeof(int32_t));
        }
        return mk_kv_pages{ident, 4, 0};
    }
    int32_t *ident = nullptr;
};

// ================================================================================ cases ==

void bench_copy(Bench &b) {
    const size_t bytes = (size_t)1 << 30;
    void *a = dev_alloc(b.stream, bytes), *c = dev_alloc(b.stream, bytes);
    const double us = b.time_us(1, [&](int) { CK(cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, b.stream)); });
    b.copy_gbs = 2.0 * bytes / (us * 1e-6) / 1e9;
    b.add("memcpy_d2d", "1 GiB", us, 2.0 * bytes, 0, true);
    CK(cudaFree(a));
    CK(cudaFree(c));
}

// A dtype's element from a float and back (F16 or BF16).
uint16_t to_half(float f, mk_dtype d) { return d == MK_DTYPE_F16 ? mk_f32_to_f16(f) : mk_f32_to_bf16(f); }
float from_half(uint16_t h, mk_dtype d) { return d == MK_DTYPE_F16 ? mk_f16_to_f32(h) : mk_bf16_to_f32(h); }

// v stored in dtype d (F32, F16 or BF16): the bytes a kernel gets; v becomes the values they
// hold (the rounded ones), which the reference reads.
std::vector<uint8_t> as_dtype(std::vector<float> &v, mk_dtype d) {
    std::vector<uint8_t> out(v.size() * (d == MK_DTYPE_F32 ? 4 : 2));
    if (d == MK_DTYPE_F32) {
        std::memcpy(out.data(), v.data(), out.size());
        return out;
    }
    for (size_t i = 0; i < v.size(); i++) {
        const uint16_t h = to_half(v[i], d);
        std::memcpy(&out[i * 2], &h, 2);
        v[i] = from_half(h, d);
    }
    return out;
}

void bench_rmsnorm(Bench &b, const NormCase &c) {
    const size_t rows = c.rows, cols = c.cols, n = rows * cols;
    const bool add = c.add;
    const float scale = c.tiny ? 1e-3f : 1.0f; // tiny: the mean square below eps
    const double bytes = (add ? 4.0 : 2.0) * n * 4 + cols * 4;
    const int sets = b.sets_for(bytes);
    std::vector<float> x = rnd(n, 1, scale), w = rnd(cols, 2), d = rnd(n, 3, scale);
    std::vector<void *> dx, dd;
    for (int s = 0; s < sets; s++) {
        dx.push_back(dev_upload(b.stream, x.data(), n * 4));
        dd.push_back(dev_upload(b.stream, d.data(), n * 4));
    }
    float *dw = (float *)dev_upload(b.stream, w.data(), cols * 4), *dout = (float *)dev_alloc(b.stream, n * 4);
    auto run = [&](int s) {
        if (add) MK(mk_kernel_add_rmsnorm((float *)dx[s], dout, (float *)dd[s], dw, rows, cols, 1e-5f, b.stream));
        else MK(mk_kernel_rmsnorm(dout, (float *)dx[s], dw, rows, cols, 1e-5f, b.stream));
    };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    std::vector<float> ref(n);
    if (add) mk_cpu_add_rmsnorm(x.data(), ref.data(), d.data(), w.data(), rows, cols, 1e-5f);
    else mk_cpu_rmsnorm(ref.data(), x.data(), w.data(), rows, cols, 1e-5f);
    const bool ok = close(add ? "add_rmsnorm" : "rmsnorm", dev_download<float>(b.stream, dout, n), ref, 1e-6 * maxabs(ref), 1e-5);
    const double us = b.time_us(sets, run);
    b.add(add ? "add_rmsnorm" : "rmsnorm", std::to_string(rows) + "x" + std::to_string(cols) + (c.tiny ? " tiny" : ""),
          us, bytes, 0, ok);
    for (int s = 0; s < sets; s++) {
        CK(cudaFree(dx[s]));
        CK(cudaFree(dd[s]));
    }
    CK(cudaFree(dw));
    CK(cudaFree(dout));
}

void bench_embed(Bench &b, const EmbedCase &c) {
    const size_t vocab = c.vocab, hidden = c.hidden, n = c.n, es = mk_dtype_size(c.dtype);
    std::vector<float> t = rnd(vocab * hidden, 4);
    const std::vector<uint8_t> th = as_dtype(t, c.dtype);
    std::vector<int32_t> ids(n);
    std::mt19937 g(5);
    for (auto &id : ids) id = (int32_t)(g() % vocab);
    void *dt = dev_upload(b.stream, th.data(), th.size()), *di = dev_upload(b.stream, ids.data(), n * 4);
    float *dout = (float *)dev_alloc(b.stream, n * hidden * 4);
    auto run = [&](int) { MK(mk_kernel_embed(dout, dt, c.dtype, (int32_t *)di, n, hidden, vocab, b.stream)); };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    std::vector<float> ref(n * hidden);
    mk_cpu_embed(ref.data(), t.data(), ids.data(), n, hidden);
    const bool ok = close("embed", dev_download<float>(b.stream, dout, n * hidden), ref, 0, 0);
    const double us = b.time_us(1, run); // the gather itself is random: no rotation needed
    b.add(std::string("embed_") + dtype_tag(c.dtype), std::to_string(n) + "x" + std::to_string(hidden), us,
          n * hidden * (es + 4.0) + n * 4, 0, ok);
    CK(cudaFree(dt));
    CK(cudaFree(di));
    CK(cudaFree(dout));
}

void bench_rope(Bench &b, const RopeCase &c) {
    const size_t rows = c.rows, heads = c.heads, hd = c.head_dim, n = rows * heads * hd;
    std::vector<float> x = rnd(n, 6);
    std::vector<int32_t> pos(rows);
    for (size_t r = 0; r < rows; r++) pos[r] = c.pos0 + (int32_t)r;
    const int sets = b.sets_for(2.0 * n * 4);
    std::vector<void *> dx;
    for (int s = 0; s < sets; s++) dx.push_back(dev_upload(b.stream, x.data(), n * 4));
    void *dp = dev_upload(b.stream, pos.data(), rows * 4);
    auto run = [&](int s) {
        MK(mk_kernel_rope((float *)dx[s], (int32_t *)dp, rows, heads, hd, c.theta, c.layout, b.stream));
    };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    std::vector<float> ref = x;
    mk_cpu_rope(ref.data(), pos.data(), rows, heads, hd, c.theta, c.layout);
    const bool ok = close("rope", dev_download<float>(b.stream, dx[0], n), ref, 1e-6 * maxabs(ref), 1e-5);
    const double us = b.time_us(sets, run); // in place: later runs rotate further, same traffic
    b.add(c.layout == MK_ROPE_ROTATE_HALF ? "rope" : "rope_adjacent",
          std::to_string(rows) + "x" + std::to_string(heads) + "x" + std::to_string(hd), us, 2.0 * n * 4, 0, ok);
    for (void *p : dx) CK(cudaFree(p));
    CK(cudaFree(dp));
}

void bench_swiglu(Bench &b, const SwigluCase &c) {
    const size_t n = c.n, es = mk_dtype_size(c.dtype);
    std::vector<float> g = rnd(n, 7, 6.0f), u = rnd(n, 8);
    const std::vector<uint8_t> gh = as_dtype(g, c.dtype), uh = as_dtype(u, c.dtype);
    const double bytes = n * (2.0 * es + 4);
    const int sets = b.sets_for(bytes);
    std::vector<void *> dg, du;
    for (int s = 0; s < sets; s++) {
        dg.push_back(dev_upload(b.stream, gh.data(), n * es));
        du.push_back(dev_upload(b.stream, uh.data(), n * es));
    }
    float *dout = (float *)dev_alloc(b.stream, n * 4);
    auto run = [&](int s) { MK(mk_kernel_swiglu(dout, dg[s], du[s], c.dtype, n, b.stream)); };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    std::vector<float> ref(n);
    mk_cpu_swiglu(ref.data(), g.data(), u.data(), n);
    const bool ok = close("swiglu", dev_download<float>(b.stream, dout, n), ref, 1e-7 * maxabs(ref), 1e-5);
    const double us = b.time_us(sets, run);
    b.add(std::string("swiglu_") + dtype_tag(c.dtype), std::to_string(n), us, bytes, 0, ok);
    for (int s = 0; s < sets; s++) {
        CK(cudaFree(dg[s]));
        CK(cudaFree(du[s]));
    }
    CK(cudaFree(dout));
}

void bench_argmax(Bench &b, const ArgmaxCase &c) {
    const size_t rows = c.rows, n = c.n;
    std::vector<float> x = rnd(rows * n, 9, 10.0f);
    for (size_t r = 0; r < rows; r++) x[r * n + (r * 7919) % n] = 99.0f;
    const double bytes = rows * n * 4.0;
    const int sets = b.sets_for(bytes);
    std::vector<void *> dx;
    for (int s = 0; s < sets; s++) dx.push_back(dev_upload(b.stream, x.data(), rows * n * 4));
    int32_t *dout = (int32_t *)dev_alloc(b.stream, rows * 4);
    auto run = [&](int s) { MK(mk_kernel_argmax(dout, (float *)dx[s], rows, n, b.stream)); };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    std::vector<int32_t> ref(rows), got = dev_download<int32_t>(b.stream, dout, rows);
    mk_cpu_argmax(ref.data(), x.data(), rows, n);
    const bool ok = got == ref;
    if (!ok) fprintf(stderr, "kernel_bench: argmax mismatch\n");
    const double us = b.time_us(sets, run);
    b.add("argmax", std::to_string(rows) + "x" + std::to_string(n), us, bytes, 0, ok);
    for (void *p : dx) CK(cudaFree(p));
    CK(cudaFree(dout));
}

void bench_convert(Bench &b, const ConvertCase &c) {
    const size_t n = c.n, ss = mk_dtype_size(c.src), ds = mk_dtype_size(c.dst);
    std::vector<float> x = rnd(n, 10, 100.0f);
    const std::vector<uint8_t> src = as_dtype(x, c.src); // x: the source values, widened
    std::vector<float> want_f = x;
    const std::vector<uint8_t> want = c.dst == c.src ? src : as_dtype(want_f, c.dst);
    const double bytes = n * (double)(ss + ds);
    const int sets = b.sets_for(bytes);
    std::vector<void *> dx;
    for (int s = 0; s < sets; s++) dx.push_back(dev_upload(b.stream, src.data(), src.size()));
    void *dout = dev_alloc(b.stream, n * ds);
    auto run = [&](int s) { MK(mk_kernel_convert(dout, c.dst, dx[s], c.src, n, b.stream)); };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    const bool ok = dev_download<uint8_t>(b.stream, dout, n * ds) == want;
    if (!ok) fprintf(stderr, "kernel_bench: convert mismatch\n");
    const double us = b.time_us(sets, run);
    b.add(std::string("convert_") + dtype_tag(c.src) + "_" + dtype_tag(c.dst), std::to_string(n), us, bytes, 0, ok);
    for (void *p : dx) CK(cudaFree(p));
    CK(cudaFree(dout));
}

// Rows appended alternately at past and at 0 (the same traffic, not the same lines).
void bench_kv_append(Bench &b, const KvAppendCase &c) {
    const size_t rows = c.rows, kv_dim = c.kv_dim, n = rows * kv_dim, ctx = c.ctx;
    std::vector<float> k = rnd(n, 11), v = rnd(n, 12);
    void *dk = dev_upload(b.stream, k.data(), n * 4), *dv = dev_upload(b.stream, v.data(), n * 4);
    float *kc = (float *)dev_alloc(b.stream, ctx * kv_dim * 4), *vc = (float *)dev_alloc(b.stream, ctx * kv_dim * 4);
    auto run = [&](int s) {
        MK(mk_kernel_kv_append(kc, vc, (float *)dk, (float *)dv, s % 2 ? c.past : 0, rows, kv_dim, b.stream));
    };
    run(1);
    CK(cudaStreamSynchronize(b.stream));
    const bool ok = dev_download<float>(b.stream, kc + c.past * kv_dim, n) == k &&
                    dev_download<float>(b.stream, vc + c.past * kv_dim, n) == v;
    if (!ok) fprintf(stderr, "kernel_bench: kv_append mismatch\n");
    const double us = b.time_us(2, run);
    b.add("kv_append", std::to_string(rows) + "x" + std::to_string(kv_dim), us, 4.0 * n * 4, 0, ok);
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    CK(cudaFree(kc));
    CK(cudaFree(vc));
}

// A prefill kernel's output rows 0, rows/2 and rows-1 against the CPU reference (F32
// caches k, v), within tol of the largest |v| plus tol relative.
bool prefill_rows_match(const char *name, const std::vector<float> &got, const std::vector<float> &q,
                        const std::vector<float> &k, const std::vector<float> &v, size_t rows, size_t past, size_t nh,
                        size_t nkv, size_t hd, double tol) {
    bool ok = true;
    for (size_t r : {(size_t)0, rows / 2, rows - 1}) {
        std::vector<float> ref(nh * hd);
        mk_cpu_attention(ref.data(), q.data() + r * nh * hd, k.data(), v.data(), 1, past + r, nh, nkv, hd);
        std::vector<float> g(got.begin() + (ptrdiff_t)(r * nh * hd), got.begin() + (ptrdiff_t)((r + 1) * nh * hd));
        ok = close(name, g, ref, tol * maxabs(v), tol) && ok;
    }
    return ok;
}

// Causal prefill flops: rows attend to (past + r + 1) keys each; QK and PV are 4 * hd flops
// per (row, key, head).
double prefill_flops(size_t rows, size_t past, size_t nh, size_t hd) {
    const double pairs = (double)rows * past + (double)rows * (rows + 1) / 2.0;
    return 4.0 * hd * nh * pairs;
}

// Prefill: validated on sampled rows (a full CPU reference would take minutes).
void bench_prefill(Bench &b, const AttnCase &c) {
    const size_t rows = c.rows, past = c.past, nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim;
    const size_t keys = past + rows, qn = rows * nh * hd, kvn = keys * nkv * hd;
    std::vector<float> q = rnd(qn, 13), k = rnd(kvn, 14), v = rnd(kvn, 15);
    void *dq = dev_upload(b.stream, q.data(), qn * 4), *dk = dev_upload(b.stream, k.data(), kvn * 4), *dv = dev_upload(b.stream, v.data(), kvn * 4);
    float *dout = (float *)dev_alloc(b.stream, qn * 4);
    auto run = [&](int) {
        MK(mk_kernel_attention_prefill_kv(dout, (float *)dq, (float *)dk, (float *)dv, b.identity_pages(), MK_DTYPE_F32, rows, past, nh, nkv, hd, b.stream));
    };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    std::vector<float> got = dev_download<float>(b.stream, dout, qn);
    const bool ok = prefill_rows_match("attention_prefill", got, q, k, v, rows, past, nh, nkv, hd, 1e-5);
    const double us = b.time_us(1, run);
    const double flops = prefill_flops(rows, past, nh, hd);
    b.add("attention_prefill", std::to_string(rows) + "r+" + std::to_string(past) + " h" + std::to_string(nh) + "/" +
                                   std::to_string(nkv) + " d" + std::to_string(hd),
          us, (2.0 * qn + 2.0 * kvn) * 4, flops, ok);
    CK(cudaFree(dq));
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    CK(cudaFree(dout));
}

// Decode attention over a cache of max_keys rows (a range's capacity: the grid and split count
// come from it) holding past + 1 keys, in the KV dtype kv. The figure is the KV bytes read per
// second (K and V of the keys once, plus q and out): the kernel is memory-bound, so this is
// the number to hold against the copy ceiling.
void bench_decode(Bench &b, const DecodeCase &c) {
    const size_t past = c.past, max_keys = c.max_keys, nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim;
    const mk_dtype kv = c.kv;
    const size_t keys = past + 1, qn = nh * hd, kvn = keys * nkv * hd, capn = max_keys * nkv * hd;
    const size_t esz = mk_dtype_size(kv);
    std::vector<float> q = rnd(qn, 16), k = rnd(kvn, 17), v = rnd(kvn, 18);
    std::vector<uint8_t> kb(capn * esz, 0), vb(capn * esz, 0);
    for (size_t i = 0; i < kvn; i++) { // the stored values; the reference reads the same ones
        if (kv == MK_DTYPE_F32) {
            std::memcpy(&kb[i * 4], &k[i], 4);
            std::memcpy(&vb[i * 4], &v[i], 4);
            continue;
        }
        const uint16_t hk = kv == MK_DTYPE_F16 ? mk_f32_to_f16(k[i]) : mk_f32_to_bf16(k[i]);
        const uint16_t hv = kv == MK_DTYPE_F16 ? mk_f32_to_f16(v[i]) : mk_f32_to_bf16(v[i]);
        k[i] = kv == MK_DTYPE_F16 ? mk_f16_to_f32(hk) : mk_bf16_to_f32(hk);
        v[i] = kv == MK_DTYPE_F16 ? mk_f16_to_f32(hv) : mk_bf16_to_f32(hv);
        std::memcpy(&kb[i * 2], &hk, 2);
        std::memcpy(&vb[i * 2], &hv, 2);
    }
    const double bytes = 2.0 * kvn * esz + 2.0 * qn * 4;
    const int sets = b.sets_for(bytes);
    std::vector<void *> dk, dv;
    for (int s = 0; s < sets; s++) {
        dk.push_back(dev_upload(b.stream, kb.data(), kb.size()));
        dv.push_back(dev_upload(b.stream, vb.data(), vb.size()));
    }
    void *dq = dev_upload(b.stream, q.data(), qn * 4);
    const int32_t pos = (int32_t)past; /* the key count is read on the device */
    void *dpos = dev_upload(b.stream, &pos, 4);
    const size_t wsb = mk_kernel_attention_decode_workspace_bytes(max_keys, nh, hd);
    size_t splits = 0;
    MK(mk_kernel_attention_decode_splits(&splits, max_keys, nh, nkv));
    void *ws = dev_alloc(b.stream, wsb);
    float *dout = (float *)dev_alloc(b.stream, qn * 4);
    auto run = [&](int s) {
        MK(mk_kernel_attention_decode(dout, (float *)dq, dk[s], dv[s], b.identity_pages(), kv, (const int32_t *)dpos, 1, max_keys, nh, nkv, hd,
                                      ws, wsb, b.stream));
    };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    std::vector<float> ref(qn);
    mk_cpu_attention(ref.data(), q.data(), k.data(), v.data(), 1, past, nh, nkv, hd);
    const bool ok = close("attention_decode", dev_download<float>(b.stream, dout, qn), ref, 1e-5 * maxabs(v), 1e-5);
    const double us = b.time_us(sets, run);
    b.add("attention_decode", std::string(mk_dtype_name(kv)) + " " + std::to_string(keys) + "/" +
                                  std::to_string(max_keys) + " keys h" + std::to_string(nh) + "/" +
                                  std::to_string(nkv) + " d" + std::to_string(hd) + " s" + std::to_string(splits),
          us, bytes, 4.0 * hd * nh * keys, ok);
    for (int s = 0; s < sets; s++) {
        CK(cudaFree(dk[s]));
        CK(cudaFree(dv[s]));
    }
    CK(cudaFree(dq));
    CK(cudaFree(dpos));
    CK(cudaFree(ws));
    CK(cudaFree(dout));
}

// The tensor-core prefill (BF16 mma, F32 accumulation) on the same shapes, with the caches in
// kv (F32 today; F16/BF16 when the backend stores them so). Validated on sampled rows with
// the BF16 tolerance of the op grid.
void bench_prefill_tc(Bench &b, const AttnTcCase &c) {
    const size_t rows = c.rows, past = c.past, nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim;
    const mk_dtype kv = c.kv;
    const size_t keys = past + rows, qn = rows * nh * hd, kvn = keys * nkv * hd;
    std::vector<float> q = rnd(qn, 13), k = rnd(kvn, 14), v = rnd(kvn, 15);
    void *dq = dev_upload(b.stream, q.data(), qn * 4), *dk = nullptr, *dv = nullptr;
    const size_t esize = kv == MK_DTYPE_F32 ? 4 : 2;
    if (kv == MK_DTYPE_F32) {
        dk = dev_upload(b.stream, k.data(), kvn * 4);
        dv = dev_upload(b.stream, v.data(), kvn * 4);
    } else {
        std::vector<uint16_t> kh(kvn), vh(kvn);
        for (size_t i = 0; i < kvn; i++) {
            kh[i] = kv == MK_DTYPE_F16 ? mk_f32_to_f16(k[i]) : mk_f32_to_bf16(k[i]);
            vh[i] = kv == MK_DTYPE_F16 ? mk_f32_to_f16(v[i]) : mk_f32_to_bf16(v[i]);
            k[i] = kv == MK_DTYPE_F16 ? mk_f16_to_f32(kh[i]) : mk_bf16_to_f32(kh[i]);
            v[i] = kv == MK_DTYPE_F16 ? mk_f16_to_f32(vh[i]) : mk_bf16_to_f32(vh[i]);
        }
        dk = dev_upload(b.stream, kh.data(), kvn * 2);
        dv = dev_upload(b.stream, vh.data(), kvn * 2);
    }
    float *dout = (float *)dev_alloc(b.stream, qn * 4);
    auto run = [&](int) {
        MK(mk_kernel_attention_prefill_tc(dout, (float *)dq, dk, dv, b.identity_pages(), kv, rows, past, nh, nkv, hd, b.stream));
    };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    std::vector<float> got = dev_download<float>(b.stream, dout, qn);
    const bool ok = prefill_rows_match("attention_prefill_tc", got, q, k, v, rows, past, nh, nkv, hd, 5e-3);
    const double us = b.time_us(1, run);
    const double flops = prefill_flops(rows, past, nh, hd);
    b.add(std::string("attention_prefill_tc"),
          std::to_string(rows) + "r+" + std::to_string(past) + " h" + std::to_string(nh) + "/" + std::to_string(nkv) +
              " d" + std::to_string(hd) + " kv " + (kv == MK_DTYPE_F32 ? "f32" : kv == MK_DTYPE_F16 ? "f16" : "bf16"),
          us, 2.0 * qn * 4 + 2.0 * kvn * esize, flops, ok);
    CK(cudaFree(dq));
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    CK(cudaFree(dout));
}

// The yardstick of the tensor-core prefill: a square cuBLAS GEMM, BF16 inputs, F32 output
// and accumulation (the backend's prefill GEMM), measured in the same run. Validated on
// sampled elements against a double dot product of the rounded inputs.
void bench_gemm_bf16(Bench &b, size_t n) {
    std::vector<float> a = rnd(n * n, 21), c = rnd(n * n, 22);
    std::vector<uint16_t> ah(n * n), ch(n * n);
    for (size_t i = 0; i < n * n; i++) {
        ah[i] = mk_f32_to_bf16(a[i]);
        ch[i] = mk_f32_to_bf16(c[i]);
    }
    void *da = dev_upload(b.stream, ah.data(), n * n * 2), *dc = dev_upload(b.stream, ch.data(), n * n * 2);
    float *dy = (float *)dev_alloc(b.stream, n * n * 4);
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, b.stream) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "kernel_bench: cublasCreate failed\n");
        exit(1);
    }
    const float one = 1.0f, zero = 0.0f;
    const int ni = (int)n;
    auto run = [&](int) {
        // column-major y = a^T c (a read transposed: row-major a), as the backend's GemmEx
        const cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, ni, ni, ni, &one, da, CUDA_R_16BF, ni, dc,
                                               CUDA_R_16BF, ni, &zero, dy, CUDA_R_32F, ni, CUBLAS_COMPUTE_32F,
                                               CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "kernel_bench: cublasGemmEx: %d\n", (int)st);
            exit(1);
        }
    };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    const std::vector<float> y = dev_download<float>(b.stream, dy, n * n);
    std::vector<float> got, ref;
    std::mt19937 g(23);
    for (int s = 0; s < 32; s++) {
        const size_t i = g() % n, j = g() % n; // y[j * n + i] = sum_k a[i, k] c[j, k]
        double acc = 0;
        for (size_t k = 0; k < n; k++) acc += (double)mk_bf16_to_f32(ah[i * n + k]) * mk_bf16_to_f32(ch[j * n + k]);
        got.push_back(y[j * n + i]);
        ref.push_back((float)acc);
    }
    const bool ok = close("gemm_bf16", got, ref, 1e-4 * std::sqrt((double)n), 1e-3);
    const double us = b.time_us(1, run);
    const double flops = 2.0 * (double)n * n * n;
    b.gemm_tflops = flops / (us * 1e-6) / 1e12;
    b.gemm_shape = std::to_string(n) + "^3";
    b.add("cublas_gemm_bf16", b.gemm_shape + " bf16->f32", us, (4.0 + 4.0) * n * n, flops, ok);
    cublasDestroy(h);
    CK(cudaFree(da));
    CK(cudaFree(dc));
    CK(cudaFree(dy));
}

// ------------------------------------------------------------------------ GEMV --
// The decode matrix products that dominate a token: y[rows, out] = x[rows, in] . w[out, in]^T
// with w in BF16 (mk_kernel_gemv) or a GGUF block format dequantized in registers
// (mk_kernel_gemv_q). Bytes: the weight once, x and y once. Random weights (the op grid's
// random_blocks: small f16 scales, every other byte random); the reference widens the same
// weights on the host (mk_gguf_dequantize, which the suite checks bit for bit against the
// gguf package's) and sums in double.
std::vector<uint8_t> gemv_weight(GemvFormat f, size_t out, size_t in, std::vector<float> *wide) {
    wide->assign(out * in, 0.0f);
    if (f == GemvFormat::BF16) {
        std::vector<uint8_t> w(out * in * 2);
        const std::vector<float> v = rnd(out * in, 78);
        for (size_t i = 0; i < v.size(); i++) {
            const uint16_t h = mk_f32_to_bf16(v[i]);
            std::memcpy(&w[i * 2], &h, 2);
            (*wide)[i] = mk_bf16_to_f32(h);
        }
        return w;
    }
    std::vector<uint8_t> w = random_blocks(f, out * in, 77 + out * 3 + in + (size_t)f);
    MK(mk_gguf_dequantize(gemv_ggml_type(f), w.data(), w.size(), wide->data(), wide->size()));
    return w;
}

void bench_gemv_shape(Bench &b, const char *model, GemvFormat f, size_t rows, size_t in, size_t out) {
    std::vector<float> wide;
    const std::vector<uint8_t> w = gemv_weight(f, out, in, &wide);
    const std::vector<float> x = rnd(rows * in, 79);
    const double bytes = (double)w.size() + 4.0 * rows * (in + out);
    const int sets = b.sets_for(bytes);
    std::vector<void *> dw;
    for (int s = 0; s < sets; s++) dw.push_back(dev_upload(b.stream, w.data(), w.size()));
    float *dx = (float *)dev_upload(b.stream, x.data(), x.size() * 4), *dy = (float *)dev_alloc(b.stream, rows * out * 4);
    auto run = [&](int s) {
        if (f == GemvFormat::BF16) MK(mk_kernel_gemv(dy, dx, dw[s], MK_DTYPE_BF16, rows, in, out, b.stream));
        else MK(mk_kernel_gemv_q(dy, dx, dw[s], gemv_ggml_type(f), rows, in, out, b.stream));
    };
    run(0);
    CK(cudaStreamSynchronize(b.stream));
    std::vector<float> ref(rows * out);
    double scale = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t o = 0; o < out; o++) {
            double acc = 0, mag = 0;
            const float *wr = &wide[o * in], *xr = &x[r * in];
            for (size_t k = 0; k < in; k++) {
                acc += (double)xr[k] * wr[k];
                mag += std::fabs((double)xr[k] * wr[k]);
            }
            ref[r * out + o] = (float)acc;
            scale = std::max(scale, mag);
        }
    /* F32 accumulation over `in` terms against a double sum: a few ulps of the magnitudes */
    const bool ok = close("gemv", dev_download<float>(b.stream, dy, rows * out), ref, 1e-6 * scale, 1e-5);
    const double us = b.time_us(sets, run);
    b.add("gemv", std::string(model) + " " + gemv_tag(f) + " " + std::to_string(rows) + "x" + std::to_string(in) + "->" +
                      std::to_string(out),
          us, bytes, 2.0 * rows * in * out, ok);
    for (void *p : dw) CK(cudaFree(p));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
}

// A GEMV case, its shape divided by `scale` (> 1: the cudasim smoke test), the input width kept
// a multiple of the 32-element blocks.
void bench_gemv(Bench &b, const GemvCase &c, size_t scale) {
    const size_t be = gemv_block_elements(c.fmt);
    bench_gemv_shape(b, c.model ? c.model : "-", c.fmt, c.rows, std::max<size_t>(be, c.in_dim / scale / be * be), std::max<size_t>(1, c.out_dim / scale));
}

// ------------------------------------------------------------------ case selection --
bool want(const char *group) {
    const char *only = getenv("MK_KBENCH_ONLY");
    if (!only || !*only) return true;
    std::string list = std::string(",") + only + ",";
    return list.find(std::string(",") + group + ",") != std::string::npos;
}

// Why kernel_bench cannot time a case the table marks for perf (nullptr: it can). Checked for
// every perf case before anything runs, so a mark the benchmark cannot honour fails at once
// (also on a machine without a GPU, where the CI runs it), instead of timing something else.
template <class C>
const char *refuses(const C &) { return nullptr; }
const char *refuses(const ArgmaxCase &c) {
    return c.pattern == ArgPattern::Random ? nullptr : "kernel_bench times random rows only";
}
const char *refuses(const GemvCase &c) {
    if (c.fmt != GemvFormat::BF16 && !gemv_is_blocks(c.fmt)) return "kernel_bench writes BF16 and block weights only";
    if (c.misaligned) return "kernel_bench times aligned operands only";
    return c.model ? nullptr : "a perf GEMV names its model";
}
const char *refuses(const KvAppendCase &c) {
    return c.past + c.rows <= c.ctx && c.rows <= c.past ? nullptr : "kernel_bench alternates rows at 0 and past";
}
const char *refuses(const ConvertCase &c) {
    const auto ok = [](mk_dtype d) { return d == MK_DTYPE_F32 || d == MK_DTYPE_F16 || d == MK_DTYPE_BF16; };
    return ok(c.src) && ok(c.dst) ? nullptr : "kernel_bench converts between F32, F16 and BF16";
}

template <class C>
size_t count_refused(const char *group, const std::vector<C> &cases) {
    size_t n = 0;
    for (const C &c : cases)
        if (is_perf(c.use))
            if (const char *why = refuses(c)) {
                fprintf(stderr, "kernel_bench: %s case %s is marked perf: %s\n", group, c.name().c_str(), why);
                n++;
            }
    return n;
}

// The perf cases of one group of the table, each timed by `one`.
template <class C, class F>
void run_group(Bench &b, const char *group, const std::vector<C> &cases, F one) {
    if (!want(group)) return;
    for (const C &c : cases)
        if (is_perf(c.use)) one(b, c);
}

// MK_KBENCH_PREFILL: prefill shapes in place of the table's (empty when unset).
std::vector<AttnCase> prefill_override() {
    const char *env = getenv("MK_KBENCH_PREFILL");
    if (!env || !*env) return {};
    std::vector<AttnCase> v;
    const char *p = env;
    while (*p) {
        AttnCase s{};
        int used = 0;
        if (sscanf(p, "%zu:%zu:%zu:%zu:%zu%n", &s.rows, &s.past, &s.n_heads, &s.n_kv_heads, &s.head_dim, &used) != 5) {
            fprintf(stderr, "kernel_bench: MK_KBENCH_PREFILL: want rows:past:heads:kv_heads:head_dim[,...] at '%s'\n", p);
            exit(1);
        }
        s.use = CaseUse::Perf;
        v.push_back(s);
        p += used;
        if (*p == ',') p++;
    }
    return v;
}

size_t env_size(const char *name, size_t dflt) {
    const char *e = getenv(name);
    return e && *e ? (size_t)strtoull(e, nullptr, 10) : dflt;
}

} // namespace

int main(int argc, char **argv) {
    const std::string outdir = argc > 1 ? argv[1] : ".";
    // the table, and the prefill shapes MK_KBENCH_PREFILL puts in place of its perf prefills
    std::vector<AttnCase> prefill = prefill_override();
    std::vector<AttnTcCase> prefill_tc;
    if (prefill.empty()) {
        prefill = prefill_cases();
        prefill_tc = prefill_tc_cases();
    } else {
        for (const AttnCase &p : prefill)
            for (const mk_dtype kv : {MK_DTYPE_F32, MK_DTYPE_BF16})
                prefill_tc.push_back({p.rows, p.past, p.n_heads, p.n_kv_heads, p.head_dim, kv, p.use});
    }
    const std::vector<NormCase> norm = norm_cases();
    const std::vector<EmbedCase> embed = embed_cases();
    const std::vector<RopeCase> rope = rope_cases();
    const std::vector<SwigluCase> swiglu = swiglu_cases();
    const std::vector<ArgmaxCase> argmax = argmax_cases();
    const std::vector<ConvertCase> convert = convert_cases();
    const std::vector<KvAppendCase> kv_append = kv_append_cases();
    const std::vector<GemvCase> gemv = gemv_cases();
    const std::vector<DecodeCase> decode = decode_cases();
    const size_t refused = count_refused("rmsnorm", norm) + count_refused("embed", embed) + count_refused("rope", rope) +
                           count_refused("swiglu", swiglu) + count_refused("argmax", argmax) +
                           count_refused("convert", convert) + count_refused("kv_append", kv_append) +
                           count_refused("gemv", gemv) + count_refused("decode", decode) +
                           count_refused("prefill", prefill) + count_refused("prefill_tc", prefill_tc);
    if (refused) return 1;

    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "kernel_bench: no CUDA device\n");
        return 2;
    }
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    Bench b;
    b.l2 = (size_t)prop.l2CacheSize;
    CK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
    CK(cudaEventCreate(&b.e0));
    CK(cudaEventCreate(&b.e1));
    printf("device: %s, %d SMs, L2 %zu MB\n", prop.name, prop.multiProcessorCount, b.l2 >> 20);

    b.iters = (int)std::max<size_t>(1, env_size("MK_KBENCH_ITERS", 50));
    if (want("copy")) bench_copy(b);
    run_group(b, "rmsnorm", norm, bench_rmsnorm);
    run_group(b, "embed", embed, bench_embed);
    run_group(b, "rope", rope, bench_rope);
    run_group(b, "swiglu", swiglu, bench_swiglu);
    run_group(b, "argmax", argmax, bench_argmax);
    run_group(b, "convert", convert, bench_convert);
    run_group(b, "kv_append", kv_append, bench_kv_append);
    const size_t gemv_scale = std::max<size_t>(1, env_size("MK_KBENCH_GEMV_SCALE", 1)); /* > 1: shapes divided (cudasim) */
    run_group(b, "gemv", gemv, [&](Bench &bb, const GemvCase &c) { bench_gemv(bb, c, gemv_scale); });
    run_group(b, "decode", decode, bench_decode);
    run_group(b, "prefill", prefill, bench_prefill);
    run_group(b, "prefill_tc", prefill_tc, bench_prefill_tc);
    if (want("gemm")) bench_gemm_bf16(b, env_size("MK_KBENCH_GEMM_N", 8192));

    const std::string csv = outdir + "/kernel_bench.csv";
    FILE *f = fopen(csv.c_str(), "w");
    if (f) fprintf(f, "kernel,shape,time_us,bytes,gb_per_s,pct_of_copy,gflop_per_s,validated\n");
    printf("\n%-20s %-28s %10s %9s %7s %9s %s\n", "kernel", "shape", "time_us", "GB/s", "%copy", "GFLOP/s", "valid");
    bool all_ok = true;
    for (const Result &r : b.results) {
        const double gbs = r.bytes / (r.us * 1e-6) / 1e9, pct = b.copy_gbs > 0 ? 100.0 * gbs / b.copy_gbs : 0.0;
        const double gf = r.flops > 0 ? r.flops / (r.us * 1e-6) / 1e9 : 0.0;
        printf("%-20s %-28s %10.2f %9.1f %6.1f%% %9.1f %s\n", r.kernel.c_str(), r.shape.c_str(), r.us, gbs, pct, gf,
               r.valid ? "ok" : "FAIL");
        if (f)
            fprintf(f, "%s,\"%s\",%.3f,%.0f,%.2f,%.2f,%.2f,%d\n", r.kernel.c_str(), r.shape.c_str(), r.us, r.bytes, gbs,
                    pct, gf, r.valid ? 1 : 0);
        all_ok = all_ok && r.valid;
    }
    if (f) fclose(f);
    printf("\nceiling: device-to-device copy %.1f GB/s (read + write); results in %s\n", b.copy_gbs, csv.c_str());
    // Issue 15's prefill target: tensor-core attention >= 50% of the cuBLAS BF16 GEMM rate.
    if (b.gemm_tflops > 0)
        for (const Result &r : b.results) {
            if (r.kernel != "attention_prefill" && r.kernel != "attention_prefill_tc") continue;
            const double tf = r.flops / (r.us * 1e-6) / 1e12;
            printf("prefill attention %-20s %-32s %8.2f TFLOP/s = %5.1f%% of cuBLAS BF16 GEMM %s (%.2f TFLOP/s; "
                   "target for the tc kernel: >= 50%%)\n",
                   r.kernel.c_str(), r.shape.c_str(), tf, 100.0 * tf / b.gemm_tflops, b.gemm_shape.c_str(),
                   b.gemm_tflops);
        }
    if (b.ident) CK(cudaFree(b.ident));
    CK(cudaEventDestroy(b.e0));
    CK(cudaEventDestroy(b.e1));
    CK(cudaStreamDestroy(b.stream));
    return all_ok ? 0 : 1;
}
