/* cudasim_exec.cpp - kernel execution: fibers, the block scheduler, barriers and warp
 * exchanges, the pool of OS threads that runs blocks, and launch-error reporting.
 *
 * Model. A launch runs every block. A block runs on one OS thread; its threads are fibers
 * switched by a hand-written x86-64 context switch (callee-saved registers + rsp). Fibers
 * switch directly to each other: a fiber that reaches a barrier, a warp intrinsic or its
 * end hands over to the next runnable fiber of the run queue. A warp group is released as
 * soon as every lane its mask names waits at the same intrinsic: its values are exchanged
 * and its fibers re-enter the run queue (at random positions among the pending fibers in
 * random order), without waiting for the other warps - so a shared-memory race between
 * warps that only warp intrinsics separate shows up as it does on a GPU. When the queue is
 * empty no fiber is runnable: if every thread waits at the same __syncthreads the barrier
 * opens; anything else is a divergent barrier, a mask that names an exited lane, an invalid
 * exchange or a deadlock: reported, the block abandoned, the launch failed. A barrier
 * releases the block in the selected order (forward, reverse, seeded random).
 */
#include "cudasim.h"
#include "cudasim_internal.h"

#include <elf.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <new>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

__thread uint3 cudasim_tls_threadIdx;
__thread uint3 cudasim_tls_blockIdx;
__thread uint3 cudasim_tls_blockDim;
__thread uint3 cudasim_tls_gridDim;

namespace cudasim {
namespace detail {
__thread unsigned char *tls_dynamic_shared;
}
}  // namespace cudasim

/* ======================================================================================
 * Context switch
 * ====================================================================================== */
#if !defined(__x86_64__)
#error "cudasim: the fiber context switch is written for x86-64"
#endif

extern "C" void cudasim_switch(void **save_sp, void *next_sp);
extern "C" void cudasim_fiber_trampoline();

/* cudasim_switch(save, next): push the callee-saved registers, store rsp in *save, load
 * next, pop its registers and return into it. A fresh fiber's stack is laid out so that
 * this "return" enters the trampoline with the Fiber* in r12. */
asm(R"(
.text
.globl cudasim_switch
.type cudasim_switch,@function
cudasim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size cudasim_switch,.-cudasim_switch

.globl cudasim_fiber_trampoline
.type cudasim_fiber_trampoline,@function
cudasim_fiber_trampoline:
  movq %r12, %rdi
  call cudasim_fiber_main
  ud2
.size cudasim_fiber_trampoline,.-cudasim_fiber_trampoline
.section .note.GNU-stack,"",@progbits
.text
)");

namespace cudasim {
namespace {

/* ======================================================================================
 * Fibers and per-OS-thread workers
 * ====================================================================================== */
enum class St : uint8_t { Runnable, Barrier, Warp, Exited };

struct Fiber {
  void *sp = nullptr;
  uint3 tid{};
  unsigned linear = 0; /* x + y*Dx + z*Dx*Dy */
  St st = St::Runnable;
  /* wait details */
  const char *file = nullptr;
  int line = 0;
  int bar_kind = 0, pred = 0;
  detail::WarpKind wkind = detail::WarpKind::Sync;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0, width = 32;
  uint64_t result = 0;
  unsigned char *stack_lo = nullptr; /* usable stack (above the guard page) */
};

struct Launch;

struct Worker {
  /* fiber stacks: one mapping, a guard page below each stack */
  unsigned char *map = nullptr;
  size_t map_len = 0, stack_size = 0;
  unsigned n_stacks = 0;
  std::vector<Fiber> fibers;
  std::vector<unsigned> queue; /* run queue (indices into fibers), consumed from qhead */
  size_t qhead = 0;
  std::vector<uint32_t> warp_waiting; /* per warp: lanes waiting at a warp intrinsic */
  std::vector<unsigned> scratch;
  void *native_sp = nullptr;
  std::vector<unsigned char> dyn_smem;
  /* this OS thread's static __shared__ arrays (static_shared_regions), poisoned per block */
  std::vector<std::pair<unsigned char *, size_t>> static_smem;
  bool static_smem_ready = false;
  /* current block */
  const Launch *launch = nullptr;
  const char *kname = nullptr;
  uint3 bid{};
  unsigned nthreads = 0;
  bool failed = false;
  std::string diag;
  uint64_t rng = 0;
  unsigned cur = 0;

  ~Worker() {
    if (map) munmap(map, map_len);
  }
};

thread_local Worker tls_worker;

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
/* Guard below each fiber stack: large enough that a big frame cannot jump over it. */
size_t guard_size() { return 16 * page_size(); }

/* A fiber that overflows its stack faults on its guard page. The handler runs on an
 * alternate signal stack, names the kernel, block and thread, then lets the fault recur
 * with the previous disposition (a crash with a clear cause, not a silent corruption). */
struct sigaction g_old_segv;
std::once_flag g_segv_once;

void segv_handler(int sig, siginfo_t *si, void *) {
  Worker &w = tls_worker;
  const uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(w.map);
  if (w.map && a >= lo && a < lo + w.map_len) {
    const size_t stride = w.stack_size + guard_size();
    const size_t i = (a - lo) / stride;
    if ((a - lo) % stride < guard_size() && i < w.fibers.size() && w.kname) {
      char buf[512];
      const uint3 t = w.fibers[i].tid;
      const int len = snprintf(buf, sizeof buf,
                               "cudasim: fiber stack overflow in kernel %s, block (%u,%u,%u) "
                               "thread (%u,%u,%u): %zu KiB per thread (set CUDASIM_STACK_KB)\n",
                               w.kname, w.bid.x, w.bid.y, w.bid.z, t.x, t.y, t.z,
                               w.stack_size / 1024);
      if (len > 0) {
        ssize_t wr = write(2, buf, static_cast<size_t>(std::min(len, int(sizeof buf) - 1)));
        (void)wr;
      }
    }
  }
  sigaction(sig, &g_old_segv, nullptr); /* returning re-executes the fault: default action */
}

void install_overflow_handler() {
  /* alternate stack for this thread: the faulting fiber's stack is unusable. A stack the
   * thread already has is kept: a sanitizer unmaps the one it finds when the thread exits,
   * so replacing its own breaks every host thread that launched a kernel and then ends. */
  stack_t cur{};
  const bool has_one = sigaltstack(nullptr, &cur) == 0 && !(cur.ss_flags & SS_DISABLE) && cur.ss_size >= 16 * 1024;
  if (!has_one) {
    static thread_local std::vector<unsigned char> alt(64 * 1024);
    stack_t ss{};
    ss.ss_sp = alt.data();
    ss.ss_size = alt.size();
    sigaltstack(&ss, nullptr);
  }
  std::call_once(g_segv_once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
  });
}

bool ensure_stacks(Worker &w, unsigned n) {
  const size_t want = sim_config().stack_bytes;
  n = std::max(n, 256u);
  if (w.map && w.n_stacks >= n && w.stack_size == want) return true;
  if (w.map) munmap(w.map, w.map_len);
  w.map = nullptr;
  const size_t pg = guard_size();
  const size_t stride = want + pg;
  const size_t len = stride * n;
  void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) return false;
  install_overflow_handler();
  w.map = static_cast<unsigned char *>(m);
  w.map_len = len;
  w.stack_size = want;
  w.n_stacks = n;
  w.fibers.assign(n, Fiber{});
  for (unsigned i = 0; i < n; ++i) {
    unsigned char *base = w.map + stride * i;
    mprotect(base, pg, PROT_NONE); /* guard pages: an overflow faults here */
    w.fibers[i].stack_lo = base + pg;
  }
  return true;
}

/* ======================================================================================
 * Launch state shared by the workers of one launch
 * ====================================================================================== */
struct Launch {
  detail::Thunk thunk;
  dim3 grid, block;
  size_t shmem = 0;
  uint64_t nblocks = 0;
  unsigned nthreads = 0;
  Order order = Order::Forward;
  uint64_t seed = 0, serial = 0;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> abort{false};
  std::mutex err_mu;
  uint64_t err_block = UINT64_MAX;
  std::string err_msg;
};

uint64_t splitmix(uint64_t &s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string where(const Worker &w, const Fiber &f) {
  return fmt("block (%u,%u,%u) thread (%u,%u,%u)", w.bid.x, w.bid.y, w.bid.z, f.tid.x, f.tid.y,
             f.tid.z);
}

const char *kind_name(detail::WarpKind k) {
  switch (k) {
    case detail::WarpKind::Sync: return "__syncwarp";
    case detail::WarpKind::ShflIdx: return "__shfl_sync";
    case detail::WarpKind::ShflUp: return "__shfl_up_sync";
    case detail::WarpKind::ShflDown: return "__shfl_down_sync";
    case detail::WarpKind::ShflXor: return "__shfl_xor_sync";
    case detail::WarpKind::Ballot: return "__ballot_sync";
    case detail::WarpKind::Any: return "__any_sync";
    case detail::WarpKind::All: return "__all_sync";
  }
  return "?";
}

/* Append fibers (indices) to the run queue in the launch's order (a whole block at its
 * start or when a barrier opens: the queue is empty then). */
void enqueue(Worker &w, std::vector<unsigned> &ids) {
  switch (w.launch->order) {
    case Order::Forward: break;
    case Order::Reverse: std::reverse(ids.begin(), ids.end()); break;
    case Order::Random:
      for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[splitmix(w.rng) % i]);
      break;
  }
  w.queue.insert(w.queue.end(), ids.begin(), ids.end());
}

/* Queue a released warp group while other fibers are pending: at the end, in lane order
 * (forward) or reverse lane order (reverse); in random order the group, its lanes shuffled,
 * goes in as one run at the front of the pending fibers (half the time) or at a uniformly
 * random position among them - so a warp may run several warp steps ahead of the others,
 * or fall behind them, as warps do on a GPU. */
void enqueue_released(Worker &w, std::vector<unsigned> &ids) {
  if (w.qhead >= 4096 && w.qhead * 2 >= w.queue.size()) { /* drop the consumed prefix */
    w.queue.erase(w.queue.begin(), w.queue.begin() + static_cast<std::ptrdiff_t>(w.qhead));
    w.qhead = 0;
  }
  size_t at = w.queue.size();
  if (w.launch->order == Order::Random) {
    /* half the time the warp keeps running (ahead of the others), else anywhere */
    const uint64_t r = splitmix(w.rng);
    at = (r & 1) ? w.qhead : w.qhead + (r >> 1) % (at - w.qhead + 1);
  }
  enqueue(w, ids);
  if (at != w.queue.size() - ids.size())
    std::rotate(w.queue.begin() + static_cast<std::ptrdiff_t>(at),
                w.queue.end() - static_cast<std::ptrdiff_t>(ids.size()), w.queue.end());
}

void fail(Worker &w, const std::string &msg) {
  w.failed = true;
  w.diag = msg;
}

/* The block is abandoned (w.diag set): back to the OS thread, never resumed. */
[[noreturn]] void abandon(Worker &w, Fiber &self) {
  cudasim_switch(&self.sp, w.native_sp);
  __builtin_unreachable();
}

/* Compute the results of the complete warp group of mask m in the warp at base (every
 * named lane waits at the same intrinsic with mask m). Returns false with *err set if the
 * exchange is invalid (bad width, a read of a lane outside the mask). */
bool exchange(Worker &w, unsigned base, unsigned m, std::string *err) {
  const unsigned lanes = std::min(32u, w.nthreads - base);
  uint32_t ballot = 0;
  for (unsigned j = 0; j < 32; ++j)
    if ((m >> j & 1u) && w.fibers[base + j].value) ballot |= 1u << j;
  for (unsigned j = 0; j < 32; ++j) {
    if (!(m >> j & 1u)) continue;
    Fiber &g = w.fibers[base + j];
    const int width = g.width;
    if (g.wkind >= detail::WarpKind::ShflIdx && g.wkind <= detail::WarpKind::ShflXor &&
        (width <= 0 || width > 32 || (width & (width - 1)))) {
      *err = fmt("%s: %s at %s:%d with width %d (must be a power of two <= 32)",
                 where(w, g).c_str(), kind_name(g.wkind), g.file, g.line, width);
      return false;
    }
    const int seg = static_cast<int>(j) & ~(width - 1);
    int src = -1; /* -1: own value */
    switch (g.wkind) {
      case detail::WarpKind::ShflIdx: src = seg + (g.arg & (width - 1)); break;
      case detail::WarpKind::ShflUp:
        src = (static_cast<int>(j) - seg) >= g.arg ? static_cast<int>(j) - g.arg : -1;
        break;
      case detail::WarpKind::ShflDown:
        src = (static_cast<int>(j) - seg) + g.arg < width ? static_cast<int>(j) + g.arg : -1;
        break;
      case detail::WarpKind::ShflXor:
        src = static_cast<int>(j) ^ g.arg;
        if (src >= seg + width || src < 0 || src > 31) src = -1;
        break;
      default: break;
    }
    switch (g.wkind) {
      case detail::WarpKind::Sync: g.result = 0; break;
      case detail::WarpKind::Ballot: g.result = ballot; break;
      case detail::WarpKind::Any: g.result = ballot != 0; break;
      case detail::WarpKind::All: g.result = ballot == m; break;
      default:
        if (src < 0 || src == static_cast<int>(j)) {
          g.result = g.value;
        } else if (m >> src & 1u) {
          g.result = w.fibers[base + static_cast<unsigned>(src)].value;
        } else {
          const unsigned s = static_cast<unsigned>(src);
          const char *why = s >= lanes ? "does not exist"
                            : w.fibers[base + s].st == St::Exited ? "has exited"
                                                                  : "is not in the mask";
          *err = fmt("%s: %s at %s:%d (mask 0x%08x) reads lane %d, which %s",
                     where(w, g).c_str(), kind_name(g.wkind), g.file, g.line, m, src, why);
          return false;
        }
    }
  }
  return true;
}

/* Fiber f (lane l of the warp at base) has just reached a warp intrinsic. If it names
 * itself and only lanes that exist (else: fail), and every lane its mask names now waits at
 * the same intrinsic with the same mask, the group exchanges and its fibers are released
 * into the run queue; other warps are not waited for. An incomplete group waits; so does a
 * group whose exchange is invalid: the queue runs dry with it waiting, and
 * diagnose_warps reports it then (when lanes that will exit have exited). */
void warp_arrive(Worker &w, Fiber &f) {
  const unsigned base = f.linear & ~31u, l = f.linear & 31u;
  const unsigned lanes = std::min(32u, w.nthreads - base);
  const unsigned m = f.mask;
  if (!(m >> l & 1u)) {
    fail(w, fmt("%s: %s called at %s:%d with mask 0x%08x that does not include its own lane %u",
                where(w, f).c_str(), kind_name(f.wkind), f.file, f.line, m, l));
    abandon(w, f);
  }
  if (lanes < 32 && (m >> lanes) != 0) {
    const unsigned j = static_cast<unsigned>(__builtin_ctz(m >> lanes)) + lanes;
    fail(w, fmt("%s: %s at %s:%d with mask 0x%08x names lane %u, which does not exist "
                "(block has %u threads)",
                where(w, f).c_str(), kind_name(f.wkind), f.file, f.line, m, j, w.nthreads));
    abandon(w, f);
  }
  uint32_t &waiting = w.warp_waiting[base >> 5];
  waiting |= 1u << l;
  if ((waiting & m) != m) return;
  for (unsigned j = 0; j < 32; ++j) {
    if (!(m >> j & 1u)) continue;
    const Fiber &g = w.fibers[base + j];
    if (g.mask != m || g.wkind != f.wkind) return; /* that lane waits in another group */
  }
  std::string err;
  if (!exchange(w, base, m, &err)) return;
  waiting &= ~m;
  std::vector<unsigned> &ids = w.scratch;
  ids.clear();
  for (unsigned j = 0; j < 32; ++j)
    if (m >> j & 1u) {
      w.fibers[base + j].st = St::Runnable;
      ids.push_back(base + j);
    }
  enqueue_released(w, ids);
}

/* Nothing is runnable and some fiber waits at a warp intrinsic: name why (a lane of its
 * mask exited, waits at __syncthreads or at another intrinsic; an invalid exchange). */
void diagnose_warps(Worker &w) {
  for (unsigned i = 0; i < w.nthreads; ++i) {
    Fiber &f = w.fibers[i];
    if (f.st != St::Warp) continue;
    const unsigned base = i & ~31u, l = i & 31u, m = f.mask;
    const char *kn = kind_name(f.wkind);
    for (unsigned j = 0; j < 32; ++j) {
      if (!(m >> j & 1u)) continue;
      const Fiber &g = w.fibers[base + j];
      if (g.st == St::Exited) {
        fail(w, fmt("%s: %s at %s:%d with mask 0x%08x names lane %u (thread (%u,%u,%u)), "
                    "which has exited",
                    where(w, f).c_str(), kn, f.file, f.line, m, j, g.tid.x, g.tid.y, g.tid.z));
        return;
      }
      if (g.st == St::Barrier) {
        fail(w, fmt("deadlock: %s waits at %s (%s:%d, mask 0x%08x) for lane %u, which waits "
                    "at __syncthreads (%s:%d)",
                    where(w, f).c_str(), kn, f.file, f.line, m, j, g.file, g.line));
        return;
      }
      if (g.mask != m || g.wkind != f.wkind) {
        fail(w, fmt("%s: mismatched warp intrinsics: lane %u calls %s at %s:%d with mask "
                    "0x%08x, lane %u calls %s at %s:%d with mask 0x%08x",
                    where(w, f).c_str(), l, kn, f.file, f.line, m, j, kind_name(g.wkind),
                    g.file, g.line, g.mask));
        return;
      }
    }
    std::string err;
    if (!exchange(w, base, m, &err)) {
      fail(w, err);
      return;
    }
  }
  for (unsigned i = 0; i < w.nthreads; ++i) {
    const Fiber &f = w.fibers[i];
    if (f.st == St::Warp) {
      fail(w, fmt("deadlock: %s waits at %s (%s:%d, mask 0x%08x)", where(w, f).c_str(),
                  kind_name(f.wkind), f.file, f.line, f.mask));
      return;
    }
  }
}

/* Run queue empty: no fiber is runnable. If every thread waits at the same __syncthreads,
 * the barrier opens; if all have exited the block is done (returns false with !failed);
 * anything else is an error (returns false with failed). */
bool resolve(Worker &w) {
  const Fiber *waiter = nullptr, *exited = nullptr, *other_site = nullptr;
  for (unsigned i = 0; i < w.nthreads; ++i) {
    const Fiber &f = w.fibers[i];
    if (f.st == St::Warp) {
      diagnose_warps(w);
      return false;
    }
    if (f.st == St::Barrier) {
      if (!waiter) waiter = &f;
      else if (!other_site && (f.line != waiter->line || std::strcmp(f.file, waiter->file) != 0))
        other_site = &f;
    } else if (f.st == St::Exited && !exited) {
      exited = &f;
    }
  }
  if (!waiter) return false; /* all exited: block done */
  if (exited) {
    fail(w, fmt("divergent __syncthreads: %s waits at %s:%d but thread (%u,%u,%u) has exited",
                where(w, *waiter).c_str(), waiter->file, waiter->line, exited->tid.x,
                exited->tid.y, exited->tid.z));
    return false;
  }
  if (other_site) {
    fail(w, fmt("divergent __syncthreads: %s waits at %s:%d but thread (%u,%u,%u) waits at %s:%d",
                where(w, *waiter).c_str(), waiter->file, waiter->line, other_site->tid.x,
                other_site->tid.y, other_site->tid.z, other_site->file, other_site->line));
    return false;
  }
  int count = 0, all = 1, any = 0;
  for (unsigned i = 0; i < w.nthreads; ++i) {
    const int p = w.fibers[i].pred != 0;
    count += p;
    all &= p;
    any |= p;
  }
  std::vector<unsigned> &ids = w.scratch;
  ids.resize(w.nthreads);
  for (unsigned i = 0; i < w.nthreads; ++i) {
    Fiber &f = w.fibers[i];
    f.st = St::Runnable;
    f.result = static_cast<uint64_t>(f.bar_kind == 1 ? count : f.bar_kind == 2 ? all : any);
    ids[i] = i;
  }
  enqueue(w, ids);
  return true;
}

void set_builtins(Worker &w, Fiber &f) {
  w.cur = f.linear;
  cudasim_tls_threadIdx = f.tid;
}

/* Leave the current fiber (already marked waiting or exited) for the next runnable one.
 * Returns when this fiber is resumed. */
void schedule_next(Worker &w, Fiber &self) {
  if (w.qhead == w.queue.size()) {
    w.queue.clear();
    w.qhead = 0;
    if (!resolve(w)) {
      cudasim_switch(&self.sp, w.native_sp); /* block finished or failed: never resumed */
      __builtin_unreachable();
    }
  }
  Fiber &next = w.fibers[w.queue[w.qhead++]];
  set_builtins(w, next);
  if (&next != &self) cudasim_switch(&self.sp, next.sp);
  set_builtins(w, self);
}

}  // namespace
}  // namespace cudasim

extern "C" void cudasim_fiber_main(cudasim::Fiber *f) {
  using namespace cudasim;
  Worker &w = tls_worker;
  w.launch->thunk.run(w.launch->thunk.pack.get());
  f->st = St::Exited;
  schedule_next(w, *f);
  __builtin_trap(); /* an exited fiber is never resumed */
}

namespace cudasim {
namespace detail {

int block_barrier(int kind, int pred, const char *file, int line) {
  Worker &w = tls_worker;
  Fiber &f = w.fibers[w.cur];
  f.st = St::Barrier;
  f.bar_kind = kind;
  f.pred = pred;
  f.file = file;
  f.line = line;
  schedule_next(w, f);
  return static_cast<int>(f.result);
}

[[noreturn]] void device_error(const char *msg, const char *file, int line) {
  Worker &w = tls_worker;
  Fiber &f = w.fibers[w.cur];
  fail(w, fmt("%s: %s at %s:%d", where(w, f).c_str(), msg, file, line));
  abandon(w, f);
}

uint64_t warp_op(WarpKind kind, unsigned mask, uint64_t value, int arg, int width,
                 const char *file, int line) {
  Worker &w = tls_worker;
  Fiber &f = w.fibers[w.cur];
  f.st = St::Warp;
  f.wkind = kind;
  f.mask = mask;
  f.value = value;
  f.arg = arg;
  f.width = width;
  f.file = file;
  f.line = line;
  warp_arrive(w, f);
  schedule_next(w, f);
  return f.result;
}

/* ======================================================================================
 * Static __shared__ arrays
 *
 * cudasim.h puts an unused constant `cudasim_shm_mark_<n>` in front of every __shared__
 * declaration. A block-scope static is named _ZZ<function>E<len><name>[_<discriminator>] in
 * the symbol table, so a marker names the function prefix, and the thread_local (STT_TLS)
 * symbols with the same prefix are that function's static shared arrays. Their st_value is
 * the offset in the module's TLS block; dl_iterate_phdr gives each thread's block.
 * ====================================================================================== */
struct StaticShared {
  size_t modid;
  size_t offset;
  size_t size;
};

void scan_static_shared(const char *path, size_t modid, std::vector<StaticShared> &out) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || static_cast<size_t>(sb.st_size) < sizeof(Elf64_Ehdr)) {
    close(fd);
    return;
  }
  const size_t len = static_cast<size_t>(sb.st_size);
  void *map = mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return;
  const unsigned char *m = static_cast<const unsigned char *>(map);
  const Elf64_Ehdr *eh = reinterpret_cast<const Elf64_Ehdr *>(m);
  const bool ok = std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
                  eh->e_ident[EI_CLASS] == ELFCLASS64 && eh->e_shoff != 0 &&
                  eh->e_shentsize == sizeof(Elf64_Shdr) &&
                  eh->e_shoff + static_cast<size_t>(eh->e_shnum) * sizeof(Elf64_Shdr) <= len;
  const Elf64_Shdr *sh = ok ? reinterpret_cast<const Elf64_Shdr *>(m + eh->e_shoff) : nullptr;
  for (unsigned i = 0; ok && i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr &strsec = sh[sh[i].sh_link];
    if (sh[i].sh_offset + sh[i].sh_size > len || strsec.sh_offset + strsec.sh_size > len)
      continue;
    const Elf64_Sym *syms = reinterpret_cast<const Elf64_Sym *>(m + sh[i].sh_offset);
    const size_t nsyms = sh[i].sh_size / sizeof(Elf64_Sym);
    const char *str = reinterpret_cast<const char *>(m + strsec.sh_offset);
    auto name_of = [&](const Elf64_Sym &s) -> std::string {
      if (s.st_name >= strsec.sh_size) return std::string();
      return std::string(str + s.st_name, strnlen(str + s.st_name, strsec.sh_size - s.st_name));
    };
    /* function prefixes "_ZZ...E" of the markers */
    static const char kMark[] = "cudasim_shm_mark_";
    std::vector<std::string> prefixes;
    for (size_t j = 0; j < nsyms; ++j) {
      const std::string n = name_of(syms[j]);
      if (n.compare(0, 3, "_ZZ") != 0) continue;
      size_t at = n.rfind(kMark);
      if (at == std::string::npos) continue;
      while (at > 0 && n[at - 1] >= '0' && n[at - 1] <= '9') --at; /* <len> */
      prefixes.push_back(n.substr(0, at));
    }
    std::sort(prefixes.begin(), prefixes.end());
    prefixes.erase(std::unique(prefixes.begin(), prefixes.end()), prefixes.end());
    if (prefixes.empty()) continue;
    for (size_t j = 0; j < nsyms; ++j) {
      if (ELF64_ST_TYPE(syms[j].st_info) != STT_TLS || syms[j].st_size == 0) continue;
      const std::string n = name_of(syms[j]);
      if (n.compare(0, 3, "_ZZ") != 0) continue;
      for (const std::string &p : prefixes) {
        if (n.size() > p.size() && n.compare(0, p.size(), p) == 0 && n[p.size()] >= '0' &&
            n[p.size()] <= '9') {
          out.push_back(StaticShared{modid, static_cast<size_t>(syms[j].st_value),
                                     static_cast<size_t>(syms[j].st_size)});
          break;
        }
      }
    }
  }
  munmap(map, len);
}

/* Every module's static shared arrays, scanned once (modules loaded later are not seen). */
const std::vector<StaticShared> &static_shared_regions() {
  static const std::vector<StaticShared> regions = [] {
    struct Mod {
      size_t modid;
      std::string path;
    };
    std::vector<Mod> mods;
    dl_iterate_phdr(
        [](dl_phdr_info *info, size_t, void *arg) {
          if (info->dlpi_tls_modid == 0) return 0;
          const char *name = info->dlpi_name;
          static_cast<std::vector<Mod> *>(arg)->push_back(
              Mod{info->dlpi_tls_modid,
                  (name && name[0]) ? std::string(name) : std::string("/proc/self/exe")});
          return 0;
        },
        &mods);
    std::vector<StaticShared> out;
    for (const Mod &mo : mods) scan_static_shared(mo.path.c_str(), mo.modid, out);
    if (sim_config().verbose) {
      size_t bytes = 0;
      for (const StaticShared &r : out) bytes += r.size;
      std::fprintf(stderr, "cudasim: %zu static __shared__ arrays (%zu bytes) poisoned per block\n",
                   out.size(), bytes);
    }
    return out;
  }();
  return regions;
}

/* This OS thread's addresses of the static shared arrays. */
std::vector<std::pair<unsigned char *, size_t>> thread_static_shared() {
  const std::vector<StaticShared> &regions = static_shared_regions();
  std::vector<std::pair<unsigned char *, size_t>> out;
  if (regions.empty()) return out;
  struct Ctx {
    const std::vector<StaticShared> *regions;
    std::vector<std::pair<unsigned char *, size_t>> *out;
  } ctx{&regions, &out};
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t, void *arg) {
        Ctx *c = static_cast<Ctx *>(arg);
        if (info->dlpi_tls_modid == 0 || info->dlpi_tls_data == nullptr) return 0;
        for (const StaticShared &r : *c->regions)
          if (r.modid == info->dlpi_tls_modid)
            c->out->emplace_back(static_cast<unsigned char *>(info->dlpi_tls_data) + r.offset,
                                 r.size);
        return 0;
      },
      &ctx);
  return out;
}

}  // namespace detail

namespace {

/* Run one block on this OS thread. Returns false (with w.diag) on a detected error. */
bool run_block(Worker &w, const Launch &L, uint64_t b) {
  w.launch = &L;
  w.kname = L.thunk.name;
  w.bid = uint3{static_cast<unsigned>(b % L.grid.x),
                static_cast<unsigned>((b / L.grid.x) % L.grid.y),
                static_cast<unsigned>(b / (static_cast<uint64_t>(L.grid.x) * L.grid.y))};
  w.nthreads = L.nthreads;
  w.failed = false;
  w.rng = L.seed * 0x2545f4914f6cdd1dull ^ (b + 1) * 0x9e3779b97f4a7c15ull ^ L.serial;
  cudasim_tls_blockIdx = w.bid;
  cudasim_tls_blockDim = uint3{L.block.x, L.block.y, L.block.z};
  cudasim_tls_gridDim = uint3{L.grid.x, L.grid.y, L.grid.z};
  if (L.shmem) {
    /* poison: uninitialised shared memory reads show up as NaN / garbage */
    std::memset(w.dyn_smem.data(), 0xff, L.shmem);
  }
  /* the same for the static __shared__ arrays (this thread's copies) */
  if (!w.static_smem_ready) {
    w.static_smem = detail::thread_static_shared();
    w.static_smem_ready = true;
  }
  for (const auto &r : w.static_smem) std::memset(r.first, 0xff, r.second);
  detail::tls_dynamic_shared = w.dyn_smem.data();

  std::vector<unsigned> ids(L.nthreads);
  for (unsigned i = 0; i < L.nthreads; ++i) {
    Fiber &f = w.fibers[i];
    f.linear = i;
    f.tid = uint3{i % L.block.x, (i / L.block.x) % L.block.y, i / (L.block.x * L.block.y)};
    f.st = St::Runnable;
    f.result = 0;
    /* initial frame: 6 callee-saved registers then the trampoline as return address */
    uintptr_t top = reinterpret_cast<uintptr_t>(f.stack_lo + w.stack_size) & ~uintptr_t(15);
    void **sp = reinterpret_cast<void **>(top - 56);
    for (int k = 0; k < 6; ++k) sp[k] = nullptr;
    sp[3] = &f; /* popped into r12 */
    sp[6] = reinterpret_cast<void *>(&cudasim_fiber_trampoline);
    f.sp = sp;
    ids[i] = i;
  }
  w.queue.clear();
  w.qhead = 0;
  w.warp_waiting.assign((L.nthreads + 31) / 32, 0u);
  enqueue(w, ids);
  Fiber &first = w.fibers[w.queue[w.qhead++]];
  set_builtins(w, first);
  cudasim_switch(&w.native_sp, first.sp);
  if (w.failed) {
#if defined(__SANITIZE_ADDRESS__)
    /* The block was abandoned with its fibers mid-call: their frames' redzones stay
     * poisoned and would fault the next block's fresh frames at the same addresses. */
    for (unsigned i = 0; i < L.nthreads; ++i) ASAN_UNPOISON_MEMORY_REGION(w.fibers[i].stack_lo, w.stack_size);
#endif
    return false;
  }
  return true;
}

/* ======================================================================================
 * Pool of OS threads running blocks
 * ====================================================================================== */
void record_error(Launch &L, uint64_t b, const std::string &msg) {
  std::lock_guard<std::mutex> g(L.err_mu);
  if (b < L.err_block) {
    L.err_block = b;
    L.err_msg = msg;
  }
  L.abort.store(true, std::memory_order_relaxed);
}

void work(Launch &L) {
  Worker &w = tls_worker;
  if (!ensure_stacks(w, L.nthreads)) {
    record_error(L, 0, "cudasim: cannot map fiber stacks");
    return;
  }
  if (w.dyn_smem.size() < L.shmem + 16) w.dyn_smem.resize(L.shmem + 16);
  for (;;) {
    if (L.abort.load(std::memory_order_relaxed)) return;
    const uint64_t b = L.next.fetch_add(1, std::memory_order_relaxed);
    if (b >= L.nblocks) return;
    if (!run_block(w, L, b)) record_error(L, b, w.diag);
  }
}

class Pool {
 public:
  static Pool &get() {
    static Pool *p = [] {
      Pool *q = new Pool(); /* leaked: threads outlive static destruction */
      pthread_atfork(before_fork, after_fork_parent, after_fork_child);
      return q;
    }();
    return *p;
  }
  /* Run work(L) on the calling thread and on up to n-1 pool threads. */
  void run(Launch &L, unsigned n) {
    std::lock_guard<std::mutex> serial(launch_mu_);
    while (threads_.size() + 1 < n) threads_.emplace_back([this] { loop(); });
    unsigned helpers = static_cast<unsigned>(std::min<uint64_t>(n - 1, L.nblocks - 1));
    {
      std::lock_guard<std::mutex> g(mu_);
      job_ = &L;
      want_ = helpers;
      active_ = 0;
      ++gen_;
    }
    cv_.notify_all();
    work(L);
    std::unique_lock<std::mutex> g(mu_);
    done_cv_.wait(g, [&] { return want_ == 0 && active_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> g(mu_);
    for (;;) {
      cv_.wait(g, [&] { return gen_ != seen && want_ > 0; });
      seen = gen_;
      --want_;
      ++active_;
      Launch *L = job_;
      g.unlock();
      work(*L);
      g.lock();
      --active_;
      if (want_ == 0 && active_ == 0) done_cv_.notify_all();
    }
  }
  /* fork(): no launch is in flight across it, and the child, which has none of the pool
   * threads, starts a new pool (the parent's thread handles are kept, unjoinable there). */
  static void before_fork() {
    get().launch_mu_.lock();
    get().mu_.lock();
  }
  static void after_fork_parent() {
    get().mu_.unlock();
    get().launch_mu_.unlock();
  }
  static void after_fork_child() {
    Pool &p = get();
    static std::vector<std::thread> *orphans = new std::vector<std::thread>();
    for (std::thread &t : p.threads_) orphans->push_back(std::move(t));
    p.threads_.clear();
    p.job_ = nullptr;
    p.want_ = p.active_ = 0;
    /* New locks and condition variables: the parent's pool threads waited on the old ones. */
    new (&p.mu_) std::mutex();
    new (&p.launch_mu_) std::mutex();
    new (&p.cv_) std::condition_variable();
    new (&p.done_cv_) std::condition_variable();
  }
  std::mutex launch_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> threads_;
  Launch *job_ = nullptr;
  unsigned want_ = 0, active_ = 0;
  uint64_t gen_ = 0;
};

std::atomic<uint64_t> g_launches{0};
/* inject_launch_failure: launches left before the failing one (-1: none armed). */
std::atomic<int64_t> g_inject_countdown{-1};
std::atomic<int> g_inject_err{cudaErrorLaunchFailure};

/* True (once) when this launch is the one inject_launch_failure armed. */
bool take_injected_failure(cudaError_t *err) {
  int64_t left = g_inject_countdown.load();
  while (left >= 0) {
    if (g_inject_countdown.compare_exchange_weak(left, left - 1)) {
      if (left != 0) return false;
      *err = static_cast<cudaError_t>(g_inject_err.load());
      return true;
    }
  }
  return false;
}

}  // namespace

uint64_t launch_count() { return g_launches.load(); }

void inject_launch_failure(uint64_t after, cudaError_t err) {
  g_inject_err = static_cast<int>(err);
  g_inject_countdown = static_cast<int64_t>(after);
}

namespace detail {

cudaError_t launch(const Thunk &t, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                   const char *file, int line) {
  const SimConfig &cfg = sim_config();
  const uint64_t serial = g_launches.fetch_add(1);
  if (cudaError_t injected; take_injected_failure(&injected)) {
    return report_launch_error(
        injected, fmt("cudasim: launch of %s at %s:%d: failed by cudasim::inject_launch_failure",
                      t.name, file, line));
  }
  const uint64_t nthreads = static_cast<uint64_t>(block.x) * block.y * block.z;
  const uint64_t nblocks = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
  if (nthreads == 0 || nblocks == 0 || nthreads > 1024 || block.x > 1024 || block.y > 1024 ||
      block.z > 64 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u) {
    return report_launch_error(
        cudaErrorInvalidConfiguration,
        fmt("cudasim: launch of %s at %s:%d: invalid configuration grid (%u,%u,%u) block "
            "(%u,%u,%u)",
            t.name, file, line, grid.x, grid.y, grid.z, block.x, block.y, block.z));
  }
  const size_t smem_limit = max_dynamic_shared(t.func);
  if (shmem > smem_limit) {
    return report_launch_error(
        cudaErrorInvalidValue,
        fmt("cudasim: launch of %s at %s:%d: %zu bytes of dynamic shared memory exceed the "
            "limit of %zu (raise it with cudaFuncSetAttribute)",
            t.name, file, line, shmem, smem_limit));
  }
  if (!stream_is_valid(stream)) {
    return report_launch_error(cudaErrorInvalidResourceHandle,
                               fmt("cudasim: launch of %s at %s:%d: invalid stream", t.name,
                                   file, line));
  }
  /* As libcudart: a kernel launch fails if its stream belongs to another device than the
   * current one (a backend that forgot cudaSetDevice before a launch on a device-1 stream). */
  if (const int sd = stream_device(stream), cur = current_device(); sd != cur) {
    return report_launch_error(
        cudaErrorInvalidResourceHandle,
        fmt("cudasim: launch of %s at %s:%d: the stream belongs to device %d, the current device "
            "is %d",
            t.name, file, line, sd, cur));
  }
  /* Queued on the stream: it runs when the simulated device gets to it (stream order, and
   * at a random point relative to other streams' work). Its errors reach the issuing host
   * thread at its next synchronisation. */
  /* The launch's parameters are kept, and each run builds its own Launch: a captured graph
   * replays the same launch many times. */
  struct Params {
    detail::Thunk thunk;
    dim3 grid, block;
    size_t shmem;
    uint64_t nblocks;
    unsigned nthreads;
    Order order;
    uint64_t seed, serial;
  };
  auto P = std::make_shared<const Params>(Params{t, grid, block, shmem, nblocks, static_cast<unsigned>(nthreads),
                                                 cfg.order.load(), cfg.seed.load(), serial});
  std::string where = fmt("cudasim: kernel %s (launched at %s:%d): ", t.name, file, line);
  stream_submit(stream, [P, where = std::move(where)] {
    Launch L;
    L.thunk = P->thunk;
    L.grid = P->grid;
    L.block = P->block;
    L.shmem = P->shmem;
    L.nblocks = P->nblocks;
    L.nthreads = P->nthreads;
    L.order = P->order;
    L.seed = P->seed;
    L.serial = P->serial;
    /* Save the running thread's built-ins (a launch from a host thread leaves them as they were). */
    const uint3 saved[4] = {cudasim_tls_threadIdx, cudasim_tls_blockIdx, cudasim_tls_blockDim,
                            cudasim_tls_gridDim};
    unsigned char *saved_dyn = tls_dynamic_shared;
    unsigned workers = sim_config().workers.load();
    if (workers < 1) workers = 1;
    Pool::get().run(L, workers);
    cudasim_tls_threadIdx = saved[0];
    cudasim_tls_blockIdx = saved[1];
    cudasim_tls_blockDim = saved[2];
    cudasim_tls_gridDim = saved[3];
    tls_dynamic_shared = saved_dyn;
    if (L.err_block != UINT64_MAX) report_launch_error(cudaErrorLaunchFailure, where + L.err_msg);
  });
  return cudaSuccess;
}

}  // namespace detail
}  // namespace cudasim

unsigned __activemask() {
  using namespace cudasim;
  Worker &w = tls_worker;
  const unsigned base = w.cur & ~31u;
  unsigned m = 0;
  for (unsigned l = 0; l < 32 && base + l < w.nthreads; ++l)
    if (w.fibers[base + l].st != St::Exited) m |= 1u << l;
  return m;
}

long long clock64() {
  return static_cast<long long>(std::chrono::steady_clock::now().time_since_epoch().count());
}
