/* cudasim_internal.h - shared between the simulator's translation units; not for kernels. */
#ifndef CUDASIM_INTERNAL_H
#define CUDASIM_INTERNAL_H

#include "cudasim.h"

#include <atomic>
#include <functional>
#include <memory>
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

/* ---- asynchronous stream work (cudasim_async.cpp) -------------------------------------
 * Kernels, copies and cuBLAS run synchronously in the calling thread. Work that must wait
 * for another party (an NCCL send or receive, a wait on an event that is not complete yet)
 * is a task queued on its stream and run, in order, by that stream's worker thread. Any
 * synchronous work issued to a stream afterwards first waits for those tasks
 * (stream_drain), so stream order holds: a kernel after a receive reads the received data. */
using StreamTask = std::function<void()>;
/* Queue task on s (a created stream, or the current device's default stream for 0). */
void stream_enqueue(cudaStream_t s, StreamTask task);
/* Block until every task queued on s so far has run (no-op for a stream without tasks). */
void stream_drain(cudaStream_t s);
/* Drain every stream of a device (cudaDeviceSynchronize). */
void device_drain(int device);
/* True while s has queued or running tasks (cudaStreamQuery). */
bool stream_busy(cudaStream_t s);
/* The stream is being destroyed: its worker finishes the queued tasks and exits. */
void stream_forget(cudaStream_t s);

/* Completion flag of an event recorded behind queued tasks. */
struct EventMark {
  bool done = false; /* guarded by the async lock */
  double t_ms = 0;
};
/* Record an event on s: nullptr if s has no pending tasks (the event is complete now),
 * else a mark that completes when the tasks queued before it have run. */
std::shared_ptr<EventMark> stream_mark(cudaStream_t s);
bool mark_done(const std::shared_ptr<EventMark> &m);
void mark_wait(const std::shared_ptr<EventMark> &m);
/* Milliseconds of the steady clock (event times). */
double now_ms();

}  // namespace cudasim

#endif
