/* test_cudasim.cpp - the simulator's own tests: correct kernels give correct answers in the
 * order the environment selects (ctest runs the suite forward and random), broken kernels
 * are caught, and the runtime subset behaves like libcudart. */
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cudasim.h"
#include "test_kernels.h"

#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudasim::last_diagnostic()
/* In a lambda returning int: a failed call gives -2. */
#define CK_RET(call)                                                                   \
  do {                                                                                 \
    if ((call) != cudaSuccess) {                                                       \
      ADD_FAILURE() << #call << ": " << cudasim::last_diagnostic();                    \
      return -2;                                                                       \
    }                                                                                  \
  } while (0)

namespace {

/* Device buffer of n T, freed at scope exit. */
template <class T>
struct DevBuf {
  T *p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void **>(&p), n * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf &) = delete;
  DevBuf &operator=(const DevBuf &) = delete;
  void put(const std::vector<T> &h) { cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

/* Restores the environment-selected order after a test that forces one. */
struct OrderGuard {
  cudasim::Order o = cudasim::order();
  uint64_t s = cudasim::seed();
  ~OrderGuard() { cudasim::set_order(o, s); }
};

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto &x : v) x = d(g);
  return v;
}

const char *order_name() {
  switch (cudasim::order()) {
    case cudasim::Order::Forward: return "forward";
    case cudasim::Order::Reverse: return "reverse";
    default: return "random";
  }
}

}  // namespace

/* ======================================================================================
 * Correct kernels
 * ====================================================================================== */
TEST(CudasimKernels, BlockReductionSharedMemory) {
  const int blocks = 37, n = 1000;
  auto hx = random_floats(size_t(blocks) * n, 1);
  DevBuf<float> x(hx.size()), out(blocks);
  x.put(hx);
  CK(tk_block_sum(out.p, x.p, n, blocks, 0));
  auto h = out.get();
  for (int b = 0; b < blocks; ++b) {
    double ref = 0;
    for (int i = 0; i < n; ++i) ref += hx[size_t(b) * n + i];
    EXPECT_NEAR(h[b], ref, 1e-3) << "block " << b << " order " << order_name();
  }
}

TEST(CudasimKernels, WarpShuffleReduction) {
  const int warps = 64;
  auto hx = random_floats(warps * 32, 2);
  for (auto &v : hx) v = std::round(v * 64.0f); /* exact sums in any association */
  DevBuf<float> x(hx.size()), out(warps);
  x.put(hx);
  CK(tk_warp_sum(out.p, x.p, warps, 0));
  auto h = out.get();
  for (int w = 0; w < warps; ++w) {
    float ref = 0;
    for (int l = 0; l < 32; ++l) ref += hx[w * 32 + l];
    EXPECT_EQ(h[w], ref) << "warp " << w;
  }
}

TEST(CudasimKernels, AtomicsFromManyBlocksOnSeveralThreads) {
  cudasim::set_workers(4);
  DevBuf<int> count(1);
  DevBuf<float> fsum(1);
  DevBuf<unsigned long long> umax(1);
  CK(cudaMemset(count.p, 0, sizeof(int)));
  CK(cudaMemset(fsum.p, 0, sizeof(float)));
  CK(cudaMemset(umax.p, 0, sizeof(unsigned long long)));
  const int blocks = 500;
  CK(tk_atomic_count(count.p, fsum.p, umax.p, blocks, 0));
  EXPECT_EQ(count.get()[0], blocks * 64);
  EXPECT_EQ(fsum.get()[0], blocks * 64 * 0.5f);
  EXPECT_EQ(umax.get()[0], blocks * 64ull - 1);
  cudasim::set_workers(std::max(1u, std::thread::hardware_concurrency()));
}

TEST(CudasimKernels, DynamicSharedMemory) {
  for (int block : {32, 96, 1024}) {
    const int blocks = 5;
    auto hx = random_floats(size_t(block) * blocks, 3);
    DevBuf<float> x(hx.size()), y(hx.size());
    x.put(hx);
    CK(tk_dynamic_reverse(y.p, x.p, block, blocks, 0));
    auto h = y.get();
    for (int b = 0; b < blocks; ++b)
      for (int t = 0; t < block; ++t)
        ASSERT_EQ(h[size_t(b) * block + t], hx[size_t(b) * block + block - 1 - t]);
  }
}

TEST(CudasimKernels, DynamicSharedAboveDefaultLimitNeedsAttribute) {
  DevBuf<float> out(1);
  CK(cudaMemset(out.p, 0, sizeof(float)));
  const int n = 20000; /* 80 KB */
  CK(tk_big_dynamic(out.p, n, 0));
  EXPECT_EQ(out.get()[0], float(n / 2));
  /* over the opt-in maximum: refused */
  EXPECT_EQ(tk_big_dynamic(out.p, 300 * 1024 / 4, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST(CudasimKernels, Grid2D) {
  const int w = 77, h = 45;
  DevBuf<int> out(size_t(w) * h);
  CK(tk_grid2d(out.p, w, h, 0));
  auto v = out.get();
  for (int r = 0; r < h; ++r)
    for (int c = 0; c < w; ++c) ASSERT_EQ(v[size_t(r) * w + c], r * 1000 + c);
}

TEST(CudasimKernels, TemplateWithStaticShared) {
  for (int bs : {64, 512}) {
    const int n = 3001;
    std::vector<double> hx(n);
    for (int i = 0; i < n; ++i) hx[i] = i;
    DevBuf<double> x(n), out(1);
    x.put(hx);
    CK(tk_template_sum(out.p, x.p, n, bs, 0));
    EXPECT_EQ(out.get()[0], double(n) * (n - 1) / 2) << "block size " << bs;
  }
}

TEST(CudasimKernels, BallotAnyAll) {
  std::vector<int> pred(32);
  for (int i = 0; i < 32; ++i) pred[i] = (i % 3 == 0);
  DevBuf<int> p(32);
  DevBuf<unsigned> out(128);
  p.put(pred);
  CK(tk_warp_votes(out.p, p.p, 0));
  auto h = out.get();
  unsigned ref = 0;
  for (int i = 0; i < 32; ++i) ref |= unsigned(pred[i] != 0) << i;
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(h[l], ref);
    EXPECT_EQ(h[32 + l], 1u);
    EXPECT_EQ(h[64 + l], 0u);
    EXPECT_EQ(h[96 + l], ref & (l < 16 ? 0x0000ffffu : 0xffff0000u));
  }
}

TEST(CudasimKernels, ShuffleUpScan) {
  std::vector<int> hx(64);
  std::iota(hx.begin(), hx.end(), 1);
  DevBuf<int> x(64), out(64);
  x.put(hx);
  CK(tk_scan_up(out.p, x.p, 0));
  auto h = out.get();
  for (int w = 0; w < 2; ++w) {
    int acc = 0;
    for (int l = 0; l < 32; ++l) {
      acc += hx[w * 32 + l];
      EXPECT_EQ(h[w * 32 + l], acc);
    }
  }
}

TEST(CudasimKernels, SyncthreadsCountAndOr) {
  std::vector<int> pred(96, 0);
  pred[3] = pred[50] = pred[95] = 1;
  DevBuf<int> p(96), out(3);
  p.put(pred);
  CK(tk_sync_count(out.p, p.p, 96, 0));
  auto h = out.get();
  EXPECT_EQ(h[0], 3);
  EXPECT_EQ(h[1], 0);
  EXPECT_EQ(h[2], 1);
}

TEST(CudasimKernels, HalfBfloatAndMath) {
  const int n = 300;
  auto hx = random_floats(n, 4);
  DevBuf<float> x(n), out(2 * n);
  x.put(hx);
  CK(tk_half_roundtrip(out.p, x.p, n, 0));
  auto h = out.get();
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(h[i], hx[i], std::fabs(hx[i]) / 1024.0f + 1e-7f);
    EXPECT_NEAR(h[n + i], hx[i], std::fabs(hx[i]) / 128.0f + 1e-7f);
  }
}

TEST(CudasimKernels, HalfWarpThenFullWarpShuffle) {
  OrderGuard g;
  DevBuf<int> out(128);
  const std::pair<cudasim::Order, uint64_t> runs[] = {
      {cudasim::Order::Forward, 1}, {cudasim::Order::Reverse, 1}, {cudasim::Order::Random, 1},
      {cudasim::Order::Random, 2},  {cudasim::Order::Random, 3},  {cudasim::Order::Random, 4}};
  for (const auto &run : runs) {
    cudasim::set_order(run.first, run.second);
    cudasim::clear_diagnostic();
    CK(tk_half_then_full_shfl(out.p, 0));
    CK(cudaDeviceSynchronize());
    EXPECT_STREQ(cudasim::last_diagnostic(), "");
    auto h = out.get();
    for (int w = 0; w < 2; ++w) {
      int v[32];
      for (int l = 0; l < 32; ++l) v[l] = l < 16 ? 100 * w + (l + 1) % 16 : 100 * w + l;
      for (int l = 0; l < 16; ++l)
        EXPECT_EQ(h[64 * w + l], v[l]) << order_name() << " seed " << run.second << " warp " << w;
      for (int l = 0; l < 32; ++l)
        EXPECT_EQ(h[64 * w + 32 + l], v[31 - l])
            << order_name() << " seed " << run.second << " warp " << w << " lane " << l;
    }
  }
}

TEST(CudasimKernels, KernelWithoutArguments) {
  DevBuf<int> flag(1);
  CK(tk_no_args(flag.p, 0));
  EXPECT_EQ(flag.get()[0], 7);
}

TEST(CudasimKernels, InvalidLaunchConfiguration) {
  EXPECT_EQ(tk_dynamic_reverse(nullptr, nullptr, 2048, 1, 0), cudaErrorInvalidConfiguration);
  EXPECT_NE(std::string(cudasim::last_diagnostic()).find("invalid configuration"),
            std::string::npos);
}

/* ======================================================================================
 * Broken kernels are caught
 * ====================================================================================== */
TEST(CudasimCatches, MissingSyncthreadsFailsUnderRandomOrder) {
  OrderGuard guard;
  const int n = 256;
  std::vector<float> hx(n);
  for (int i = 0; i < n; ++i) hx[i] = float(i + 1);
  const float ref = n * (n + 1) / 2.0f;
  DevBuf<float> x(n), out(1);
  x.put(hx);
  int wrong = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    cudasim::set_order(cudasim::Order::Random, seed);
    CK(tk_sum_missing_sync(out.p, x.p, n, 0));
    wrong += out.get()[0] != ref;
  }
  EXPECT_GE(wrong, 1) << "a reduction without its barrier passed in 8 random orders";
  /* the same reduction with its barrier is right in every order */
  cudasim::set_order(cudasim::Order::Random, 3);
  DevBuf<float> x2(n), out2(1);
  x2.put(hx);
  CK(tk_block_sum(out2.p, x2.p, n, 1, 0));
  EXPECT_EQ(out2.get()[0], ref);
}

TEST(CudasimCatches, WarpLockstepWithoutSyncFailsUnderRandomOrder) {
  OrderGuard guard;
  std::vector<float> hx(64);
  for (int i = 0; i < 64; ++i) hx[i] = float(i + 1);
  const float ref = 64 * 65 / 2.0f;
  DevBuf<float> x(64), out(1);
  x.put(hx);
  int wrong = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    cudasim::set_order(cudasim::Order::Random, seed);
    CK(tk_warp_lockstep(out.p, x.p, 0));
    wrong += out.get()[0] != ref;
  }
  EXPECT_GE(wrong, 1) << "a lock-step warp reduction passed in 8 random orders";
}

/* Warp intrinsics synchronise the lanes of one warp, not the block: a race between warps
 * separated only by shuffles must show up (other warps run ahead of or behind a warp). */
TEST(CudasimCatches, CrossWarpRaceAcrossShufflesFailsUnderRandomOrder) {
  OrderGuard guard;
  const int blocks = 16;
  std::vector<float> hx(64 * blocks);
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = float(i % 97 + 1);
  std::vector<float> ref(32 * blocks);
  for (int b = 0; b < blocks; ++b) {
    float warp1 = 0;
    for (int l = 32; l < 64; ++l) warp1 += hx[b * 64 + l];
    for (int l = 0; l < 32; ++l) ref[b * 32 + l] = hx[b * 64 + l] + warp1;
  }
  DevBuf<float> x(hx.size()), out(ref.size());
  x.put(hx);
  int wrong = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    cudasim::set_order(cudasim::Order::Random, seed);
    CK(tk_cross_warp_shfl(out.p, x.p, blocks, false, 0));
    wrong += out.get() != ref;
  }
  EXPECT_GE(wrong, 1) << "a cross-warp race separated only by shuffles passed in 8 random orders";
  /* with the __syncthreads it is right in every order */
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    cudasim::set_order(cudasim::Order::Random, seed);
    CK(tk_cross_warp_shfl(out.p, x.p, blocks, true, 0));
    EXPECT_EQ(out.get(), ref) << "seed " << seed;
  }
  for (cudasim::Order o : {cudasim::Order::Forward, cudasim::Order::Reverse}) {
    cudasim::set_order(o, 1);
    CK(tk_cross_warp_shfl(out.p, x.p, blocks, true, 0));
    EXPECT_EQ(out.get(), ref) << order_name();
  }
}

TEST(CudasimCatches, StaticSharedReadBeforeWriteSeesPoisonInEveryBlock) {
  /* One worker: every block runs on the same OS thread, so its static shared arrays are the
   * ones the previous block wrote - without the per-block poison the odd blocks would read
   * the even blocks' values and look right. Then several workers. */
  for (unsigned workers : {1u, 2u}) {
    cudasim::set_workers(workers);
    const int blocks = 8;
    DevBuf<unsigned> ou(32 * blocks);
    DevBuf<float> of(32 * blocks);
    for (int rep = 0; rep < 2; ++rep) {
      CK(tk_stale_static_shared(ou.p, of.p, blocks, 0));
      auto hu = ou.get();
      auto hf = of.get();
      for (int b = 0; b < blocks; ++b)
        for (int t = 0; t < 32; ++t) {
          const size_t i = size_t(b) * 32 + t;
          if (b % 2 == 0) {
            ASSERT_EQ(hu[i], 1000u + i);
            ASSERT_EQ(hf[i], float(i));
          } else {
            ASSERT_EQ(hu[i], 0xffffffffu) << "block " << b << " thread " << t << ", " << workers
                                          << " worker(s): stale static shared memory";
            ASSERT_TRUE(std::isnan(hf[i])) << "block " << b << " thread " << t << ": " << hf[i];
          }
        }
    }
  }
  cudasim::set_workers(std::max(1u, std::thread::hardware_concurrency()));
}

TEST(CudasimCatches, DivergentBarrierReportedWithCoordinates) {
  EXPECT_EQ(tk_divergent_barrier(0), cudaErrorLaunchFailure);
  const std::string d = cudasim::last_diagnostic();
  EXPECT_NE(d.find("divergent __syncthreads"), std::string::npos) << d;
  EXPECT_NE(d.find("block (0,0,0)"), std::string::npos) << d; /* first failing block */
  EXPECT_NE(d.find("thread ("), std::string::npos) << d;
  EXPECT_NE(d.find("broken_kernels.cu"), std::string::npos) << d;
  EXPECT_NE(d.find("divergent_barrier_kernel"), std::string::npos) << d;
  /* the error is reported once, then the next launch works */
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  DevBuf<int> flag(1);
  CK(tk_no_args(flag.p, 0));
}

TEST(CudasimCatches, BarrierAfterEarlyReturnReported) {
  EXPECT_EQ(tk_barrier_after_exit(0), cudaErrorLaunchFailure);
  const std::string d = cudasim::last_diagnostic();
  EXPECT_NE(d.find("block (3,0,0)"), std::string::npos) << d;
  EXPECT_NE(d.find("has exited"), std::string::npos) << d;
  /* cudaGetErrorString carries the diagnostic of the latest failure with that code */
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorLaunchFailure)).find("block (3,0,0)"),
            std::string::npos);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess); /* consumed by cudaGetLastError */
}

TEST(CudasimCatches, LaunchErrorSurfacesAtNextSynchronize) {
  DevBuf<float> out(32);
  tk_shfl_exited_lane(out.p, 0);                         /* consumes the launch error */
  tk_divergent_barrier_no_check(0);                      /* leaves it pending */
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudasimCatches, ShuffleFromExitedLaneReported) {
  DevBuf<float> out(32);
  EXPECT_EQ(tk_shfl_exited_lane(out.p, 0), cudaErrorLaunchFailure);
  const std::string d = cudasim::last_diagnostic();
  EXPECT_NE(d.find("__shfl_down_sync"), std::string::npos) << d;
  EXPECT_NE(d.find("reads lane 16, which has exited"), std::string::npos) << d;
  EXPECT_NE(d.find("thread (0,0,0)"), std::string::npos) << d;
}

TEST(CudasimCatches, MaskNamingExitedLaneReported) {
  DevBuf<float> out(32);
  EXPECT_EQ(tk_mask_exited(out.p, 0), cudaErrorLaunchFailure);
  const std::string d = cudasim::last_diagnostic();
  EXPECT_NE(d.find("which has exited"), std::string::npos) << d;
  EXPECT_NE(d.find("0xffffffff"), std::string::npos) << d;
}

TEST(CudasimCatches, WarpIntrinsicVersusBarrierDeadlockReported) {
  EXPECT_EQ(tk_warp_vs_barrier(0), cudaErrorLaunchFailure);
  const std::string d = cudasim::last_diagnostic();
  EXPECT_NE(d.find("deadlock"), std::string::npos) << d;
}

TEST(CudasimCatches, MaskMismatchReported) {
  EXPECT_EQ(tk_mask_mismatch(0), cudaErrorLaunchFailure);
  const std::string d = cudasim::last_diagnostic();
  EXPECT_NE(d.find("mask"), std::string::npos) << d;
}

TEST(CudasimCatches, FiberStackOverflowIsAClearFault) {
  DevBuf<int> out(1);
  CK(tk_stack_overflow(out.p, 4, 0)); /* shallow: fine */
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(tk_stack_overflow(out.p, 1 << 30, 0), "fiber stack overflow in kernel "
                                                     "stack_overflow_kernel, block \\(0,0,0\\)");
}

#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDASIM_TEST_ASAN 1
#endif
#endif

/* A kernel that reads one element past the end of its input must be caught by the
 * sanitizer build even when the overrun stays inside the 256-byte alignment of the
 * allocation (1000 floats: 4000 bytes, the next 96 bytes were invisible to ASan). */
TEST(CudasimCatches, ReadPastAllocationEndCaughtUnderAsan) {
#if !defined(CUDASIM_TEST_ASAN)
  GTEST_SKIP() << "needs the AddressSanitizer build (MESHKERN_SANITIZE=ON)";
#else
  const int n = 1000;
  DevBuf<float> x(n), out(1);
  x.put(std::vector<float>(n, 1.0f));
  CK(tk_block_sum(out.p, x.p, n, 1, 0)); /* in bounds: fine */
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  /* Launches are asynchronous: the synchronisation runs the kernel inside the death test. */
  EXPECT_DEATH(
      {
        tk_block_sum(out.p, x.p, n + 1, 1, 0);
        cudaDeviceSynchronize();
      },
      "heap-buffer-overflow");
#endif
}

/* ======================================================================================
 * Runtime subset
 * ====================================================================================== */
TEST(CudasimRuntime, DevicesAndProperties) {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  EXPECT_GE(n, 1);
  EXPECT_EQ(cudaSetDevice(n), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
  cudaGetLastError();
  CK(cudaSetDevice(n - 1));
  int d = -1;
  CK(cudaGetDevice(&d));
  EXPECT_EQ(d, n - 1);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  EXPECT_STREQ(prop.name, "cudasim");
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_GT(prop.totalGlobalMem, 0u);
  EXPECT_EQ(cudaGetDeviceProperties(&prop, n), cudaErrorInvalidDevice);
  cudaGetLastError();
  CK(cudaSetDevice(0));
}

TEST(CudasimRuntime, MallocOverCapacityFailsAndUsageIsTracked) {
  size_t free0 = 0, total = 0;
  CK(cudaMemGetInfo(&free0, &total));
  void *p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  CK(cudaMalloc(&p, 1 << 20));
  size_t free1 = 0;
  CK(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free0 - free1, size_t(1) << 20);
  CK(cudaFree(p));
  CK(cudaMemGetInfo(&free1, &total));
  EXPECT_EQ(free1, free0);
  /* device 1 has its own capacity */
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n > 1) {
    CK(cudaMalloc(&p, total / 2 + 1));
    CK(cudaSetDevice(1));
    void *q = nullptr;
    CK(cudaMalloc(&q, total / 2 + 1));
    CK(cudaFree(q));
    CK(cudaSetDevice(0));
    void *r = nullptr;
    EXPECT_EQ(cudaMalloc(&r, total / 2 + 1), cudaErrorMemoryAllocation);
    cudaGetLastError();
    CK(cudaFree(p));
  }
  EXPECT_EQ(cudaFree(reinterpret_cast<void *>(0x1234)), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST(CudasimRuntime, MemcpyRoundTripAndBoundsChecks) {
  std::vector<int> h(1000), back(1000, 0);
  std::iota(h.begin(), h.end(), 5);
  int *d = nullptr, *d2 = nullptr, *pinned = nullptr;
  CK(cudaMalloc(reinterpret_cast<void **>(&d), 1000 * sizeof(int)));
  CK(cudaMalloc(reinterpret_cast<void **>(&d2), 1000 * sizeof(int)));
  CK(cudaMallocHost(reinterpret_cast<void **>(&pinned), 1000 * sizeof(int)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMemcpyAsync(d, h.data(), 1000 * sizeof(int), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d2, d, 1000 * sizeof(int), cudaMemcpyDeviceToDevice, s));
  CK(cudaMemcpyAsync(pinned, d2, 1000 * sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(back.data(), pinned, 1000 * sizeof(int), cudaMemcpyDefault));
  EXPECT_EQ(back, h);
  CK(cudaMemsetAsync(d, 0, 1000 * sizeof(int), s));
  CK(cudaStreamSynchronize(s)); /* s is non-blocking: the legacy-stream copy does not wait for it */
  CK(cudaMemcpy(back.data(), d, 1000 * sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, std::vector<int>(1000, 0));
  /* out of bounds and wrong direction are refused */
  EXPECT_EQ(cudaMemcpy(d, h.data(), 1001 * sizeof(int), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudasim::last_diagnostic()).find("destination"), std::string::npos);
  EXPECT_EQ(cudaMemcpy(h.data(), back.data(), 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  cudaGetLastError();
  CK(cudaStreamDestroy(s));
  CK(cudaFreeHost(pinned));
  CK(cudaFree(d));
  CK(cudaFree(d2));
}

/* Work on different streams runs in a seeded random interleaving unless something orders it:
 * a memset on a non-blocking stream and a copy on the legacy stream race (both outcomes
 * occur over seeds, each seed reproduces its own); an event, a blocking stream (the legacy
 * stream's implicit synchronisation) or a stream synchronisation order them every time. */
TEST(CudasimRuntime, UnorderedStreamsInterleaveAtRandomAndOrderingHolds) {
  const uint64_t saved = cudasim::stream_seed();
  int *d = nullptr;
  CK(cudaMalloc(reinterpret_cast<void **>(&d), 64 * sizeof(int)));
  cudaStream_t nb, bl;
  CK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  CK(cudaStreamCreate(&bl));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  enum How { None, Event, Blocking };
  /* Returns the first word seen by a legacy-stream download after a memset to 7 on another
   * stream (0 before the memset) */
  auto race = [&](uint64_t seed, How how) {
    CK_RET(cudaMemset(d, 0, 64 * sizeof(int)));
    CK_RET(cudaDeviceSynchronize());
    cudasim::set_stream_seed(seed);
    cudaStream_t s = how == Blocking ? bl : nb;
    CK_RET(cudaMemsetAsync(d, 7, 64 * sizeof(int), s));
    if (how == Event) {
      CK_RET(cudaEventRecord(ev, s));
      CK_RET(cudaStreamWaitEvent(nullptr, ev, 0));
    }
    int v = -1;
    CK_RET(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost));
    CK_RET(cudaDeviceSynchronize());
    return v;
  };
  int seen_old = 0, seen_new = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    const int v = race(seed, None);
    ASSERT_TRUE(v == 0 || v == 0x07070707) << v;
    (v == 0 ? seen_old : seen_new)++;
    EXPECT_EQ(race(seed, None), v) << "seed " << seed << " does not reproduce its interleaving";
    EXPECT_EQ(race(seed, Event), 0x07070707) << "seed " << seed;
    EXPECT_EQ(race(seed, Blocking), 0x07070707) << "seed " << seed;
  }
  EXPECT_GT(seen_old, 0);
  EXPECT_GT(seen_new, 0);
  cudasim::set_stream_seed(saved);
  CK(cudaEventDestroy(ev));
  CK(cudaStreamDestroy(nb));
  CK(cudaStreamDestroy(bl));
  CK(cudaFree(d));
}

/* Stream capture: the recorded work (a device copy, a kernel, a memset) replays on every
 * cudaGraphLaunch with the device memory of that moment, giving what eager execution gives;
 * a synchronisation inside the capture invalidates it. */
TEST(CudasimRuntime, CapturedGraphReplaysLikeEagerExecution) {
  const int n = 250, blocks = 4, total = n * blocks; /* block b sums x[b*n, (b+1)*n) */
  DevBuf<float> src(total), x(total), out(blocks), eager(blocks);
  DevBuf<int> flag(4);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CK(cudaStreamIsCapturing(s, &st));
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  CK(cudaMemcpyAsync(x.p, src.p, total * sizeof(float), cudaMemcpyDeviceToDevice, s));
  CK(tk_block_sum(out.p, x.p, n, blocks, s));
  CK(cudaMemsetAsync(flag.p, 0x11, 4 * sizeof(int), s));
  cudaGraph_t graph = nullptr;
  CK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (unsigned round = 0; round < 3; ++round) {
    const std::vector<float> h = random_floats(total, 40 + round);
    CK(cudaMemcpyAsync(src.p, h.data(), total * sizeof(float), cudaMemcpyHostToDevice, s));
    CK(cudaMemsetAsync(out.p, 0xff, blocks * sizeof(float), s));
    CK(cudaMemsetAsync(flag.p, 0, 4 * sizeof(int), s));
    CK(cudaGraphLaunch(exec, s));
    CK(tk_block_sum(eager.p, src.p, n, blocks, s));
    CK(cudaStreamSynchronize(s));
    const std::vector<float> got = out.get(), want = eager.get();
    EXPECT_EQ(0, memcmp(got.data(), want.data(), blocks * sizeof(float))) << "round " << round;
    EXPECT_EQ(flag.get(), std::vector<int>(4, 0x11111111)) << "round " << round;
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  /* a synchronisation inside a capture invalidates it */
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(tk_block_sum(out.p, x.p, n, blocks, s));
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  cudaGetLastError();
  CK(cudaStreamDestroy(s));
}

/* What a captured step may contain, as libcudart has it: a copy from pinned host memory is
 * replayed with the pinned bytes of the replay moment; a copy with pageable host memory and
 * the "potentially unsafe" calls (cudaMalloc, cudaFree, cudaMemcpy, cudaDeviceSynchronize,
 * a query of the capturing stream) are refused with cudaErrorStreamCaptureUnsupported and
 * invalidate the capture: on the capturing thread in thread-local mode (another thread may
 * allocate meanwhile), on every thread in global mode. */
TEST(CudasimRuntime, CaptureReplaysPinnedCopiesAndRefusesUnsafeCalls) {
  DevBuf<float> x(64), out(1);
  float *pinned = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void **>(&pinned), 64 * sizeof(float)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CK(cudaMemcpyAsync(x.p, pinned, 64 * sizeof(float), cudaMemcpyHostToDevice, s));
  CK(tk_block_sum(out.p, x.p, 64, 1, s));
  cudaGraph_t graph = nullptr;
  CK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 64; ++i) pinned[i] = float(i * (round + 1)); /* after the capture */
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    EXPECT_EQ(out.get()[0], float(2016 * (round + 1))) << "round " << round;
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));

  /* a pageable host buffer in a captured copy */
  std::vector<float> pageable(64, 1.0f);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(cudaMemcpyAsync(x.p, pageable.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, s),
            cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();

  /* unsafe calls on the capturing thread; another thread may allocate (thread-local mode) */
  const uint64_t calls = cudasim::allocation_calls();
  struct Unsafe {
    const char *name;
    std::function<cudaError_t()> call;
  };
  void *p = nullptr;
  float h = 0.0f;
  const std::vector<Unsafe> unsafe = {
      {"cudaMalloc", [&] { return cudaMalloc(&p, 256); }},
      {"cudaMallocHost", [&] { return cudaMallocHost(&p, 256); }},
      {"cudaFree", [&] { return cudaFree(x.p); }},
      {"cudaMemcpy", [&] { return cudaMemcpy(&h, out.p, sizeof h, cudaMemcpyDeviceToHost); }},
      {"cudaDeviceSynchronize", [&] { return cudaDeviceSynchronize(); }},
      {"cudaStreamQuery", [&] { return cudaStreamQuery(s); }},
  };
  for (const Unsafe &u : unsafe) {
    SCOPED_TRACE(u.name);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CK(tk_block_sum(out.p, x.p, 64, 1, s));
    cudaError_t other = cudaErrorUnknown;
    std::thread([&] {
      void *q = nullptr;
      other = cudaMalloc(&q, 256);
      if (other == cudaSuccess) other = cudaFree(q);
    }).join();
    EXPECT_EQ(other, cudaSuccess) << "another thread is not bound by a thread-local capture";
    EXPECT_EQ(u.call(), cudaErrorStreamCaptureUnsupported);
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
    cudaGetLastError();
  }
  EXPECT_EQ(cudasim::allocation_calls(), calls + unsafe.size()) << "only the other thread's allocations ran";
  EXPECT_EQ(cudaFree(x.p), cudaSuccess) << "the refused cudaFree freed nothing";
  x.p = nullptr;

  /* global mode: every thread's unsafe call is refused while the capture runs */
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaError_t other = cudaSuccess;
  std::thread([&] {
    void *q = nullptr;
    other = cudaMalloc(&q, 256);
    cudaGetLastError();
  }).join();
  EXPECT_EQ(other, cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  CK(cudaStreamDestroy(s));
  CK(cudaFreeHost(pinned));
}

/* libcudart refuses a kernel launch on a stream of another device than the current one,
 * and an event recorded on a stream of another device than the event's: a backend that
 * forgets cudaSetDevice before touching its device-1 stream must fail here too. */
TEST(CudasimRuntime, StreamOfAnotherDeviceIsRefusedForLaunchAndEventRecord) {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) GTEST_SKIP() << "needs 2 simulated devices";
  DevBuf<int> flag(1);
  CK(cudaSetDevice(1));
  DevBuf<int> flag1(1);
  cudaStream_t s1;
  cudaEvent_t e1;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaEventCreate(&e1));
  CK(tk_no_args(flag1.p, s1)); /* device 1 current: fine */
  CK(cudaEventRecord(e1, s1));
  CK(cudaSetDevice(0));
  EXPECT_EQ(tk_no_args(flag.p, s1), cudaErrorInvalidResourceHandle);
  EXPECT_NE(std::string(cudasim::last_diagnostic()).find("stream belongs to device 1"), std::string::npos)
      << cudasim::last_diagnostic();
  EXPECT_EQ(cudaEventRecord(e1, 0), cudaErrorInvalidResourceHandle); /* device 0's default stream */
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  CK(cudaMemset(flag.p, 0, sizeof(int)));
  CK(tk_no_args(flag.p, 0)); /* the current device's default stream still works */
  EXPECT_EQ(flag.get()[0], 7);
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(s1));
}

TEST(CudasimRuntime, EventsAndStreams) {
  cudaStream_t a, b;
  CK(cudaStreamCreate(&a));
  CK(cudaStreamCreate(&b));
  cudaEvent_t e0, e1, nt;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
  float ms = -1;
  EXPECT_NE(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess); /* not recorded yet */
  cudaGetLastError();
  CK(cudaEventRecord(e0, a));
  const int rows = 64, cols = 1024;
  auto hx = random_floats(size_t(rows) * cols, 9);
  DevBuf<float> x(hx.size()), y(hx.size()), w(cols);
  x.put(hx);
  w.put(std::vector<float>(cols, 1.0f));
  CK(tk_rmsnorm(y.p, x.p, w.p, rows, cols, 1e-5f, a));
  CK(cudaEventRecord(e1, a));
  CK(cudaStreamWaitEvent(b, e1, 0));
  CK(cudaEventRecord(nt, b));
  CK(cudaEventSynchronize(e1));
  CK(cudaEventElapsedTime(&ms, e0, e1));
  EXPECT_GE(ms, 0.0f);
  EXPECT_NE(cudaEventElapsedTime(&ms, e0, nt), cudaSuccess);
  cudaGetLastError();
  CK(cudaStreamSynchronize(b));
  CK(cudaDeviceSynchronize());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaEventDestroy(nt));
  CK(cudaStreamDestroy(a));
  CK(cudaStreamDestroy(b));
  EXPECT_EQ(cudaStreamDestroy(a), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

/* ======================================================================================
 * Speed: a 4096 x 4096 RMSNorm, one block of 256 threads per row
 * ====================================================================================== */
TEST(CudasimSpeed, RmsNorm4096x4096) {
  const int rows = 4096, cols = 4096;
  auto hx = random_floats(size_t(rows) * cols, 11);
  auto hw = random_floats(cols, 12);
  DevBuf<float> x(hx.size()), y(hx.size()), w(cols);
  x.put(hx);
  w.put(hw);
  const auto t0 = std::chrono::steady_clock::now();
  CK(tk_rmsnorm(y.p, x.p, w.p, rows, cols, 1e-5f, 0));
  CK(cudaDeviceSynchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("cudasim: 4096x4096 rmsnorm (%s order) simulated in %.3f s\n", order_name(), s);
  auto hy = y.get();
  for (int r = 0; r < rows; r += 511) {
    double ss = 0;
    for (int c = 0; c < cols; ++c) ss += double(hx[size_t(r) * cols + c]) * hx[size_t(r) * cols + c];
    const double scale = 1.0 / std::sqrt(ss / cols + 1e-5);
    for (int c = 0; c < cols; c += 97) {
      const double ref = hx[size_t(r) * cols + c] * scale * hw[c];
      ASSERT_NEAR(hy[size_t(r) * cols + c], ref, 1e-5 * std::fabs(ref) + 1e-6) << r << "," << c;
    }
  }
  EXPECT_LT(s, 10.0);
}

/* ======================================================================================
 * nvcuda::wmma stand-in (cudasim_wmma.h)
 * ====================================================================================== */
namespace {

/* Element (i, j) of a 16-column tile stored with leading dimension ld. */
size_t at(size_t i, size_t j, size_t ld, bool row_major) { return row_major ? i * ld + j : j * ld + i; }

cudaError_t sync_status(cudaError_t launch) { return launch != cudaSuccess ? launch : cudaDeviceSynchronize(); }

/* One case: A (16 x 16k) and B (16k x 16) in the given layouts, C loaded or filled, D stored
 * in either layout, against fmaf over k in order on the same rounded inputs (bit-exact). */
template <class T>
void check_wmma_gemm(bool bf16, int ktiles, bool a_row, bool b_row, bool c_load, bool c_col, bool d_col, int warps) {
  const unsigned K = 16u * ktiles, lda = a_row ? K + 8 : 24, ldb = b_row ? 24 : K + 8, ldc = 20;
  auto ra = random_floats(16 * K, 100 + ktiles), rb = random_floats(16 * K, 200 + ktiles), rc = random_floats(256, 300);
  const size_t a_len = a_row ? 16 * lda : K * lda, b_len = b_row ? K * ldb : 16 * ldb;
  std::vector<T> ha(a_len, T(0.0f)), hb(b_len, T(0.0f));
  std::vector<float> fa(16 * K), fb(16 * K), hc(16 * ldc, 0.0f);
  for (size_t i = 0; i < 16; ++i)
    for (size_t k = 0; k < K; ++k) {
      ha[at(i, k, lda, a_row)] = T(ra[i * K + k]);
      fa[i * K + k] = float(T(ra[i * K + k]));
    }
  for (size_t k = 0; k < K; ++k)
    for (size_t j = 0; j < 16; ++j) {
      hb[at(k, j, ldb, b_row)] = T(rb[k * 16 + j]);
      fb[k * 16 + j] = float(T(rb[k * 16 + j]));
    }
  for (size_t i = 0; i < 16; ++i)
    for (size_t j = 0; j < 16; ++j) hc[at(i, j, ldc, !c_col)] = rc[i * 16 + j];
  DevBuf<T> da(a_len), db(b_len);
  DevBuf<float> dc(hc.size()), dd(size_t(warps) * 16 * ldc);
  da.put(ha);
  db.put(hb);
  dc.put(hc);
  CK(cudaMemset(dd.p, 0xff, dd.n * sizeof(float)));
  const float fill = 0.375f, post = 0.5f;
  cudaError_t e;
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    e = tk_wmma_gemm_bf16(dd.p, da.p, db.p, c_load ? dc.p : nullptr, fill, ktiles, a_row, b_row, lda, ldb, ldc, c_col,
                          d_col, post, warps, 0);
  else
    e = tk_wmma_gemm_f16(dd.p, da.p, db.p, c_load ? dc.p : nullptr, fill, ktiles, a_row, b_row, lda, ldb, ldc, c_col,
                         d_col, post, warps, 0);
  CK(sync_status(e));
  auto hd = dd.get();
  for (int w = 0; w < warps; ++w)
    for (size_t i = 0; i < 16; ++i)
      for (size_t j = 0; j < 16; ++j) {
        float acc = c_load ? rc[i * 16 + j] : fill;
        for (size_t k = 0; k < K; ++k) acc = fmaf(fa[i * K + k], fb[k * 16 + j], acc);
        const float got = hd[size_t(w) * 16 * ldc + at(i, j, ldc, !d_col)];
        ASSERT_EQ(got, acc * post) << (bf16 ? "bf16" : "f16") << " k" << K << " a_row " << a_row << " b_row "
                                   << b_row << " c_load " << c_load << " c_col " << c_col << " d_col " << d_col
                                   << " warp " << w << " (" << i << "," << j << ")";
      }
}

}  // namespace

TEST(CudasimWmma, ProductsInEveryLayoutMatchAPlainLoop) {
  for (int layout = 0; layout < 4; ++layout) {
    const bool a_row = layout & 1, b_row = layout & 2;
    check_wmma_gemm<__nv_bfloat16>(true, 2, a_row, b_row, true, layout == 1, layout == 2, 2);
    check_wmma_gemm<__half>(false, 3, a_row, b_row, layout != 3, layout == 3, layout == 0, 1);
  }
  check_wmma_gemm<__nv_bfloat16>(true, 1, true, false, false, false, true, 3);
}

/* The fragment inputs are of the 16-bit type: a value that needs more than 8 significant
 * bits comes in rounded (bf16), and the product accumulates in float. */
TEST(CudasimWmma, InputsAreBf16AndAccumulationIsFloat) {
  std::vector<__nv_bfloat16> ha(256, __float2bfloat16(0.0f)), eye(256, __float2bfloat16(0.0f));
  for (int i = 0; i < 16; ++i) eye[i * 16 + i] = __float2bfloat16(1.0f);
  ha[0] = __float2bfloat16(1.0f + 1.0f / 512); /* rounds to 1.0 (even) */
  ha[1] = __float2bfloat16(3.0f);
  DevBuf<__nv_bfloat16> da(256), de(256);
  DevBuf<float> dd(256);
  da.put(ha);
  de.put(eye);
  CK(sync_status(tk_wmma_staged_load(dd.p, da.p, de.p, true, 0)));
  auto hd = dd.get();
  EXPECT_EQ(hd[0], 1.0f);
  EXPECT_EQ(hd[1], 3.0f);
  EXPECT_EQ(hd[2], 0.0f);
}

TEST(CudasimWmma, LoadOfLanesWritesWithoutSyncwarpIsCaught) {
  OrderGuard guard;
  auto ra = random_floats(256, 7);
  std::vector<__nv_bfloat16> ha(256), eye(256, __float2bfloat16(0.0f));
  for (int i = 0; i < 256; ++i) ha[i] = __float2bfloat16(ra[i]);
  for (int i = 0; i < 16; ++i) eye[i * 16 + i] = __float2bfloat16(1.0f);
  DevBuf<__nv_bfloat16> da(256), de(256);
  DevBuf<float> dd(256);
  da.put(ha);
  de.put(eye);
  for (int sync = 1; sync >= 0; --sync) {
    int wrong = 0;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      cudasim::set_order(seed == 1 ? cudasim::Order::Forward : cudasim::Order::Random, seed);
      CK(sync_status(tk_wmma_staged_load(dd.p, da.p, de.p, sync, 0)));
      auto hd = dd.get();
      bool ok = true;
      for (int i = 0; i < 256; ++i) ok = ok && hd[i] == __bfloat162float(ha[i]);
      wrong += !ok;
    }
    if (sync) EXPECT_EQ(wrong, 0);
    else EXPECT_GE(wrong, 1) << "a fragment load of other lanes' unsynchronised writes passed";
  }
}

TEST(CudasimWmma, ReadOfStoredTileWithoutSyncwarpIsCaught) {
  OrderGuard guard;
  DevBuf<float> out(32);
  for (int sync = 1; sync >= 0; --sync) {
    int wrong = 0;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      cudasim::set_order(seed == 1 ? cudasim::Order::Forward : cudasim::Order::Random, seed);
      CK(sync_status(tk_wmma_store_then_read(out.p, sync, 0)));
      auto h = out.get();
      bool ok = true;
      for (float v : h) ok = ok && v == 32.0f;
      wrong += !ok;
    }
    if (sync) EXPECT_EQ(wrong, 0);
    else EXPECT_GE(wrong, 1) << "a read of a stored accumulator without __syncwarp passed";
  }
}

TEST(CudasimWmma, HalfWarpCallIsReported) {
  DevBuf<float> out(256);
  EXPECT_EQ(sync_status(tk_wmma_half_warp(out.p, 0)), cudaErrorLaunchFailure);
  const std::string d = cudasim::last_diagnostic();
  EXPECT_NE(d.find("which has exited"), std::string::npos) << d;
  cudaGetLastError();
}

TEST(CudasimWmma, MisalignedPointerOrLdmIsReported) {
  DevBuf<__half> a(1024);
  DevBuf<float> out(32);
  CK(sync_status(tk_wmma_misaligned(out.p, a.p, 0, 16, 0)));
  EXPECT_EQ(sync_status(tk_wmma_misaligned(out.p, a.p, 8, 16, 0)), cudaErrorLaunchFailure);
  std::string d = cudasim::last_diagnostic();
  EXPECT_NE(d.find("wmma::load_matrix_sync"), std::string::npos) << d;
  cudaGetLastError();
  EXPECT_EQ(sync_status(tk_wmma_misaligned(out.p, a.p, 0, 20, 0)), cudaErrorLaunchFailure);
  cudaGetLastError();
}
