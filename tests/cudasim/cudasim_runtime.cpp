/* cudasim_runtime.cpp - the CUDA runtime subset over host memory, with N simulated devices.
 *
 * These are link-time stand-ins: the same C functions libcudart exports, declared by the
 * real cuda_runtime_api.h. Stream work is queued and run later (cudasim_async.cpp): in
 * stream order, at random points relative to other streams unless ordered, and the calls
 * that wait for it (synchronisations, copies into pageable host memory) run it.
 * Device pointers are host pointers; copies check that the device side of a copy lies
 * inside a cudaMalloc'd (or pinned) allocation, so a bad size or swapped argument fails.
 */
#include "cudasim.h"
#include "cudasim_internal.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

struct CUstream_st {
  int device;
  unsigned flags;
};
struct CUevent_st {
  int device;
  unsigned flags;
  bool recorded;
  /* The queued record: complete (with its time) once the work before it has run. */
  std::shared_ptr<cudasim::EventMark> mark;
};

/* A captured graph: the work recorded on one stream, in order; its executable form shares it. */
struct CUgraph_st {
  std::shared_ptr<std::vector<cudasim::StreamTask>> tasks;
};
struct CUgraphExec_st {
  std::shared_ptr<std::vector<cudasim::StreamTask>> tasks;
};

namespace cudasim {
namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kSharedPerBlock = 48 * 1024;
constexpr size_t kSharedOptin = 227 * 1024;

/* ---- configuration ------------------------------------------------------------------- */
SimConfig *make_config() {
  SimConfig *c = new SimConfig();
  unsigned hw = std::thread::hardware_concurrency();
  c->workers = hw ? hw : 1;
  if (const char *s = getenv("CUDASIM_ORDER")) {
    std::string v = s;
    if (v == "forward") c->order = Order::Forward;
    else if (v == "reverse") c->order = Order::Reverse;
    else if (v == "random") c->order = Order::Random;
    else fprintf(stderr, "cudasim: CUDASIM_ORDER=%s unknown (forward|reverse|random)\n", s);
  }
  if (const char *s = getenv("CUDASIM_SEED")) c->seed = strtoull(s, nullptr, 0);
  if (const char *s = getenv("CUDASIM_THREADS")) c->workers = std::max(1, atoi(s));
  if (const char *s = getenv("CUDASIM_DEVICES"))
    c->devices = std::min(kMaxDevices, std::max(1, atoi(s)));
  if (const char *s = getenv("CUDASIM_MEM_MB")) c->mem_bytes = strtoull(s, nullptr, 0) << 20;
  if (const char *s = getenv("CUDASIM_STACK_KB"))
    c->stack_bytes = std::max<size_t>(16, strtoull(s, nullptr, 0)) * 1024;
  if (const char *s = getenv("CUDASIM_VERBOSE")) c->verbose = atoi(s) != 0;
  return c;
}

/* ---- per-host-thread error state ------------------------------------------------------- */
thread_local cudaError_t tls_last = cudaSuccess;
thread_local cudaError_t tls_pending = cudaSuccess; /* returned by the next synchronise */
thread_local std::string tls_diag;
thread_local cudaError_t tls_diag_code = cudaSuccess; /* the error tls_diag describes */
thread_local int tls_device = 0;

cudaError_t fail(cudaError_t e, const std::string &msg) {
  tls_last = e;
  tls_diag = msg;
  tls_diag_code = e;
  if (sim_config().verbose) fprintf(stderr, "%s\n", msg.c_str());
  return e;
}

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

/* ---- allocations ------------------------------------------------------------------------ */
struct Alloc {
  size_t size;
  int device; /* -1: pinned host */
};
std::mutex g_mu;
std::map<uintptr_t, Alloc> g_allocs;
size_t g_used[kMaxDevices];
std::set<cudaStream_t> g_streams;
std::set<cudaEvent_t> g_events;
std::unordered_map<const void *, size_t> g_smem_limit;

/* The allocation holding [p, p+n), or nullptr. Caller holds g_mu. */
const Alloc *find_locked(const void *p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  if (a - it->first + n > it->second.size && !(n == 0 && a - it->first <= it->second.size))
    return nullptr;
  return &it->second;
}

bool device_range_ok(const void *p, size_t n) {
  std::lock_guard<std::mutex> g(g_mu);
  return find_locked(p, n) != nullptr;
}

std::atomic<uint64_t> g_alloc_calls{0};
std::atomic<uint64_t> g_graph_instantiations{0};
std::atomic<int64_t> g_live_graph_execs{0};

cudaError_t alloc(void **p, size_t size, int device) {
  if (!p) return fail(cudaErrorInvalidValue, "cudasim: allocation with a null result pointer");
  g_alloc_calls.fetch_add(1);
  *p = nullptr;
  if (size == 0) return cudaSuccess;
  const size_t cap = sim_config().mem_bytes;
  if (device >= 0) {
    std::lock_guard<std::mutex> g(g_mu);
    if (size > cap - std::min(cap, g_used[device]))
      return fail(cudaErrorMemoryAllocation,
                  fmt("cudasim: cudaMalloc of %zu bytes on device %d: %zu of %zu bytes in use",
                      size, device, g_used[device], cap));
    g_used[device] += size;
  }
  /* The exact size, 256-byte aligned: under AddressSanitizer a kernel that reads or writes
   * past the end of an allocation is reported even inside the alignment slack (with
   * aligned_alloc of the size rounded up to 256, ASan saw the slack as valid memory). */
  void *m = nullptr;
  if (posix_memalign(&m, 256, size) != 0) m = nullptr;
  if (!m) {
    std::lock_guard<std::mutex> g(g_mu);
    if (device >= 0) g_used[device] -= size;
    return fail(cudaErrorMemoryAllocation, fmt("cudasim: host allocation of %zu bytes failed", size));
  }
  /* Device memory starts as garbage (NaN for floats), as on a GPU; large ones stay lazy. */
  if (size <= (size_t(256) << 20)) memset(m, 0xff, size);
  std::lock_guard<std::mutex> g(g_mu);
  g_allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{size, device};
  *p = m;
  return cudaSuccess;
}

cudaError_t release(void *p, bool host) {
  if (!p) return cudaSuccess;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || (it->second.device < 0) != host) {
    tls_last = tls_diag_code = cudaErrorInvalidValue;
    tls_diag = fmt("cudasim: %s(%p): not a pointer returned by %s", host ? "cudaFreeHost" : "cudaFree",
                   p, host ? "cudaMallocHost" : "cudaMalloc");
    return cudaErrorInvalidValue;
  }
  if (it->second.device >= 0) g_used[it->second.device] -= it->second.size;
  free(p);
  g_allocs.erase(it);
  return cudaSuccess;
}

const char *kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "HostToHost";
    case cudaMemcpyHostToDevice: return "HostToDevice";
    case cudaMemcpyDeviceToHost: return "DeviceToHost";
    case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
    case cudaMemcpyDefault: return "Default";
  }
  return "?";
}

/* How a copy waits. */
enum class CopyMode {
  Async, /* cudaMemcpyAsync: queued on the stream */
  Sync,  /* cudaMemcpy: on the legacy stream, the host waits except for what libcudart lets go */
};

/* Checks a copy's arguments and queues it on stream s. As libcudart: a pageable host source
 * is taken at the call (staged), so the caller may reuse it at once; the host waits for a
 * copy into pageable host memory, and (Sync) for one from pinned memory or host to host;
 * a copy into device memory from a staged source, or between devices, goes on without the
 * host. Pinned host memory is read or written when the copy runs. */
cudaError_t copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *fn,
                 cudaStream_t s, CopyMode mode) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue, fmt("cudasim: %s with a null pointer", fn));
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (static_cast<int>(kind) < 0 || static_cast<int>(kind) > 4)
    return fail(cudaErrorInvalidMemcpyDirection, fmt("cudasim: %s: bad kind %d", fn, int(kind)));
  if (dst_dev && !device_range_ok(dst, n))
    return fail(cudaErrorInvalidValue,
                fmt("cudasim: %s(%s): destination [%p, +%zu) is not inside one device allocation",
                    fn, kind_name(kind), dst, n));
  if (src_dev && !device_range_ok(src, n))
    return fail(cudaErrorInvalidValue,
                fmt("cudasim: %s(%s): source [%p, +%zu) is not inside one device allocation", fn,
                    kind_name(kind), src, n));
  const int dst_where = allocation_device(dst, n), src_where = allocation_device(src, n);
  const bool dst_pageable = dst_where == -2, src_pageable = src_where == -2;
  /* A captured copy is replayed later: pageable host memory cannot take part (libcudart:
   * "operation not permitted when stream is capturing", the capture invalidated). */
  if (mode == CopyMode::Async && (dst_pageable || src_pageable) && stream_capturing(s)) {
    stream_break_capture(s);
    return fail(cudaErrorStreamCaptureUnsupported,
                fmt("cudasim: %s(%s) with pageable host memory on a capturing stream", fn, kind_name(kind)));
  }
  bool wait = dst_pageable;
  if (mode == CopyMode::Sync && (src_where == -1 || (dst_where < 0 && src_where < 0))) wait = true;
  std::shared_ptr<EventMark> m;
  if (src_pageable && !wait) {
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char *>(src), static_cast<const unsigned char *>(src) + n);
    m = stream_submit(s, [dst, staged, n] { memcpy(dst, staged->data(), n); });
  } else {
    m = stream_submit(s, [dst, src, n] { memmove(dst, src, n); });
  }
  if (wait) mark_wait(m);
  return cudaSuccess;
}

bool device_ok(int d) { return d >= 0 && d < sim_config().devices.load(); }

cudaError_t check_stream(cudaStream_t s, const char *fn) {
  if (stream_is_valid(s)) return cudaSuccess;
  return fail(cudaErrorInvalidResourceHandle, fmt("cudasim: %s: invalid stream %p", fn, (void *)s));
}

/* libcudart refuses "potentially unsafe" calls during a stream capture (this thread's, or
 * another thread's in global mode) and invalidates the capture: code that allocates or
 * waits inside a captured step fails here as on a GPU. */
cudaError_t refuse_during_capture(const char *fn) {
  if (!capture_prohibits_unsafe_call()) return cudaSuccess;
  return fail(cudaErrorStreamCaptureUnsupported,
              fmt("cudasim: %s during a stream capture (not permitted when a stream is capturing)", fn));
}

/* Errors of queued work this thread issued that ran since: they become its pending error. */
void absorb_exec_errors() {
  cudaError_t e;
  std::string msg;
  if (!take_exec_error(&e, &msg)) return;
  tls_last = e;
  tls_pending = e;
  tls_diag = std::move(msg);
  tls_diag_code = e;
}

cudaError_t sync_result() {
  absorb_exec_errors();
  cudaError_t e = tls_pending;
  tls_pending = cudaSuccess;
  if (e != cudaSuccess) tls_last = e;
  return e;
}

}  // namespace

SimConfig &sim_config() {
  static SimConfig *c = make_config();
  return *c;
}

cudaError_t report_launch_error(cudaError_t err, const std::string &msg) {
  if (sim_config().verbose) fprintf(stderr, "%s\n", msg.c_str());
  if (route_exec_error(err, msg)) return err; /* found while running queued work */
  tls_last = err;
  tls_pending = err;
  tls_diag = msg;
  tls_diag_code = err;
  return err;
}

unsigned stream_flags(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return 0;
  std::lock_guard<std::mutex> g(g_mu);
  return g_streams.count(s) ? s->flags : 0;
}

size_t max_dynamic_shared(const void *func) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_smem_limit.find(func);
  return it == g_smem_limit.end() ? kSharedPerBlock : it->second;
}

bool stream_is_valid(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> g(g_mu);
  return g_streams.count(s) != 0;
}

int stream_device(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return tls_device;
  std::lock_guard<std::mutex> g(g_mu);
  return g_streams.count(s) ? s->device : -1;
}

int current_device() { return tls_device; }

int allocation_device(const void *p, size_t n) {
  std::lock_guard<std::mutex> g(g_mu);
  const Alloc *a = find_locked(p, n);
  return a ? a->device : -2;
}

uint64_t allocation_calls() { return g_alloc_calls.load(); }
uint64_t graph_instantiations() { return g_graph_instantiations.load(); }
size_t live_graph_execs() { return (size_t)g_live_graph_execs.load(); }

size_t live_allocations() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_allocs.size();
}

void set_order(Order o, uint64_t s) {
  sim_config().order = o;
  sim_config().seed = s;
}
Order order() { return sim_config().order; }
uint64_t seed() { return sim_config().seed; }
void set_workers(unsigned n) { sim_config().workers = n ? n : 1; }
void set_device_memory(size_t bytes) { sim_config().mem_bytes = bytes; }
void set_device_count(int n) { sim_config().devices = std::min(kMaxDevices, std::max(1, n)); }
const char *last_diagnostic() {
  absorb_exec_errors();
  return tls_diag.c_str();
}
void clear_diagnostic() {
  tls_diag.clear();
  tls_diag_code = cudaSuccess;
}

}  // namespace cudasim

using namespace cudasim;

extern "C" const char *cudasim_last_diagnostic(void) { return last_diagnostic(); }

/* ======================================================================================
 * Errors
 * ====================================================================================== */
/* An error of queued work that already ran counts, as a GPU's asynchronous errors do. */
cudaError_t cudaGetLastError(void) {
  absorb_exec_errors();
  cudaError_t e = tls_last;
  tls_last = cudaSuccess;
  tls_pending = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  absorb_exec_errors();
  return tls_last;
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define N(x) \
  case x: return #x;
    N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation)
    N(cudaErrorInitializationError) N(cudaErrorInvalidConfiguration)
    N(cudaErrorInvalidDevice) N(cudaErrorInvalidMemcpyDirection)
    N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady) N(cudaErrorLaunchFailure)
    N(cudaErrorNoDevice) N(cudaErrorNotSupported) N(cudaErrorIllegalAddress)
    N(cudaErrorPeerAccessAlreadyEnabled) N(cudaErrorInvalidDevicePointer)
    N(cudaErrorStreamCaptureUnsupported) N(cudaErrorStreamCaptureInvalidated) N(cudaErrorIllegalState)
#undef N
    default: return "cudaErrorUnknown";
  }
}

const char *cudaGetErrorString(cudaError_t e) {
  /* The most recent failure on this thread carries the simulator's full diagnostic. */
  absorb_exec_errors();
  if (e != cudaSuccess && e == tls_diag_code && !tls_diag.empty()) return tls_diag.c_str();
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotReady: return "device not ready";
    default: return cudaGetErrorName(e);
  }
}

/* ======================================================================================
 * Devices
 * ====================================================================================== */
cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return fail(cudaErrorInvalidValue, "cudasim: cudaGetDeviceCount(NULL)");
  *count = sim_config().devices;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (!device_ok(device))
    return fail(cudaErrorInvalidDevice, fmt("cudasim: cudaSetDevice(%d): %d devices", device,
                                            sim_config().devices.load()));
  tls_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  if (!device) return fail(cudaErrorInvalidValue, "cudasim: cudaGetDevice(NULL)");
  *device = tls_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
  if (!p) return fail(cudaErrorInvalidValue, "cudasim: cudaGetDeviceProperties(NULL)");
  if (!device_ok(device))
    return fail(cudaErrorInvalidDevice, fmt("cudasim: cudaGetDeviceProperties(%d)", device));
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "cudasim");
  p->totalGlobalMem = sim_config().mem_bytes;
  p->sharedMemPerBlock = kSharedPerBlock;
  p->sharedMemPerBlockOptin = kSharedOptin;
  p->sharedMemPerMultiprocessor = 228 * 1024;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->memoryBusWidth = 5120;
  p->unifiedAddressing = 1;
  p->pciDeviceID = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int device) {
  if (!v) return fail(cudaErrorInvalidValue, "cudasim: cudaDeviceGetAttribute(NULL)");
  if (!device_ok(device))
    return fail(cudaErrorInvalidDevice, fmt("cudasim: cudaDeviceGetAttribute device %d", device));
  switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxBlockDimX: *v = 1024; break;
    case cudaDevAttrMaxBlockDimY: *v = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *v = 64; break;
    case cudaDevAttrMaxGridDimX: *v = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *v = 65535; break;
    case cudaDevAttrMaxGridDimZ: *v = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = int(kSharedPerBlock); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = int(kSharedOptin); break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrL2CacheSize: *v = 50 * 1024 * 1024; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; break;
    case cudaDevAttrUnifiedAddressing: *v = 1; break;
    default:
      return fail(cudaErrorInvalidValue,
                  fmt("cudasim: cudaDeviceGetAttribute: attribute %d not simulated", int(a)));
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  if (cudaError_t e = refuse_during_capture("cudaDeviceSynchronize")) return e;
  device_sync(tls_device);
  return sync_result();
}
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer) {
  if (!can) return fail(cudaErrorInvalidValue, "cudasim: cudaDeviceCanAccessPeer(NULL)");
  if (!device_ok(device) || !device_ok(peer))
    return fail(cudaErrorInvalidDevice, "cudasim: cudaDeviceCanAccessPeer: bad device");
  *can = device != peer;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int) {
  if (!device_ok(peer)) return fail(cudaErrorInvalidDevice, "cudasim: cudaDeviceEnablePeerAccess");
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || size_t(value) > kSharedOptin)
      return fail(cudaErrorInvalidValue,
                  fmt("cudasim: cudaFuncSetAttribute: %d bytes of dynamic shared memory > %zu",
                      value, kSharedOptin));
    std::lock_guard<std::mutex> g(g_mu);
    g_smem_limit[func] = size_t(value);
  }
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
  if (v) *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
  if (v) *v = CUDART_VERSION;
  return cudaSuccess;
}

/* ======================================================================================
 * Memory
 * ====================================================================================== */
cudaError_t cudaMalloc(void **p, size_t size) {
  if (cudaError_t e = refuse_during_capture("cudaMalloc")) return e;
  return alloc(p, size, tls_device);
}
/* As libcudart, freeing synchronises the allocation's device: its queued work runs first
 * (not other devices': a rank thread's free must not wait on a peer's pending receive). */
cudaError_t cudaFree(void *p) {
  if (cudaError_t e = refuse_during_capture("cudaFree")) return e;
  if (p) {
    const int d = allocation_device(p, 0);
    if (d >= 0) device_sync(d);
  }
  return release(p, false);
}
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
  if (cudaError_t e = check_stream(s, "cudaMallocAsync")) return e;
  return alloc(p, size, tls_device);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  if (cudaError_t e = check_stream(s, "cudaFreeAsync")) return e;
  if (!p) return cudaSuccess;
  if (allocation_device(p, 0) < 0)
    return fail(cudaErrorInvalidValue, fmt("cudasim: cudaFreeAsync(%p): not a pointer returned by cudaMalloc", p));
  stream_submit(s, [p] { release(p, false); });
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t size) {
  if (cudaError_t e = refuse_during_capture("cudaMallocHost")) return e;
  return alloc(p, size, -1);
}
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int) {
  if (cudaError_t e = refuse_during_capture("cudaHostAlloc")) return e;
  return alloc(p, size, -1);
}
cudaError_t cudaFreeHost(void *p) {
  if (cudaError_t e = refuse_during_capture("cudaFreeHost")) return e;
  if (p) device_sync(-1);
  return release(p, true);
}
cudaError_t cudaHostRegister(void *, size_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaHostUnregister(void *) { return cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
  const size_t cap = sim_config().mem_bytes;
  std::lock_guard<std::mutex> g(g_mu);
  const size_t used = g_used[tls_device];
  if (free_b) *free_b = cap - std::min(cap, used);
  if (total) *total = cap;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  if (cudaError_t e = refuse_during_capture("cudaMemcpy")) return e;
  if (cudaError_t e = copy(dst, src, n, kind, "cudaMemcpy", nullptr, CopyMode::Sync)) return e;
  return sync_result();
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
  if (cudaError_t e = check_stream(s, "cudaMemcpyAsync")) return e;
  return copy(dst, src, n, kind, "cudaMemcpyAsync", s, CopyMode::Async);
}
cudaError_t cudaMemcpyPeer(void *dst, int, const void *src, int, size_t n) {
  if (cudaError_t e = refuse_during_capture("cudaMemcpyPeer")) return e;
  return copy(dst, src, n, cudaMemcpyDeviceToDevice, "cudaMemcpyPeer", nullptr, CopyMode::Sync);
}
cudaError_t cudaMemcpyPeerAsync(void *dst, int, const void *src, int, size_t n, cudaStream_t s) {
  if (cudaError_t e = check_stream(s, "cudaMemcpyPeerAsync")) return e;
  return copy(dst, src, n, cudaMemcpyDeviceToDevice, "cudaMemcpyPeerAsync", s, CopyMode::Async);
}
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, cudaMemcpyKind kind) {
  if (width > dpitch || width > spitch)
    return fail(cudaErrorInvalidValue, "cudasim: cudaMemcpy2D: width exceeds pitch");
  for (size_t r = 0; r < height; ++r)
    if (cudaError_t e = copy(static_cast<char *>(dst) + r * dpitch,
                             static_cast<const char *>(src) + r * spitch, width, kind,
                             "cudaMemcpy2D", nullptr, CopyMode::Sync))
      return e;
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s) {
  if (cudaError_t e = check_stream(s, "cudaMemcpy2DAsync")) return e;
  if (width > dpitch || width > spitch)
    return fail(cudaErrorInvalidValue, "cudasim: cudaMemcpy2DAsync: width exceeds pitch");
  for (size_t r = 0; r < height; ++r)
    if (cudaError_t e = copy(static_cast<char *>(dst) + r * dpitch,
                             static_cast<const char *>(src) + r * spitch, width, kind,
                             "cudaMemcpy2DAsync", s, CopyMode::Async))
      return e;
  return cudaSuccess;
}
/* __constant__ / __device__ variables are host memory here: the copy waits for the work
 * queued before it (a kernel queued earlier must not see the new value). */
cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset,
                               cudaMemcpyKind) {
  device_sync(-1);
  memcpy(static_cast<char *>(const_cast<void *>(symbol)) + offset, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset,
                                 cudaMemcpyKind) {
  device_sync(-1);
  memcpy(dst, static_cast<const char *>(symbol) + offset, count);
  return cudaSuccess;
}
/* cudaMemset of device memory is asynchronous to the host (legacy stream), as in libcudart. */
cudaError_t cudaMemset(void *p, int value, size_t n) {
  if (n && !device_range_ok(p, n))
    return fail(cudaErrorInvalidValue,
                fmt("cudasim: cudaMemset: [%p, +%zu) is not inside one device allocation", p, n));
  if (n) stream_submit(nullptr, [p, value, n] { memset(p, value, n); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
  if (cudaError_t e = check_stream(s, "cudaMemsetAsync")) return e;
  if (n && !device_range_ok(p, n))
    return fail(cudaErrorInvalidValue,
                fmt("cudasim: cudaMemsetAsync: [%p, +%zu) is not inside one device allocation", p, n));
  if (n) stream_submit(s, [p, value, n] { memset(p, value, n); });
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p) {
  if (!a) return fail(cudaErrorInvalidValue, "cudasim: cudaPointerGetAttributes(NULL)");
  memset(a, 0, sizeof *a);
  std::lock_guard<std::mutex> g(g_mu);
  const Alloc *al = find_locked(p, 0);
  if (!al) {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    a->hostPointer = const_cast<void *>(p);
  } else if (al->device < 0) {
    a->type = cudaMemoryTypeHost;
    a->device = 0;
    a->hostPointer = a->devicePointer = const_cast<void *>(p);
  } else {
    a->type = cudaMemoryTypeDevice;
    a->device = al->device;
    a->devicePointer = const_cast<void *>(p);
  }
  return cudaSuccess;
}

/* ======================================================================================
 * Streams and events (work queued per stream; cudasim_async.cpp)
 * ====================================================================================== */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  if (!s) return fail(cudaErrorInvalidValue, "cudasim: cudaStreamCreate(NULL)");
  *s = new CUstream_st{tls_device, flags};
  std::lock_guard<std::mutex> g(g_mu);
  g_streams.insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::mutex> g(g_mu);
  if (!s || !g_streams.erase(s)) {
    tls_last = tls_diag_code = cudaErrorInvalidResourceHandle;
    tls_diag = "cudasim: cudaStreamDestroy: invalid stream";
    return cudaErrorInvalidResourceHandle;
  }
  stream_forget(s);
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (cudaError_t e = check_stream(s, "cudaStreamSynchronize")) return e;
  if (stream_capturing(s)) {
    stream_break_capture(s);
    return fail(cudaErrorStreamCaptureUnsupported, "cudasim: cudaStreamSynchronize on a capturing stream");
  }
  stream_sync(s);
  return sync_result();
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (cudaError_t e = check_stream(s, "cudaStreamQuery")) return e;
  if (stream_capturing(s)) {
    stream_break_capture(s);
    return fail(cudaErrorStreamCaptureUnsupported, "cudasim: cudaStreamQuery on a capturing stream");
  }
  return stream_query(s) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int) {
  if (cudaError_t e = check_stream(s, "cudaStreamWaitEvent")) return e;
  std::shared_ptr<EventMark> m;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!g_events.count(ev)) {
      tls_last = tls_diag_code = cudaErrorInvalidResourceHandle;
      tls_diag = "cudasim: cudaStreamWaitEvent: invalid event";
      return cudaErrorInvalidResourceHandle;
    }
    m = ev->mark;
  }
  /* Later work on s starts only once the recorded point of the event's stream has run. */
  if (m) stream_submit(s, [] {}, false, m);
  return cudaSuccess;
}

static CUevent_st *find_event(cudaEvent_t e) {
  std::lock_guard<std::mutex> g(g_mu);
  return g_events.count(e) ? e : nullptr;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  if (!e) return fail(cudaErrorInvalidValue, "cudasim: cudaEventCreate(NULL)");
  *e = new CUevent_st{tls_device, flags, false, nullptr};
  std::lock_guard<std::mutex> g(g_mu);
  g_events.insert(*e);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  std::lock_guard<std::mutex> g(g_mu);
  if (!e || !g_events.erase(e)) {
    tls_last = tls_diag_code = cudaErrorInvalidResourceHandle;
    tls_diag = "cudasim: cudaEventDestroy: invalid event";
    return cudaErrorInvalidResourceHandle;
  }
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (cudaError_t r = check_stream(s, "cudaEventRecord")) return r;
  CUevent_st *ev = find_event(e);
  if (!ev) return fail(cudaErrorInvalidResourceHandle, "cudasim: cudaEventRecord: invalid event");
  /* As libcudart: an event records only on a stream of the device it was created on. */
  if (const int sd = stream_device(s); sd != ev->device)
    return fail(cudaErrorInvalidResourceHandle,
                fmt("cudasim: cudaEventRecord: event of device %d recorded on a stream of device %d",
                    ev->device, sd));
  ev->mark = stream_mark(s);
  ev->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  CUevent_st *ev = find_event(e);
  if (!ev)
    return fail(cudaErrorInvalidResourceHandle, "cudasim: cudaEventSynchronize: invalid event");
  mark_wait(ev->mark);
  return sync_result();
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  CUevent_st *ev = find_event(e);
  if (!ev) return fail(cudaErrorInvalidResourceHandle, "cudasim: cudaEventQuery: invalid event");
  return mark_query(ev->mark) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  CUevent_st *ea = find_event(a), *eb = find_event(b);
  if (!ms || !ea || !eb)
    return fail(cudaErrorInvalidResourceHandle, "cudasim: cudaEventElapsedTime: invalid event");
  if ((ea->flags | eb->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle,
                "cudasim: cudaEventElapsedTime: event created with cudaEventDisableTiming");
  if (!ea->recorded || !eb->recorded)
    return fail(cudaErrorInvalidResourceHandle,
                "cudasim: cudaEventElapsedTime: event not recorded");
  if (!mark_done(ea->mark) || !mark_done(eb->mark)) return cudaErrorNotReady;
  const double ta = mark_time(ea->mark), tb = mark_time(eb->mark);
  *ms = static_cast<float>(tb - ta);
  return cudaSuccess;
}

/* ======================================================================================
 * Stream capture and graphs: one stream's work recorded (kernels with their arguments,
 * copies, memsets, cuBLAS calls) and replayed as one queued operation per launch. Work that
 * cannot be replayed here (NCCL, event waits, a copy with pageable host memory), a
 * synchronisation or query of the capturing stream, or a "potentially unsafe" call during
 * the capture (cudaMalloc/Free[Host], cudaMemcpy, cudaDeviceSynchronize: refused with
 * cudaErrorStreamCaptureUnsupported on the capturing thread, and on every thread while a
 * global-mode capture runs) invalidates the capture (cudaStreamEndCapture:
 * cudaErrorStreamCaptureInvalidated).
 * ====================================================================================== */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  if (cudaError_t e = check_stream(s, "cudaStreamBeginCapture")) return e;
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue, fmt("cudasim: cudaStreamBeginCapture: mode %d", int(mode)));
  if (!stream_begin_capture(s, int(mode)))
    return fail(cudaErrorIllegalState, "cudasim: cudaStreamBeginCapture: the legacy stream, or already capturing");
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  if (cudaError_t e = check_stream(s, "cudaStreamEndCapture")) return e;
  if (!graph) return fail(cudaErrorInvalidValue, "cudasim: cudaStreamEndCapture(NULL graph)");
  *graph = nullptr;
  bool broken = false;
  std::shared_ptr<std::vector<StreamTask>> tasks = stream_end_capture(s, &broken);
  if (!tasks) return fail(cudaErrorIllegalState, "cudasim: cudaStreamEndCapture: the stream is not capturing");
  if (broken)
    return fail(cudaErrorStreamCaptureInvalidated,
                "cudasim: cudaStreamEndCapture: the capture was invalidated (a synchronisation, an NCCL "
                "operation or an event wait on the capturing stream)");
  *graph = new CUgraph_st{std::move(tasks)};
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
  if (cudaError_t e = check_stream(s, "cudaStreamIsCapturing")) return e;
  if (!status) return fail(cudaErrorInvalidValue, "cudasim: cudaStreamIsCapturing(NULL)");
  *status = stream_capturing(s) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long) {
  if (!exec || !graph) return fail(cudaErrorInvalidValue, "cudasim: cudaGraphInstantiate: NULL argument");
  *exec = new CUgraphExec_st{graph->tasks};
  cudasim::g_graph_instantiations.fetch_add(1);
  cudasim::g_live_graph_execs.fetch_add(1);
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (cudaError_t e = check_stream(s, "cudaGraphLaunch")) return e;
  if (!exec) return fail(cudaErrorInvalidValue, "cudasim: cudaGraphLaunch(NULL)");
  std::shared_ptr<std::vector<StreamTask>> tasks = exec->tasks;
  stream_submit(s, [tasks] {
    for (const StreamTask &t : *tasks) t();
  });
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec) cudasim::g_live_graph_execs.fetch_sub(1);
  delete exec; /* a launch already queued keeps the tasks */
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
