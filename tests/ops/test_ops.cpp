// Op grid for the CUDA kernels (kernels/*.cu), in the spirit of llama.cpp's test-backend-ops:
// every kernel against the CPU backend's op (host/backend/cpu/cpu_ops.h) on seeded random non-zero inputs
// over odd and edge shapes. Outputs are poisoned (all bits set: NaN / -1) before the run and
// guarded by sentinel regions before and after, checked afterwards.
//
// The cases are the table in op_cases.cpp, which kernel_bench reads too (it times the perf
// cases); every case here is checked.
//
// The same source builds two binaries: test_ops_sim (kernels compiled by the host compiler,
// run by tests/cudasim) and test_ops_device (nvcc kernels, real CUDA runtime), whose cases
// skip with "no CUDA device" when there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "model/gguf.h"
#include "kernels.h"
#include "mk_test_util.h"
#include "ops/op_cases.h"

// gtest prints a case by its name (PrintTo is found by argument-dependent lookup, in the
// namespace of the case types)
namespace mk_ops {
void PrintTo(const NormCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const EmbedCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const RopeCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const AttnCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const DecodeCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const SwigluCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const ArgmaxCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const ConvertCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const GemvCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const DequantCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const AttnTcCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const QSetCase &c, std::ostream *os) { *os << c.name(); }
void PrintTo(const KvAppendCase &c, std::ostream *os) { *os << c.name(); }
} // namespace mk_ops

namespace {

using namespace mk_ops; // the case table (tests/ops/op_cases.h), shared with bench/kernel_bench.cpp

// ============================================================================ device ==

#define CUDA_OK(expr)                                                                          \
    do {                                                                                       \
        const cudaError_t e_ = (expr);                                                         \
        ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);                 \
    } while (0)

#define MK_OK_(expr)                                                                           \
    do {                                                                                       \
        const mk_status s_ = (expr);                                                           \
        ASSERT_EQ(s_, MK_OK) << #expr << ": " << mk_status_name(s_) << ": " << mk_last_error(); \
    } while (0)

// A device buffer of `bytes` payload with `kGuard` sentinel bytes before and after.
// poison() fills the payload with 0xFF (NaN for F32/F16/BF16, -1 for I32).
class GuardedBuf {
public:
    static constexpr size_t kGuard = 256;
    explicit GuardedBuf(size_t bytes) : bytes_(bytes) {
        const cudaError_t e = cudaMalloc(&base_, bytes_ + 2 * kGuard);
        if (e != cudaSuccess) base_ = nullptr;
    }
    ~GuardedBuf() {
        if (base_) (void)cudaFree(base_);
    }
    GuardedBuf(const GuardedBuf &) = delete;
    GuardedBuf &operator=(const GuardedBuf &) = delete;

    bool ok() const { return base_ != nullptr; }
    template <class T = void>
    T *ptr() const {
        return reinterpret_cast<T *>(static_cast<uint8_t *>(base_) + kGuard);
    }
    // Sentinels + payload from host memory (nullptr: poison the payload), on the stream the
    // kernel runs on: a plain cudaMemcpy runs on the legacy default stream, which does not
    // order against a non-blocking stream, so on a GPU the poison could land after the kernel.
    cudaError_t upload(const void *src, cudaStream_t stream) {
        std::vector<uint8_t> h(bytes_ + 2 * kGuard);
        for (size_t i = 0; i < kGuard; i++) {
            h[i] = pre(i);
            h[kGuard + bytes_ + i] = post(i);
        }
        if (src) std::memcpy(h.data() + kGuard, src, bytes_);
        else std::memset(h.data() + kGuard, 0xFF, bytes_);
        const cudaError_t e = cudaMemcpyAsync(base_, h.data(), h.size(), cudaMemcpyHostToDevice, stream);
        return e != cudaSuccess ? e : cudaStreamSynchronize(stream); // h is freed on return
    }
    cudaError_t poison(cudaStream_t stream) { return upload(nullptr, stream); }
    // Payload to host (after the work on `stream`); checks the sentinels.
    ::testing::AssertionResult download(void *dst, cudaStream_t stream) const {
        std::vector<uint8_t> h(bytes_ + 2 * kGuard);
        cudaError_t e = cudaMemcpyAsync(h.data(), base_, h.size(), cudaMemcpyDeviceToHost, stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) return ::testing::AssertionFailure() << "cudaMemcpyAsync D2H: " << cudaGetErrorString(e);
        for (size_t i = 0; i < kGuard; i++) {
            if (h[i] != pre(i))
                return ::testing::AssertionFailure() << "sentinel before the buffer overwritten at byte -" << (kGuard - i);
            if (h[kGuard + bytes_ + i] != post(i))
                return ::testing::AssertionFailure() << "sentinel after the buffer overwritten at byte +" << i;
        }
        std::memcpy(dst, h.data() + kGuard, bytes_);
        return ::testing::AssertionSuccess();
    }

private:
    static uint8_t pre(size_t i) { return static_cast<uint8_t>(0xA5 ^ (i * 7)); }
    static uint8_t post(size_t i) { return static_cast<uint8_t>(0x5A ^ (i * 13)); }
    size_t bytes_;
    void *base_ = nullptr;
};

// ============================================================================ inputs ==

// Uniform in [-scale, -scale/64] U [scale/64, scale]: never zero.
std::vector<float> random_f32(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(1.0f / 64.0f, 1.0f);
    std::vector<float> v(n);
    for (auto &x : v) x = (rng() & 1 ? 1.0f : -1.0f) * u(rng) * scale;
    return v;
}

std::vector<uint16_t> to_half_bits(const std::vector<float> &v, mk_dtype d) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); i++) h[i] = d == MK_DTYPE_F16 ? mk_f32_to_f16(v[i]) : mk_f32_to_bf16(v[i]);
    return h;
}

std::vector<float> from_half_bits(const std::vector<uint16_t> &h, mk_dtype d) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); i++) v[i] = d == MK_DTYPE_F16 ? mk_f16_to_f32(h[i]) : mk_bf16_to_f32(h[i]);
    return v;
}

// ============================================================================ checks ==

// The CPU reference of causal attention (mk_cpu_attention) over every core: its (row, head)
// pairs are computed alone (cpu_ops.h), so any split gives the same bits. A model-sized case
// (2048 rows x 32 heads) takes about 15 s on one core, which a GPU machine's budget cannot spare.
void cpu_attention_all_cores(float *out, const float *q, const float *k, const float *v, size_t rows, size_t past,
                             size_t n_heads, size_t n_kv_heads, size_t head_dim) {
    const size_t items = rows * n_heads;
    const size_t workers = std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(), items / 64));
    const mk_kv_pages contiguous{}; // a NULL table: key t at row t
    std::vector<std::thread> pool;
    for (size_t w = 0; w < workers; w++)
        pool.emplace_back([=] {
            mk_cpu_attention_heads(out, q, k, v, contiguous, items * w / workers,
                                   items * (w + 1) / workers, past, n_heads, n_kv_heads, head_dim);
        });
    for (std::thread &t : pool) t.join();
}

float max_abs(const std::vector<float> &v) {
    float m = 0.0f;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}

// |got - ref| <= atol + rtol * |ref| (llm.c style); NaN passes only against NaN.
// Prints the first mismatches and stops after ten.
::testing::AssertionResult all_close(const std::vector<float> &got, const std::vector<float> &ref, double atol,
                                     double rtol) {
    if (got.size() != ref.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size();
    size_t bad = 0;
    double worst = 0.0;
    std::ostringstream msg;
    for (size_t i = 0; i < got.size(); i++) {
        const double g = got[i], r = ref[i];
        bool ok;
        if (std::isnan(r)) ok = std::isnan(g);
        else if (std::isnan(g)) ok = false;
        else if (std::isinf(r)) ok = g == r;
        else {
            const double err = std::fabs(g - r);
            ok = err <= atol + rtol * std::fabs(r);
            worst = std::max(worst, err / (atol + rtol * std::fabs(r)));
        }
        if (!ok) {
            if (bad < 10) msg << "\n  [" << i << "] got " << g << " ref " << r << " diff " << (g - r);
            if (++bad == 10) msg << "\n  (stopping after ten)";
            if (bad >= 10) break;
        }
    }
    if (bad) return ::testing::AssertionFailure() << "mismatches (atol " << atol << ", rtol " << rtol << "):" << msg.str();
    return ::testing::AssertionSuccess() << "worst error / tolerance " << worst;
}

template <class T>
::testing::AssertionResult all_equal(const std::vector<T> &got, const std::vector<T> &ref) {
    size_t bad = 0;
    std::ostringstream msg;
    for (size_t i = 0; i < got.size() && bad < 10; i++) {
        if (got[i] != ref[i]) {
            msg << "\n  [" << i << "] got " << +got[i] << " ref " << +ref[i];
            bad++;
        }
    }
    if (bad) return ::testing::AssertionFailure() << "mismatches:" << msg.str();
    return ::testing::AssertionSuccess();
}

// Every op test: a stream of its own, and the device check.
class OpTest : public ::testing::Test {
protected:
    void SetUp() override {
        MK_REQUIRE_DEVICE();
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    }
    void TearDown() override {
        ident_.reset();
        if (stream_) (void)cudaStreamDestroy(stream_);
    }
    // The kernels read their caches through a block table: this one maps every block to
    // itself (blocks of 16 positions, up to kIdentityPositions), so a contiguous cache reads
    // as it always did. The paged cases build shuffled tables of their own.
    static constexpr size_t kIdentityPositions = 1 << 16;
    mk_kv_pages identity_pages() {
        if (!ident_) {
            std::vector<int32_t> id(kIdentityPositions / 16);
            for (size_t i = 0; i < id.size(); i++) id[i] = (int32_t)i;
            ident_ = std::make_unique<GuardedBuf>(id.size() * sizeof(int32_t));
            if (!ident_->ok() || ident_->upload(id.data(), stream_) != cudaSuccess) ADD_FAILURE() << "identity table";
        }
        return mk_kv_pages{ident_->ptr<int32_t>(), 4, 0};
    }
    cudaStream_t stream_ = nullptr;
    std::unique_ptr<GuardedBuf> ident_;
};

// A parametrised op test: one case of the table.
template <class P>
class OpTestP : public OpTest, public ::testing::WithParamInterface<P> {};

// The cases this build checks: all of them on a device; under cudasim all but the PerfDevice
// ones (model-sized: minutes and gigabytes per launch in the simulator; test_ops_device checks
// them on a GPU and kernel_bench times them). Left out, not skipped: a skip here would read as
// a missing prerequisite.
template <class C>
std::vector<C> cases_here(std::vector<C> all) {
#if defined(MK_OPS_SIMULATED)
    all.erase(std::remove_if(all.begin(), all.end(), [](const C &c) { return c.use == CaseUse::PerfDevice; }),
              all.end());
#endif
    return all;
}

template <class P>
std::string case_name(const ::testing::TestParamInfo<P> &info) {
    return info.param.name();
}

// ============================================================================ rmsnorm ==

using RmsNorm = OpTestP<NormCase>;

TEST_P(RmsNorm, MatchesCpu) {
    const NormCase c = GetParam();
    const size_t n = c.rows * c.cols;
    const float eps = 1e-5f;
    // Inputs far above eps hide a wrong eps; the tiny cases put the mean square below it.
    const float scale = c.tiny ? 1e-3f : 1.0f;
    std::vector<float> x = random_f32(n, 11 + n, 3.0f * scale), w = random_f32(c.cols, 12 + c.cols, 1.5f);
    std::vector<float> delta = random_f32(n, 13 + n, 0.5f * scale);
    GuardedBuf dx(n * 4), dw(c.cols * 4), dout(n * 4), ddelta(n * 4);
    ASSERT_TRUE(dx.ok() && dw.ok() && dout.ok() && ddelta.ok());
    CUDA_OK(dx.upload(x.data(), stream_));
    CUDA_OK(dw.upload(w.data(), stream_));
    CUDA_OK(ddelta.upload(delta.data(), stream_));
    CUDA_OK(dout.poison(stream_));
    std::vector<float> ref(n), got(n);
    if (c.add) {
        MK_OK_(mk_kernel_add_rmsnorm(dx.ptr<float>(), dout.ptr<float>(), ddelta.ptr<float>(), dw.ptr<float>(), c.rows,
                                     c.cols, eps, stream_));
        mk_cpu_add_rmsnorm(x.data(), ref.data(), delta.data(), w.data(), c.rows, c.cols, eps);
        std::vector<float> res(n);
        CUDA_OK(cudaStreamSynchronize(stream_));
        ASSERT_TRUE(dx.download(res.data(), stream_));
        EXPECT_TRUE(all_equal(res, x)) << "residual after the add";
    } else {
        MK_OK_(mk_kernel_rmsnorm(dout.ptr<float>(), dx.ptr<float>(), dw.ptr<float>(), c.rows, c.cols, eps, stream_));
        mk_cpu_rmsnorm(ref.data(), x.data(), w.data(), c.rows, c.cols, eps);
    }
    CUDA_OK(cudaStreamSynchronize(stream_));
    ASSERT_TRUE(dout.download(got.data(), stream_));
    EXPECT_TRUE(all_close(got, ref, 1e-6 * max_abs(ref), 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Ops, RmsNorm, ::testing::ValuesIn(cases_here(norm_cases())), case_name<NormCase>);

// ============================================================================== embed ==

using Embed = OpTestP<EmbedCase>;

TEST_P(Embed, MatchesCpu) {
    const EmbedCase c = GetParam();
    const size_t tn = c.vocab * c.hidden;
    std::vector<float> table = random_f32(tn, 21 + tn);
    std::vector<uint16_t> table_h;
    size_t esize = 4;
    const void *host_table = table.data();
    if (c.dtype != MK_DTYPE_F32) {
        table_h = to_half_bits(table, c.dtype);
        table = from_half_bits(table_h, c.dtype);
        host_table = table_h.data();
        esize = 2;
    }
    std::mt19937 rng(22);
    std::vector<int32_t> ids(c.n);
    for (auto &id : ids) id = (int32_t)(rng() % c.vocab);
    ids[0] = (int32_t)(c.vocab - 1); // last row of the table
    if (c.n > 2) ids[1] = -3;          // out of range -> zero row
    if (c.n > 3) ids[2] = (int32_t)c.vocab;
    GuardedBuf dt(tn * esize), dids(c.n * 4), dout(c.n * c.hidden * 4);
    ASSERT_TRUE(dt.ok() && dids.ok() && dout.ok());
    CUDA_OK(dt.upload(host_table, stream_));
    CUDA_OK(dids.upload(ids.data(), stream_));
    CUDA_OK(dout.poison(stream_));
    MK_OK_(mk_kernel_embed(dout.ptr<float>(), dt.ptr(), c.dtype, dids.ptr<int32_t>(), c.n, c.hidden, c.vocab, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(c.n * c.hidden), ref(c.n * c.hidden, 0.0f);
    for (size_t i = 0; i < c.n; i++)
        if (ids[i] >= 0 && (size_t)ids[i] < c.vocab) mk_cpu_embed(ref.data() + i * c.hidden, table.data(), &ids[i], 1, c.hidden);
    ASSERT_TRUE(dout.download(got.data(), stream_));
    EXPECT_TRUE(all_close(got, ref, 0.0, 0.0)); // a gather is exact
}

INSTANTIATE_TEST_SUITE_P(Ops, Embed, ::testing::ValuesIn(cases_here(embed_cases())), case_name<EmbedCase>);

// =============================================================================== rope ==

using Rope = OpTestP<RopeCase>;

TEST_P(Rope, MatchesCpu) {
    const RopeCase c = GetParam();
    const size_t n = c.rows * c.heads * c.head_dim;
    std::vector<float> x = random_f32(n, 31 + n, 2.0f);
    std::vector<int32_t> pos(c.rows);
    for (size_t r = 0; r < c.rows; r++) pos[r] = c.pos0 + (int32_t)r;
    if (c.rows > 2) pos[c.rows - 1] = 131071; // far from 0
    if (c.rows > 3) pos[1] = 0;
    GuardedBuf dx(n * 4), dpos(c.rows * 4);
    ASSERT_TRUE(dx.ok() && dpos.ok());
    CUDA_OK(dx.upload(x.data(), stream_));
    CUDA_OK(dpos.upload(pos.data(), stream_));
    MK_OK_(mk_kernel_rope(dx.ptr<float>(), dpos.ptr<int32_t>(), c.rows, c.heads, c.head_dim, c.theta, c.layout, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(n);
    ASSERT_TRUE(dx.download(got.data(), stream_));
    mk_cpu_rope(x.data(), pos.data(), c.rows, c.heads, c.head_dim, c.theta, c.layout);
    EXPECT_TRUE(all_close(got, x, 1e-6 * max_abs(x), 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Ops, Rope, ::testing::ValuesIn(cases_here(rope_cases())), case_name<RopeCase>);

// ========================================================================== attention ==

// Tolerance of an attention output: an average of V rows, so the absolute error scales with
// max|V| (and the CPU sums in double): atol = 1e-5 * max|V|, rtol 1e-5.
constexpr double kAttnAtol = 1e-5;

using AttentionPrefill = OpTestP<AttnCase>;

TEST_P(AttentionPrefill, MatchesCpu) {
    const AttnCase c = GetParam();
    const size_t keys = c.past + c.rows;
    const size_t qn = c.rows * c.n_heads * c.head_dim, kvn = keys * c.n_kv_heads * c.head_dim;
    std::vector<float> q = random_f32(qn, 41 + qn, 1.0f), k = random_f32(kvn, 42 + kvn, 1.0f),
                       v = random_f32(kvn, 43 + kvn, 1.0f);
    GuardedBuf dq(qn * 4), dk(kvn * 4), dv(kvn * 4), dout(qn * 4);
    ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok());
    CUDA_OK(dq.upload(q.data(), stream_));
    CUDA_OK(dk.upload(k.data(), stream_));
    CUDA_OK(dv.upload(v.data(), stream_));
    CUDA_OK(dout.poison(stream_));
    MK_OK_(mk_kernel_attention_prefill_kv(dout.ptr<float>(), dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), identity_pages(), MK_DTYPE_F32, c.rows,
                                       c.past, c.n_heads, c.n_kv_heads, c.head_dim, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(qn), ref(qn);
    ASSERT_TRUE(dout.download(got.data(), stream_));
    cpu_attention_all_cores(ref.data(), q.data(), k.data(), v.data(), c.rows, c.past, c.n_heads, c.n_kv_heads, c.head_dim);
    EXPECT_TRUE(all_close(got, ref, kAttnAtol * max_abs(v), 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Ops, AttentionPrefill, ::testing::ValuesIn(cases_here(prefill_cases())), case_name<AttnCase>);

// Decode reads its key count from positions[0] on the device and launches a grid fixed by
// max_keys (the cache capacity) and the SM count: the cache rows past the keys hold NaN (never
// read), the workspace starts poisoned, the splits holding keys must hold a finite partial and
// those past the keys are neither written nor read (their poison stays, and the result is
// right: the combine walks only the splits of this step's keys). The cache is F32, F16 or BF16; the reference reads the
// same rounded values.

constexpr size_t kDecSplitKeys = 64; // attention_decode.cu's DEC_SPLIT_KEYS: a split's share granule

// K and V of `max_keys` rows: random for the first `keys`, NaN after (a read of them shows).
std::vector<float> decode_cache(size_t keys, size_t max_keys, size_t kv_dim, uint64_t seed) {
    std::vector<float> c = random_f32(keys * kv_dim, seed, 1.0f);
    c.resize(max_keys * kv_dim, std::numeric_limits<float>::quiet_NaN());
    return c;
}

// The cache as stored (bytes in kv) and as the reference reads it (the rounded values).
struct DecodeCacheBytes {
    std::vector<uint8_t> bytes;
    std::vector<float> values;
};
DecodeCacheBytes decode_cache_as(const std::vector<float> &c, mk_dtype kv) {
    DecodeCacheBytes out;
    if (kv == MK_DTYPE_F32) {
        out.values = c;
        out.bytes.resize(c.size() * 4);
        std::memcpy(out.bytes.data(), c.data(), out.bytes.size());
        return out;
    }
    const std::vector<uint16_t> h = to_half_bits(c, kv);
    out.values = from_half_bits(h, kv);
    out.bytes.resize(h.size() * 2);
    std::memcpy(out.bytes.data(), h.data(), out.bytes.size());
    return out;
}

size_t decode_splits(size_t max_keys, size_t n_heads, size_t n_kv_heads) {
    size_t splits = 0;
    EXPECT_EQ(mk_kernel_attention_decode_splits(&splits, max_keys, n_heads, n_kv_heads), MK_OK) << mk_last_error();
    return splits;
}

// Workspace [n_heads][splits][hd + 2]: split s holds keys iff s * share < keys (share =
// ceil(keys / splits) rounded up to kDecSplitKeys); those hold a finite max and a positive
// sum; the others are not written (poisoned: still all bits set; reused: whatever an earlier
// launch left). Also counts the splits that held keys.
::testing::AssertionResult decode_partials(const std::vector<float> &ws, size_t keys, size_t splits, size_t n_heads,
                                           size_t hd, size_t *used_out = nullptr, bool poisoned = true) {
    size_t share = (keys + splits - 1) / splits;
    share = (share + kDecSplitKeys - 1) / kDecSplitKeys * kDecSplitKeys;
    const size_t used = (keys + share - 1) / share;
    if (used_out) *used_out = used;
    for (size_t h = 0; h < n_heads; h++)
        for (size_t c = 0; c < splits; c++) {
            const float *p = ws.data() + (h * splits + c) * (hd + 2);
            bool ok;
            if (c < used) {
                ok = std::isfinite(p[0]) && p[1] > 0.0f;
                for (size_t d = 0; d < hd && ok; d++) ok = std::isfinite(p[2 + d]);
            } else {
                ok = true;
                for (size_t d = 0; d < hd + 2 && ok && poisoned; d++) {
                    uint32_t bits;
                    std::memcpy(&bits, p + d, 4);
                    ok = bits == 0xFFFFFFFFu;
                }
            }
            if (!ok)
                return ::testing::AssertionFailure() << "head " << h << " split " << c << (c < used ? " (keys)" : "")
                                                     << " partial (" << p[0] << ", " << p[1]
                                                     << (c < used ? ") is wrong" : ") was written");
        }
    return ::testing::AssertionSuccess();
}

using AttentionDecode = OpTestP<DecodeCase>;

TEST_P(AttentionDecode, MatchesCpu) {
    const DecodeCase c = GetParam();
    const size_t keys = c.past + 1, kv_dim = c.n_kv_heads * c.head_dim, esz = mk_dtype_size(c.kv);
    const size_t qn = c.n_heads * c.head_dim, kvn = c.max_keys * kv_dim;
    std::vector<float> q = random_f32(qn, 51 + qn, 1.0f);
    const DecodeCacheBytes k = decode_cache_as(decode_cache(keys, c.max_keys, kv_dim, 52 + kvn), c.kv),
                           v = decode_cache_as(decode_cache(keys, c.max_keys, kv_dim, 53 + kvn), c.kv);
    const int32_t pos = (int32_t)c.past;
    const size_t ws_bytes = mk_kernel_attention_decode_workspace_bytes(c.max_keys, c.n_heads, c.head_dim);
    const size_t splits = decode_splits(c.max_keys, c.n_heads, c.n_kv_heads);
    ASSERT_GE(splits, 1u);
    ASSERT_LE(splits * c.n_heads * (c.head_dim + 2) * 4, ws_bytes); // the workspace bounds every split count
    if (c.max_keys >= 256) {                                         // the keys are really split
        EXPECT_GT(splits, 1u);
    }
    GuardedBuf dq(qn * 4), dk(kvn * esz), dv(kvn * esz), dout(qn * 4), dws(ws_bytes), dpos(4);
    ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok() && dws.ok() && dpos.ok());
    CUDA_OK(dq.upload(q.data(), stream_));
    CUDA_OK(dk.upload(k.bytes.data(), stream_));
    CUDA_OK(dv.upload(v.bytes.data(), stream_));
    CUDA_OK(dpos.upload(&pos, stream_));
    CUDA_OK(dout.poison(stream_));
    CUDA_OK(dws.poison(stream_));
    // too small a workspace (it is sized from max_keys, not the step's keys) is refused
    EXPECT_ERROR(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), c.kv,
                                            dpos.ptr<int32_t>(), 1, c.max_keys, c.n_heads, c.n_kv_heads, c.head_dim,
                                            dws.ptr(), ws_bytes - 4, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode: workspace");
    MK_OK_(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), c.kv,
                                      dpos.ptr<int32_t>(), 1, c.max_keys, c.n_heads, c.n_kv_heads, c.head_dim, dws.ptr(),
                                      ws_bytes, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(qn), ref(qn), ws(ws_bytes / 4);
    ASSERT_TRUE(dout.download(got.data(), stream_));
    ASSERT_TRUE(dws.download(ws.data(), stream_));
    mk_cpu_attention(ref.data(), q.data(), k.values.data(), v.values.data(), 1, c.past, c.n_heads, c.n_kv_heads,
                     c.head_dim);
    const std::vector<float> vk(v.values.begin(), v.values.begin() + keys * kv_dim);
    EXPECT_TRUE(all_close(got, ref, kAttnAtol * max_abs(vk), 1e-5));
    size_t used = 0;
    EXPECT_TRUE(decode_partials(ws, keys, splits, c.n_heads, c.head_dim, &used));
    if (keys > 2 * kDecSplitKeys && splits > 2) {
        EXPECT_GT(used, 1u); // several splits walked keys
    }

    // the same launch again: the same bits (fixed summation order)
    CUDA_OK(dout.poison(stream_));
    MK_OK_(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), c.kv,
                                      dpos.ptr<int32_t>(), 1, c.max_keys, c.n_heads, c.n_kv_heads, c.head_dim, dws.ptr(),
                                      ws_bytes, stream_));
    std::vector<float> again(qn);
    ASSERT_TRUE(dout.download(again.data(), stream_));
    EXPECT_EQ(std::memcmp(again.data(), got.data(), qn * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Ops, AttentionDecode, ::testing::ValuesIn(cases_here(decode_cases())), case_name<DecodeCase>);

// ============================================================= paged KV caches ==

// A paged copy of a contiguous cache: a pool of `blocks_of(positions) + 3` blocks, every row
// poisoned (NaN bits), the table a random permutation of pool blocks (out of order, the
// extra blocks never named), and row t of the contiguous cache at the pool row the table
// gives it (mk_kv_row). Whatever reads or writes a row the table does not name shows.
struct PagedCache {
    std::vector<int32_t> table;
    std::vector<uint8_t> pool;
    size_t row_bytes = 0, shift = 0;
    size_t row(size_t t) const { return mk_kv_row(mk_kv_pages{table.data(), (uint32_t)shift, 0}, t); }
};
PagedCache page_cache(const std::vector<uint8_t> &contiguous, size_t positions, size_t row_bytes, size_t block,
                      uint64_t seed) {
    PagedCache p;
    p.row_bytes = row_bytes;
    while (((size_t)1 << p.shift) < block) p.shift++;
    const size_t logical = (positions + block - 1) / block, physical = logical + 3;
    std::vector<int32_t> perm(physical);
    for (size_t i = 0; i < physical; i++) perm[i] = (int32_t)i;
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
    p.table.assign(perm.begin(), perm.begin() + (long)logical);
    p.pool.assign(physical * block * row_bytes, 0xFF);
    for (size_t t = 0; t < positions && (t + 1) * row_bytes <= contiguous.size(); t++)
        std::memcpy(p.pool.data() + p.row(t) * row_bytes, contiguous.data() + t * row_bytes, row_bytes);
    return p;
}

// The attention kernels (decode, prefill, tensor-core prefill) over a paged cache give the
// bits they give over the same cache contiguous (identity table): blocks of 16, 32 and 64,
// tables out of order, GQA, F32 / F16 / BF16 caches, up to 4096 keys. And rope_kv writes
// each row at its position's pool row and nowhere else.
TEST_F(OpTest, PagedCachesReadAndWriteThroughTheBlockTable) {
    struct Shape {
        size_t n_heads, n_kv, hd, keys;
    };
    const Shape shapes[] = {{6, 2, 64, 37}, {4, 4, 32, 300}, {8, 2, 64, 4096}};
    for (const Shape sh : shapes)
        for (const size_t block : {16u, 32u, 64u})
            for (const mk_dtype kv : {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16}) {
                SCOPED_TRACE("heads " + std::to_string(sh.n_heads) + "/" + std::to_string(sh.n_kv) + " hd " +
                             std::to_string(sh.hd) + " keys " + std::to_string(sh.keys) + " block " +
                             std::to_string(block) + " " + dtype_tag(kv));
                const size_t kv_dim = sh.n_kv * sh.hd, esz = mk_dtype_size(kv), row_bytes = kv_dim * esz;
                const size_t positions = sh.keys + 5; // the cache's capacity: the decode grid reads it
                const uint64_t seed = sh.keys * 131 + block * 7 + (uint64_t)kv;
                const DecodeCacheBytes k = decode_cache_as(decode_cache(sh.keys, positions, kv_dim, seed), kv),
                                       v = decode_cache_as(decode_cache(sh.keys, positions, kv_dim, seed + 1), kv);
                const PagedCache pk = page_cache(k.bytes, sh.keys, row_bytes, block, seed + 2),
                                 pv = page_cache(v.bytes, sh.keys, row_bytes, block, seed + 2); // one table
                const size_t rows = sh.keys >= 19 ? 19 : 1, past = sh.keys - rows, qn = rows * sh.n_heads * sh.hd;
                const std::vector<float> q = random_f32(qn, seed + 3);
                GuardedBuf dq(qn * 4), dk(k.bytes.size()), dv(v.bytes.size()), dpk(pk.pool.size()),
                    dpv(pv.pool.size()), dtab(pk.table.size() * 4), dout(qn * 4), dpos(4);
                ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok() && dpk.ok() && dpv.ok() && dtab.ok() && dout.ok());
                CUDA_OK(dq.upload(q.data(), stream_));
                CUDA_OK(dk.upload(k.bytes.data(), stream_));
                CUDA_OK(dv.upload(v.bytes.data(), stream_));
                CUDA_OK(dpk.upload(pk.pool.data(), stream_));
                CUDA_OK(dpv.upload(pv.pool.data(), stream_));
                CUDA_OK(dtab.upload(pk.table.data(), stream_));
                const mk_kv_pages paged{dtab.ptr<int32_t>(), (uint32_t)pk.shift, 0};
                // contiguous then paged: the same bits
                auto both = [&](const char *what, size_t out_rows,
                                const std::function<mk_status(const void *, const void *, mk_kv_pages)> &run) {
                    SCOPED_TRACE(what);
                    const size_t n = out_rows * sh.n_heads * sh.hd; // the rows the kernel writes
                    std::vector<float> flat(qn), pag(qn);
                    CUDA_OK(dout.poison(stream_));
                    MK_OK_(run(dk.ptr(), dv.ptr(), identity_pages()));
                    ASSERT_TRUE(dout.download(flat.data(), stream_));
                    CUDA_OK(dout.poison(stream_));
                    MK_OK_(run(dpk.ptr(), dpv.ptr(), paged));
                    ASSERT_TRUE(dout.download(pag.data(), stream_));
                    for (size_t i = 0; i < n; i++) ASSERT_TRUE(std::isfinite(flat[i])) << "a poisoned row was read";
                    EXPECT_EQ(std::memcmp(flat.data(), pag.data(), n * 4), 0) << "paged differs from contiguous";
                };
                const int32_t last = (int32_t)(sh.keys - 1);
                CUDA_OK(dpos.upload(&last, stream_));
                const size_t ws_bytes = mk_kernel_attention_decode_workspace_bytes(positions, sh.n_heads, sh.hd);
                GuardedBuf dws(ws_bytes);
                both("decode", 1, [&](const void *kc, const void *vc, mk_kv_pages pg) {
                    return mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>() + (rows - 1) * sh.n_heads * sh.hd,
                                                      kc, vc, pg, kv, dpos.ptr<int32_t>(), 1, positions, sh.n_heads, sh.n_kv,
                                                      sh.hd, dws.ptr(), ws_bytes, stream_);
                });
                if (rows > 1) {
                    both("prefill", rows, [&](const void *kc, const void *vc, mk_kv_pages pg) {
                        return mk_kernel_attention_prefill_kv(dout.ptr<float>(), dq.ptr<float>(), kc, vc, pg, kv, rows,
                                                              past, sh.n_heads, sh.n_kv, sh.hd, stream_);
                    });
                    if (mk_kernel_attention_prefill_tc_supports(sh.hd))
                        both("prefill_tc", rows, [&](const void *kc, const void *vc, mk_kv_pages pg) {
                            return mk_kernel_attention_prefill_tc(dout.ptr<float>(), dq.ptr<float>(), kc, vc, pg, kv,
                                                                  rows, past, sh.n_heads, sh.n_kv, sh.hd, stream_);
                        });
                }
                // rope_kv: rows [past, keys) written into a poisoned pool land at their pool
                // rows, with the bits the contiguous write gives, and nowhere else
                if (sh.keys > 1000) continue; // the writes do not depend on the cache length
                std::vector<int32_t> pos(rows);
                for (size_t r = 0; r < rows; r++) pos[r] = (int32_t)(past + r);
                const std::vector<float> nq = random_f32(qn, seed + 4), nk = random_f32(rows * kv_dim, seed + 5),
                                         nv = random_f32(rows * kv_dim, seed + 6);
                GuardedBuf dnq(qn * 4), dnk(rows * kv_dim * 4), dnv(rows * kv_dim * 4), drp(rows * 4);
                CUDA_OK(drp.upload(pos.data(), stream_));
                std::vector<uint8_t> flat_k(k.bytes.size()), flat_v(v.bytes.size()), pool_k(pk.pool.size()),
                    pool_v(pv.pool.size());
                for (int pass = 0; pass < 2; pass++) {
                    GuardedBuf &ck = pass ? dpk : dk, &cv = pass ? dpv : dv;
                    CUDA_OK(ck.poison(stream_));
                    CUDA_OK(cv.poison(stream_));
                    CUDA_OK(dnq.upload(nq.data(), stream_));
                    CUDA_OK(dnk.upload(nk.data(), stream_));
                    CUDA_OK(dnv.upload(nv.data(), stream_));
                    MK_OK_(mk_kernel_rope_kv(dnq.ptr<float>(), dnk.ptr<float>(), dnv.ptr<float>(), ck.ptr(), cv.ptr(),
                                             pass ? paged : identity_pages(), kv, drp.ptr<int32_t>(), positions, rows,
                                             sh.n_heads, sh.n_kv, sh.hd, 10000.0f, MK_ROPE_ROTATE_HALF, stream_));
                    ASSERT_TRUE(ck.download(pass ? pool_k.data() : flat_k.data(), stream_));
                    ASSERT_TRUE(cv.download(pass ? pool_v.data() : flat_v.data(), stream_));
                }
                std::vector<bool> written(pk.pool.size() / row_bytes, false);
                for (size_t t = past; t < sh.keys; t++) {
                    const size_t at = pk.row(t);
                    written[at] = true;
                    EXPECT_EQ(std::memcmp(pool_k.data() + at * row_bytes, flat_k.data() + t * row_bytes, row_bytes), 0)
                        << "K of position " << t;
                    EXPECT_EQ(std::memcmp(pool_v.data() + at * row_bytes, flat_v.data() + t * row_bytes, row_bytes), 0)
                        << "V of position " << t;
                }
                for (size_t at = 0; at < written.size(); at++) {
                    if (written[at]) continue;
                    for (size_t b = 0; b < row_bytes; b++) {
                        ASSERT_EQ(pool_k[at * row_bytes + b], 0xFF) << "pool row " << at << " written";
                    }
                }
            }
}

// Decode rows of many sequences in one launch (a row stride over a matrix of block tables):
// each sequence's blocks scattered through one shared pool (a random permutation, out of
// order, other sequences' blocks between them), its own key count (1 to 300, some equal,
// one past a block edge). Each row's output has the bits of the same row decoded alone
// through its own table (batch invariance), for GQA shapes, block sizes 16/32/64 and every
// cache dtype; rope_kv of the rows writes each at its own position through its own table
// and nowhere else.
TEST_F(OpTest, DecodeRowsOfManySequencesReadTheirOwnBlocks) {
    struct Shape {
        size_t n_heads, n_kv, hd;
    };
    const Shape shapes[] = {{6, 2, 64}, {4, 4, 32}, {8, 1, 128}};
    const std::vector<size_t> keys = {1, 37, 300, 16, 17, 37, 129}; // row r attends keys[r]
    const size_t rows = keys.size(), max_keys = 320;
    for (const Shape sh : shapes)
        for (const size_t block : {16u, 32u, 64u})
            for (const mk_dtype kv : {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16}) {
                SCOPED_TRACE("heads " + std::to_string(sh.n_heads) + "/" + std::to_string(sh.n_kv) + " hd " +
                             std::to_string(sh.hd) + " block " + std::to_string(block) + " " + dtype_tag(kv));
                const size_t kv_dim = sh.n_kv * sh.hd, esz = mk_dtype_size(kv), row_bytes = kv_dim * esz;
                const uint64_t seed = block * 7 + (uint64_t)kv * 3 + sh.hd;
                uint32_t shift = 0;
                while (((size_t)1 << shift) < block) shift++;
                // the shared pool: every sequence's blocks, 3 spare, in a random order
                const size_t stride = (max_keys + block - 1) / block;
                size_t used = 0;
                for (size_t k : keys) used += (k + block - 1) / block;
                std::vector<int32_t> perm(used + 3);
                for (size_t i = 0; i < perm.size(); i++) perm[i] = (int32_t)i;
                std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
                std::vector<int32_t> tables(rows * stride, -1); // an unnamed entry is never read
                std::vector<uint8_t> pool_k(perm.size() * block * row_bytes, 0xFF), pool_v(pool_k.size(), 0xFF);
                size_t next = 0;
                for (size_t r = 0; r < rows; r++) {
                    for (size_t b = 0; b < (keys[r] + block - 1) / block; b++) tables[r * stride + b] = perm[next++];
                    const DecodeCacheBytes k = decode_cache_as(decode_cache(keys[r], keys[r], kv_dim, seed + 10 * r), kv),
                                           v = decode_cache_as(decode_cache(keys[r], keys[r], kv_dim, seed + 10 * r + 1), kv);
                    for (size_t t = 0; t < keys[r]; t++) {
                        const size_t at = mk_kv_row(mk_kv_pages{tables.data() + r * stride, shift, 0}, t);
                        std::memcpy(pool_k.data() + at * row_bytes, k.bytes.data() + t * row_bytes, row_bytes);
                        std::memcpy(pool_v.data() + at * row_bytes, v.bytes.data() + t * row_bytes, row_bytes);
                    }
                }
                const size_t qn = rows * sh.n_heads * sh.hd;
                const std::vector<float> q = random_f32(qn, seed + 3);
                std::vector<int32_t> pos(rows);
                for (size_t r = 0; r < rows; r++) pos[r] = (int32_t)(keys[r] - 1);
                const size_t ws_row = mk_kernel_attention_decode_workspace_bytes(max_keys, sh.n_heads, sh.hd);
                GuardedBuf dq(qn * 4), dpk(pool_k.size()), dpv(pool_v.size()), dtab(tables.size() * 4), dout(qn * 4),
                    dpos(rows * 4), dws(rows * ws_row);
                ASSERT_TRUE(dq.ok() && dpk.ok() && dpv.ok() && dtab.ok() && dout.ok() && dpos.ok() && dws.ok());
                CUDA_OK(dq.upload(q.data(), stream_));
                CUDA_OK(dpk.upload(pool_k.data(), stream_));
                CUDA_OK(dpv.upload(pool_v.data(), stream_));
                CUDA_OK(dtab.upload(tables.data(), stream_));
                CUDA_OK(dpos.upload(pos.data(), stream_));
                CUDA_OK(dout.poison(stream_));
                const mk_kv_pages all{dtab.ptr<int32_t>(), shift, (uint32_t)stride};
                MK_OK_(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dpk.ptr(), dpv.ptr(), all, kv,
                                                  dpos.ptr<int32_t>(), rows, max_keys, sh.n_heads, sh.n_kv, sh.hd,
                                                  dws.ptr(), rows * ws_row, stream_));
                std::vector<float> together(qn), alone(sh.n_heads * sh.hd);
                ASSERT_TRUE(dout.download(together.data(), stream_));
                for (size_t r = 0; r < rows; r++) {
                    SCOPED_TRACE("row " + std::to_string(r) + " of " + std::to_string(keys[r]) + " keys");
                    CUDA_OK(dout.poison(stream_));
                    const mk_kv_pages own{dtab.ptr<int32_t>() + r * stride, shift, 0};
                    MK_OK_(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>() + r * sh.n_heads * sh.hd,
                                                      dpk.ptr(), dpv.ptr(), own, kv, dpos.ptr<int32_t>() + r, 1, max_keys,
                                                      sh.n_heads, sh.n_kv, sh.hd, dws.ptr(), ws_row, stream_));
                    std::vector<float> got(qn);
                    ASSERT_TRUE(dout.download(got.data(), stream_));
                    std::memcpy(alone.data(), got.data(), alone.size() * 4);
                    for (float x : alone) ASSERT_TRUE(std::isfinite(x)) << "a poisoned row was read";
                    EXPECT_EQ(std::memcmp(alone.data(), together.data() + r * alone.size(), alone.size() * 4), 0)
                        << "the row in the batch differs from the row alone";
                }
                // rope_kv: row r's k and v land at pool row (table r, keys[r] - 1) and nowhere else
                const std::vector<float> nk = random_f32(rows * kv_dim, seed + 5), nv = random_f32(rows * kv_dim, seed + 6);
                GuardedBuf dnq(qn * 4), dnk(rows * kv_dim * 4), dnv(rows * kv_dim * 4);
                CUDA_OK(dnq.upload(q.data(), stream_));
                CUDA_OK(dnk.upload(nk.data(), stream_));
                CUDA_OK(dnv.upload(nv.data(), stream_));
                CUDA_OK(dpk.poison(stream_));
                CUDA_OK(dpv.poison(stream_));
                MK_OK_(mk_kernel_rope_kv(dnq.ptr<float>(), dnk.ptr<float>(), dnv.ptr<float>(), dpk.ptr(), dpv.ptr(), all, kv,
                                         dpos.ptr<int32_t>(), max_keys, rows, sh.n_heads, sh.n_kv, sh.hd, 10000.0f,
                                         MK_ROPE_ROTATE_HALF, stream_));
                std::vector<uint8_t> got_k(pool_k.size()), got_v(pool_v.size());
                ASSERT_TRUE(dpk.download(got_k.data(), stream_));
                ASSERT_TRUE(dpv.download(got_v.data(), stream_));
                std::vector<bool> written(pool_k.size() / row_bytes, false);
                for (size_t r = 0; r < rows; r++)
                    written[mk_kv_row(mk_kv_pages{tables.data() + r * stride, shift, 0}, keys[r] - 1)] = true;
                for (size_t at = 0; at < written.size(); at++) {
                    bool poisoned = true;
                    for (size_t b = 0; b < row_bytes; b++) poisoned = poisoned && got_k[at * row_bytes + b] == 0xFF;
                    EXPECT_EQ(poisoned, !written[at]) << "pool row " << at << (written[at] ? " not written" : " written");
                }
            }
}

// The kernels refuse a cache without a block table (they never read one as contiguous rows).
TEST_F(OpTest, KernelsRefuseAMissingBlockTable) {
    GuardedBuf b(1 << 16);
    float *f = b.ptr<float>();
    int32_t *i = b.ptr<int32_t>();
    const mk_kv_pages none{nullptr, 4, 0};
    EXPECT_ERROR(mk_kernel_attention_decode(f, f, f, f, none, MK_DTYPE_F32, i, 1, 16, 4, 2, 8, f, 4096, stream_),
                 MK_ERR_INVALID_ARGUMENT, "no block table");
    EXPECT_ERROR(mk_kernel_attention_prefill_kv(f, f, f, f, none, MK_DTYPE_F32, 2, 0, 4, 2, 8, stream_),
                 MK_ERR_INVALID_ARGUMENT, "no block table");
    EXPECT_ERROR(mk_kernel_attention_prefill_tc(f, f, f, f, none, MK_DTYPE_F32, 2, 0, 4, 2, 16, stream_),
                 MK_ERR_INVALID_ARGUMENT, "no block table");
    EXPECT_ERROR(mk_kernel_rope_kv(f, f, f, f, f, none, MK_DTYPE_F32, i, 4, 1, 2, 2, 8, 10000.0f, MK_ROPE_ROTATE_HALF,
                                   stream_),
                 MK_ERR_INVALID_ARGUMENT, "no block table");
}

// One set of arguments, positions rewritten between launches (what a graph replay does): each
// launch attends to positions[0] + 1 keys, across the split edges and up to the capacity.
TEST_F(OpTest, DecodeSameLaunchFollowsPositions) {
    const size_t max_keys = 777, n_heads = 4, n_kv = 2, hd = 32, kv_dim = n_kv * hd, qn = n_heads * hd;
    std::vector<float> q = random_f32(qn, 71);
    for (const mk_dtype kv : {MK_DTYPE_F32, MK_DTYPE_F16}) {
        SCOPED_TRACE(dtype_tag(kv));
        const DecodeCacheBytes k = decode_cache_as(random_f32(max_keys * kv_dim, 72), kv),
                               v = decode_cache_as(random_f32(max_keys * kv_dim, 73), kv);
        const size_t ws_bytes = mk_kernel_attention_decode_workspace_bytes(max_keys, n_heads, hd);
        const size_t splits = decode_splits(max_keys, n_heads, n_kv);
        GuardedBuf dq(qn * 4), dk(k.bytes.size()), dv(v.bytes.size()), dout(qn * 4), dws(ws_bytes), dpos(4);
        CUDA_OK(dq.upload(q.data(), stream_));
        CUDA_OK(dk.upload(k.bytes.data(), stream_));
        CUDA_OK(dv.upload(v.bytes.data(), stream_));
        CUDA_OK(dws.poison(stream_));
        for (const size_t past : {0, 1, 63, 64, 255, 256, 257, 511, 512, 700, 775, 776, 3}) {
            SCOPED_TRACE("past " + std::to_string(past));
            const int32_t pos = (int32_t)past;
            CUDA_OK(dpos.upload(&pos, stream_));
            CUDA_OK(dout.poison(stream_));
            MK_OK_(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), kv,
                                              dpos.ptr<int32_t>(), 1, max_keys, n_heads, n_kv, hd, dws.ptr(), ws_bytes,
                                              stream_));
            std::vector<float> got(qn), ref(qn), ws(ws_bytes / 4);
            ASSERT_TRUE(dout.download(got.data(), stream_));
            ASSERT_TRUE(dws.download(ws.data(), stream_));
            mk_cpu_attention(ref.data(), q.data(), k.values.data(), v.values.data(), 1, past, n_heads, n_kv, hd);
            EXPECT_TRUE(all_close(got, ref, kAttnAtol * max_abs(v.values), 1e-5));
            // after a longer step the splits past this one's keys hold that step's finite
            // partials: read, they would change the result checked above
            EXPECT_TRUE(decode_partials(ws, past + 1, splits, n_heads, hd, nullptr, false));
        }
    }
    GuardedBuf dq(qn * 4), dk(max_keys * kv_dim * 4), dv(max_keys * kv_dim * 4), dout(qn * 4), dws(1 << 20), dpos(4);
    // an F32, F16 or BF16 cache only (another dtype is refused, not misread)
    EXPECT_ERROR(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), MK_DTYPE_I64,
                                            dpos.ptr<int32_t>(), 1, max_keys, n_heads, n_kv, hd, dws.ptr(), 1 << 20,
                                            stream_),
                 MK_ERR_DTYPE, "mk_kernel_attention_decode: KV cache dtype");
    EXPECT_ERROR(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), MK_DTYPE_F32,
                                            nullptr, 1, max_keys, n_heads, n_kv, hd, dws.ptr(), 1 << 20, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode: null pointer");
    // a cache that is not even element-pair aligned is refused (the loads are at least 2 wide)
    EXPECT_ERROR(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dk.ptr<uint8_t>() + 2, dv.ptr(), identity_pages(),
                                            MK_DTYPE_F32, dpos.ptr<int32_t>(), 1, max_keys, n_heads, n_kv, hd, dws.ptr(),
                                            1 << 20, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode: KV cache not aligned");
    size_t splits = 7;
    EXPECT_ERROR(mk_kernel_attention_decode_splits(&splits, max_keys, 6, 4), MK_ERR_SHAPE,
                 "mk_kernel_attention_decode_splits: n_heads 6");
    EXPECT_EQ(splits, 0u);
    // the split count is bounded by the keys (a split walks at least kDecSplitKeys of them)
    EXPECT_EQ(decode_splits(1, 8, 8), 1u);
    EXPECT_EQ(decode_splits(2 * kDecSplitKeys, 1, 1), 2u);
}

// Decode of the last row == prefill of the same row (two kernels, one semantics).
TEST_F(OpTest, DecodeAgreesWithPrefill) {
    const size_t past = 77, n_heads = 8, n_kv = 2, hd = 64, keys = past + 1;
    const size_t qn = n_heads * hd, kvn = keys * n_kv * hd;
    std::vector<float> q = random_f32(qn, 61), k = random_f32(kvn, 62), v = random_f32(kvn, 63);
    const size_t ws_bytes = mk_kernel_attention_decode_workspace_bytes(keys, n_heads, hd);
    const int32_t pos = (int32_t)past;
    GuardedBuf dq(qn * 4), dk(kvn * 4), dv(kvn * 4), da(qn * 4), db(qn * 4), dws(ws_bytes), dpos(4);
    CUDA_OK(dq.upload(q.data(), stream_));
    CUDA_OK(dk.upload(k.data(), stream_));
    CUDA_OK(dv.upload(v.data(), stream_));
    CUDA_OK(dpos.upload(&pos, stream_));
    CUDA_OK(da.poison(stream_));
    CUDA_OK(db.poison(stream_));
    MK_OK_(mk_kernel_attention_decode(da.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), MK_DTYPE_F32,
                                      dpos.ptr<int32_t>(), 1, keys, n_heads, n_kv, hd, dws.ptr(), ws_bytes, stream_));
    MK_OK_(mk_kernel_attention_prefill_kv(db.ptr<float>(), dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), identity_pages(), MK_DTYPE_F32, 1, past,
                                       n_heads, n_kv, hd, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> a(qn), b(qn);
    ASSERT_TRUE(da.download(a.data(), stream_));
    ASSERT_TRUE(db.download(b.data(), stream_));
    EXPECT_TRUE(all_close(a, b, kAttnAtol * max_abs(v), 1e-5));
}

// ========================================================================== kv append ==

using KvAppend = OpTestP<KvAppendCase>;

TEST_P(KvAppend, MatchesCpu) {
    const KvAppendCase c = GetParam();
    const size_t ctx = c.ctx, kv_dim = c.kv_dim, past = c.past, rows = c.rows;
    ASSERT_TRUE(past + rows <= ctx && rows >= 2) << "a case appends inside the cache, and 2 rows at its end";
    std::vector<float> kc = random_f32(ctx * kv_dim, 71), vc = random_f32(ctx * kv_dim, 72);
    std::vector<float> k = random_f32(rows * kv_dim, 73), v = random_f32(rows * kv_dim, 74);
    GuardedBuf dkc(ctx * kv_dim * 4), dvc(ctx * kv_dim * 4), dk(rows * kv_dim * 4), dv(rows * kv_dim * 4);
    CUDA_OK(dkc.upload(kc.data(), stream_));
    CUDA_OK(dvc.upload(vc.data(), stream_));
    CUDA_OK(dk.upload(k.data(), stream_));
    CUDA_OK(dv.upload(v.data(), stream_));
    MK_OK_(mk_kernel_kv_append(dkc.ptr<float>(), dvc.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), past, rows, kv_dim,
                               stream_));
    // the last rows of the cache, exactly up to its end
    MK_OK_(mk_kernel_kv_append(dkc.ptr<float>(), dvc.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), ctx - 2, 2, kv_dim,
                               stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::copy(k.begin(), k.end(), kc.begin() + past * kv_dim);
    std::copy(v.begin(), v.end(), vc.begin() + past * kv_dim);
    std::copy(k.begin(), k.begin() + 2 * kv_dim, kc.begin() + (ctx - 2) * kv_dim);
    std::copy(v.begin(), v.begin() + 2 * kv_dim, vc.begin() + (ctx - 2) * kv_dim);
    std::vector<float> gk(ctx * kv_dim), gv(ctx * kv_dim);
    ASSERT_TRUE(dkc.download(gk.data(), stream_));
    ASSERT_TRUE(dvc.download(gv.data(), stream_));
    EXPECT_TRUE(all_equal(gk, kc));
    EXPECT_TRUE(all_equal(gv, vc));
}

INSTANTIATE_TEST_SUITE_P(Ops, KvAppend, ::testing::ValuesIn(cases_here(kv_append_cases())), case_name<KvAppendCase>);

// ============================================================================= swiglu ==

using Swiglu = OpTestP<SwigluCase>;

TEST_P(Swiglu, MatchesCpu) {
    const SwigluCase c = GetParam();
    std::vector<float> g = random_f32(c.n, 81 + c.n, 8.0f), u = random_f32(c.n, 82 + c.n, 2.0f);
    if (c.n > 4) {
        g[1] = 88.0f; // exp(-g) underflows
        g[2] = -88.0f; // exp(-g) large
        g[3] = -120.0f; // exp(-g) overflows to inf -> 0
    }
    std::vector<uint16_t> gh, uh;
    size_t es = 4;
    const void *hg = g.data(), *hu = u.data();
    if (c.dtype != MK_DTYPE_F32) {
        gh = to_half_bits(g, c.dtype);
        uh = to_half_bits(u, c.dtype);
        g = from_half_bits(gh, c.dtype);
        u = from_half_bits(uh, c.dtype);
        hg = gh.data();
        hu = uh.data();
        es = 2;
    }
    GuardedBuf dg(c.n * es), du(c.n * es), dout(c.n * 4);
    CUDA_OK(dg.upload(hg, stream_));
    CUDA_OK(du.upload(hu, stream_));
    CUDA_OK(dout.poison(stream_));
    MK_OK_(mk_kernel_swiglu(dout.ptr<float>(), dg.ptr(), du.ptr(), c.dtype, c.n, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(c.n), ref(c.n);
    ASSERT_TRUE(dout.download(got.data(), stream_));
    mk_cpu_swiglu(ref.data(), g.data(), u.data(), c.n);
    EXPECT_TRUE(all_close(got, ref, 1e-7 * max_abs(ref), 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Ops, Swiglu, ::testing::ValuesIn(cases_here(swiglu_cases())), case_name<SwigluCase>);

// ============================================================================= argmax ==

using Argmax = OpTestP<ArgmaxCase>;

TEST_P(Argmax, ExactLowestIndex) {
    const ArgmaxCase c = GetParam();
    const size_t total = c.rows * c.n;
    std::vector<float> x = random_f32(total, 91 + total, 10.0f);
    const float qnan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::mt19937_64 rng(92 + total);
    for (size_t r = 0; r < c.rows; r++) {
        float *xr = x.data() + r * c.n;
        switch (c.pattern) {
            case ArgPattern::Ties: { // the maximum planted at several indices, highest first
                const size_t m = 1 + rng() % 5;
                std::vector<size_t> at;
                for (size_t i = 0; i < m; i++) at.push_back(rng() % c.n);
                at.push_back(c.n - 1);
                for (size_t i : at) xr[i] = 50.0f;
                break;
            }
            case ArgPattern::ThreadTies:
            case ArgPattern::ThreadTiesMisaligned: {
                // Ties one thread sees in its own scan, whatever the block size (32, 256 or
                // 1024 threads) and load width: the same 16-byte load (+1..+3) and the same
                // thread's later strides (+32 .. +8192). The lowest is a multiple of 4.
                const size_t a = (rng() % (c.n / 2 + 1)) & ~size_t(3);
                for (size_t off : {0, 1, 2, 3, 32, 64, 256, 512, 1024, 2048, 4096, 8192})
                    if (a + off < c.n) xr[a + off] = 50.0f;
                break;
            }
            case ArgPattern::Nans: // NaNs everywhere, one bigger-looking than anything, and at 0
                for (size_t i = 0; i < c.n; i += 1 + rng() % 7) xr[i] = qnan;
                xr[0] = qnan;
                xr[c.n / 2] = -qnan;
                break;
            case ArgPattern::AllNan:
                for (size_t i = 0; i < c.n; i++) xr[i] = qnan;
                break;
            case ArgPattern::NegInf:
                for (size_t i = 0; i < c.n; i++) xr[i] = -inf;
                if (c.n > 3) xr[0] = qnan;
                if (c.n > 10) xr[c.n - 3] = -inf;
                break;
            default: break;
        }
    }
    // Misaligned: the rows start 4 bytes into the buffer (no 16-byte loads).
    const size_t shift =
        c.pattern == ArgPattern::Misaligned || c.pattern == ArgPattern::ThreadTiesMisaligned ? 1 : 0;
    GuardedBuf dx((total + shift) * 4), dout(c.rows * 4);
    std::vector<float> hx(total + shift, 1e30f);
    std::copy(x.begin(), x.end(), hx.begin() + shift);
    CUDA_OK(dx.upload(hx.data(), stream_));
    CUDA_OK(dout.poison(stream_));
    MK_OK_(mk_kernel_argmax(dout.ptr<int32_t>(), dx.ptr<float>() + shift, c.rows, c.n, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<int32_t> got(c.rows), ref(c.rows);
    ASSERT_TRUE(dout.download(got.data(), stream_));
    mk_cpu_argmax(ref.data(), x.data(), c.rows, c.n);
    EXPECT_TRUE(all_equal(got, ref));
}

INSTANTIATE_TEST_SUITE_P(Ops, Argmax, ::testing::ValuesIn(cases_here(argmax_cases())), case_name<ArgmaxCase>);

// ============================================================================ convert ==

using Convert = OpTestP<ConvertCase>;

// Bit patterns that exercise the rounding paths: halfway cases, subnormals, overflow, NaN.
std::vector<float> convert_inputs(size_t n, uint64_t seed) {
    std::vector<float> x = random_f32(n, seed, 100.0f);
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < n; i += 5) { // random bit patterns, including tiny and huge values
        uint32_t b = (uint32_t)rng();
        float f;
        std::memcpy(&f, &b, 4);
        x[i] = f;
    }
    // the specials last, so no random pattern overwrites one (it did for every fifth)
    const float specials[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, -3e-6f, 5.9604645e-8f, 2.9802322e-8f,
                              6.1035156e-5f, 1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f, 1.00390625f, 1.01171875f,
                              3.4e38f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), 1e-40f};
    const size_t ns = sizeof(specials) / sizeof(specials[0]);
    for (size_t i = 0; i < n && i < ns; i++) x[i * (n / ns > 0 ? n / ns : 1)] = specials[i];
    return x;
}

TEST_P(Convert, BitExact) {
    const ConvertCase c = GetParam();
    const size_t ss = c.src == MK_DTYPE_F32 ? 4 : 2, ds = c.dst == MK_DTYPE_F32 ? 4 : 2;
    std::vector<float> x = convert_inputs(c.n, 101 + c.n);
    // the source in its dtype, and the reference output bits from the CPU conversions
    std::vector<uint8_t> src(c.n * ss), ref(c.n * ds), got(c.n * ds);
    for (size_t i = 0; i < c.n; i++) {
        float f = x[i];
        if (c.src == MK_DTYPE_F32) std::memcpy(&src[i * 4], &f, 4);
        else {
            const uint16_t h = c.src == MK_DTYPE_F16 ? mk_f32_to_f16(f) : mk_f32_to_bf16(f);
            std::memcpy(&src[i * 2], &h, 2);
            f = c.src == MK_DTYPE_F16 ? mk_f16_to_f32(h) : mk_bf16_to_f32(h);
        }
        if (c.dst == c.src) std::memcpy(&ref[i * ds], &src[i * ss], ss);
        else if (c.dst == MK_DTYPE_F32) std::memcpy(&ref[i * 4], &f, 4);
        else {
            const uint16_t h = c.dst == MK_DTYPE_F16 ? mk_f32_to_f16(f) : mk_f32_to_bf16(f);
            std::memcpy(&ref[i * 2], &h, 2);
        }
    }
    GuardedBuf dsrc(c.n * ss), ddst(c.n * ds);
    CUDA_OK(dsrc.upload(src.data(), stream_));
    CUDA_OK(ddst.poison(stream_));
    MK_OK_(mk_kernel_convert(ddst.ptr(), c.dst, dsrc.ptr(), c.src, c.n, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    ASSERT_TRUE(ddst.download(got.data(), stream_));
    EXPECT_TRUE(all_equal(got, ref));
}

INSTANTIATE_TEST_SUITE_P(Ops, Convert, ::testing::ValuesIn(cases_here(convert_cases())), case_name<ConvertCase>);

// ==================================================================== add, last row ==

TEST_F(OpTest, AddAndLastRow) {
    for (size_t n : {1, 33, 100003}) {
        std::vector<float> y = random_f32(n, 111 + n), x = random_f32(n, 112 + n);
        GuardedBuf dy(n * 4), dx(n * 4);
        CUDA_OK(dy.upload(y.data(), stream_));
        CUDA_OK(dx.upload(x.data(), stream_));
        MK_OK_(mk_kernel_add(dy.ptr<float>(), dx.ptr<float>(), n, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
        std::vector<float> got(n);
        ASSERT_TRUE(dy.download(got.data(), stream_));
        mk_cpu_add(y.data(), x.data(), n);
        EXPECT_TRUE(all_equal(got, y)) << "add n=" << n;
    }
    for (size_t rows : {1, 7}) {
        const size_t cols = 4097;
        std::vector<float> x = random_f32(rows * cols, 113 + rows);
        GuardedBuf dx(rows * cols * 4), dout(cols * 4);
        CUDA_OK(dx.upload(x.data(), stream_));
        CUDA_OK(dout.poison(stream_));
        MK_OK_(mk_kernel_last_row(dout.ptr<float>(), dx.ptr<float>(), rows, cols, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
        std::vector<float> got(cols), ref(x.end() - (ptrdiff_t)cols, x.end());
        ASSERT_TRUE(dout.download(got.data(), stream_));
        EXPECT_TRUE(all_equal(got, ref)) << "last_row rows=" << rows;
    }
}

// =============================================================================== gemv ==
// Decode matrix products (kernels/gemv.cu, kernels/gemv_q.cu) against dequantize-then-multiply:
// the weights widened/dequantized on the CPU (mk_f16_to_f32 & co., mk_gguf_dequantize), the
// product in double. Tolerance per output: the float summation tree of the kernel (in_dim / 32
// sequential adds per lane, then five levels) bounds the error by about
// (in_dim / 32 + 8) * 2^-24 * sum|x_k w_k|; a margin covers the FMA contraction of the
// dequantization on a GPU (<= 1 ulp of |d * q| per weight, bounded via max|w| of the row).
// One wrong or missing weight shows up as an error ~|x_k w_k| ~ sum / in_dim, far above it.

// Native weights expanded on the device (kernels/dequant_q.cu) against mk_gguf_dequantize:
// F32 rows equal (a GPU may contract d * q + m into one FMA: 1 ulp), BF16 rows are the
// reference rounded to BF16 (1 BF16 ulp on a GPU); gathered rows by id, an out-of-range id
// a zero row; a row slice [row0, row0 + n).
using DequantQ = OpTestP<DequantCase>;

TEST_P(DequantQ, MatchesTheHostDequantizer) {
    const DequantCase c = GetParam();
    const size_t wn = c.src_rows * c.cols;
    const std::vector<uint8_t> wbytes = random_blocks(c.fmt, wn, 190 + wn);
    std::vector<float> ref(wn);
    MK_OK_(mk_gguf_dequantize(gemv_ggml_type(c.fmt), wbytes.data(), wbytes.size(), ref.data(), wn));
    const std::vector<int32_t> ids = {(int32_t)(c.src_rows - 1), 0, -1, (int32_t)c.src_rows, (int32_t)(c.src_rows / 2)};
    const size_t row0 = c.src_rows / 3, n = c.src_rows - row0;
    GuardedBuf dw(wbytes.size()), di(ids.size() * 4), df(ids.size() * c.cols * 4), dh(n * c.cols * 2);
    ASSERT_TRUE(dw.ok() && di.ok() && df.ok() && dh.ok());
    CUDA_OK(dw.upload(wbytes.data(), stream_));
    CUDA_OK(di.upload(ids.data(), stream_));
    CUDA_OK(df.poison(stream_));
    CUDA_OK(dh.poison(stream_));
    const uint32_t type = gemv_ggml_type(c.fmt);
    MK_OK_(mk_kernel_dequant_q(df.ptr<float>(), MK_DTYPE_F32, dw.ptr<uint8_t>(), type, di.ptr<int32_t>(), 0, ids.size(),
                               c.src_rows, c.cols, stream_));
    MK_OK_(mk_kernel_dequant_q(dh.ptr<uint16_t>(), MK_DTYPE_BF16, dw.ptr<uint8_t>(), type, nullptr, row0, n, c.src_rows,
                               c.cols, stream_));
    std::vector<float> gf(ids.size() * c.cols);
    std::vector<uint16_t> gh(n * c.cols);
    ASSERT_TRUE(df.download(gf.data(), stream_));
    ASSERT_TRUE(dh.download(gh.data(), stream_));
    size_t bad = 0;
    for (size_t i = 0; i < ids.size() && bad < 10; i++)
        for (size_t k = 0; k < c.cols && bad < 10; k++) {
            const bool in = ids[i] >= 0 && (size_t)ids[i] < c.src_rows;
            const float want = in ? ref[(size_t)ids[i] * c.cols + k] : 0.0f, got = gf[i * c.cols + k];
            if (!(std::fabs(got - want) <= std::ldexp(std::fabs(want), -23))) {
                ADD_FAILURE() << "f32 id " << ids[i] << " col " << k << ": got " << got << " want " << want;
                bad++;
            }
        }
    for (size_t i = 0; i < n && bad < 10; i++)
        for (size_t k = 0; k < c.cols && bad < 10; k++) {
            const float want = ref[(row0 + i) * c.cols + k];
            const uint16_t wb = mk_f32_to_bf16(want), gb = gh[i * c.cols + k];
            if (std::abs((int)gb - (int)wb) > 1) {
                ADD_FAILURE() << "bf16 row " << row0 + i << " col " << k << ": got " << gb << " want " << wb;
                bad++;
            }
        }
    EXPECT_ERROR(mk_kernel_dequant_q(df.ptr<float>(), MK_DTYPE_F32, dw.ptr<uint8_t>(), type, nullptr, 1, c.src_rows,
                                     c.src_rows, c.cols, stream_),
                 MK_ERR_SHAPE, "outside the weight");
}

INSTANTIATE_TEST_SUITE_P(Ops, DequantQ, ::testing::ValuesIn(cases_here(dequant_cases())), case_name<DequantCase>);

using Gemv = OpTestP<GemvCase>;

TEST_P(Gemv, MatchesDequantizeThenMultiply) {
    const GemvCase c = GetParam();
    const size_t xn = c.rows * c.in_dim, wn = c.out_dim * c.in_dim, yn = c.rows * c.out_dim;
    const bool quant = gemv_is_blocks(c.fmt);
    std::vector<float> x = random_f32(xn, 91 + xn, 2.0f);
    std::vector<float> wf;           // the weights as the reference sees them
    std::vector<uint8_t> wbytes;     // as the kernel gets them
    if (quant) {
        wbytes = random_blocks(c.fmt, wn, 92 + wn);
        wf.resize(wn);
        MK_OK_(mk_gguf_dequantize(gemv_ggml_type(c.fmt), wbytes.data(), wbytes.size(), wf.data(), wn));
    } else {
        wf = random_f32(wn, 93 + wn, 1.0f);
        if (c.fmt == GemvFormat::F32) {
            wbytes.resize(wn * 4);
            std::memcpy(wbytes.data(), wf.data(), wbytes.size());
        } else {
            const mk_dtype d = c.fmt == GemvFormat::F16 ? MK_DTYPE_F16 : MK_DTYPE_BF16;
            std::vector<uint16_t> h = to_half_bits(wf, d);
            wf = from_half_bits(h, d);
            wbytes.resize(wn * 2);
            std::memcpy(wbytes.data(), h.data(), wbytes.size());
        }
    }
    const size_t off = c.misaligned ? 4 : 0;
    std::vector<uint8_t> xbytes(off + xn * 4, 0x77), wpad(off + wbytes.size(), 0x77);
    std::memcpy(xbytes.data() + off, x.data(), xn * 4);
    std::memcpy(wpad.data() + off, wbytes.data(), wbytes.size());
    GuardedBuf dx(xbytes.size()), dw(wpad.size()), dy(yn * 4);
    ASSERT_TRUE(dx.ok() && dw.ok() && dy.ok());
    CUDA_OK(dx.upload(xbytes.data(), stream_));
    CUDA_OK(dw.upload(wpad.data(), stream_));
    CUDA_OK(dy.poison(stream_));
    const float *xp = reinterpret_cast<const float *>(dx.ptr<uint8_t>() + off);
    const void *wp = dw.ptr<uint8_t>() + off;
    if (quant)
        MK_OK_(mk_kernel_gemv_q(dy.ptr<float>(), xp, wp, gemv_ggml_type(c.fmt), c.rows, c.in_dim, c.out_dim, stream_));
    else
        MK_OK_(mk_kernel_gemv(dy.ptr<float>(), xp, wp,
                              c.fmt == GemvFormat::F32 ? MK_DTYPE_F32
                              : c.fmt == GemvFormat::F16 ? MK_DTYPE_F16
                                                         : MK_DTYPE_BF16,
                              c.rows, c.in_dim, c.out_dim, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(yn);
    ASSERT_TRUE(dy.download(got.data(), stream_));
    size_t bad = 0;
    for (size_t r = 0; r < c.rows && bad < 10; r++)
        for (size_t o = 0; o < c.out_dim && bad < 10; o++) {
            double ref = 0.0, abs_sum = 0.0, x_sum = 0.0, w_max = 0.0;
            for (size_t k = 0; k < c.in_dim; k++) {
                const double xv = x[r * c.in_dim + k], wv = wf[o * c.in_dim + k];
                ref += xv * wv;
                abs_sum += std::fabs(xv * wv);
                x_sum += std::fabs(xv);
                w_max = std::max(w_max, std::fabs(wv));
            }
            const double tol = ((double)c.in_dim / 32.0 + 8.0) * 0x1p-24 * abs_sum + 4.0 * 0x1p-24 * x_sum * w_max;
            const double g = got[r * c.out_dim + o];
            if (!(std::fabs(g - ref) <= tol)) {
                ADD_FAILURE() << "y[" << r << ", " << o << "] got " << g << " ref " << ref << " tol " << tol;
                bad++;
            }
        }
}

INSTANTIATE_TEST_SUITE_P(Ops, Gemv, ::testing::ValuesIn(cases_here(gemv_cases())), case_name<GemvCase>);

// The fused launches (Q/K/V sharing the input; gate and up with SwiGLU) give exactly the
// bits of the separate launches they replace (which the grid above checks against the CPU),
// so the cuda backend's decode is the same computation fused or not.
TEST_F(OpTest, GemvMultiAndSwigluEqualSeparateLaunches) {
    for (const mk_dtype d : {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16})
        for (const size_t rows : {size_t(1), size_t(3), size_t(8)})
            for (const size_t in_dim : {size_t(40), size_t(33)}) {
                SCOPED_TRACE(std::string(dtype_tag(d)) + " rows " + std::to_string(rows) + " in " + std::to_string(in_dim));
                const size_t outs[3] = {13, 5, 7};
                const size_t es = d == MK_DTYPE_F32 ? 4 : 2;
                std::vector<float> x = random_f32(rows * in_dim, 101 + rows, 2.0f);
                std::vector<std::vector<uint8_t>> wh(3);
                std::vector<std::unique_ptr<GuardedBuf>> dw, dy, dsep;
                GuardedBuf dx(x.size() * 4);
                CUDA_OK(dx.upload(x.data(), stream_));
                for (int i = 0; i < 3; i++) {
                    std::vector<float> wf = random_f32(outs[i] * in_dim, 102 + i, 1.0f);
                    wh[i].resize(wf.size() * es);
                    if (d == MK_DTYPE_F32) std::memcpy(wh[i].data(), wf.data(), wh[i].size());
                    else {
                        std::vector<uint16_t> h = to_half_bits(wf, d);
                        std::memcpy(wh[i].data(), h.data(), wh[i].size());
                    }
                    dw.emplace_back(new GuardedBuf(wh[i].size()));
                    dy.emplace_back(new GuardedBuf(rows * outs[i] * 4));
                    dsep.emplace_back(new GuardedBuf(rows * outs[i] * 4));
                    CUDA_OK(dw[i]->upload(wh[i].data(), stream_));
                    CUDA_OK(dy[i]->poison(stream_));
                    CUDA_OK(dsep[i]->poison(stream_));
                }
                float *ys[3] = {dy[0]->ptr<float>(), dy[1]->ptr<float>(), dy[2]->ptr<float>()};
                const void *ws[3] = {dw[0]->ptr(), dw[1]->ptr(), dw[2]->ptr()};
                MK_OK_(mk_kernel_gemv_multi(3, ys, ws, outs, d, dx.ptr<float>(), rows, in_dim, stream_));
                for (int i = 0; i < 3; i++)
                    MK_OK_(mk_kernel_gemv(dsep[i]->ptr<float>(), dx.ptr<float>(), ws[i], d, rows, in_dim, outs[i], stream_));
                for (int i = 0; i < 3; i++) {
                    std::vector<float> a(rows * outs[i]), b(rows * outs[i]);
                    ASSERT_TRUE(dy[i]->download(a.data(), stream_));
                    ASSERT_TRUE(dsep[i]->download(b.data(), stream_));
                    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "matrix " << i;
                }
                // gate = w[1] (5 rows), up = the first 5 rows of w[2]
                GuardedBuf dout(rows * outs[1] * 4), dg(rows * outs[1] * 4), du(rows * outs[1] * 4), dref(rows * outs[1] * 4);
                CUDA_OK(dout.poison(stream_));
                CUDA_OK(dg.poison(stream_));
                CUDA_OK(du.poison(stream_));
                CUDA_OK(dref.poison(stream_));
                MK_OK_(mk_kernel_gemv_swiglu(dout.ptr<float>(), dx.ptr<float>(), ws[1], ws[2], d, rows, in_dim, outs[1],
                                             stream_));
                MK_OK_(mk_kernel_gemv(dg.ptr<float>(), dx.ptr<float>(), ws[1], d, rows, in_dim, outs[1], stream_));
                MK_OK_(mk_kernel_gemv(du.ptr<float>(), dx.ptr<float>(), ws[2], d, rows, in_dim, outs[1], stream_));
                MK_OK_(mk_kernel_swiglu(dref.ptr<float>(), dg.ptr<float>(), du.ptr<float>(), MK_DTYPE_F32, rows * outs[1],
                                        stream_));
                std::vector<float> a(rows * outs[1]), b(rows * outs[1]);
                ASSERT_TRUE(dout.download(a.data(), stream_));
                ASSERT_TRUE(dref.download(b.data(), stream_));
                EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "swiglu";
                EXPECT_FALSE(std::isnan(a[0]));
            }
    GuardedBuf b(4096);
    float *f = b.ptr<float>();
    float *ys[3] = {f, f, f};
    const void *ws[3] = {f, f, f};
    const size_t outs[3] = {1, 1, 1};
    EXPECT_ERROR(mk_kernel_gemv_multi(4, ys, ws, outs, MK_DTYPE_BF16, f, 1, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_gemv_multi: 4 matrices (1..3)");
    for (int i = 0; i < 3; i++) { // a missing weight or output of any matrix with outputs
        const void *ws_null[3] = {f, f, f};
        float *ys_null[3] = {f, f, f};
        ws_null[i] = nullptr;
        EXPECT_ERROR(mk_kernel_gemv_multi(3, ys, ws_null, outs, MK_DTYPE_BF16, f, 1, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                     "mk_kernel_gemv_multi: null pointer")
            << "weight " << i;
        ys_null[i] = nullptr;
        EXPECT_ERROR(mk_kernel_gemv_multi(3, ys_null, ws, outs, MK_DTYPE_BF16, f, 1, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                     "mk_kernel_gemv_multi: null pointer")
            << "output " << i;
    }
    EXPECT_ERROR(mk_kernel_gemv_swiglu(f, f, f, f, MK_DTYPE_BF16, 9, 4, 4, stream_), MK_ERR_SHAPE,
                 "mk_kernel_gemv_swiglu: 9 rows exceed the decode limit 8");
    EXPECT_ERROR(mk_kernel_gemv_swiglu(f, f, nullptr, f, MK_DTYPE_BF16, 1, 4, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_gemv_swiglu: null pointer");
}

// RoPE of Q and K plus the KV-cache write in one launch: the same bits as mk_kernel_rope on
// q and k then mk_kernel_kv_append (the cache outside [past, past + rows) untouched). The
// fused kernel takes each row's slot from positions (== past + r) on the device.
TEST_F(OpTest, RopeKvEqualsRopeThenKvAppend) {
    struct C {
        mk_rope_layout layout;
        size_t rows, past, n_heads, n_kv_heads, head_dim;
    };
    for (const C c : {C{MK_ROPE_ROTATE_HALF, 1, 5, 4, 2, 8}, C{MK_ROPE_ADJACENT_PAIRS, 3, 0, 6, 3, 6},
                      C{MK_ROPE_ROTATE_HALF, 8, 17, 9, 3, 64}, C{MK_ROPE_ADJACENT_PAIRS, 1, 40, 3, 1, 128},
                      C{MK_ROPE_ROTATE_HALF, 1, 0, 4, 2, 8}, C{MK_ROPE_ROTATE_HALF, 1, 256, 2, 1, 16}}) {
        SCOPED_TRACE("rows " + std::to_string(c.rows) + " past " + std::to_string(c.past) + " head_dim " +
                     std::to_string(c.head_dim));
        const size_t ctx = c.past + c.rows + 3, kv_dim = c.n_kv_heads * c.head_dim, qn = c.rows * c.n_heads * c.head_dim;
        const size_t kn = c.rows * kv_dim;
        std::vector<float> q = random_f32(qn, 111 + qn, 2.0f), k = random_f32(kn, 112 + kn, 2.0f),
                           v = random_f32(kn, 113 + kn, 2.0f);
        std::vector<int32_t> pos(c.rows);
        for (size_t r = 0; r < c.rows; r++) pos[r] = (int32_t)(c.past + r);
        GuardedBuf dpos(c.rows * 4);
        CUDA_OK(dpos.upload(pos.data(), stream_));
        std::vector<float> out[2][4]; // [fused, separate][q, k, k_cache, v_cache]
        for (int fused = 0; fused < 2; fused++) {
            GuardedBuf dq(qn * 4), dk(kn * 4), dv(kn * 4), dkc(ctx * kv_dim * 4), dvc(ctx * kv_dim * 4);
            CUDA_OK(dq.upload(q.data(), stream_));
            CUDA_OK(dk.upload(k.data(), stream_));
            CUDA_OK(dv.upload(v.data(), stream_));
            CUDA_OK(dkc.poison(stream_));
            CUDA_OK(dvc.poison(stream_));
            if (fused == 0) {
                MK_OK_(mk_kernel_rope_kv(dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), dkc.ptr<float>(),
                                         dvc.ptr<float>(), identity_pages(), MK_DTYPE_F32, dpos.ptr<int32_t>(), ctx, c.rows, c.n_heads,
                                         c.n_kv_heads, c.head_dim, 10000.0f, c.layout, stream_));
            } else {
                MK_OK_(mk_kernel_rope(dq.ptr<float>(), dpos.ptr<int32_t>(), c.rows, c.n_heads, c.head_dim, 10000.0f,
                                      c.layout, stream_));
                MK_OK_(mk_kernel_rope(dk.ptr<float>(), dpos.ptr<int32_t>(), c.rows, c.n_kv_heads, c.head_dim, 10000.0f,
                                      c.layout, stream_));
                MK_OK_(mk_kernel_kv_append(dkc.ptr<float>(), dvc.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), c.past,
                                           c.rows, kv_dim, stream_));
            }
            out[fused][0].resize(qn);
            out[fused][1].resize(kn);
            out[fused][2].resize(ctx * kv_dim);
            out[fused][3].resize(ctx * kv_dim);
            ASSERT_TRUE(dq.download(out[fused][0].data(), stream_));
            ASSERT_TRUE(dk.download(out[fused][1].data(), stream_));
            ASSERT_TRUE(dkc.download(out[fused][2].data(), stream_));
            ASSERT_TRUE(dvc.download(out[fused][3].data(), stream_));
        }
        for (int i = 0; i < 4; i++)
            EXPECT_EQ(std::memcmp(out[0][i].data(), out[1][i].data(), out[0][i].size() * 4), 0) << "buffer " << i;
        // and the rotation is the CPU's
        std::vector<float> qref = q;
        mk_cpu_rope(qref.data(), pos.data(), c.rows, c.n_heads, c.head_dim, 10000.0f, c.layout);
        EXPECT_TRUE(all_close(out[0][0], qref, 1e-6 * max_abs(qref), 1e-5));
    }
    GuardedBuf b(4096);
    float *f = b.ptr<float>();
    int32_t *i = b.ptr<int32_t>();
    EXPECT_ERROR(mk_kernel_rope_kv(f, f, f, f, f, identity_pages(), MK_DTYPE_F32, i, 4, 1, 2, 0, 8, 10000.0f, MK_ROPE_ROTATE_HALF, stream_), MK_ERR_SHAPE,
                 "mk_kernel_rope_kv: zero kv heads");
    EXPECT_ERROR(mk_kernel_rope_kv(f, f, f, f, f, identity_pages(), MK_DTYPE_F32, i, 4, 1, 2, 1, 7, 10000.0f, MK_ROPE_ROTATE_HALF, stream_), MK_ERR_SHAPE,
                 "mk_kernel_rope_kv: head_dim 7 must be even");
    EXPECT_ERROR(mk_kernel_rope_kv(f, nullptr, f, f, f, identity_pages(), MK_DTYPE_F32, i, 4, 1, 2, 1, 8, 10000.0f, MK_ROPE_ROTATE_HALF, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_rope_kv: null pointer");
}

// A position outside the cache (the executor never sends one) stores nothing: no write past
// the cache, the rows inside it still stored.
TEST_F(OpTest, RopeKvPositionOutsideTheCacheStoresNothing) {
    const size_t rows = 3, n_heads = 2, n_kv = 1, hd = 8, ctx = 5, kv_dim = n_kv * hd;
    std::vector<float> q = random_f32(rows * n_heads * hd, 121), k = random_f32(rows * kv_dim, 122),
                       v = random_f32(rows * kv_dim, 123);
    const std::vector<int32_t> pos = {4, 5, -1}; // the last slot, one past the cache, negative
    GuardedBuf dq(q.size() * 4), dk(k.size() * 4), dv(v.size() * 4), dkc(ctx * kv_dim * 4), dvc(ctx * kv_dim * 4),
        dpos(rows * 4);
    CUDA_OK(dq.upload(q.data(), stream_));
    CUDA_OK(dk.upload(k.data(), stream_));
    CUDA_OK(dv.upload(v.data(), stream_));
    CUDA_OK(dpos.upload(pos.data(), stream_));
    CUDA_OK(dkc.poison(stream_));
    CUDA_OK(dvc.poison(stream_));
    MK_OK_(mk_kernel_rope_kv(dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), dkc.ptr<float>(), dvc.ptr<float>(), identity_pages(),
                             MK_DTYPE_F32, dpos.ptr<int32_t>(), ctx, rows, n_heads, n_kv, hd, 10000.0f, MK_ROPE_ROTATE_HALF, stream_));
    std::vector<float> kr(k.size()), kc(ctx * kv_dim), vc(ctx * kv_dim);
    ASSERT_TRUE(dk.download(kr.data(), stream_));
    ASSERT_TRUE(dkc.download(kc.data(), stream_)); // sentinels after the cache intact
    ASSERT_TRUE(dvc.download(vc.data(), stream_));
    EXPECT_EQ(std::memcmp(kc.data() + 4 * kv_dim, kr.data(), kv_dim * 4), 0);
    EXPECT_EQ(std::memcmp(vc.data() + 4 * kv_dim, v.data(), kv_dim * 4), 0);
    for (size_t i = 0; i < 4 * kv_dim; i++) ASSERT_TRUE(std::isnan(kc[i]) && std::isnan(vc[i])) << i;
}

// The fused RoPE + cache write into an F16 or BF16 cache: q and k rotated exactly as with an
// F32 cache, the cache rows at positions[r] the F32 run's rows rounded as mk_f32_to_f16 /
// mk_f32_to_bf16 round them (bit for bit), every other cache element untouched.
TEST_F(OpTest, RopeKvHalfCacheStoresRoundedRows) {
    const size_t rows = 3, n_heads = 9, n_kv = 3, hd = 64, ctx = 11, kv_dim = n_kv * hd, past = 6;
    std::vector<float> q = random_f32(rows * n_heads * hd, 131, 3.0f), k = random_f32(rows * kv_dim, 132, 3.0f),
                       v = random_f32(rows * kv_dim, 133, 3.0f);
    v[5] = 65504.0f * 1.5f; // overflows F16 (inf), stays finite in BF16
    v[7] = 1e-7f;           // an F16 subnormal
    std::vector<int32_t> pos(rows);
    for (size_t r = 0; r < rows; r++) pos[r] = (int32_t)(past + r);
    GuardedBuf dpos(rows * 4);
    CUDA_OK(dpos.upload(pos.data(), stream_));
    std::vector<float> want_q(q.size()), want_k(k.size()), f32_kc(ctx * kv_dim), f32_vc(ctx * kv_dim);
    for (const mk_dtype kv : {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16}) {
        SCOPED_TRACE(dtype_tag(kv));
        const size_t esz = mk_dtype_size(kv);
        GuardedBuf dq(q.size() * 4), dk(k.size() * 4), dv(v.size() * 4), dkc(ctx * kv_dim * esz),
            dvc(ctx * kv_dim * esz);
        CUDA_OK(dq.upload(q.data(), stream_));
        CUDA_OK(dk.upload(k.data(), stream_));
        CUDA_OK(dv.upload(v.data(), stream_));
        CUDA_OK(dkc.poison(stream_));
        CUDA_OK(dvc.poison(stream_));
        MK_OK_(mk_kernel_rope_kv(dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), dkc.ptr(), dvc.ptr(), identity_pages(), kv,
                                 dpos.ptr<int32_t>(), ctx, rows, n_heads, n_kv, hd, 10000.0f, MK_ROPE_ROTATE_HALF,
                                 stream_));
        std::vector<float> gq(q.size()), gk(k.size());
        ASSERT_TRUE(dq.download(gq.data(), stream_));
        ASSERT_TRUE(dk.download(gk.data(), stream_));
        if (kv == MK_DTYPE_F32) {
            want_q = gq;
            want_k = gk;
            ASSERT_TRUE(dkc.download(f32_kc.data(), stream_));
            ASSERT_TRUE(dvc.download(f32_vc.data(), stream_));
            continue;
        }
        EXPECT_EQ(std::memcmp(gq.data(), want_q.data(), q.size() * 4), 0);
        EXPECT_EQ(std::memcmp(gk.data(), want_k.data(), k.size() * 4), 0);
        std::vector<uint16_t> kc(ctx * kv_dim), vc(ctx * kv_dim);
        ASSERT_TRUE(dkc.download(kc.data(), stream_));
        ASSERT_TRUE(dvc.download(vc.data(), stream_));
        const std::vector<uint16_t> wk = to_half_bits(f32_kc, kv), wv = to_half_bits(f32_vc, kv);
        for (size_t i = 0; i < ctx * kv_dim; i++) {
            const bool stored = i / kv_dim >= past && i / kv_dim < past + rows;
            ASSERT_EQ(kc[i], stored ? wk[i] : 0xFFFFu) << "k element " << i;
            ASSERT_EQ(vc[i], stored ? wv[i] : 0xFFFFu) << "v element " << i;
        }
    }
    GuardedBuf b(4096);
    EXPECT_ERROR(mk_kernel_rope_kv(b.ptr<float>(), b.ptr<float>(), b.ptr<float>(), b.ptr(), b.ptr(), identity_pages(), MK_DTYPE_I64,
                                   b.ptr<int32_t>(), 4, 1, 2, 1, 8, 10000.0f, MK_ROPE_ROTATE_HALF, stream_),
                 MK_ERR_DTYPE, "mk_kernel_rope_kv: KV cache dtype");
}

// Prefill over an F16 or BF16 cache == the CPU reference on the rounded values.
TEST_F(OpTest, AttentionPrefillHalfCache) {
    struct C {
        size_t rows, past, n_heads, n_kv_heads, head_dim;
    };
    for (const mk_dtype kv : {MK_DTYPE_F16, MK_DTYPE_BF16})
        for (const C c : {C{5, 40, 9, 3, 64}, C{17, 3, 4, 1, 128}, C{3, 10, 6, 2, 34}}) {
            SCOPED_TRACE(std::string(dtype_tag(kv)) + " rows " + std::to_string(c.rows) + " hd " +
                         std::to_string(c.head_dim));
            const size_t keys = c.past + c.rows, qn = c.rows * c.n_heads * c.head_dim,
                         kvn = keys * c.n_kv_heads * c.head_dim;
            std::vector<float> q = random_f32(qn, 141 + qn);
            const DecodeCacheBytes k = decode_cache_as(random_f32(kvn, 142 + kvn), kv),
                                   v = decode_cache_as(random_f32(kvn, 143 + kvn), kv);
            GuardedBuf dq(qn * 4), dk(k.bytes.size()), dv(v.bytes.size()), dout(qn * 4);
            CUDA_OK(dq.upload(q.data(), stream_));
            CUDA_OK(dk.upload(k.bytes.data(), stream_));
            CUDA_OK(dv.upload(v.bytes.data(), stream_));
            CUDA_OK(dout.poison(stream_));
            MK_OK_(mk_kernel_attention_prefill_kv(dout.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), kv, c.rows,
                                                  c.past, c.n_heads, c.n_kv_heads, c.head_dim, stream_));
            std::vector<float> got(qn), ref(qn);
            ASSERT_TRUE(dout.download(got.data(), stream_));
            cpu_attention_all_cores(ref.data(), q.data(), k.values.data(), v.values.data(), c.rows, c.past, c.n_heads,
                                    c.n_kv_heads, c.head_dim);
            EXPECT_TRUE(all_close(got, ref, kAttnAtol * max_abs(v.values), 1e-5));
        }
    GuardedBuf b(4096);
    EXPECT_ERROR(mk_kernel_attention_prefill_kv(b.ptr<float>(), b.ptr<float>(), b.ptr(), b.ptr(), identity_pages(), MK_DTYPE_I64, 1, 0,
                                                4, 4, 8, stream_),
                 MK_ERR_DTYPE, "mk_kernel_attention_prefill: KV cache dtype");
}

TEST_F(OpTest, GemvErrors) {
    GuardedBuf b(4096);
    float *f = b.ptr<float>();
    EXPECT_ERROR(mk_kernel_gemv(f, f, f, MK_DTYPE_I32, 1, 4, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_gemv: weight dtype 4 is not F32/F16/BF16");
    EXPECT_ERROR(mk_kernel_gemv(f, f, f, MK_DTYPE_BF16, 9, 4, 4, stream_), MK_ERR_SHAPE,
                 "mk_kernel_gemv: 9 rows exceed the decode limit 8");
    EXPECT_ERROR(mk_kernel_gemv(f, f, f, MK_DTYPE_BF16, 1, 0, 4, stream_), MK_ERR_SHAPE,
                 "mk_kernel_gemv: zero input width");
    EXPECT_ERROR(mk_kernel_gemv(nullptr, f, f, MK_DTYPE_BF16, 1, 4, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_gemv: null pointer");
    EXPECT_ERROR(mk_kernel_gemv_q(f, f, f, MK_GGML_TYPE_IQ2_XXS, 1, 256, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_gemv_q: ggml type 16 has no device GEMV");
    EXPECT_ERROR(mk_kernel_gemv_q(f, f, f, MK_GGML_TYPE_Q4_K, 1, 288, 4, stream_), MK_ERR_SHAPE,
                 "input width 288 is not a multiple of the block size 256");
    EXPECT_ERROR(mk_kernel_gemv_q(f, f, f, MK_GGML_TYPE_Q8_0, 9, 32, 4, stream_), MK_ERR_SHAPE,
                 "mk_kernel_gemv_q: 9 rows exceed the decode limit 8");
    EXPECT_ERROR(mk_kernel_gemv_q(f, f, b.ptr<uint8_t>() + 2, MK_GGML_TYPE_Q4_1, 1, 32, 4, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_q: weights not 4-byte aligned");
    EXPECT_ERROR(mk_kernel_gemv_q(f, f, b.ptr<uint8_t>() + 4, MK_GGML_TYPE_Q5_K, 1, 256, 4, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_q: weights not 8-byte aligned");
    EXPECT_ERROR(mk_kernel_gemv_q(f, f, b.ptr<uint8_t>() + 1, MK_GGML_TYPE_Q6_K, 1, 256, 4, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_q: weights not 2-byte aligned");
    // every format the cpu backend keeps in its blocks, and nothing else
    for (uint32_t t = 0; t < 40; t++) {
        const bool want = t == MK_GGML_TYPE_Q4_0 || t == MK_GGML_TYPE_Q4_1 || t == MK_GGML_TYPE_Q5_0 ||
                          t == MK_GGML_TYPE_Q5_1 || t == MK_GGML_TYPE_Q8_0 || t == MK_GGML_TYPE_Q2_K || t == MK_GGML_TYPE_Q3_K ||
                          t == MK_GGML_TYPE_Q4_K || t == MK_GGML_TYPE_Q5_K || t == MK_GGML_TYPE_Q6_K ||
                          t == MK_GGML_TYPE_IQ4_NL || t == MK_GGML_TYPE_IQ4_XS;
        EXPECT_EQ(mk_kernel_gemv_q_supports(t), want) << "type " << t;
    }
    EXPECT_EQ(mk_kernel_gemv(f, f, f, MK_DTYPE_F16, 0, 4, 4, stream_), MK_OK); // zero rows: no-op
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// ============================================================================= errors ==

TEST_F(OpTest, ShapeAndArgumentErrors) {
    GuardedBuf b(4096);
    float *f = b.ptr<float>();
    int32_t *i = b.ptr<int32_t>();
    EXPECT_ERROR(mk_kernel_embed(f, f, MK_DTYPE_I32, i, 1, 4, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_embed: table dtype 4 is not F32/F16/BF16");
    EXPECT_ERROR(mk_kernel_embed(f, f, MK_DTYPE_F32, i, 1, 0, 4, stream_), MK_ERR_SHAPE, "mk_kernel_embed: hidden 0, vocab 4");
    EXPECT_ERROR(mk_kernel_rmsnorm(f, f, f, 2, 0, 1e-5f, stream_), MK_ERR_SHAPE, "mk_kernel_rmsnorm: zero columns");
    EXPECT_ERROR(mk_kernel_rmsnorm(nullptr, f, f, 2, 4, 1e-5f, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_rmsnorm: null pointer");
    EXPECT_ERROR(mk_kernel_rope(f, i, 1, 1, 7, 10000.0f, MK_ROPE_ROTATE_HALF, stream_), MK_ERR_SHAPE,
                 "mk_kernel_rope: head_dim 7 must be even");
    EXPECT_ERROR(mk_kernel_rope(f, i, 1, 1, 258, 10000.0f, MK_ROPE_ROTATE_HALF, stream_), MK_ERR_SHAPE,
                 "mk_kernel_rope: head_dim 258 must be even and <= 256");
    EXPECT_ERROR(mk_kernel_rope(f, i, 1, 1, 8, 10000.0f, (mk_rope_layout)9, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_rope: unknown layout 9");
    EXPECT_ERROR(mk_kernel_attention_prefill_kv(f, f, f, f, identity_pages(), MK_DTYPE_F32, 1, 0, 6, 4, 8, stream_), MK_ERR_SHAPE,
                 "n_heads 6 must be a multiple of n_kv_heads 4");
    EXPECT_ERROR(mk_kernel_attention_prefill_kv(f, f, f, f, identity_pages(), MK_DTYPE_F32, 1, 0, 4, 4, 5, stream_), MK_ERR_SHAPE,
                 "mk_kernel_attention_prefill: head_dim 5 must be even");
    EXPECT_ERROR(mk_kernel_attention_prefill_kv(f, f, b.ptr<char>() + 2, f, identity_pages(), MK_DTYPE_F16, 1, 0, 4, 2, 8,
                                                stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_prefill: KV cache not aligned to 4 bytes");
    EXPECT_ERROR(mk_kernel_attention_decode(f, f, f, f, identity_pages(), MK_DTYPE_F32, i, 1, 16, 4, 0, 8, f, 4096, stream_), MK_ERR_SHAPE,
                 "mk_kernel_attention_decode: n_heads 4 must be a multiple of n_kv_heads 0");
    EXPECT_ERROR(mk_kernel_swiglu(f, f, f, MK_DTYPE_I64, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_swiglu: dtype 5 is not F32/F16/BF16");
    EXPECT_ERROR(mk_kernel_argmax(i, f, 1, 0, stream_), MK_ERR_SHAPE, "mk_kernel_argmax: row length 0");
    EXPECT_ERROR(mk_kernel_argmax(i, f, 1, (size_t)1 << 31, stream_), MK_ERR_SHAPE, "mk_kernel_argmax: row length 2147483648");
    EXPECT_ERROR(mk_kernel_convert(f, MK_DTYPE_I32, f, MK_DTYPE_F32, 4, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_convert: unsupported dtypes 1 -> 4");
    EXPECT_ERROR(mk_kernel_last_row(f, f, 0, 4, stream_), MK_ERR_SHAPE, "mk_kernel_last_row: shape [0, 4]");
    EXPECT_ERROR(mk_kernel_kv_append(f, f, f, f, 0, 1, 0, stream_), MK_ERR_SHAPE, "mk_kernel_kv_append: zero kv_dim");
    // zero work is a no-op, not an error
    EXPECT_EQ(mk_kernel_rmsnorm(f, f, f, 0, 4, 1e-5f, stream_), MK_OK);
    EXPECT_EQ(mk_kernel_argmax(i, f, 0, 4, stream_), MK_OK);
    EXPECT_EQ(mk_kernel_add(f, f, 0, stream_), MK_OK);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// ===================================================== attention prefill, tensor cores ==

// Q, K, V and the softmax weights enter the tensor cores as BF16 (8 significant bits: a
// relative error up to 2^-9 each); an output row is a weighted average of V rows, so the
// error scales with max|V|. A row with one visible key is that V row in BF16.
constexpr double kAttnTcTol = 5e-3;

using AttentionPrefillTc = OpTestP<AttnTcCase>;

TEST_P(AttentionPrefillTc, MatchesCpu) {
    const AttnTcCase c = GetParam();
    const size_t keys = c.past + c.rows;
    const size_t qn = c.rows * c.n_heads * c.head_dim, kvn = keys * c.n_kv_heads * c.head_dim;
    std::vector<float> q = random_f32(qn, 71 + qn, 1.0f), k = random_f32(kvn, 72 + kvn, 1.0f),
                       v = random_f32(kvn, 73 + kvn, 1.0f);
    const size_t esize = c.kv == MK_DTYPE_F32 ? 4 : 2;
    GuardedBuf dq(qn * 4), dk(kvn * esize), dv(kvn * esize), dout(qn * 4);
    ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok());
    CUDA_OK(dq.upload(q.data(), stream_));
    if (c.kv == MK_DTYPE_F32) {
        CUDA_OK(dk.upload(k.data(), stream_));
        CUDA_OK(dv.upload(v.data(), stream_));
    } else { // the caches in 16 bits; the reference reads them widened back
        const std::vector<uint16_t> kh = to_half_bits(k, c.kv), vh = to_half_bits(v, c.kv);
        CUDA_OK(dk.upload(kh.data(), stream_));
        CUDA_OK(dv.upload(vh.data(), stream_));
        k = from_half_bits(kh, c.kv);
        v = from_half_bits(vh, c.kv);
    }
    CUDA_OK(dout.poison(stream_));
    MK_OK_(mk_kernel_attention_prefill_tc(dout.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), c.kv, c.rows, c.past,
                                          c.n_heads, c.n_kv_heads, c.head_dim, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(qn), ref(qn);
    ASSERT_TRUE(dout.download(got.data(), stream_));
    cpu_attention_all_cores(ref.data(), q.data(), k.data(), v.data(), c.rows, c.past, c.n_heads, c.n_kv_heads, c.head_dim);
    const ::testing::AssertionResult r = all_close(got, ref, kAttnTcTol * max_abs(v), kAttnTcTol);
    EXPECT_TRUE(r);
    if (r && getenv("MK_TEST_VERBOSE")) printf("%s: %s\n", c.name().c_str(), r.message());
}

INSTANTIATE_TEST_SUITE_P(Ops, AttentionPrefillTc, ::testing::ValuesIn(cases_here(prefill_tc_cases())), case_name<AttnTcCase>);

TEST_F(OpTest, AttentionPrefillTcRefusesWhatItCannotRun) {
    GuardedBuf b(4096);
    float *f = b.ptr<float>();
    EXPECT_FALSE(mk_kernel_attention_prefill_tc_supports(72));
    EXPECT_FALSE(mk_kernel_attention_prefill_tc_supports(272));
    EXPECT_TRUE(mk_kernel_attention_prefill_tc_supports(64));
    EXPECT_TRUE(mk_kernel_attention_prefill_tc_supports(128));
    EXPECT_ERROR(mk_kernel_attention_prefill_tc(f, f, f, f, identity_pages(), MK_DTYPE_F32, 4, 0, 4, 4, 72, stream_), MK_ERR_SHAPE,
                 "mk_kernel_attention_prefill_tc: head_dim 72 must be a multiple of 16");
    EXPECT_ERROR(mk_kernel_attention_prefill_tc(f, f, f, f, identity_pages(), MK_DTYPE_F32, 4, 0, 6, 4, 64, stream_), MK_ERR_SHAPE,
                 "n_heads 6 must be a multiple of n_kv_heads 4");
    EXPECT_ERROR(mk_kernel_attention_prefill_tc(f, f, f, f, identity_pages(), MK_DTYPE_I32, 4, 0, 4, 4, 64, stream_), MK_ERR_DTYPE,
                 "mk_kernel_attention_prefill_tc: KV cache dtype 4");
    EXPECT_ERROR(mk_kernel_attention_prefill_tc(nullptr, f, f, f, identity_pages(), MK_DTYPE_F32, 4, 0, 4, 4, 64, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_prefill_tc: null pointer");
    EXPECT_EQ(mk_kernel_attention_prefill_tc(f, f, f, f, identity_pages(), MK_DTYPE_F32, 0, 0, 4, 4, 64, stream_), MK_OK);
}

// BF16 caches at 16-byte aligned addresses are copied 16 bytes at a time (cp.async on sm_80+);
// at an address 2 bytes off they take the element loads. The tiles hold the same bits, so the
// outputs are identical.
TEST_F(OpTest, AttentionPrefillTcBf16CacheCopyPathsAgree) {
    const size_t rows = 70, past = 21, nh = 4, nkv = 2, hd = 64, keys = past + rows;
    const size_t qn = rows * nh * hd, kvn = keys * nkv * hd;
    const std::vector<float> q = random_f32(qn, 81), k = random_f32(kvn, 82), v = random_f32(kvn, 83);
    std::vector<uint16_t> kh = to_half_bits(k, MK_DTYPE_BF16), vh = to_half_bits(v, MK_DTYPE_BF16);
    std::vector<uint16_t> kh_off(kvn + 8), vh_off(kvn + 8); // the same data one element in
    std::copy(kh.begin(), kh.end(), kh_off.begin() + 1);
    std::copy(vh.begin(), vh.end(), vh_off.begin() + 1);
    GuardedBuf dq(qn * 4), dk(kvn * 2), dv(kvn * 2), dk_off((kvn + 8) * 2), dv_off((kvn + 8) * 2), da(qn * 4), db(qn * 4);
    CUDA_OK(dq.upload(q.data(), stream_));
    CUDA_OK(dk.upload(kh.data(), stream_));
    CUDA_OK(dv.upload(vh.data(), stream_));
    CUDA_OK(dk_off.upload(kh_off.data(), stream_));
    CUDA_OK(dv_off.upload(vh_off.data(), stream_));
    CUDA_OK(da.poison(stream_));
    CUDA_OK(db.poison(stream_));
    MK_OK_(mk_kernel_attention_prefill_tc(da.ptr<float>(), dq.ptr<float>(), dk.ptr(), dv.ptr(), identity_pages(), MK_DTYPE_BF16, rows, past,
                                          nh, nkv, hd, stream_));
    MK_OK_(mk_kernel_attention_prefill_tc(db.ptr<float>(), dq.ptr<float>(), dk_off.ptr<uint16_t>() + 1,
                                          dv_off.ptr<uint16_t>() + 1, identity_pages(), MK_DTYPE_BF16, rows, past, nh, nkv, hd, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> a(qn), b(qn), ref(qn);
    ASSERT_TRUE(da.download(a.data(), stream_));
    ASSERT_TRUE(db.download(b.data(), stream_));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), qn * 4), 0);
    const std::vector<float> kw = from_half_bits(kh, MK_DTYPE_BF16), vw = from_half_bits(vh, MK_DTYPE_BF16);
    mk_cpu_attention(ref.data(), q.data(), kw.data(), vw.data(), rows, past, nh, nkv, hd);
    EXPECT_TRUE(all_close(a, ref, kAttnTcTol * max_abs(vw), kAttnTcTol));
}

// ============================================================ fused native GEMV ==
// Native weight sets in one launch (kernels/gemv_q_set.cu mk_kernel_gemv_q_multi / _swiglu): each
// matrix in its own format (a device block format, or BF16 for a matrix stored widened), mixed
// freely. Against the CPU (mk_gguf_dequantize then mk_cpu_matmul, then mk_cpu_swiglu) within
// the GEMV error bound, and bit for bit against the separate launches the backend replaces
// (mk_kernel_gemv_q, mk_kernel_gemv on BF16, mk_kernel_swiglu), for 1..8 rows.

struct NativeMat {
    GemvFormat fmt;                // a block format or BF16
    std::vector<uint8_t> bytes;    // as stored on the device
    std::vector<float> wf;         // as the reference sees it
    uint32_t type() const { return fmt == GemvFormat::BF16 ? (uint32_t)MK_GGML_TYPE_BF16 : gemv_ggml_type(fmt); }
};

NativeMat native_mat(GemvFormat f, size_t out, size_t in, uint64_t seed) {
    NativeMat m;
    m.fmt = f;
    const size_t n = out * in;
    if (f == GemvFormat::BF16) {
        std::vector<uint16_t> h = to_half_bits(random_f32(n, seed, 1.0f), MK_DTYPE_BF16);
        m.wf = from_half_bits(h, MK_DTYPE_BF16);
        m.bytes.resize(n * 2);
        std::memcpy(m.bytes.data(), h.data(), m.bytes.size());
    } else {
        m.bytes = random_blocks(f, n, seed);
        m.wf.resize(n);
        if (mk_gguf_dequantize(gemv_ggml_type(f), m.bytes.data(), m.bytes.size(), m.wf.data(), n) != MK_OK) m.wf.clear();
    }
    return m;
}

// Error bound of one GEMV output (see the Gemv grid above): per element of y [rows, out].
std::vector<double> gemv_tolerance(const std::vector<float> &x, const std::vector<float> &wf, size_t rows, size_t in,
                                   size_t out) {
    std::vector<double> tol(rows * out);
    for (size_t r = 0; r < rows; r++)
        for (size_t o = 0; o < out; o++) {
            double abs_sum = 0.0, x_sum = 0.0, w_max = 0.0;
            for (size_t k = 0; k < in; k++) {
                abs_sum += std::fabs((double)x[r * in + k] * wf[o * in + k]);
                x_sum += std::fabs(x[r * in + k]);
                w_max = std::max(w_max, (double)std::fabs(wf[o * in + k]));
            }
            // the kernel's tree and the CPU SGEMM's order: twice the one-sided bound
            tol[r * out + o] = 2.0 * (((double)in / 32.0 + 8.0) * 0x1p-24 * abs_sum + 4.0 * 0x1p-24 * x_sum * w_max);
        }
    return tol;
}

::testing::AssertionResult within(const std::vector<float> &got, const std::vector<float> &ref,
                                  const std::vector<double> &tol) {
    for (size_t i = 0; i < got.size(); i++)
        if (!(std::fabs((double)got[i] - ref[i]) <= tol[i]))
            return ::testing::AssertionFailure() << "[" << i << "] got " << got[i] << " ref " << ref[i] << " tol " << tol[i];
    return ::testing::AssertionSuccess();
}

using GemvQSet = OpTestP<QSetCase>;

TEST_P(GemvQSet, MatchesCpuAndSeparateLaunches) {
    const QSetCase c = GetParam();
    const size_t in = c.in_dim(), outs[3] = {13, 5, 7}, sw_out = 5; // SwiGLU: gate w[1], up w[2]'s first 5 rows
    std::vector<NativeMat> m;
    std::vector<std::unique_ptr<GuardedBuf>> dw;
    for (int i = 0; i < 3; i++) {
        m.push_back(native_mat(c.f[i], outs[i], in, 301 + 17 * i + in));
        ASSERT_FALSE(m[i].wf.empty());
        dw.emplace_back(new GuardedBuf(m[i].bytes.size()));
        ASSERT_TRUE(dw[i]->ok());
        CUDA_OK(dw[i]->upload(m[i].bytes.data(), stream_));
    }
    const void *ws[3] = {dw[0]->ptr(), dw[1]->ptr(), dw[2]->ptr()};
    const uint32_t types[3] = {m[0].type(), m[1].type(), m[2].type()};
    const size_t off = c.misaligned ? 4 : 0;
    for (size_t rows = 1; rows <= MK_GEMV_MAX_ROWS; rows++) {
        SCOPED_TRACE("rows " + std::to_string(rows));
        const std::vector<float> x = random_f32(rows * in, 310 + rows, 2.0f);
        std::vector<uint8_t> xbytes(off + x.size() * 4, 0x77);
        std::memcpy(xbytes.data() + off, x.data(), x.size() * 4);
        GuardedBuf dx(xbytes.size());
        ASSERT_TRUE(dx.ok());
        CUDA_OK(dx.upload(xbytes.data(), stream_));
        const float *xp = reinterpret_cast<const float *>(dx.ptr<uint8_t>() + off);
        std::vector<std::unique_ptr<GuardedBuf>> dy, dsep;
        for (int i = 0; i < 3; i++) {
            dy.emplace_back(new GuardedBuf(rows * outs[i] * 4));
            dsep.emplace_back(new GuardedBuf(rows * outs[i] * 4));
            CUDA_OK(dy[i]->poison(stream_));
            CUDA_OK(dsep[i]->poison(stream_));
        }
        float *ys[3] = {dy[0]->ptr<float>(), dy[1]->ptr<float>(), dy[2]->ptr<float>()};
        MK_OK_(mk_kernel_gemv_q_multi(3, ys, ws, types, outs, xp, rows, in, stream_));
        for (int i = 0; i < 3; i++) {
            if (c.f[i] == GemvFormat::BF16)
                MK_OK_(mk_kernel_gemv(dsep[i]->ptr<float>(), xp, ws[i], MK_DTYPE_BF16, rows, in, outs[i], stream_));
            else
                MK_OK_(mk_kernel_gemv_q(dsep[i]->ptr<float>(), xp, ws[i], types[i], rows, in, outs[i], stream_));
        }
        std::vector<std::vector<float>> ref(3);
        for (int i = 0; i < 3; i++) {
            std::vector<float> a(rows * outs[i]), b(rows * outs[i]);
            ASSERT_TRUE(dy[i]->download(a.data(), stream_));
            ASSERT_TRUE(dsep[i]->download(b.data(), stream_));
            EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "matrix " << i << ": fused vs separate";
            ref[i].resize(rows * outs[i]);
            mk_cpu_matmul(ref[i].data(), x.data(), m[i].wf.data(), rows, in, outs[i]);
            EXPECT_TRUE(within(a, ref[i], gemv_tolerance(x, m[i].wf, rows, in, outs[i]))) << "matrix " << i;
        }
        // gate/up + SwiGLU in one launch
        GuardedBuf dout(rows * sw_out * 4), dg(rows * sw_out * 4), du(rows * sw_out * 4), dref(rows * sw_out * 4);
        CUDA_OK(dout.poison(stream_));
        CUDA_OK(dg.poison(stream_));
        CUDA_OK(du.poison(stream_));
        CUDA_OK(dref.poison(stream_));
        MK_OK_(mk_kernel_gemv_q_swiglu(dout.ptr<float>(), xp, ws[1], types[1], ws[2], types[2], rows, in, sw_out, stream_));
        float *sep[2] = {dg.ptr<float>(), du.ptr<float>()};
        for (int i = 1; i < 3; i++) {
            if (c.f[i] == GemvFormat::BF16)
                MK_OK_(mk_kernel_gemv(sep[i - 1], xp, ws[i], MK_DTYPE_BF16, rows, in, sw_out, stream_));
            else
                MK_OK_(mk_kernel_gemv_q(sep[i - 1], xp, ws[i], types[i], rows, in, sw_out, stream_));
        }
        MK_OK_(mk_kernel_swiglu(dref.ptr<float>(), dg.ptr<float>(), du.ptr<float>(), MK_DTYPE_F32, rows * sw_out, stream_));
        std::vector<float> a(rows * sw_out), b(rows * sw_out);
        ASSERT_TRUE(dout.download(a.data(), stream_));
        ASSERT_TRUE(dref.download(b.data(), stream_));
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "swiglu: fused vs separate";
        // CPU: the gate and up products (w[2]'s first sw_out rows), then SwiGLU
        std::vector<float> g(rows * sw_out), u(rows * sw_out), want(rows * sw_out);
        mk_cpu_matmul(g.data(), x.data(), m[1].wf.data(), rows, in, sw_out);
        mk_cpu_matmul(u.data(), x.data(), m[2].wf.data(), rows, in, sw_out);
        mk_cpu_swiglu(want.data(), g.data(), u.data(), want.size());
        const std::vector<double> tg = gemv_tolerance(x, m[1].wf, rows, in, sw_out);
        const std::vector<float> w2(m[2].wf.begin(), m[2].wf.begin() + (std::ptrdiff_t)(sw_out * in));
        const std::vector<double> tu = gemv_tolerance(x, w2, rows, in, sw_out);
        std::vector<double> tol(want.size());
        for (size_t i = 0; i < tol.size(); i++) // silu' <= 1.1; silu(g) <= |g|
            tol[i] = 1.1 * std::fabs(u[i]) * tg[i] + (std::fabs(g[i]) + tg[i]) * tu[i] + 1e-6 * std::fabs(want[i]);
        EXPECT_TRUE(within(a, want, tol)) << "swiglu vs cpu";
    }
}

INSTANTIATE_TEST_SUITE_P(Ops, GemvQSet, ::testing::ValuesIn(cases_here(qset_cases())), case_name<QSetCase>);

TEST_F(OpTest, GemvQSetErrors) {
    GuardedBuf b(8192);
    float *f = b.ptr<float>();
    float *ys[3] = {f, f, f};
    const void *ws[3] = {f, f, f};
    const size_t outs[3] = {1, 1, 1};
    uint32_t types[3] = {MK_GGML_TYPE_Q8_0, MK_GGML_TYPE_Q4_K, MK_GGML_TYPE_BF16};
    EXPECT_ERROR(mk_kernel_gemv_q_multi(4, ys, ws, types, outs, f, 1, 256, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_gemv_q_multi: 4 matrices (1..3)");
    EXPECT_ERROR(mk_kernel_gemv_q_multi(3, ys, ws, types, outs, f, 9, 256, stream_), MK_ERR_SHAPE,
                 "mk_kernel_gemv_q_multi: 9 rows exceed the decode limit 8");
    EXPECT_ERROR(mk_kernel_gemv_q_multi(3, ys, ws, types, outs, f, 1, 96, stream_), MK_ERR_SHAPE,
                 "input width 96 is not a multiple of matrix 1's block size 256");
    types[2] = MK_GGML_TYPE_IQ2_XXS;
    EXPECT_ERROR(mk_kernel_gemv_q_multi(3, ys, ws, types, outs, f, 1, 256, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_gemv_q_multi: matrix 2 has ggml type 16");
    const void *odd[3] = {f, f, b.ptr<uint8_t>() + 2};
    types[2] = MK_GGML_TYPE_Q4_1;
    EXPECT_ERROR(mk_kernel_gemv_q_multi(3, ys, odd, types, outs, f, 1, 256, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_gemv_q_multi: matrix 2 not 4-byte aligned");
    EXPECT_ERROR(mk_kernel_gemv_q_swiglu(f, f, nullptr, MK_GGML_TYPE_Q8_0, f, MK_GGML_TYPE_Q8_0, 1, 32, 4, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_q_swiglu: null pointer");
    EXPECT_ERROR(mk_kernel_gemv_q_swiglu(f, f, f, MK_GGML_TYPE_Q8_0, f, MK_GGML_TYPE_F16, 1, 32, 4, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_gemv_q_swiglu: matrix 1 has ggml type 1");
    EXPECT_TRUE(mk_kernel_gemv_q_set_supports(MK_GGML_TYPE_BF16) && mk_kernel_gemv_q_set_supports(MK_GGML_TYPE_Q4_K) &&
                mk_kernel_gemv_q_set_supports(MK_GGML_TYPE_Q6_K) && !mk_kernel_gemv_q_set_supports(MK_GGML_TYPE_F16) &&
                !mk_kernel_gemv_q_set_supports(MK_GGML_TYPE_IQ2_XXS));
    EXPECT_EQ(mk_kernel_gemv_q_swiglu(f, f, f, MK_GGML_TYPE_Q8_0, f, MK_GGML_TYPE_Q8_0, 0, 32, 4, stream_), MK_OK);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

// ======================================================= rmsnorm low-precision copy ==
// The norm that also writes its output in the GEMM dtype: the F32 output is the plain norm's,
// bit for bit, and the copy is exactly what mk_kernel_convert makes of that output (the
// conversion launch the cuda backend no longer issues before a prefill GEMM).
TEST_F(OpTest, RmsNormLowpCopyEqualsConvertOfTheOutput) {
    struct C {
        size_t rows, cols;
    };
    for (const C c : {C{9, 33}, C{13, 576}, C{10, 1}, C{3, 4097}})
        for (const bool add : {false, true})
            for (const mk_dtype d : {MK_DTYPE_BF16, MK_DTYPE_F16}) {
                SCOPED_TRACE(std::string(add ? "add_" : "") + dtype_tag(d) + " r" + std::to_string(c.rows) + " c" +
                             std::to_string(c.cols));
                const size_t n = c.rows * c.cols;
                // values around the F16 range's ends too: subnormal and overflowing halves
                std::vector<float> x = random_f32(n, 400 + n, 3.0f), w = random_f32(c.cols, 401 + c.cols, 1.5f);
                for (size_t i = 0; i < c.cols; i += 7) w[i] *= (i % 2) ? 3e4f : 3e-6f;
                const std::vector<float> delta = random_f32(n, 402 + n, 0.5f);
                GuardedBuf dx(n * 4), dx2(n * 4), dw(c.cols * 4), dd(n * 4), dout(n * 4), dplain(n * 4), dlow(n * 2),
                    dconv(n * 2);
                ASSERT_TRUE(dx.ok() && dx2.ok() && dw.ok() && dd.ok() && dout.ok() && dplain.ok() && dlow.ok() && dconv.ok());
                CUDA_OK(dx.upload(x.data(), stream_));
                CUDA_OK(dx2.upload(x.data(), stream_));
                CUDA_OK(dw.upload(w.data(), stream_));
                CUDA_OK(dd.upload(delta.data(), stream_));
                CUDA_OK(dout.poison(stream_));
                CUDA_OK(dplain.poison(stream_));
                CUDA_OK(dlow.poison(stream_));
                CUDA_OK(dconv.poison(stream_));
                if (add) {
                    MK_OK_(mk_kernel_add_rmsnorm_lowp(dx.ptr<float>(), dout.ptr<float>(), dlow.ptr(), d, dd.ptr<float>(),
                                                      dw.ptr<float>(), c.rows, c.cols, 1e-5f, stream_));
                    MK_OK_(mk_kernel_add_rmsnorm(dx2.ptr<float>(), dplain.ptr<float>(), dd.ptr<float>(), dw.ptr<float>(),
                                                 c.rows, c.cols, 1e-5f, stream_));
                } else {
                    MK_OK_(mk_kernel_rmsnorm_lowp(dout.ptr<float>(), dlow.ptr(), d, dx.ptr<float>(), dw.ptr<float>(),
                                                  c.rows, c.cols, 1e-5f, stream_));
                    MK_OK_(mk_kernel_rmsnorm(dplain.ptr<float>(), dx.ptr<float>(), dw.ptr<float>(), c.rows, c.cols, 1e-5f,
                                             stream_));
                }
                MK_OK_(mk_kernel_convert(dconv.ptr(), d, dout.ptr<float>(), MK_DTYPE_F32, n, stream_));
                std::vector<float> out(n), plain(n), res(n), res2(n);
                std::vector<uint16_t> low(n), conv(n);
                ASSERT_TRUE(dout.download(out.data(), stream_));
                ASSERT_TRUE(dplain.download(plain.data(), stream_));
                ASSERT_TRUE(dlow.download(low.data(), stream_));
                ASSERT_TRUE(dconv.download(conv.data(), stream_));
                ASSERT_TRUE(dx.download(res.data(), stream_));
                ASSERT_TRUE(dx2.download(res2.data(), stream_));
                EXPECT_EQ(std::memcmp(out.data(), plain.data(), n * 4), 0) << "F32 output";
                EXPECT_TRUE(all_equal(low, conv)) << "low-precision copy vs convert";
                EXPECT_EQ(std::memcmp(res.data(), add ? res2.data() : x.data(), n * 4), 0) << "residual";
                // the output within the CPU norm's tolerance, and the copy its rounding (mk_f32_to_bf16 / _f16)
                std::vector<float> ref(n);
                if (add) {
                    std::vector<float> r = x;
                    mk_cpu_add_rmsnorm(r.data(), ref.data(), delta.data(), w.data(), c.rows, c.cols, 1e-5f);
                } else {
                    mk_cpu_rmsnorm(ref.data(), x.data(), w.data(), c.rows, c.cols, 1e-5f);
                }
                EXPECT_TRUE(all_close(out, ref, 1e-6 * max_abs(ref), 1e-5));
                EXPECT_TRUE(all_equal(low, to_half_bits(out, d))) << "the host's rounding of the output";
            }
    GuardedBuf b(4096);
    float *f = b.ptr<float>();
    EXPECT_ERROR(mk_kernel_rmsnorm_lowp(f, f, MK_DTYPE_F32, f, f, 2, 4, 1e-5f, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_rmsnorm: low-precision dtype 1 is not F16/BF16");
    EXPECT_ERROR(mk_kernel_add_rmsnorm_lowp(f, f, f, MK_DTYPE_I32, f, f, 2, 4, 1e-5f, stream_), MK_ERR_INVALID_ARGUMENT,
                 "mk_kernel_add_rmsnorm: low-precision dtype 4 is not F16/BF16");
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

} // namespace
