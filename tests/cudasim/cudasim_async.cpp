/* cudasim_async.cpp - stream work as a simulated device runs it: later, in stream order, and
 * interleaved at random between streams unless something orders them.
 *
 * Every piece of stream work (kernel, copy, memset, cuBLAS call, NCCL operation, event
 * record, event wait) is an operation queued on its stream; the call that issued it returns
 * at once, as on a GPU. Operations run when something waits for them (a synchronisation, a
 * copy into pageable host memory, an event query) or when the host has been quiet for a
 * while (the progress thread: a host that waits on a socket for a peer whose progress needs
 * this device still gets it). Whoever runs them picks, at every step, one stream at random
 * (seeded: CUDASIM_STREAM_SEED, cudasim::stream_seed()) among those whose next operation
 * may start:
 *   - the stream is not running an operation (stream order);
 *   - every event the operation waits for (cudaStreamWaitEvent) has completed;
 *   - the legacy default stream: its operations wait for the work issued before them on
 *     every blocking stream of the device, and a blocking stream's operations wait for the
 *     legacy stream's earlier work (streams created with cudaStreamNonBlocking do neither).
 * So a kernel on one stream that reads what an upload on another stream (or on the legacy
 * stream, from a non-blocking one) wrote, with no event between them, sees the upload or
 * not depending on the seed: a missing dependency fails a test instead of passing by luck.
 *
 * Kernels, copies and cuBLAS run in the thread that picked them. Operations that may block
 * until another party acts (NCCL send/receive) run on the stream's own worker thread, and
 * the stream counts as running until they finish; other streams go on meanwhile.
 *
 * An error found while running an operation (a kernel that fails) goes to the host thread
 * that issued it: its next synchronisation, cudaGetLastError or last_diagnostic() reports it.
 *
 * The lock and condition variable are never destroyed: detached workers may still wait on
 * them while the process exits.
 */
#include <pthread.h>
#include <unistd.h>

#include <new>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cudasim_internal.h"

namespace cudasim {

struct EventMark {
  bool done = false; /* guarded by the scheduler lock */
  double t_ms = 0;   /* when it completed */
};

struct ErrSink {
  cudaError_t err = cudaSuccess; /* guarded by the scheduler lock */
  std::string diag;
};

namespace {

struct Op {
  StreamTask fn;
  bool async = false; /* may block on another party: runs on the stream's worker */
  std::shared_ptr<ErrSink> sink;
  std::vector<std::shared_ptr<EventMark>> deps; /* must be done before the op starts */
  std::shared_ptr<EventMark> mark;              /* done when the op has run */
};

struct StreamQueue {
  std::deque<Op> ops;
  bool running = false;  /* an op of this stream is running (stream order) */
  bool legacy = false;   /* the device's legacy default stream */
  bool blocking = false; /* synchronises with the legacy stream */
  bool forgotten = false;
  int device = 0;
  std::shared_ptr<EventMark> tail; /* mark of the last op queued */
  /* stream capture (cudaStreamBeginCapture): work is recorded here instead of queued */
  std::shared_ptr<std::vector<StreamTask>> capture;
  bool capture_broken = false;
  int capture_mode = 0;             /* cudaStreamCaptureMode of the capture */
  std::thread::id capture_thread;   /* the host thread that began it */
  /* async ops: the worker thread runs `handoff` */
  bool has_worker = false, stop = false;
  Op handoff;
  bool handoff_set = false;
};

struct Sched {
  std::mutex mu;
  std::condition_variable cv; /* an op finished, was queued or handed off */
  std::unordered_map<cudaStream_t, std::shared_ptr<StreamQueue>> created;
  std::map<int, std::shared_ptr<StreamQueue>> legacy; /* per device */
  std::vector<std::shared_ptr<StreamQueue>> live;     /* every queue that may hold work */
  std::mt19937_64 rng;
  uint64_t seed = 0;
  double last_activity_ms = 0;
  bool progress_started = false;
  uint64_t choices = 0; /* picks among two or more runnable streams */
};

Sched *g_sched = nullptr;
thread_local std::shared_ptr<ErrSink> tls_sink; /* errors of the work this thread issued */
thread_local ErrSink *tls_exec_sink = nullptr;  /* set while running an op */

uint64_t initial_seed() {
  if (const char *s = getenv("CUDASIM_STREAM_SEED")) return strtoull(s, nullptr, 0);
  /* A new interleaving every run, printed on a failure by the test listener. */
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
}

void before_fork() { g_sched->mu.lock(); }
void after_fork_parent() { g_sched->mu.unlock(); }
void after_fork_child() {
  /* The parent's workers and progress thread do not exist here: fresh lock and condition
   * variable, no queues (the parent's are leaked on purpose: their ops may hold objects
   * whose destructors expect threads that do not exist in the child). */
  new (&g_sched->mu) std::mutex();
  new (&g_sched->cv) std::condition_variable();
  static auto *orphans = new std::vector<std::shared_ptr<StreamQueue>>();
  for (auto &q : g_sched->live) orphans->push_back(q);
  g_sched->created.clear();
  g_sched->legacy.clear();
  g_sched->live.clear();
  g_sched->progress_started = false;
}

Sched &sched() {
  static Sched *s = [] {
    g_sched = new Sched(); /* intentionally never destroyed */
    g_sched->seed = initial_seed();
    g_sched->rng.seed(g_sched->seed);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    return g_sched;
  }();
  return *s;
}

bool is_default(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

/* Caller holds the lock. The queue of s, created on first use. */
std::shared_ptr<StreamQueue> queue_locked(cudaStream_t s) {
  Sched &a = sched();
  if (is_default(s)) {
    const int dev = current_device();
    auto it = a.legacy.find(dev);
    if (it != a.legacy.end()) return it->second;
    auto q = std::make_shared<StreamQueue>();
    q->legacy = true;
    q->device = dev;
    a.legacy[dev] = q;
    a.live.push_back(q);
    return q;
  }
  auto it = a.created.find(s);
  if (it != a.created.end()) return it->second;
  auto q = std::make_shared<StreamQueue>();
  q->device = stream_device(s);
  q->blocking = (stream_flags(s) & cudaStreamNonBlocking) == 0;
  a.created[s] = q;
  a.live.push_back(q);
  return q;
}

/* Caller holds the lock. */
std::shared_ptr<StreamQueue> find_locked(cudaStream_t s) {
  Sched &a = sched();
  if (is_default(s)) {
    auto it = a.legacy.find(current_device());
    return it == a.legacy.end() ? nullptr : it->second;
  }
  auto it = a.created.find(s);
  return it == a.created.end() ? nullptr : it->second;
}

bool runnable(const StreamQueue &q) {
  if (q.running || q.ops.empty()) return false;
  for (const auto &d : q.ops.front().deps)
    if (!d->done) return false;
  return true;
}

/* Caller holds the lock: the op has run. */
void complete_locked(StreamQueue &q, const Op &op) {
  op.mark->done = true;
  op.mark->t_ms = now_ms();
  q.running = false;
  Sched &a = sched();
  if (q.forgotten && q.ops.empty()) {
    q.stop = true;
    for (size_t i = 0; i < a.live.size(); ++i)
      if (a.live[i].get() == &q) {
        a.live.erase(a.live.begin() + static_cast<long>(i));
        break;
      }
  }
  a.cv.notify_all();
}

void worker(std::shared_ptr<StreamQueue> q) {
  Sched &a = sched();
  std::unique_lock<std::mutex> lk(a.mu);
  for (;;) {
    a.cv.wait(lk, [&] { return q->handoff_set || q->stop; });
    if (!q->handoff_set) return;
    Op op = std::move(q->handoff);
    q->handoff_set = false;
    lk.unlock();
    tls_exec_sink = op.sink.get();
    op.fn();
    tls_exec_sink = nullptr;
    op.fn = nullptr; /* release what the task captured before reporting it done */
    lk.lock();
    complete_locked(*q, op);
  }
}

/* Caller holds lk. Runs ops, picked at random among the runnable streams, until done()
 * holds. block: wait for running ops (other threads, workers) when nothing is runnable;
 * else return when nothing is runnable. Returns done(). */
template <class Done>
bool drive_locked(std::unique_lock<std::mutex> &lk, Done done, bool block) {
  Sched &a = sched();
  std::vector<StreamQueue *> ready;
  while (!done()) {
    ready.clear();
    for (auto &q : a.live)
      if (runnable(*q)) ready.push_back(q.get());
    if (ready.empty()) {
      if (!block) return false;
      a.cv.wait(lk);
      continue;
    }
    StreamQueue *q = ready.size() == 1 ? ready[0] : ready[a.rng() % ready.size()];
    if (ready.size() > 1) ++a.choices;
    Op op = std::move(q->ops.front());
    q->ops.pop_front();
    q->running = true;
    if (op.async) {
      q->handoff = std::move(op);
      q->handoff_set = true;
      if (!q->has_worker) {
        q->has_worker = true;
        /* the worker holds the queue alive */
        for (auto &sp : a.live)
          if (sp.get() == q) std::thread(worker, sp).detach();
      }
      a.cv.notify_all();
      continue;
    }
    lk.unlock();
    ErrSink *saved = tls_exec_sink;
    tls_exec_sink = op.sink.get();
    op.fn();
    tls_exec_sink = saved;
    op.fn = nullptr;
    lk.lock();
    complete_locked(*q, op);
  }
  return true;
}

/* The progress thread: when the host has issued nothing for a while, run what can run
 * (a host that waits for a peer over a socket, not for this device, still sees progress). */
void progress() {
  Sched &a = sched();
  std::unique_lock<std::mutex> lk(a.mu);
  for (;;) {
    a.cv.wait_for(lk, std::chrono::milliseconds(5));
    if (now_ms() - a.last_activity_ms < 20.0) continue;
    drive_locked(lk, [] { return false; }, false);
  }
}

std::shared_ptr<ErrSink> my_sink() {
  if (!tls_sink) tls_sink = std::make_shared<ErrSink>();
  return tls_sink;
}

}  // namespace

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::shared_ptr<EventMark> stream_submit(cudaStream_t s, StreamTask task, bool async,
                                         const std::shared_ptr<EventMark> &wait_for) {
  Sched &a = sched();
  std::shared_ptr<ErrSink> sink = my_sink();
  std::lock_guard<std::mutex> g(a.mu);
  std::shared_ptr<StreamQueue> q = queue_locked(s);
  if (q->capture) {
    /* Recorded for the graph; an operation that may block on another party (NCCL) or wait
     * for an event cannot be replayed here: the capture is invalidated. */
    if (async || wait_for) q->capture_broken = true;
    else q->capture->push_back(std::move(task));
    auto done = std::make_shared<EventMark>();
    done->done = true;
    return done;
  }
  Op op;
  op.fn = std::move(task);
  op.async = async;
  op.sink = std::move(sink);
  op.mark = std::make_shared<EventMark>();
  if (wait_for && !wait_for->done) op.deps.push_back(wait_for);
  /* The legacy default stream's implicit synchronisation with blocking streams. */
  if (q->legacy) {
    for (auto &o : a.live)
      if (o->blocking && o->device == q->device && o->tail && !o->tail->done)
        op.deps.push_back(o->tail);
  } else if (q->blocking) {
    auto it = a.legacy.find(q->device);
    if (it != a.legacy.end() && it->second->tail && !it->second->tail->done)
      op.deps.push_back(it->second->tail);
  }
  q->tail = op.mark;
  std::shared_ptr<EventMark> m = op.mark;
  q->ops.push_back(std::move(op));
  a.last_activity_ms = now_ms();
  if (!a.progress_started) {
    a.progress_started = true;
    std::thread(progress).detach();
  }
  a.cv.notify_all();
  return m;
}

void stream_sync(cudaStream_t s) {
  Sched &a = sched();
  std::unique_lock<std::mutex> lk(a.mu);
  std::shared_ptr<StreamQueue> q = find_locked(s);
  if (!q || !q->tail) return;
  std::shared_ptr<EventMark> t = q->tail;
  drive_locked(lk, [&] { return t->done; }, true);
}

void device_sync(int device) {
  Sched &a = sched();
  std::unique_lock<std::mutex> lk(a.mu);
  std::vector<std::shared_ptr<EventMark>> tails;
  for (auto &q : a.live)
    if ((device < 0 || q->device == device) && q->tail) tails.push_back(q->tail);
  drive_locked(lk, [&] {
    for (auto &t : tails)
      if (!t->done) return false;
    return true;
  }, true);
}

bool stream_query(cudaStream_t s) {
  Sched &a = sched();
  std::unique_lock<std::mutex> lk(a.mu);
  std::shared_ptr<StreamQueue> q = find_locked(s);
  if (!q || !q->tail) return true;
  std::shared_ptr<EventMark> t = q->tail;
  return drive_locked(lk, [&] { return t->done; }, false);
}

void stream_forget(cudaStream_t s) {
  Sched &a = sched();
  std::lock_guard<std::mutex> g(a.mu);
  auto it = a.created.find(s);
  if (it == a.created.end()) return;
  std::shared_ptr<StreamQueue> q = it->second;
  a.created.erase(it);
  q->forgotten = true; /* queued work still runs; the queue goes when it is empty */
  if (q->ops.empty() && !q->running) {
    q->stop = true;
    for (size_t i = 0; i < a.live.size(); ++i)
      if (a.live[i] == q) {
        a.live.erase(a.live.begin() + static_cast<long>(i));
        break;
      }
  }
  a.cv.notify_all();
}

std::shared_ptr<EventMark> stream_mark(cudaStream_t s) {
  return stream_submit(s, [] {}, false, nullptr);
}

bool mark_query(const std::shared_ptr<EventMark> &m) {
  if (!m) return true;
  std::unique_lock<std::mutex> lk(sched().mu);
  return drive_locked(lk, [&] { return m->done; }, false);
}

void mark_wait(const std::shared_ptr<EventMark> &m) {
  if (!m) return;
  std::unique_lock<std::mutex> lk(sched().mu);
  drive_locked(lk, [&] { return m->done; }, true);
}

bool mark_done(const std::shared_ptr<EventMark> &m) {
  if (!m) return true;
  std::lock_guard<std::mutex> g(sched().mu);
  return m->done;
}

double mark_time(const std::shared_ptr<EventMark> &m) {
  std::lock_guard<std::mutex> g(sched().mu);
  return m ? m->t_ms : 0.0;
}

bool route_exec_error(cudaError_t err, const std::string &msg) {
  ErrSink *s = tls_exec_sink;
  if (!s) return false;
  std::lock_guard<std::mutex> g(sched().mu);
  s->err = err;
  s->diag = msg;
  return true;
}

bool take_exec_error(cudaError_t *err, std::string *msg) {
  if (!tls_sink) return false;
  std::lock_guard<std::mutex> g(sched().mu);
  if (tls_sink->err == cudaSuccess) return false;
  *err = tls_sink->err;
  *msg = std::move(tls_sink->diag);
  tls_sink->err = cudaSuccess;
  tls_sink->diag.clear();
  return true;
}

bool stream_begin_capture(cudaStream_t s, int mode) {
  if (is_default(s)) return false;
  Sched &a = sched();
  std::lock_guard<std::mutex> g(a.mu);
  std::shared_ptr<StreamQueue> q = queue_locked(s);
  if (q->capture) return false;
  q->capture = std::make_shared<std::vector<StreamTask>>();
  q->capture_broken = false;
  q->capture_mode = mode;
  q->capture_thread = std::this_thread::get_id();
  return true;
}

bool capture_prohibits_unsafe_call() {
  Sched &a = sched();
  std::lock_guard<std::mutex> g(a.mu);
  const std::thread::id me = std::this_thread::get_id();
  bool prohibited = false;
  for (auto &kv : a.created) {
    StreamQueue &q = *kv.second;
    if (!q.capture) continue;
    /* this thread's own capture (global or thread-local), or another thread's global one */
    const bool mine = q.capture_thread == me && q.capture_mode != cudaStreamCaptureModeRelaxed;
    const bool global = q.capture_thread != me && q.capture_mode == cudaStreamCaptureModeGlobal;
    if (mine || global) {
      q.capture_broken = true; /* as libcudart: the refused call invalidates the capture */
      prohibited = true;
    }
  }
  return prohibited;
}

std::shared_ptr<std::vector<StreamTask>> stream_end_capture(cudaStream_t s, bool *broken) {
  Sched &a = sched();
  std::lock_guard<std::mutex> g(a.mu);
  std::shared_ptr<StreamQueue> q = find_locked(s);
  *broken = false;
  if (!q || !q->capture) return nullptr;
  std::shared_ptr<std::vector<StreamTask>> tasks = std::move(q->capture);
  q->capture = nullptr;
  *broken = q->capture_broken;
  return tasks;
}

bool stream_capturing(cudaStream_t s) {
  Sched &a = sched();
  std::lock_guard<std::mutex> g(a.mu);
  std::shared_ptr<StreamQueue> q = find_locked(s);
  return q && q->capture;
}

void stream_break_capture(cudaStream_t s) {
  Sched &a = sched();
  std::lock_guard<std::mutex> g(a.mu);
  if (std::shared_ptr<StreamQueue> q = find_locked(s); q && q->capture) q->capture_broken = true;
}

uint64_t stream_seed() { return sched().seed; }
uint64_t stream_choices() {
  std::lock_guard<std::mutex> g(sched().mu);
  return sched().choices;
}
void set_stream_seed(uint64_t seed) {
  Sched &a = sched();
  std::lock_guard<std::mutex> g(a.mu);
  a.seed = seed;
  a.rng.seed(seed);
}

}  // namespace cudasim
