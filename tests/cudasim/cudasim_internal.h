/* cudasim_internal.h - shared between the simulator's translation units; not for kernels. */
#ifndef CUDASIM_INTERNAL_H
#define CUDASIM_INTERNAL_H

#include "cudasim.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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

/* ---- stream work (cudasim_async.cpp) ---------------------------------------------------
 * Every piece of stream work is an operation queued on its stream and run later, in stream
 * order, interleaved at random (seeded) with the other streams' work unless events, the
 * legacy default stream or a synchronisation order them. See cudasim_async.cpp. */
using StreamTask = std::function<void()>;
/* Completion of one queued operation (an event record, or any op). */
struct EventMark;
/* Queue task on s (a created stream, or the current device's legacy stream for 0). async:
 * the task may block on another party (NCCL) and runs on the stream's worker thread.
 * wait_for: a mark the task must wait for (cudaStreamWaitEvent). Returns the op's mark. */
std::shared_ptr<EventMark> stream_submit(cudaStream_t s, StreamTask task, bool async = false,
                                         const std::shared_ptr<EventMark> &wait_for = nullptr);
/* Run work until everything queued on s so far has run. */
void stream_sync(cudaStream_t s);
/* ... on every stream of a device (-1: of every device). */
void device_sync(int device);
/* Run what can run without waiting; true when everything queued on s so far has run. */
bool stream_query(cudaStream_t s);
/* The stream is being destroyed: its queued work still runs, then the queue goes. */
void stream_forget(cudaStream_t s);
/* A mark behind the work queued on s so far (cudaEventRecord). */
std::shared_ptr<EventMark> stream_mark(cudaStream_t s);
bool mark_query(const std::shared_ptr<EventMark> &m); /* runs what can run, then done? */
void mark_wait(const std::shared_ptr<EventMark> &m);  /* runs work until the mark is done */
bool mark_done(const std::shared_ptr<EventMark> &m);  /* done now? (runs nothing) */
double mark_time(const std::shared_ptr<EventMark> &m);
/* While running an op: hand an error to the host thread that issued it (true), else false. */
bool route_exec_error(cudaError_t err, const std::string &msg);
/* This host thread's pending error from the work it issued, if any (then cleared). */
bool take_exec_error(cudaError_t *err, std::string *msg);
/* Stream creation flags (cudaStreamNonBlocking), 0 for the default streams. */
unsigned stream_flags(cudaStream_t s);
/* Stream capture: while capturing, work submitted to s is recorded (in order) instead of
 * queued; stream_end_capture hands the recorded tasks over (nullptr: s was not capturing;
 * *broken: something that cannot be replayed was issued, or a synchronisation was tried). */
bool stream_begin_capture(cudaStream_t s, int mode /* cudaStreamCaptureMode */);
/* A "potentially unsafe" call (cudaMalloc, cudaFree, a synchronous cudaMemcpy, a device
 * synchronisation...) is refused while this thread captures (global or thread-local mode)
 * or another thread captures in global mode: true, and those captures are invalidated. */
bool capture_prohibits_unsafe_call();
std::shared_ptr<std::vector<StreamTask>> stream_end_capture(cudaStream_t s, bool *broken);
bool stream_capturing(cudaStream_t s);
void stream_break_capture(cudaStream_t s);
/* Milliseconds of the steady clock (event times). */
double now_ms();

}  // namespace cudasim

#endif
