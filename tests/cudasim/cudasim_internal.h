/* cudasim_internal.h - shared between the simulator's translation units; not for kernels. */
#ifndef CUDASIM_INTERNAL_H
#define CUDASIM_INTERNAL_H

#include "cudasim.h"

#include <atomic>
#include <string>

namespace cudasim {

struct SimConfig {
  std::atomic<Order> order{Order::Forward};
  std::atomic<uint64_t> seed{1};
  std::atomic<unsigned> workers{1};
  size_t stack_bytes = 256 * 1024; /* per fiber, CUDASIM_STACK_KB */
  std::atomic<int> devices{2};
  std::atomic<size_t> mem_bytes{size_t(4) << 30};
  bool verbose = false; /* CUDASIM_VERBOSE=1: print diagnostics to stderr */
};

/* Read once from the environment on first use. */
SimConfig &sim_config();

/* Set this host thread's last error and diagnostic; returns err. */
cudaError_t report_launch_error(cudaError_t err, const std::string &msg);
/* Dynamic shared memory a launch of func may use (48 KiB unless raised). */
size_t max_dynamic_shared(const void *func);
bool stream_is_valid(cudaStream_t s);
/* The device a stream belongs to (the default streams: the current device); -1 if invalid. */
int stream_device(cudaStream_t s);
/* This host thread's current device (cudaSetDevice). */
int current_device();
/* Where [p, p + n) lives: the device of the one allocation holding it, -1 for pinned host
 * memory, -2 when no single allocation holds it (used by the cuBLAS stand-ins). */
int allocation_device(const void *p, size_t n);

}  // namespace cudasim

#endif
