// Op grid for the CUDA kernels (kernels/*.cu), in the spirit of llama.cpp's test-backend-ops:
// every kernel against the CPU backend's op (host/cpu_ops.h) on seeded random non-zero inputs
// over odd and edge shapes. Outputs are poisoned (all bits set: NaN / -1) before the run and
// guarded by sentinel regions before and after, checked afterwards.
//
// The same source builds two binaries: test_ops_sim (kernels compiled by the host compiler,
// run by tests/cudasim) and test_ops_device (nvcc kernels, real CUDA runtime), whose cases
// skip with "no CUDA device" when there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_ops.h"
#include "kernels.h"
#include "mk_test_util.h"

namespace {

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
    // Sentinels + payload from host memory (nullptr: poison the payload).
    cudaError_t upload(const void *src) {
        std::vector<uint8_t> h(bytes_ + 2 * kGuard);
        for (size_t i = 0; i < kGuard; i++) {
            h[i] = pre(i);
            h[kGuard + bytes_ + i] = post(i);
        }
        if (src) std::memcpy(h.data() + kGuard, src, bytes_);
        else std::memset(h.data() + kGuard, 0xFF, bytes_);
        return cudaMemcpy(base_, h.data(), h.size(), cudaMemcpyHostToDevice);
    }
    cudaError_t poison() { return upload(nullptr); }
    // Payload to host; checks the sentinels.
    ::testing::AssertionResult download(void *dst) const {
        std::vector<uint8_t> h(bytes_ + 2 * kGuard);
        const cudaError_t e = cudaMemcpy(h.data(), base_, h.size(), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) return ::testing::AssertionFailure() << "cudaMemcpy D2H: " << cudaGetErrorString(e);
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

const char *dtype_tag(mk_dtype d) {
    switch (d) {
        case MK_DTYPE_F32: return "f32";
        case MK_DTYPE_F16: return "f16";
        case MK_DTYPE_BF16: return "bf16";
        default: return "other";
    }
}

// ============================================================================ checks ==

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
        if (stream_) (void)cudaStreamDestroy(stream_);
    }
    cudaStream_t stream_ = nullptr;
};

template <class P>
class OpTestP : public OpTest, public ::testing::WithParamInterface<P> {};

template <class P>
std::string case_name(const ::testing::TestParamInfo<P> &info) {
    return info.param.name();
}

// ============================================================================ rmsnorm ==

struct NormCase {
    size_t rows, cols;
    bool add;
    bool tiny = false; // inputs ~1e-3: mean square ~3e-7, below eps, so eps decides the scale
    std::string name() const {
        return std::string(add ? "add_" : "") + "r" + std::to_string(rows) + "_c" + std::to_string(cols) +
               (tiny ? "_tiny" : "");
    }
};
void PrintTo(const NormCase &c, std::ostream *os) { *os << c.name(); }

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
    CUDA_OK(dx.upload(x.data()));
    CUDA_OK(dw.upload(w.data()));
    CUDA_OK(ddelta.upload(delta.data()));
    CUDA_OK(dout.poison());
    std::vector<float> ref(n), got(n);
    if (c.add) {
        MK_OK_(mk_kernel_add_rmsnorm(dx.ptr<float>(), dout.ptr<float>(), ddelta.ptr<float>(), dw.ptr<float>(), c.rows,
                                     c.cols, eps, stream_));
        mk_cpu_add_rmsnorm(x.data(), ref.data(), delta.data(), w.data(), c.rows, c.cols, eps);
        std::vector<float> res(n);
        CUDA_OK(cudaStreamSynchronize(stream_));
        ASSERT_TRUE(dx.download(res.data()));
        EXPECT_TRUE(all_equal(res, x)) << "residual after the add";
    } else {
        MK_OK_(mk_kernel_rmsnorm(dout.ptr<float>(), dx.ptr<float>(), dw.ptr<float>(), c.rows, c.cols, eps, stream_));
        mk_cpu_rmsnorm(ref.data(), x.data(), w.data(), c.rows, c.cols, eps);
    }
    CUDA_OK(cudaStreamSynchronize(stream_));
    ASSERT_TRUE(dout.download(got.data()));
    EXPECT_TRUE(all_close(got, ref, 1e-6 * max_abs(ref), 1e-5));
}

std::vector<NormCase> norm_cases() {
    std::vector<NormCase> v;
    for (size_t cols : {1, 31, 33, 100, 576, 4097})
        for (bool add : {false, true}) v.push_back({cols > 1000 ? size_t(2) : size_t(5), cols, add});
    v.push_back({4, 8192, false});
    v.push_back({4, 8192, true});
    v.push_back({64, 32, false});
    v.push_back({16, 8192, true});
    for (size_t cols : {1, 33, 576, 4097})
        for (bool add : {false, true}) v.push_back({cols > 1000 ? size_t(2) : size_t(5), cols, add, true});
    return v;
}
INSTANTIATE_TEST_SUITE_P(Ops, RmsNorm, ::testing::ValuesIn(norm_cases()), case_name<NormCase>);

// ============================================================================== embed ==

struct EmbedCase {
    mk_dtype dtype;
    size_t n, hidden, vocab;
    std::string name() const {
        return std::string(dtype_tag(dtype)) + "_n" + std::to_string(n) + "_h" + std::to_string(hidden) + "_v" +
               std::to_string(vocab);
    }
};
void PrintTo(const EmbedCase &c, std::ostream *os) { *os << c.name(); }

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
    CUDA_OK(dt.upload(host_table));
    CUDA_OK(dids.upload(ids.data()));
    CUDA_OK(dout.poison());
    MK_OK_(mk_kernel_embed(dout.ptr<float>(), dt.ptr(), c.dtype, dids.ptr<int32_t>(), c.n, c.hidden, c.vocab, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(c.n * c.hidden), ref(c.n * c.hidden, 0.0f);
    for (size_t i = 0; i < c.n; i++)
        if (ids[i] >= 0 && (size_t)ids[i] < c.vocab) mk_cpu_embed(ref.data() + i * c.hidden, table.data(), &ids[i], 1, c.hidden);
    ASSERT_TRUE(dout.download(got.data()));
    EXPECT_TRUE(all_close(got, ref, 0.0, 0.0)); // a gather is exact
}

std::vector<EmbedCase> embed_cases() {
    std::vector<EmbedCase> v;
    for (mk_dtype d : {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16}) {
        v.push_back({d, 1, 1, 5});
        v.push_back({d, 7, 33, 100});
        v.push_back({d, 9, 576, 300});
        v.push_back({d, 3, 4097, 20});
    }
    return v;
}
INSTANTIATE_TEST_SUITE_P(Ops, Embed, ::testing::ValuesIn(embed_cases()), case_name<EmbedCase>);

// =============================================================================== rope ==

struct RopeCase {
    mk_rope_layout layout;
    size_t rows, heads, head_dim;
    float theta;
    int32_t pos0; // positions pos0, pos0 + 1, ... (plus a few planted far ones)
    std::string name() const {
        return std::string(layout == MK_ROPE_ROTATE_HALF ? "half" : "adjacent") + "_r" + std::to_string(rows) + "_h" +
               std::to_string(heads) + "_d" + std::to_string(head_dim) + "_t" + std::to_string((long)theta) + "_p" +
               std::to_string(pos0);
    }
};
void PrintTo(const RopeCase &c, std::ostream *os) { *os << c.name(); }

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
    CUDA_OK(dx.upload(x.data()));
    CUDA_OK(dpos.upload(pos.data()));
    MK_OK_(mk_kernel_rope(dx.ptr<float>(), dpos.ptr<int32_t>(), c.rows, c.heads, c.head_dim, c.theta, c.layout, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(n);
    ASSERT_TRUE(dx.download(got.data()));
    mk_cpu_rope(x.data(), pos.data(), c.rows, c.heads, c.head_dim, c.theta, c.layout);
    EXPECT_TRUE(all_close(got, x, 1e-6 * max_abs(x), 1e-5));
}

std::vector<RopeCase> rope_cases() {
    std::vector<RopeCase> v;
    for (mk_rope_layout l : {MK_ROPE_ROTATE_HALF, MK_ROPE_ADJACENT_PAIRS}) {
        v.push_back({l, 5, 3, 6, 10000.0f, 0});
        v.push_back({l, 4, 2, 8, 10000.0f, 7});
        v.push_back({l, 6, 8, 64, 10000.0f, 100000});
        v.push_back({l, 5, 4, 128, 500000.0f, 99990});
        v.push_back({l, 3, 2, 256, 10000.0f, 12345});
    }
    v.push_back({MK_ROPE_ROTATE_HALF, 33, 32, 128, 500000.0f, 0});
    return v;
}
INSTANTIATE_TEST_SUITE_P(Ops, Rope, ::testing::ValuesIn(rope_cases()), case_name<RopeCase>);

// ========================================================================== attention ==

struct AttnCase {
    size_t rows, past, n_heads, n_kv_heads, head_dim;
    std::string name() const {
        return "r" + std::to_string(rows) + "_past" + std::to_string(past) + "_h" + std::to_string(n_heads) + "_kv" +
               std::to_string(n_kv_heads) + "_d" + std::to_string(head_dim);
    }
};
void PrintTo(const AttnCase &c, std::ostream *os) { *os << c.name(); }

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
    CUDA_OK(dq.upload(q.data()));
    CUDA_OK(dk.upload(k.data()));
    CUDA_OK(dv.upload(v.data()));
    CUDA_OK(dout.poison());
    MK_OK_(mk_kernel_attention_prefill(dout.ptr<float>(), dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), c.rows,
                                       c.past, c.n_heads, c.n_kv_heads, c.head_dim, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(qn), ref(qn);
    ASSERT_TRUE(dout.download(got.data()));
    mk_cpu_attention(ref.data(), q.data(), k.data(), v.data(), c.rows, c.past, c.n_heads, c.n_kv_heads, c.head_dim);
    EXPECT_TRUE(all_close(got, ref, kAttnAtol * max_abs(v), 1e-5));
}

std::vector<AttnCase> prefill_cases() {
    return {
        {1, 0, 1, 1, 8},     {5, 0, 4, 2, 6},     {3, 40, 6, 3, 6},     {33, 0, 8, 8, 64},    {17, 100, 16, 2, 128},
        {70, 17, 6, 2, 128}, {300, 0, 8, 1, 64},  {40, 5, 2, 1, 256},   {20, 3, 3, 1, 96},    {16, 16, 4, 4, 128},
        {2, 250, 3, 3, 32},  {64, 2000, 8, 1, 128}, {300, 0, 8, 1, 128}, {129, 7, 12, 4, 64},
    };
}
INSTANTIATE_TEST_SUITE_P(Ops, AttentionPrefill, ::testing::ValuesIn(prefill_cases()), case_name<AttnCase>);

using AttentionDecode = OpTestP<AttnCase>;

TEST_P(AttentionDecode, MatchesCpu) {
    const AttnCase c = GetParam(); // rows == 1
    const size_t keys = c.past + 1;
    const size_t qn = c.n_heads * c.head_dim, kvn = keys * c.n_kv_heads * c.head_dim;
    std::vector<float> q = random_f32(qn, 51 + qn, 1.0f), k = random_f32(kvn, 52 + kvn, 1.0f),
                       v = random_f32(kvn, 53 + kvn, 1.0f);
    const size_t ws_bytes = mk_kernel_attention_decode_workspace_bytes(keys, c.n_heads, c.head_dim);
    GuardedBuf dq(qn * 4), dk(kvn * 4), dv(kvn * 4), dout(qn * 4), dws(ws_bytes);
    ASSERT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok() && dws.ok());
    CUDA_OK(dq.upload(q.data()));
    CUDA_OK(dk.upload(k.data()));
    CUDA_OK(dv.upload(v.data()));
    CUDA_OK(dout.poison());
    CUDA_OK(dws.poison());
    // too small a workspace is refused
    EXPECT_ERROR(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), c.past,
                                            c.n_heads, c.n_kv_heads, c.head_dim, dws.ptr(), ws_bytes - 4, stream_),
                 MK_ERR_INVALID_ARGUMENT, "mk_kernel_attention_decode: workspace");
    MK_OK_(mk_kernel_attention_decode(dout.ptr<float>(), dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), c.past,
                                      c.n_heads, c.n_kv_heads, c.head_dim, dws.ptr(), ws_bytes, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(qn), ref(qn), ws(ws_bytes / 4);
    ASSERT_TRUE(dout.download(got.data()));
    ASSERT_TRUE(dws.download(ws.data()));
    mk_cpu_attention(ref.data(), q.data(), k.data(), v.data(), 1, c.past, c.n_heads, c.n_kv_heads, c.head_dim);
    EXPECT_TRUE(all_close(got, ref, kAttnAtol * max_abs(v), 1e-5));
}

std::vector<AttnCase> decode_cases() {
    return {
        {1, 0, 1, 1, 8},     {1, 5, 6, 2, 6},      {1, 255, 4, 4, 64},   {1, 256, 4, 2, 64},
        {1, 700, 6, 2, 128}, {1, 1999, 8, 1, 128}, {1, 300, 3, 1, 256},  {1, 511, 32, 8, 64}, {1, 4095, 8, 2, 128},
    };
}
INSTANTIATE_TEST_SUITE_P(Ops, AttentionDecode, ::testing::ValuesIn(decode_cases()), case_name<AttnCase>);

// Decode of the last row == prefill of the same row (two kernels, one semantics).
TEST_F(OpTest, DecodeAgreesWithPrefill) {
    const size_t past = 77, n_heads = 8, n_kv = 2, hd = 64, keys = past + 1;
    const size_t qn = n_heads * hd, kvn = keys * n_kv * hd;
    std::vector<float> q = random_f32(qn, 61), k = random_f32(kvn, 62), v = random_f32(kvn, 63);
    const size_t ws_bytes = mk_kernel_attention_decode_workspace_bytes(keys, n_heads, hd);
    GuardedBuf dq(qn * 4), dk(kvn * 4), dv(kvn * 4), da(qn * 4), db(qn * 4), dws(ws_bytes);
    CUDA_OK(dq.upload(q.data()));
    CUDA_OK(dk.upload(k.data()));
    CUDA_OK(dv.upload(v.data()));
    CUDA_OK(da.poison());
    CUDA_OK(db.poison());
    MK_OK_(mk_kernel_attention_decode(da.ptr<float>(), dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), past, n_heads,
                                      n_kv, hd, dws.ptr(), ws_bytes, stream_));
    MK_OK_(mk_kernel_attention_prefill(db.ptr<float>(), dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), 1, past,
                                       n_heads, n_kv, hd, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> a(qn), b(qn);
    ASSERT_TRUE(da.download(a.data()));
    ASSERT_TRUE(db.download(b.data()));
    EXPECT_TRUE(all_close(a, b, kAttnAtol * max_abs(v), 1e-5));
}

// ========================================================================== kv append ==

TEST_F(OpTest, KvAppend) {
    const size_t ctx = 40, kv_dim = 3 * 6, past = 13, rows = 9;
    std::vector<float> kc = random_f32(ctx * kv_dim, 71), vc = random_f32(ctx * kv_dim, 72);
    std::vector<float> k = random_f32(rows * kv_dim, 73), v = random_f32(rows * kv_dim, 74);
    GuardedBuf dkc(ctx * kv_dim * 4), dvc(ctx * kv_dim * 4), dk(rows * kv_dim * 4), dv(rows * kv_dim * 4);
    CUDA_OK(dkc.upload(kc.data()));
    CUDA_OK(dvc.upload(vc.data()));
    CUDA_OK(dk.upload(k.data()));
    CUDA_OK(dv.upload(v.data()));
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
    ASSERT_TRUE(dkc.download(gk.data()));
    ASSERT_TRUE(dvc.download(gv.data()));
    EXPECT_TRUE(all_equal(gk, kc));
    EXPECT_TRUE(all_equal(gv, vc));
}

// ============================================================================= swiglu ==

struct SwigluCase {
    mk_dtype dtype;
    size_t n;
    std::string name() const { return std::string(dtype_tag(dtype)) + "_n" + std::to_string(n); }
};
void PrintTo(const SwigluCase &c, std::ostream *os) { *os << c.name(); }

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
    CUDA_OK(dg.upload(hg));
    CUDA_OK(du.upload(hu));
    CUDA_OK(dout.poison());
    MK_OK_(mk_kernel_swiglu(dout.ptr<float>(), dg.ptr(), du.ptr(), c.dtype, c.n, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<float> got(c.n), ref(c.n);
    ASSERT_TRUE(dout.download(got.data()));
    mk_cpu_swiglu(ref.data(), g.data(), u.data(), c.n);
    EXPECT_TRUE(all_close(got, ref, 1e-7 * max_abs(ref), 1e-5));
}

std::vector<SwigluCase> swiglu_cases() {
    std::vector<SwigluCase> v;
    for (mk_dtype d : {MK_DTYPE_F32, MK_DTYPE_F16, MK_DTYPE_BF16})
        for (size_t n : {1, 31, 1000, 65537}) v.push_back({d, n});
    return v;
}
INSTANTIATE_TEST_SUITE_P(Ops, Swiglu, ::testing::ValuesIn(swiglu_cases()), case_name<SwigluCase>);

// ============================================================================= argmax ==

enum class ArgPattern { Random, Ties, Nans, AllNan, NegInf, Misaligned, ThreadTies, ThreadTiesMisaligned };

struct ArgmaxCase {
    size_t rows, n;
    ArgPattern pattern;
    std::string name() const {
        static const char *tags[] = {"random", "ties", "nans", "allnan", "neginf", "misaligned", "threadties",
                                     "threadties_misaligned"};
        return std::string(tags[(int)pattern]) + "_r" + std::to_string(rows) + "_n" + std::to_string(n);
    }
};
void PrintTo(const ArgmaxCase &c, std::ostream *os) { *os << c.name(); }

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
    CUDA_OK(dx.upload(hx.data()));
    CUDA_OK(dout.poison());
    MK_OK_(mk_kernel_argmax(dout.ptr<int32_t>(), dx.ptr<float>() + shift, c.rows, c.n, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<int32_t> got(c.rows), ref(c.rows);
    ASSERT_TRUE(dout.download(got.data()));
    mk_cpu_argmax(ref.data(), x.data(), c.rows, c.n);
    EXPECT_TRUE(all_equal(got, ref));
}

std::vector<ArgmaxCase> argmax_cases() {
    std::vector<ArgmaxCase> v;
    for (size_t n : {1, 31, 1000, 4097, 49152}) {
        v.push_back({3, n, ArgPattern::Random});
        v.push_back({3, n, ArgPattern::Ties});
        v.push_back({2, n, ArgPattern::Nans});
    }
    v.push_back({2, 100, ArgPattern::AllNan});
    v.push_back({2, 37, ArgPattern::NegInf});
    v.push_back({2, 4096, ArgPattern::Misaligned});
    v.push_back({1, 262144, ArgPattern::Ties});
    v.push_back({1, 262144, ArgPattern::Nans});
    v.push_back({1, 256000, ArgPattern::Random});
    v.push_back({1, 151937, ArgPattern::Ties});
    for (size_t n : {100, 1000, 4097, 49152}) v.push_back({3, n, ArgPattern::ThreadTies});
    v.push_back({3, 1000, ArgPattern::ThreadTiesMisaligned});
    v.push_back({2, 8192, ArgPattern::ThreadTiesMisaligned});
    return v;
}
INSTANTIATE_TEST_SUITE_P(Ops, Argmax, ::testing::ValuesIn(argmax_cases()), case_name<ArgmaxCase>);

// ============================================================================ convert ==

struct ConvertCase {
    mk_dtype src, dst;
    size_t n;
    std::string name() const {
        return std::string(dtype_tag(src)) + "_to_" + dtype_tag(dst) + "_n" + std::to_string(n);
    }
};
void PrintTo(const ConvertCase &c, std::ostream *os) { *os << c.name(); }

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
    CUDA_OK(dsrc.upload(src.data()));
    CUDA_OK(ddst.poison());
    MK_OK_(mk_kernel_convert(ddst.ptr(), c.dst, dsrc.ptr(), c.src, c.n, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    ASSERT_TRUE(ddst.download(got.data()));
    EXPECT_TRUE(all_equal(got, ref));
}

std::vector<ConvertCase> convert_cases() {
    std::vector<ConvertCase> v;
    const mk_dtype pairs[][2] = {{MK_DTYPE_F32, MK_DTYPE_F16},  {MK_DTYPE_F32, MK_DTYPE_BF16}, {MK_DTYPE_F16, MK_DTYPE_F32},
                                 {MK_DTYPE_BF16, MK_DTYPE_F32}, {MK_DTYPE_F16, MK_DTYPE_BF16}, {MK_DTYPE_BF16, MK_DTYPE_F16},
                                 {MK_DTYPE_F32, MK_DTYPE_F32}};
    for (auto &p : pairs)
        for (size_t n : {1, 1000, 70001}) v.push_back({p[0], p[1], n});
    return v;
}
INSTANTIATE_TEST_SUITE_P(Ops, Convert, ::testing::ValuesIn(convert_cases()), case_name<ConvertCase>);

// ==================================================================== add, last row ==

TEST_F(OpTest, AddAndLastRow) {
    for (size_t n : {1, 33, 100003}) {
        std::vector<float> y = random_f32(n, 111 + n), x = random_f32(n, 112 + n);
        GuardedBuf dy(n * 4), dx(n * 4);
        CUDA_OK(dy.upload(y.data()));
        CUDA_OK(dx.upload(x.data()));
        MK_OK_(mk_kernel_add(dy.ptr<float>(), dx.ptr<float>(), n, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
        std::vector<float> got(n);
        ASSERT_TRUE(dy.download(got.data()));
        mk_cpu_add(y.data(), x.data(), n);
        EXPECT_TRUE(all_equal(got, y)) << "add n=" << n;
    }
    for (size_t rows : {1, 7}) {
        const size_t cols = 4097;
        std::vector<float> x = random_f32(rows * cols, 113 + rows);
        GuardedBuf dx(rows * cols * 4), dout(cols * 4);
        CUDA_OK(dx.upload(x.data()));
        CUDA_OK(dout.poison());
        MK_OK_(mk_kernel_last_row(dout.ptr<float>(), dx.ptr<float>(), rows, cols, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
        std::vector<float> got(cols), ref(x.end() - (ptrdiff_t)cols, x.end());
        ASSERT_TRUE(dout.download(got.data()));
        EXPECT_TRUE(all_equal(got, ref)) << "last_row rows=" << rows;
    }
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
    EXPECT_ERROR(mk_kernel_attention_prefill(f, f, f, f, 1, 0, 6, 4, 8, stream_), MK_ERR_SHAPE,
                 "n_heads 6 must be a multiple of n_kv_heads 4");
    EXPECT_ERROR(mk_kernel_attention_prefill(f, f, f, f, 1, 0, 4, 4, 5, stream_), MK_ERR_SHAPE,
                 "mk_kernel_attention_prefill: head_dim 5 must be even");
    EXPECT_ERROR(mk_kernel_attention_decode(f, f, f, f, 0, 4, 0, 8, f, 4096, stream_), MK_ERR_SHAPE,
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

} // namespace
