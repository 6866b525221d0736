/* cudasim_async.cpp - per-stream task queues for work that waits on another party.
 *
 * A stream gets a queue and a worker thread the first time a task is queued on it (NCCL
 * operations, waits on incomplete events). The worker runs the tasks in order; a task may
 * block (a receive waiting for its send) without blocking the thread that issued it, as on
 * a GPU. Synchronous work issued to the stream later drains the queue first, so the stream
 * order the CUDA programming model promises holds across both kinds of work.
 *
 * The lock and condition variable are never destroyed: detached workers may still wait on
 * them while the process exits.
 */
#include <pthread.h>

#include <new>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "cudasim_internal.h"

namespace cudasim {
namespace {

struct StreamQueue {
  std::deque<StreamTask> tasks;
  uint64_t posted = 0, done = 0; /* tasks queued / finished */
  bool stop = false;             /* the stream was destroyed */
  int device = 0;
};

struct AsyncState {
  std::mutex mu;
  std::condition_variable cv; /* any task finished or was queued */
  std::unordered_map<cudaStream_t, std::shared_ptr<StreamQueue>> created;
  std::map<int, std::shared_ptr<StreamQueue>> defaults; /* per device */
};

AsyncState *g_state = nullptr;

/* fork(): the child has none of the parent's worker threads, so the parent's queues would
 * never run there. The lock is held across the fork (no worker is mid-update) and the child
 * starts with no queues and a new lock; the parent's are leaked in the child on purpose (their tasks may
 * hold objects whose destructors expect threads that do not exist there). */
void before_fork() { g_state->mu.lock(); }
void after_fork_parent() { g_state->mu.unlock(); }
void after_fork_child() {
  /* Fresh lock and condition variable: the parent's workers were waiting on the old one,
   * and a condition variable with waiters that do not exist loses wakeups. */
  new (&g_state->mu) std::mutex();
  new (&g_state->cv) std::condition_variable();
  static auto *orphans = new std::vector<std::shared_ptr<StreamQueue>>();
  for (auto &kv : g_state->created) orphans->push_back(kv.second);
  for (auto &kv : g_state->defaults) orphans->push_back(kv.second);
  g_state->created.clear();
  g_state->defaults.clear();
}

AsyncState &state() {
  static AsyncState *s = [] {
    g_state = new AsyncState(); /* intentionally never destroyed */
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    return g_state;
  }();
  return *s;
}

bool is_default(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

/* Caller holds the lock. */
std::shared_ptr<StreamQueue> find_locked(cudaStream_t s) {
  AsyncState &a = state();
  if (is_default(s)) {
    auto it = a.defaults.find(current_device());
    return it == a.defaults.end() ? nullptr : it->second;
  }
  auto it = a.created.find(s);
  return it == a.created.end() ? nullptr : it->second;
}

void worker(std::shared_ptr<StreamQueue> q) {
  AsyncState &a = state();
  std::unique_lock<std::mutex> lk(a.mu);
  for (;;) {
    a.cv.wait(lk, [&] { return !q->tasks.empty() || q->stop; });
    if (q->tasks.empty()) return;
    StreamTask t = std::move(q->tasks.front());
    q->tasks.pop_front();
    lk.unlock();
    t();
    t = nullptr; /* release what the task captured before reporting it done */
    lk.lock();
    ++q->done;
    a.cv.notify_all();
  }
}

void wait_done(std::unique_lock<std::mutex> &lk, const std::shared_ptr<StreamQueue> &q) {
  const uint64_t target = q->posted;
  state().cv.wait(lk, [&] { return q->done >= target; });
}

}  // namespace

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void stream_enqueue(cudaStream_t s, StreamTask task) {
  AsyncState &a = state();
  std::lock_guard<std::mutex> g(a.mu);
  std::shared_ptr<StreamQueue> q = find_locked(s);
  if (!q) {
    q = std::make_shared<StreamQueue>();
    q->device = is_default(s) ? current_device() : stream_device(s);
    if (is_default(s)) a.defaults[q->device] = q;
    else a.created[s] = q;
    std::thread(worker, q).detach();
  }
  q->tasks.push_back(std::move(task));
  ++q->posted;
  a.cv.notify_all();
}

void stream_drain(cudaStream_t s) {
  AsyncState &a = state();
  std::unique_lock<std::mutex> lk(a.mu);
  if (std::shared_ptr<StreamQueue> q = find_locked(s)) wait_done(lk, q);
}

void device_drain(int device) {
  AsyncState &a = state();
  std::unique_lock<std::mutex> lk(a.mu);
  std::vector<std::shared_ptr<StreamQueue>> qs;
  for (auto &kv : a.created)
    if (kv.second->device == device) qs.push_back(kv.second);
  if (auto it = a.defaults.find(device); it != a.defaults.end()) qs.push_back(it->second);
  for (auto &q : qs) wait_done(lk, q);
}

bool stream_busy(cudaStream_t s) {
  AsyncState &a = state();
  std::lock_guard<std::mutex> g(a.mu);
  std::shared_ptr<StreamQueue> q = find_locked(s);
  return q && q->done < q->posted;
}

void stream_forget(cudaStream_t s) {
  AsyncState &a = state();
  std::lock_guard<std::mutex> g(a.mu);
  auto it = a.created.find(s);
  if (it == a.created.end()) return;
  it->second->stop = true; /* the worker runs what is queued, then exits */
  a.created.erase(it);
  a.cv.notify_all();
}

std::shared_ptr<EventMark> stream_mark(cudaStream_t s) {
  AsyncState &a = state();
  std::shared_ptr<EventMark> m;
  {
    std::lock_guard<std::mutex> g(a.mu);
    std::shared_ptr<StreamQueue> q = find_locked(s);
    if (!q || q->done >= q->posted) return nullptr;
    m = std::make_shared<EventMark>();
  }
  stream_enqueue(s, [m] {
    AsyncState &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    m->t_ms = now_ms();
    m->done = true;
  });
  return m;
}

bool mark_done(const std::shared_ptr<EventMark> &m) {
  if (!m) return true;
  std::lock_guard<std::mutex> g(state().mu);
  return m->done;
}

void mark_wait(const std::shared_ptr<EventMark> &m) {
  if (!m) return;
  std::unique_lock<std::mutex> lk(state().mu);
  state().cv.wait(lk, [&] { return m->done; });
}

}  // namespace cudasim
