/* cudasim.h - CUDA semantics on the CPU for kernel sources compiled by a C++ compiler.
 *
 * Kernel sources include mk_cuda_compat.h; its cudasim flavour (this directory, on the
 * include path of whatever links the `cudasim` target) includes this header. Each block's threads run as cooperative fibers on one OS thread;
 * blocks of a launch are spread over a small pool of OS threads. __syncthreads and the
 * warp intrinsics are real barriers/exchanges; the order threads run between them is
 * forward, reverse or seeded random (CUDASIM_ORDER, CUDASIM_SEED, cudasim::set_order).
 *
 * The CUDA host headers supply the runtime types (cudaError_t, cudaDeviceProp, dim3,
 * __half, __nv_bfloat16 ...) and declarations; cudasim defines the runtime functions
 * itself (libcudart is not linked). They define __global__/__device__/__shared__ as
 * (almost) nothing for a host compiler, so they are included first and the device-side
 * pieces are (re)defined after them.
 */
#ifndef CUDASIM_H
#define CUDASIM_H

#ifndef __cplusplus
#error "cudasim.h needs C++17"
#endif
#if defined(__CUDACC__)
#error "cudasim.h is for host-compiler builds; nvcc uses the real CUDA headers"
#endif

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <math.h>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers --------------------------------------------------------------------- */
/* Static __shared__ arrays: one copy per OS thread, and an OS thread runs one block at a
 * time to completion, so every fiber of a block sees the same storage. Each declaration is
 * preceded by an unused marker constant named cudasim_shm_mark_<n>: the runtime finds the
 * markers in the symbol table (.symtab of each module with TLS), takes the thread_local
 * block-scope statics of the same functions to be the static shared arrays, and fills them
 * with 0xff bytes before every block, like dynamic shared memory (a stripped binary: no
 * poisoning). Only __shared__ declared in a function (or function template) is poisoned. */
#define CUDASIM_CAT2_(a, b) a##b
#define CUDASIM_CAT_(a, b) CUDASIM_CAT2_(a, b)
#undef __shared__
#define __shared__                                                                         \
  [[gnu::used]] static const char CUDASIM_CAT_(cudasim_shm_mark_, __COUNTER__) = 0;        \
  static thread_local
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __grid_constant__
#define __grid_constant__

constexpr int warpSize = 32;

/* ---- public control API --------------------------------------------------------------- */
namespace cudasim {

enum class Order { Forward, Reverse, Random };

/* Thread order between barriers for later launches (overrides CUDASIM_ORDER/CUDASIM_SEED). */
void set_order(Order order, uint64_t seed = 1);
Order order();
uint64_t seed();
/* Number of OS threads that run blocks (CUDASIM_THREADS; default hardware_concurrency). */
void set_workers(unsigned n);
/* Per-device memory capacity in bytes (CUDASIM_MEM_MB; default 4 GiB). Call before use. */
void set_device_memory(size_t bytes);
/* Number of simulated devices (CUDASIM_DEVICES; default 2). Call before use. */
void set_device_count(int n);
/* Text of the last error cudasim reported on this host thread ("" if none), with kernel
 * name, block and thread coordinates and source line. Not cleared by cudaGetLastError. */
const char *last_diagnostic();
void clear_diagnostic();
/* Number of kernel launches issued so far (all host threads). */
uint64_t launch_count();
/* Seed of the random interleaving of work on different streams (CUDASIM_STREAM_SEED; by
 * default a new one per process), and how many times the scheduler chose between two or
 * more streams that could run. set_stream_seed restarts the sequence. */
uint64_t stream_seed();
uint64_t stream_choices();
void set_stream_seed(uint64_t seed);
/* Fault injection for error-path tests: the launch `after` launches from now (0: the next
 * one, on any host thread) fails with `err` without running, reported like any failed
 * launch (cudaGetLastError, the next synchronisation, last_diagnostic()). */
void inject_launch_failure(uint64_t after, cudaError_t err = cudaErrorLaunchFailure);
/* Live cudaMalloc + cudaMallocHost allocations (every device), for leak checks. */
size_t live_allocations();
/* cudaMalloc / cudaMallocAsync / cudaMallocHost / cudaHostAlloc calls so far (all threads):
 * a difference of zero across a forward shows nothing was allocated in it. */
uint64_t allocation_calls();
/* cudaGraphInstantiate calls that made an executable graph, and the executable graphs not
 * yet destroyed (all threads): how many times work was recorded, and leak checks. */
uint64_t graph_instantiations();
size_t live_graph_execs();

namespace detail {

/* Type-erased kernel invocation: run(args) calls the kernel with its stored arguments. */
struct Thunk {
  void (*run)(const void *pack);
  std::shared_ptr<const void> pack; /* the arguments, kept until the queued launch has run */
  const void *func;                 /* the kernel's address (cudaFuncSetAttribute key) */
  const char *name;
};

cudaError_t launch(const Thunk &t, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                   const char *file, int line);

template <class... P, class... A>
cudaError_t launch_kernel(const char *name, const char *file, int line, void (*kernel)(P...),
                          dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                          A &&...args) {
  static_assert(sizeof...(P) == sizeof...(A), "cudasim: kernel argument count mismatch");
  struct Pack {
    void (*k)(P...);
    std::tuple<std::decay_t<P>...> args;
  };
  auto pack = std::make_shared<const Pack>(
      Pack{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)});
  Thunk t{[](const void *p) {
            const Pack *pk = static_cast<const Pack *>(p);
            std::apply(pk->k, pk->args);
          },
          std::move(pack), reinterpret_cast<const void *>(kernel), name};
  return launch(t, grid, block, shmem, stream, file, line);
}

/* Per-OS-thread state of the running fiber. */
extern __thread unsigned char *tls_dynamic_shared;
inline void *dynamic_shared() { return tls_dynamic_shared; }

enum class WarpKind : int { Sync, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All };
/* Blocks the calling fiber until the lanes named in mask arrive; returns this lane's
 * result (shuffled bits, ballot mask, or predicate). */
uint64_t warp_op(WarpKind kind, unsigned mask, uint64_t value, int arg, int width,
                 const char *file, int line);
/* kind: 0 plain, 1 count, 2 and, 3 or. Returns the reduction over the block. */
int block_barrier(int kind, int pred, const char *file, int line);

template <class T>
inline uint64_t to_bits(const T &v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "cudasim: shuffle of a type larger than 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, static_cast<const void *>(&v), sizeof(T));
  return b;
}
template <class T>
inline T from_bits(uint64_t b) {
  T v;
  std::memcpy(static_cast<void *>(&v), &b, sizeof(T));
  return v;
}

template <class T, class F>
inline T atomic_update(T *addr, F f) { /* CAS loop for types without a native RMW */
  using U = std::conditional_t<sizeof(T) == 2, uint16_t,
                               std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
  static_assert(sizeof(T) == sizeof(U), "cudasim: unsupported atomic size");
  U *p = reinterpret_cast<U *>(addr);
  U old = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    T oldv = from_bits<T>(old);
    U nw = static_cast<U>(to_bits(static_cast<T>(f(oldv))));
    if (__atomic_compare_exchange_n(p, &old, nw, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
      return oldv;
  }
}

} /* namespace detail */
} /* namespace cudasim */

extern "C" const char *cudasim_last_diagnostic(void);

/* The C++ convenience overload of cuda_runtime.h, which is nvcc-only. */
template <class T>
inline cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void *>(entry), attr, value);
}

#define CUDASIM_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...)                        \
  ((void)::cudasim::detail::launch_kernel(#kernel, __FILE__, __LINE__, kernel, (grid),       \
                                          (block), (shmem_bytes), (stream), ##__VA_ARGS__))

/* ---- built-in variables ------------------------------------------------------------------ */
extern __thread uint3 cudasim_tls_threadIdx;
extern __thread uint3 cudasim_tls_blockIdx;
extern __thread uint3 cudasim_tls_blockDim;
extern __thread uint3 cudasim_tls_gridDim;
/* By value: read-only for kernels, and no reference to a TLS object (UBSan's null check
 * misfires on those). */
inline uint3 cudasim_threadIdx() { return cudasim_tls_threadIdx; }
inline uint3 cudasim_blockIdx() { return cudasim_tls_blockIdx; }
inline uint3 cudasim_blockDim() { return cudasim_tls_blockDim; }
inline uint3 cudasim_gridDim() { return cudasim_tls_gridDim; }
#define threadIdx (cudasim_threadIdx())
#define blockIdx (cudasim_blockIdx())
#define blockDim (cudasim_blockDim())
#define gridDim (cudasim_gridDim())

/* ---- synchronisation ------------------------------------------------------------------- */
inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::cudasim::detail::block_barrier(0, 0, file, line);
}
inline int __syncthreads_count(int p, const char *file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
  return ::cudasim::detail::block_barrier(1, p, file, line);
}
inline int __syncthreads_and(int p, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  return ::cudasim::detail::block_barrier(2, p, file, line);
}
inline int __syncthreads_or(int p, const char *file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  return ::cudasim::detail::block_barrier(3, p, file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  ::cudasim::detail::warp_op(::cudasim::detail::WarpKind::Sync, mask, 0, 0, 32, file, line);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---- warp intrinsics ---------------------------------------------------------------------- */
template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32,
                     const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace ::cudasim::detail;
  return from_bits<T>(warp_op(WarpKind::ShflIdx, mask, to_bits(var), srcLane, width, file, line));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                        const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace ::cudasim::detail;
  return from_bits<T>(
      warp_op(WarpKind::ShflUp, mask, to_bits(var), static_cast<int>(delta), width, file, line));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                          const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace ::cudasim::detail;
  return from_bits<T>(
      warp_op(WarpKind::ShflDown, mask, to_bits(var), static_cast<int>(delta), width, file, line));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32,
                         const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  using namespace ::cudasim::detail;
  return from_bits<T>(warp_op(WarpKind::ShflXor, mask, to_bits(var), laneMask, width, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  using namespace ::cudasim::detail;
  return static_cast<unsigned>(warp_op(WarpKind::Ballot, mask, pred != 0, 0, 32, file, line));
}
inline int __any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  using namespace ::cudasim::detail;
  return static_cast<int>(warp_op(WarpKind::Any, mask, pred != 0, 0, 32, file, line));
}
inline int __all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  using namespace ::cudasim::detail;
  return static_cast<int>(warp_op(WarpKind::All, mask, pred != 0, 0, 32, file, line));
}
/* Lanes of the caller's warp that have not exited. */
unsigned __activemask();

/* ---- atomics (really atomic: blocks run on several OS threads) ------------------------- */
#define CUDASIM_ATOMIC_INT(T)                                                                  \
  inline T atomicAdd(T *a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }         \
  inline T atomicSub(T *a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }         \
  inline T atomicAnd(T *a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }         \
  inline T atomicOr(T *a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }           \
  inline T atomicXor(T *a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }         \
  inline T atomicExch(T *a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }       \
  inline T atomicMax(T *a, T v) {                                                              \
    return ::cudasim::detail::atomic_update(a, [v](T o) { return o > v ? o : v; });            \
  }                                                                                            \
  inline T atomicMin(T *a, T v) {                                                              \
    return ::cudasim::detail::atomic_update(a, [v](T o) { return o < v ? o : v; });            \
  }                                                                                            \
  inline T atomicCAS(T *a, T cmp, T v) {                                                       \
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
    return cmp;                                                                                \
  }
CUDASIM_ATOMIC_INT(int)
CUDASIM_ATOMIC_INT(unsigned int)
CUDASIM_ATOMIC_INT(unsigned long long)
CUDASIM_ATOMIC_INT(long long)
#undef CUDASIM_ATOMIC_INT
inline unsigned short atomicCAS(unsigned short *a, unsigned short cmp, unsigned short v) {
  __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
inline unsigned atomicInc(unsigned *a, unsigned lim) {
  return ::cudasim::detail::atomic_update(a, [lim](unsigned o) { return o >= lim ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned *a, unsigned lim) {
  return ::cudasim::detail::atomic_update(
      a, [lim](unsigned o) { return (o == 0 || o > lim) ? lim : o - 1; });
}
inline float atomicAdd(float *a, float v) {
  return ::cudasim::detail::atomic_update(a, [v](float o) { return o + v; });
}
inline double atomicAdd(double *a, double v) {
  return ::cudasim::detail::atomic_update(a, [v](double o) { return o + v; });
}
inline __half atomicAdd(__half *a, __half v) {
  return ::cudasim::detail::atomic_update(
      a, [v](__half o) { return __float2half(__half2float(o) + __half2float(v)); });
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *a, __nv_bfloat16 v) {
  return ::cudasim::detail::atomic_update(a, [v](__nv_bfloat16 o) {
    return __float2bfloat16(__bfloat162float(o) + __bfloat162float(v));
  });
}
inline float atomicExch(float *a, float v) {
  return ::cudasim::detail::atomic_update(a, [v](float) { return v; });
}
inline float atomicMax(float *a, float v) { /* sm_90+ only on a GPU; handy for tests */
  return ::cudasim::detail::atomic_update(a, [v](float o) { return fmaxf(o, v); });
}
inline float atomicMin(float *a, float v) {
  return ::cudasim::detail::atomic_update(a, [v](float o) { return fminf(o, v); });
}

/* ---- math and bit intrinsics ------------------------------------------------------------ */
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float2int_rn(float x) { return static_cast<int>(nearbyintf(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float2int_rd(float x) { return static_cast<int>(floorf(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(ceilf(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned x) { return static_cast<float>(x); }
inline int __float_as_int(float x) { return ::cudasim::detail::from_bits<int>(::cudasim::detail::to_bits(x)); }
inline unsigned __float_as_uint(float x) { return ::cudasim::detail::from_bits<unsigned>(::cudasim::detail::to_bits(x)); }
inline float __int_as_float(int x) { return ::cudasim::detail::from_bits<float>(::cudasim::detail::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return ::cudasim::detail::from_bits<float>(::cudasim::detail::to_bits(x)); }
inline long long __double_as_longlong(double x) { return ::cudasim::detail::from_bits<long long>(::cudasim::detail::to_bits(x)); }
inline double __longlong_as_double(long long x) { return ::cudasim::detail::from_bits<double>(::cudasim::detail::to_bits(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
long long clock64(); /* nanoseconds; clock() is the C library's */

/* Read-only / cache-hinted loads and stores are plain accesses on the CPU. */
template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
template <class T> inline T __ldca(const T *p) { return *p; }
template <class T> inline T __ldcs(const T *p) { return *p; }
template <class T> inline T __ldlu(const T *p) { return *p; }
template <class T> inline void __stcg(T *p, T v) { *p = v; }
template <class T> inline void __stcs(T *p, T v) { *p = v; }
template <class T> inline void __stwt(T *p, T v) { *p = v; }

/* ---- half / bfloat16 device-only functions: host fallbacks through float ---------------- */
inline __half __hfma(__half a, __half b, __half c) {
  return __float2half(fmaf(__half2float(a), __half2float(b), __half2float(c)));
}
inline __half hexp(__half a) { return __float2half(expf(__half2float(a))); }
inline __half hlog(__half a) { return __float2half(logf(__half2float(a))); }
inline __half hsqrt(__half a) { return __float2half(sqrtf(__half2float(a))); }
inline __half hrsqrt(__half a) { return __float2half(1.0f / sqrtf(__half2float(a))); }
inline __half hrcp(__half a) { return __float2half(1.0f / __half2float(a)); }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __halves2half2(__hfma(__low2half(a), __low2half(b), __low2half(c)),
                        __hfma(__high2half(a), __high2half(b), __high2half(c)));
}
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __float2bfloat16(fmaf(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c)));
}
inline __nv_bfloat16 hexp(__nv_bfloat16 a) { return __float2bfloat16(expf(__bfloat162float(a))); }
inline __nv_bfloat16 hlog(__nv_bfloat16 a) { return __float2bfloat16(logf(__bfloat162float(a))); }
inline __nv_bfloat16 hsqrt(__nv_bfloat16 a) { return __float2bfloat16(sqrtf(__bfloat162float(a))); }
inline __nv_bfloat16 hrsqrt(__nv_bfloat16 a) {
  return __float2bfloat16(1.0f / sqrtf(__bfloat162float(a)));
}
inline __nv_bfloat16 hrcp(__nv_bfloat16 a) { return __float2bfloat16(1.0f / __bfloat162float(a)); }

#endif /* CUDASIM_H */
