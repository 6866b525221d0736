// The CPU reference ops against direct float64 formulas: they are what every kernel and
// backend is compared with, so they are checked on their own, including the long-row
// path of attention (more keys than its score cache holds).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace {

std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float &x : v) x = dist(rng);
    return v;
}

class CpuAttention : public ::testing::TestWithParam<std::tuple<size_t, size_t, size_t>> {};

TEST_P(CpuAttention, MatchesFloat64Softmax) {
    const auto [rows, past, head_dim] = GetParam();
    const size_t n_heads = 4, n_kv = 2, n_keys = past + rows, kv_dim = n_kv * head_dim;
    const std::vector<float> q = random_vector(rows * n_heads * head_dim, 1), k = random_vector(n_keys * kv_dim, 2),
                             v = random_vector(n_keys * kv_dim, 3);
    std::vector<float> out(rows * n_heads * head_dim, NAN);
    mk_cpu_attention(out.data(), q.data(), k.data(), v.data(), rows, past, n_heads, n_kv, head_dim);
    for (size_t r = 0; r < rows; r++) {
        for (size_t h = 0; h < n_heads; h++) {
            const size_t kvh = h / (n_heads / n_kv), keys = past + r + 1;
            std::vector<double> s(keys);
            double mx = -INFINITY;
            for (size_t t = 0; t < keys; t++) {
                double dot = 0.0;
                for (size_t d = 0; d < head_dim; d++)
                    dot += (double)q[(r * n_heads + h) * head_dim + d] * k[t * kv_dim + kvh * head_dim + d];
                s[t] = dot / std::sqrt((double)head_dim);
                mx = std::max(mx, s[t]);
            }
            double denom = 0.0;
            for (double &x : s) denom += (x = std::exp(x - mx));
            for (size_t d = 0; d < head_dim; d++) {
                double ref = 0.0;
                for (size_t t = 0; t < keys; t++) ref += s[t] * v[t * kv_dim + kvh * head_dim + d];
                ref /= denom;
                const float got = out[(r * n_heads + h) * head_dim + d];
                ASSERT_NEAR(got, ref, 1e-5 + 1e-4 * std::fabs(ref)) << "row " << r << " head " << h << " dim " << d;
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuAttention,
                         ::testing::Values(std::make_tuple(7, 0, 8), std::make_tuple(1, 4094, 16),
                                           std::make_tuple(3, 4095, 16), std::make_tuple(1, 5000, 64),
                                           std::make_tuple(2, 9000, 8)));

TEST(CpuOps, RmsNormMatchesFloat64) {
    const size_t rows = 3, cols = 4097;
    const std::vector<float> x = random_vector(rows * cols, 4, 3.0f), w = random_vector(cols, 5);
    std::vector<float> out(rows * cols);
    mk_cpu_rmsnorm(out.data(), x.data(), w.data(), rows, cols, 1e-5f);
    for (size_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (size_t c = 0; c < cols; c++) ss += (double)x[r * cols + c] * x[r * cols + c];
        const double scale = 1.0 / std::sqrt(ss / cols + 1e-5);
        for (size_t c = 0; c < cols; c++) {
            const double ref = x[r * cols + c] * scale * w[c];
            ASSERT_NEAR(out[r * cols + c], ref, 1e-6 + 1e-5 * std::fabs(ref));
        }
    }
}

// Rows whose mean square is below eps: eps sits under the root with the mean square,
// 1 / sqrt(ms + eps), not beside it (1 / (rms + eps) is within 1e-5 of it only when the
// rows are large, as above).
TEST(CpuOps, RmsNormOfSmallRowsKeepsEpsUnderTheRoot) {
    const size_t rows = 3, cols = 37;
    const float eps = 1e-5f;
    const std::vector<float> x = random_vector(rows * cols, 14, 1e-3f), w = random_vector(cols, 15);
    std::vector<float> out(rows * cols);
    mk_cpu_rmsnorm(out.data(), x.data(), w.data(), rows, cols, eps);
    for (size_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (size_t c = 0; c < cols; c++) ss += (double)x[r * cols + c] * x[r * cols + c];
        const double scale = 1.0 / std::sqrt(ss / cols + (double)eps);
        for (size_t c = 0; c < cols; c++) {
            const double ref = x[r * cols + c] * scale * w[c];
            ASSERT_NEAR(out[r * cols + c], ref, 1e-6 + 1e-5 * std::fabs(ref)) << "row " << r << " col " << c;
        }
    }
}

TEST(CpuOps, RopeLayoutsRotateTheRightPairs) {
    const size_t head_dim = 8, heads = 2;
    const int32_t pos[] = {100000};
    for (mk_rope_layout layout : {MK_ROPE_ROTATE_HALF, MK_ROPE_ADJACENT_PAIRS}) {
        std::vector<float> x = random_vector(heads * head_dim, 6);
        const std::vector<float> orig = x;
        mk_cpu_rope(x.data(), pos, 1, heads, head_dim, 10000.0f, layout);
        for (size_t h = 0; h < heads; h++) {
            for (size_t i = 0; i < head_dim / 2; i++) {
                const size_t a = layout == MK_ROPE_ROTATE_HALF ? i : 2 * i;
                const size_t b = layout == MK_ROPE_ROTATE_HALF ? i + head_dim / 2 : 2 * i + 1;
                const double angle = (double)(float)(100000.0f * (float)std::pow(10000.0, -2.0 * i / head_dim));
                const double xa = orig[h * head_dim + a], xb = orig[h * head_dim + b];
                EXPECT_NEAR(x[h * head_dim + a], xa * std::cos(angle) - xb * std::sin(angle), 1e-5);
                EXPECT_NEAR(x[h * head_dim + b], xb * std::cos(angle) + xa * std::sin(angle), 1e-5);
            }
        }
    }
}

TEST(CpuOps, ArgmaxTakesTheLowestIndexOnTiesAndSkipsNaN) {
    const std::vector<float> x = {1.0f, NAN, 3.0f, 3.0f, -INFINITY, 3.0f, NAN, NAN, NAN};
    int32_t out[3];
    mk_cpu_argmax(out, x.data(), 3, 3);
    EXPECT_EQ(out[0], 2);  // {1, NaN, 3}: NaN never wins
    EXPECT_EQ(out[1], 0);  // {3, -inf, 3}: a tie goes to the lowest index
    EXPECT_EQ(out[2], 0);  // all NaN: index 0
}

TEST(CpuOps, HalfConversionsRoundToNearestEven) {
    EXPECT_EQ(mk_f32_to_f16(1.0f), 0x3c00);
    EXPECT_EQ(mk_f32_to_f16(65504.0f), 0x7bff);
    EXPECT_EQ(mk_f32_to_f16(65520.0f), 0x7c00);              // rounds up to inf
    EXPECT_EQ(mk_f32_to_f16(5.960464477539063e-08f), 0x0001); // smallest subnormal
    EXPECT_EQ(mk_f32_to_f16(2.98023223876953125e-08f), 0x0000); // half of it: ties to even (0)
    EXPECT_EQ(mk_f16_to_f32(0x0001), 5.960464477539063e-08f);
    EXPECT_EQ(mk_f32_to_bf16(1.00390625f), 0x3f80);  // halfway between 0x3f80 and 0x3f81: even
    EXPECT_EQ(mk_f32_to_bf16(1.01171875f), 0x3f82);  // halfway between 0x3f81 and 0x3f82: even
    EXPECT_EQ(mk_bf16_to_f32(0x3f80), 1.0f);
    for (uint32_t h = 0; h < 0x7c00; h++) EXPECT_EQ(mk_f32_to_f16(mk_f16_to_f32((uint16_t)h)), h);
}

// Every value halfway between two neighbouring halves rounds to the even one, in the
// subnormal range, across the subnormal/normal boundary and in every binade; a value one
// float ulp off the midpoint rounds to its nearer neighbour.
TEST(CpuOps, HalfMidpointsRoundToEven) {
    for (uint32_t h = 0; h < 0x7bff; h++) {
        const float lo = mk_f16_to_f32((uint16_t)h), hi = mk_f16_to_f32((uint16_t)(h + 1));
        const float mid = lo + (hi - lo) / 2; // exact: one bit more than the half's significand
        const uint16_t even = (uint16_t)((h & 1u) ? h + 1 : h);
        ASSERT_EQ(mk_f32_to_f16(mid), even) << "f16 midpoint above 0x" << std::hex << h;
        ASSERT_EQ(mk_f32_to_f16(-mid), even | 0x8000u) << "f16 midpoint below -0x" << std::hex << h;
        ASSERT_EQ(mk_f32_to_f16(std::nextafter(mid, 0.0f)), h) << "f16 just under the midpoint above 0x" << std::hex << h;
        ASSERT_EQ(mk_f32_to_f16(std::nextafter(mid, INFINITY)), h + 1) << "f16 just over the midpoint above 0x" << std::hex << h;
    }
    for (uint32_t b = 0; b < 0x7f7f; b++) {
        const float lo = mk_bf16_to_f32((uint16_t)b), hi = mk_bf16_to_f32((uint16_t)(b + 1));
        const float mid = lo + (hi - lo) / 2; // (lo + hi) / 2 would overflow at the top binade
        const uint16_t even = (uint16_t)((b & 1u) ? b + 1 : b);
        ASSERT_EQ(mk_f32_to_bf16(mid), even) << "bf16 midpoint above 0x" << std::hex << b;
        ASSERT_EQ(mk_f32_to_bf16(std::nextafter(mid, 0.0f)), b) << "bf16 just under the midpoint above 0x" << std::hex << b;
    }
}

}  // namespace
