/* cudasim_nccl.cpp - the NCCL point-to-point subset, for cudasim.
 *
 * Link-time stand-ins: the same C functions libnccl exports, declared by the real nccl.h,
 * so host code compiled against <nccl.h> links against these instead (DESIGN.md section 3).
 *
 * Transport. Every communicator talks over loopback TCP, within one process (one thread or
 * one communicator per simulated device) and across processes alike:
 *   ncclGetUniqueId    opens a rendezvous socket on 127.0.0.1 and serves it from a detached
 *                      thread; the id carries its port and a random nonce.
 *   ncclCommInitRank*  registers the rank's own listening port with the rendezvous, gets
 *                      every rank's port back, connects to the lower ranks and accepts the
 *                      higher ones (a full mesh), then starts one reader thread per peer.
 *                      Non-blocking communicators (config.blocking = 0) do this on a thread
 *                      and report ncclInProgress from init and ncclCommGetAsyncError until
 *                      the mesh is up.
 *   ncclSend/ncclRecv  are tasks queued on their stream (cudasim_async.cpp): they run in
 *                      stream order, without blocking the issuing thread. A send writes a
 *                      header (sequence number, count, type) and the payload read from the
 *                      simulated device memory; the peer's reader thread buffers it; the
 *                      receive at the head of its stream takes the next message from that
 *                      peer, checks it and copies it into its buffer, then acknowledges.
 *                      The send completes on the acknowledgement.
 *
 * Semantics are NCCL's, stricter where real NCCL would hang or corrupt memory:
 *   - sends and receives match in order per peer pair; a count or type that differs between
 *     the two sides fails both (ncclInvalidUsage, sticky in ncclCommGetAsyncError) and the
 *     receive buffer is left untouched;
 *   - every send is a rendezvous: it completes only when the receive took it, so a program
 *     relying on NCCL's internal buffering (send then receive on one stream, unpaired with
 *     the peer) blocks here as it may on a GPU;
 *   - an unmatched operation blocks its stream until matched, or until the communicator is
 *     aborted or destroyed (every waiter is released, nothing hangs) or the peer's
 *     connection closes (ncclRemoteError);
 *   - zero-count operations are matched like any other (a count mismatch involving zero is
 *     caught instead of silently skipped);
 *   - buffers must lie inside one device allocation of the communicator's device, and the
 *     stream must belong to that device (ncclInvalidArgument);
 *   - operations on a non-blocking communicator before its init completed are refused
 *     (ncclInvalidUsage), as NCCL's documentation requires the caller to wait;
 *   - ncclCommDestroy with operations still in flight releases them like ncclCommAbort
 *     instead of waiting for them forever.
 * Inside ncclGroupStart/End the operations of one stream form one task that posts all its
 * sends before it waits for any receive, so a send and a receive to each other in one group
 * do not deadlock.
 *
 * Environment: CUDASIM_NCCL_TIMEOUT_MS bounds the bootstrap (rendezvous and mesh; default
 * 30000). Diagnostics: ncclGetLastError(comm), and stderr with CUDASIM_VERBOSE=1.
 */
#include <nccl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cudasim.h"
#include "cudasim_internal.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kIdMagic[8] = {'m', 'k', 'n', 'c', 's', 'i', 'm', '1'};
constexpr uint32_t kWireMagic = 0x4d4b4e43u; /* "MKNC" */
constexpr uint32_t kData = 1, kAck = 2;
constexpr uint64_t kMaxPayload = uint64_t(1) << 40; /* a corrupt count is refused, not allocated */

/* The unique id's contents (NCCL_UNIQUE_ID_BYTES = 128 leaves room). */
struct IdBody {
  char magic[8];
  uint64_t nonce;
  uint16_t port; /* rendezvous on 127.0.0.1 */
};
static_assert(sizeof(IdBody) <= sizeof(ncclUniqueId), "id body too large");

/* Bootstrap messages. */
struct Reg {
  uint64_t nonce;
  int32_t nranks, rank;
  uint16_t port;
};
struct TableHead {
  int32_t status; /* 0, or an ncclResult_t */
  char msg[160];
};
struct Hello {
  uint64_t nonce;
  int32_t nranks, rank;
};
/* Data-plane header, before every payload and acknowledgement. */
struct Wire {
  uint32_t magic, kind;
  uint64_t seq;
  uint64_t count;
  int32_t dtype;
  int32_t status; /* kAck: 0 accepted, 1 count/type mismatch (count/dtype: the receiver's) */
};

/* ---- errors ---------------------------------------------------------------------------- */
thread_local std::string tls_err;

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

ncclResult_t fail(ncclResult_t r, const std::string &msg) {
  tls_err = "cudasim NCCL: " + msg;
  if (cudasim::sim_config().verbose) fprintf(stderr, "%s\n", tls_err.c_str());
  return r;
}

int bootstrap_timeout_ms() {
  const char *s = getenv("CUDASIM_NCCL_TIMEOUT_MS");
  const int v = s ? atoi(s) : 0;
  return v > 0 ? v : 30000;
}

size_t type_size(int t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

const char *type_name(int t) {
  static const char *names[] = {"int8",    "uint8",   "int32",   "uint32",   "int64",     "uint64",
                                "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
  return t >= 0 && t < ncclNumTypes ? names[t] : "invalid-type";
}

/* ---- sockets --------------------------------------------------------------------------- */
/* Wait until fd is ready for ev, in 50 ms slices so a stop flag (abort) is seen promptly.
 * False on timeout, stop or a poll error. */
bool wait_fd(int fd, short ev, Clock::time_point deadline, const std::atomic<bool> *stop) {
  for (;;) {
    if (stop && stop->load()) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, ev, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<long long>(left, 50)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool write_all(int fd, const void *buf, size_t n) {
  const char *p = static_cast<const char *>(buf);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

/* Blocking read of exactly n bytes: false on end of stream or error. */
bool read_all(int fd, void *buf, size_t n) {
  char *p = static_cast<char *>(buf);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

/* Read exactly n bytes before the deadline (or the stop flag). */
bool read_until(int fd, void *buf, size_t n, Clock::time_point deadline, const std::atomic<bool> *stop) {
  char *p = static_cast<char *>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline, stop)) return false;
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int listen_loopback(uint16_t *port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

int connect_loopback(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  int r;
  do r = connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
  while (r != 0 && errno == EINTR);
  if (r != 0) {
    close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int accept_until(int lfd, Clock::time_point deadline, const std::atomic<bool> *stop) {
  for (;;) {
    if (!wait_fd(lfd, POLLIN, deadline, stop)) return -1;
    const int c = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) {
      const int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return c;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) return -1;
  }
}

/* ---- rendezvous (the root served for one unique id) ------------------------------------ */
void reply_error(int fd, ncclResult_t r, const std::string &msg) {
  TableHead h{};
  h.status = r;
  snprintf(h.msg, sizeof h.msg, "%s", msg.c_str());
  (void)write_all(fd, &h, sizeof h);
}

void root_serve(int lfd, uint64_t nonce) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
  std::vector<int> fds;       /* by rank, once registered */
  std::vector<uint16_t> ports;
  int nranks = -1, registered = 0;
  while (nranks < 0 || registered < nranks) {
    const int c = accept_until(lfd, deadline, nullptr);
    if (c < 0) break; /* timed out: the registered ranks see the connection close */
    Reg r{};
    if (!read_until(c, &r, sizeof r, Clock::now() + std::chrono::seconds(5), nullptr)) {
      close(c);
      continue;
    }
    std::string why;
    if (r.nonce != nonce) why = "the unique id's nonce does not match this rendezvous";
    else if (r.nranks < 1 || r.nranks > 4096) why = fmt("nranks %d out of range", r.nranks);
    else if (nranks >= 0 && r.nranks != nranks)
      why = fmt("rank %d says nranks %d, earlier ranks said %d", r.rank, r.nranks, nranks);
    else if (r.rank < 0 || r.rank >= r.nranks) why = fmt("rank %d outside [0, %d)", r.rank, r.nranks);
    else if (nranks >= 0 && fds[r.rank] >= 0) why = fmt("rank %d registered twice", r.rank);
    if (!why.empty()) {
      reply_error(c, ncclInvalidUsage, why);
      close(c);
      continue;
    }
    if (nranks < 0) {
      nranks = r.nranks;
      fds.assign(nranks, -1);
      ports.assign(nranks, 0);
    }
    fds[r.rank] = c;
    ports[r.rank] = r.port;
    ++registered;
  }
  if (nranks > 0 && registered == nranks) {
    TableHead h{};
    for (int fd : fds)
      if (!write_all(fd, &h, sizeof h) || !write_all(fd, ports.data(), ports.size() * sizeof(uint16_t))) {
        /* that rank gave up; the others still get the table and will fail to reach it */
      }
  }
  for (int fd : fds)
    if (fd >= 0) close(fd);
  close(lfd);
}

/* ---- communicators --------------------------------------------------------------------- */
struct Msg {
  uint64_t seq = 0, count = 0;
  int32_t dtype = 0, status = 0;
  std::vector<char> payload;
};

struct Peer {
  int fd = -1;
  std::mutex wmu;                 /* one writer at a time */
  uint64_t send_seq = 0;          /* next DATA sequence number (under wmu) */
  std::deque<Msg> data;           /* received, not yet taken by a receive (under Comm::mu) */
  std::map<uint64_t, Msg> acks;   /* acknowledgements by sequence number (under Comm::mu) */
  bool closed = false;            /* the reader saw the end of the stream (under Comm::mu) */
  std::thread reader;
};

struct Comm {
  int rank = 0, nranks = 0, device = 0;
  bool blocking = true;
  uint64_t nonce = 0;
  uint16_t root_port = 0;
  std::atomic<bool> aborted{false}; /* abort or destroy: release every waiter */
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Peer>> peers;
  ncclResult_t init = ncclInProgress; /* under mu */
  ncclResult_t async = ncclSuccess;   /* first asynchronous error, sticky (under mu) */
  std::string msg;                    /* its message (under mu) */
  int inflight = 0;                   /* operations submitted, not finished (under mu) */
  bool finalizing = false;
  std::thread init_thread;

  ~Comm() {
    for (auto &p : peers)
      if (p && p->fd >= 0) close(p->fd);
  }
  /* Record an asynchronous error (the first one sticks). Caller holds mu. */
  void set_error_locked(ncclResult_t r, const std::string &m) {
    if (async == ncclSuccess) {
      async = r;
      msg = "cudasim NCCL: " + m;
      if (cudasim::sim_config().verbose) fprintf(stderr, "%s\n", msg.c_str());
    }
    cv.notify_all();
  }
  void set_error(ncclResult_t r, const std::string &m) {
    std::lock_guard<std::mutex> g(mu);
    set_error_locked(r, m);
  }
};

}  // namespace

/* The opaque handle nccl.h declares. */
struct ncclComm {
  std::shared_ptr<Comm> st;
};

namespace {

std::mutex g_live_mu;
std::set<ncclComm_t> g_live; /* handles not yet destroyed or aborted */

std::shared_ptr<Comm> live(ncclComm_t c) {
  std::lock_guard<std::mutex> g(g_live_mu);
  return c && g_live.count(c) ? c->st : nullptr;
}

void reader_loop(Comm *c, Peer *p, int peer) {
  for (;;) {
    Wire w{};
    if (!read_all(p->fd, &w, sizeof w)) break;
    if (w.magic != kWireMagic || (w.kind != kData && w.kind != kAck)) {
      c->set_error(ncclSystemError, fmt("rank %d: garbage on the connection from rank %d", c->rank, peer));
      break;
    }
    Msg m;
    m.seq = w.seq;
    m.count = w.count;
    m.dtype = w.dtype;
    m.status = w.status;
    if (w.kind == kData) {
      const size_t es = type_size(w.dtype);
      if (es == 0 || w.count > kMaxPayload / es) {
        c->set_error(ncclSystemError, fmt("rank %d: bad message header from rank %d", c->rank, peer));
        break;
      }
      m.payload.resize(w.count * es);
      if (!read_all(p->fd, m.payload.data(), m.payload.size())) break;
    }
    std::lock_guard<std::mutex> g(c->mu);
    if (w.kind == kData) p->data.push_back(std::move(m));
    else p->acks.emplace(m.seq, std::move(m));
    c->cv.notify_all();
  }
  std::lock_guard<std::mutex> g(c->mu);
  p->closed = true;
  c->cv.notify_all();
}

/* Build the mesh. Returns ncclSuccess or an error (message in *why). */
ncclResult_t bootstrap(Comm &c, std::string *why) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(bootstrap_timeout_ms());
  const std::atomic<bool> *stop = &c.aborted;
  uint16_t my_port = 0;
  const int lfd = listen_loopback(&my_port);
  if (lfd < 0) {
    *why = fmt("rank %d: cannot listen on 127.0.0.1: %s", c.rank, strerror(errno));
    return ncclSystemError;
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } lclose{lfd};

  const int rfd = connect_loopback(c.root_port);
  if (rfd < 0) {
    *why = fmt("rank %d: cannot reach the rendezvous 127.0.0.1:%u of the unique id (%s)", c.rank,
               unsigned(c.root_port), strerror(errno));
    return ncclSystemError;
  }
  Closer rclose{rfd};
  const Reg reg{c.nonce, c.nranks, c.rank, my_port};
  TableHead head{};
  std::vector<uint16_t> ports(static_cast<size_t>(c.nranks));
  if (!write_all(rfd, &reg, sizeof reg) || !read_until(rfd, &head, sizeof head, deadline, stop)) {
    *why = c.aborted ? fmt("rank %d: aborted during bootstrap", c.rank)
                     : fmt("rank %d: the rendezvous did not answer within %d ms (all %d ranks must join)",
                           c.rank, bootstrap_timeout_ms(), c.nranks);
    return c.aborted ? ncclInvalidUsage : ncclSystemError;
  }
  if (head.status != 0) {
    head.msg[sizeof head.msg - 1] = 0;
    *why = fmt("rank %d: the rendezvous refused: %s", c.rank, head.msg);
    return static_cast<ncclResult_t>(head.status);
  }
  if (!read_until(rfd, ports.data(), ports.size() * sizeof(uint16_t), deadline, stop)) {
    *why = fmt("rank %d: the rendezvous closed while sending the table", c.rank);
    return ncclSystemError;
  }

  {
    std::lock_guard<std::mutex> g(c.mu); /* shut_down walks the peers under mu */
    c.peers.resize(static_cast<size_t>(c.nranks));
    for (auto &p : c.peers) p = std::make_unique<Peer>();
  }
  for (int j = 0; j < c.rank; ++j) {
    const int fd = connect_loopback(ports[static_cast<size_t>(j)]);
    const Hello h{c.nonce, c.nranks, c.rank};
    if (fd < 0 || !write_all(fd, &h, sizeof h)) {
      if (fd >= 0) close(fd);
      *why = fmt("rank %d: cannot connect to rank %d", c.rank, j);
      return ncclRemoteError;
    }
    std::lock_guard<std::mutex> g(c.mu);
    c.peers[static_cast<size_t>(j)]->fd = fd;
  }
  for (int accepted = 0; accepted < c.nranks - 1 - c.rank;) {
    const int fd = accept_until(lfd, deadline, stop);
    if (fd < 0) {
      *why = c.aborted ? fmt("rank %d: aborted during bootstrap", c.rank)
                       : fmt("rank %d: %d higher ranks did not connect within %d ms", c.rank,
                             c.nranks - 1 - c.rank - accepted, bootstrap_timeout_ms());
      return c.aborted ? ncclInvalidUsage : ncclRemoteError;
    }
    Hello h{};
    if (!read_until(fd, &h, sizeof h, deadline, stop) || h.nonce != c.nonce || h.nranks != c.nranks ||
        h.rank <= c.rank || h.rank >= c.nranks || c.peers[static_cast<size_t>(h.rank)]->fd >= 0) {
      close(fd); /* a stray or duplicate connection */
      continue;
    }
    {
      std::lock_guard<std::mutex> g(c.mu);
      c.peers[static_cast<size_t>(h.rank)]->fd = fd;
    }
    ++accepted;
  }
  for (int j = 0; j < c.nranks; ++j)
    if (j != c.rank) {
      Peer *p = c.peers[static_cast<size_t>(j)].get();
      p->reader = std::thread(reader_loop, &c, p, j);
    }
  return ncclSuccess;
}

void run_init(Comm &c) {
  std::string why;
  const ncclResult_t r = bootstrap(c, &why);
  std::lock_guard<std::mutex> g(c.mu);
  c.init = r;
  if (r != ncclSuccess) {
    c.msg = "cudasim NCCL: " + why;
    if (cudasim::sim_config().verbose) fprintf(stderr, "%s\n", c.msg.c_str());
  }
  c.cv.notify_all();
}

/* Release every waiter and stop the threads; the state lives on while tasks hold it. */
void shut_down(Comm &c) {
  c.aborted = true;
  {
    std::lock_guard<std::mutex> g(c.mu);
    for (auto &p : c.peers)
      if (p->fd >= 0) shutdown(p->fd, SHUT_RDWR);
    c.cv.notify_all();
  }
  if (c.init_thread.joinable()) c.init_thread.join();
  {
    std::lock_guard<std::mutex> g(c.mu); /* the init thread may have connected more peers */
    for (auto &p : c.peers)
      if (p->fd >= 0) shutdown(p->fd, SHUT_RDWR);
  }
  for (auto &p : c.peers)
    if (p->reader.joinable()) p->reader.join();
}

/* ---- operations ------------------------------------------------------------------------ */
struct Op {
  std::shared_ptr<Comm> c;
  bool send;
  void *buf;
  size_t count;
  ncclDataType_t dt;
  int peer;
  cudaStream_t stream;
  int device; /* the stream's device (default streams are per device) */
};

/* Write one message to a peer (to ourselves: straight into our own queues). */
bool post(Comm &c, int peer, const Wire &w, const void *payload, size_t bytes) {
  Peer &p = *c.peers[static_cast<size_t>(peer)];
  if (peer == c.rank) {
    Msg m;
    m.seq = w.seq;
    m.count = w.count;
    m.dtype = w.dtype;
    m.status = w.status;
    if (w.kind == kData) m.payload.assign(static_cast<const char *>(payload), static_cast<const char *>(payload) + bytes);
    std::lock_guard<std::mutex> g(c.mu);
    if (w.kind == kData) p.data.push_back(std::move(m));
    else p.acks.emplace(m.seq, std::move(m));
    c.cv.notify_all();
    return true;
  }
  std::lock_guard<std::mutex> g(p.wmu);
  return write_all(p.fd, &w, sizeof w) && (bytes == 0 || write_all(p.fd, payload, bytes));
}

std::string lost(const Comm &c, const Op &op) {
  return fmt("rank %d: %s of %zu x %s %s rank %d failed: the peer closed the connection (it aborted, "
             "destroyed its communicator or exited)",
             c.rank, op.send ? "ncclSend" : "ncclRecv", op.count, type_name(op.dt), op.send ? "to" : "from",
             op.peer);
}

/* One stream's share of a group: all sends are posted before any receive waits. */
void run_ops(const std::vector<Op> &ops) {
  std::vector<uint64_t> seqs(ops.size(), 0);
  std::vector<bool> done(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op &op = ops[i];
    Comm &c = *op.c;
    if (!op.send) continue;
    if (c.aborted) {
      done[i] = true;
      continue;
    }
    Peer &p = *c.peers[static_cast<size_t>(op.peer)];
    {
      std::lock_guard<std::mutex> g(p.wmu);
      seqs[i] = p.send_seq++;
    }
    const Wire w{kWireMagic, kData, seqs[i], op.count, op.dt, 0};
    if (!post(c, op.peer, w, op.buf, op.count * type_size(op.dt))) {
      c.set_error(ncclRemoteError, lost(c, op));
      done[i] = true;
    }
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op &op = ops[i];
    if (op.send) continue;
    Comm &c = *op.c;
    Peer &p = *c.peers[static_cast<size_t>(op.peer)];
    Msg m;
    {
      std::unique_lock<std::mutex> lk(c.mu);
      c.cv.wait(lk, [&] { return c.aborted || !p.data.empty() || p.closed; });
      if (c.aborted) continue;
      if (p.data.empty()) {
        c.set_error_locked(ncclRemoteError, lost(c, op));
        continue;
      }
      m = std::move(p.data.front());
      p.data.pop_front();
    }
    const bool match = m.count == op.count && m.dtype == op.dt;
    if (match && !m.payload.empty()) memcpy(op.buf, m.payload.data(), m.payload.size());
    const Wire ack{kWireMagic, kAck, m.seq, op.count, op.dt, match ? 0 : 1};
    if (!match)
      c.set_error(ncclInvalidUsage,
                  fmt("rank %d: ncclRecv of %zu x %s from rank %d does not match the peer's ncclSend of "
                      "%llu x %s (sends and receives match in order per peer pair)",
                      c.rank, op.count, type_name(op.dt), op.peer, static_cast<unsigned long long>(m.count),
                      type_name(m.dtype)));
    if (!post(c, op.peer, ack, nullptr, 0) && match) c.set_error(ncclRemoteError, lost(c, op));
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op &op = ops[i];
    if (!op.send || done[i]) continue;
    Comm &c = *op.c;
    Peer &p = *c.peers[static_cast<size_t>(op.peer)];
    std::unique_lock<std::mutex> lk(c.mu);
    c.cv.wait(lk, [&] { return c.aborted || p.acks.count(seqs[i]) || p.closed; });
    auto it = p.acks.find(seqs[i]);
    if (it == p.acks.end()) {
      if (!c.aborted) c.set_error_locked(ncclRemoteError, lost(c, op));
      continue;
    }
    if (it->second.status != 0)
      c.set_error_locked(ncclInvalidUsage,
                         fmt("rank %d: ncclSend of %zu x %s to rank %d does not match the peer's ncclRecv of "
                             "%llu x %s (sends and receives match in order per peer pair)",
                             c.rank, op.count, type_name(op.dt), op.peer,
                             static_cast<unsigned long long>(it->second.count), type_name(it->second.dtype)));
    p.acks.erase(it);
  }
  for (const Op &op : ops) {
    std::lock_guard<std::mutex> g(op.c->mu);
    --op.c->inflight;
    op.c->cv.notify_all();
  }
}

/* Queue a group's operations: one task per stream, in the order they were issued. */
void submit(std::vector<Op> ops) {
  for (const Op &op : ops) {
    std::lock_guard<std::mutex> g(op.c->mu);
    ++op.c->inflight;
  }
  while (!ops.empty()) {
    const cudaStream_t s = ops.front().stream;
    const int dev = ops.front().device;
    std::vector<Op> mine, rest;
    for (Op &op : ops) (op.stream == s && op.device == dev ? mine : rest).push_back(std::move(op));
    ops = std::move(rest);
    /* A default stream is the device's own: queue on it with that device current. */
    int cur = 0;
    cudaGetDevice(&cur);
    if (dev != cur) cudaSetDevice(dev);
    cudasim::stream_submit(s, [mine = std::move(mine)] { run_ops(mine); }, true);
    if (dev != cur) cudaSetDevice(cur);
  }
}

thread_local int tls_group_depth = 0;
thread_local std::vector<Op> tls_group;

ncclResult_t issue(bool send, void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                   cudaStream_t stream) {
  const char *fn = send ? "ncclSend" : "ncclRecv";
  std::shared_ptr<Comm> c = live(comm);
  if (!c) return fail(ncclInvalidArgument, fmt("%s: %p is not a live communicator", fn, static_cast<void *>(comm)));
  {
    std::lock_guard<std::mutex> g(c->mu);
    if (c->init == ncclInProgress)
      return fail(ncclInvalidUsage, fmt("%s: rank %d: the communicator is still initializing (poll "
                                        "ncclCommGetAsyncError until ncclSuccess first)", fn, c->rank));
    if (c->init != ncclSuccess) return fail(c->init, fmt("%s: rank %d: the communicator failed to initialize", fn, c->rank));
    if (c->async != ncclSuccess) return fail(c->async, fmt("%s: rank %d: %s", fn, c->rank, c->msg.c_str()));
    if (c->finalizing) return fail(ncclInvalidUsage, fmt("%s: rank %d: the communicator is finalized", fn, c->rank));
  }
  const size_t es = type_size(dt);
  if (es == 0) return fail(ncclInvalidArgument, fmt("%s: invalid datatype %d", fn, int(dt)));
  if (peer < 0 || peer >= c->nranks)
    return fail(ncclInvalidArgument, fmt("%s: peer %d outside [0, %d)", fn, peer, c->nranks));
  if (count > kMaxPayload / es) return fail(ncclInvalidArgument, fmt("%s: count %zu too large", fn, count));
  const size_t bytes = count * es;
  if (bytes > 0) {
    if (!buf) return fail(ncclInvalidArgument, fmt("%s: null buffer", fn));
    const int where = cudasim::allocation_device(buf, bytes);
    if (where == -2)
      return fail(ncclInvalidArgument, fmt("%s: buffer [%p, +%zu) is not inside one device allocation", fn, buf, bytes));
    if (where != c->device)
      return fail(ncclInvalidArgument,
                  fmt("%s: buffer %p is on %s, the communicator (rank %d) is on device %d", fn, buf,
                      where < 0 ? "pinned host memory" : fmt("device %d", where).c_str(), c->rank, c->device));
  }
  if (!cudasim::stream_is_valid(stream)) return fail(ncclInvalidArgument, fmt("%s: invalid stream", fn));
  const int sdev = cudasim::stream_device(stream);
  if (sdev != c->device)
    return fail(ncclInvalidArgument,
                fmt("%s: the stream belongs to device %d, the communicator (rank %d) to device %d", fn, sdev,
                    c->rank, c->device));
  Op op{c, send, buf, count, dt, peer, stream, sdev};
  if (tls_group_depth > 0) {
    tls_group.push_back(std::move(op));
  } else {
    std::vector<Op> one;
    one.push_back(std::move(op));
    submit(std::move(one));
  }
  return ncclSuccess;
}

uint64_t random_nonce() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd() ^ (uint64_t(getpid()) << 16);
}

ncclResult_t init_rank(ncclComm_t *out, int nranks, const ncclUniqueId &id, int rank, bool blocking) {
  if (!out) return fail(ncclInvalidArgument, "ncclCommInitRank: null communicator pointer");
  *out = nullptr;
  IdBody body;
  memcpy(&body, id.internal, sizeof body);
  if (memcmp(body.magic, kIdMagic, sizeof kIdMagic) != 0)
    return fail(ncclInvalidArgument, "ncclCommInitRank: not a unique id from ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, fmt("ncclCommInitRank: rank %d of %d ranks", rank, nranks));
  auto c = std::make_shared<Comm>();
  c->rank = rank;
  c->nranks = nranks;
  c->device = cudasim::current_device();
  c->blocking = blocking;
  c->nonce = body.nonce;
  c->root_port = body.port;
  ncclComm_t h = new ncclComm{c};
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    g_live.insert(h);
  }
  if (!blocking) {
    c->init_thread = std::thread([cp = c.get()] { run_init(*cp); });
    *out = h;
    return ncclInProgress;
  }
  run_init(*c);
  if (c->init != ncclSuccess) {
    const ncclResult_t r = c->init;
    const std::string m = c->msg; /* "cudasim NCCL: ..." */
    ncclCommAbort(h);
    tls_err = m;
    if (cudasim::sim_config().verbose) fprintf(stderr, "%s\n", m.c_str());
    return r;
  }
  *out = h;
  return ncclSuccess;
}

}  // namespace

/* ======================================================================================
 * The exported subset
 * ====================================================================================== */
extern "C" {

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion(NULL)");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (a socket or the bootstrap failed)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  if (std::shared_ptr<Comm> c = live(comm)) {
    std::lock_guard<std::mutex> g(c->mu);
    if ((c->async != ncclSuccess || (c->init != ncclSuccess && c->init != ncclInProgress)) && !c->msg.empty()) {
      tls_err = c->msg;
      return tls_err.c_str();
    }
  }
  return tls_err.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId(NULL)");
  uint16_t port = 0;
  const int lfd = listen_loopback(&port);
  if (lfd < 0) return fail(ncclSystemError, fmt("ncclGetUniqueId: cannot listen on 127.0.0.1: %s", strerror(errno)));
  IdBody body{};
  memcpy(body.magic, kIdMagic, sizeof kIdMagic);
  body.nonce = random_nonce();
  body.port = port;
  memset(id->internal, 0, sizeof id->internal);
  memcpy(id->internal, &body, sizeof body);
  std::thread(root_serve, lfd, body.nonce).detach();
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return init_rank(comm, nranks, id, rank, true);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  bool blocking = true;
  if (config) {
    if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, cgaClusterSize))
      return fail(ncclInvalidArgument, "ncclCommInitRankConfig: config not set from NCCL_CONFIG_INITIALIZER");
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
  }
  return init_rank(comm, nranks, id, rank, blocking);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  if (!comms || ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: no communicators to create");
  int ndevices = 0;
  cudaGetDeviceCount(&ndevices);
  for (int i = 0; i < ndev; ++i) {
    const int d = devlist ? devlist[i] : i;
    if (d < 0 || d >= ndevices)
      return fail(ncclInvalidArgument, fmt("ncclCommInitAll: device %d of %d simulated devices", d, ndevices));
  }
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id)) return r;
  std::vector<ncclResult_t> res(static_cast<size_t>(ndev), ncclSuccess);
  std::vector<std::string> msgs(static_cast<size_t>(ndev));
  std::vector<std::thread> ts;
  for (int i = 0; i < ndev; ++i)
    ts.emplace_back([&, i] {
      cudaSetDevice(devlist ? devlist[i] : i);
      res[static_cast<size_t>(i)] = ncclCommInitRank(&comms[i], ndev, id, i);
      msgs[static_cast<size_t>(i)] = tls_err;
    });
  for (auto &t : ts) t.join();
  for (int i = 0; i < ndev; ++i)
    if (res[static_cast<size_t>(i)] != ncclSuccess) {
      for (int j = 0; j < ndev; ++j)
        if (res[static_cast<size_t>(j)] == ncclSuccess) ncclCommAbort(comms[j]);
      for (int j = 0; j < ndev; ++j) comms[j] = nullptr;
      tls_err = msgs[static_cast<size_t>(i)];
      return res[static_cast<size_t>(i)];
    }
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
  std::shared_ptr<Comm> c = live(comm);
  if (!c || !err) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: not a live communicator");
  std::lock_guard<std::mutex> g(c->mu);
  if (c->init != ncclSuccess) *err = c->init;
  else if (c->async != ncclSuccess) *err = c->async;
  else if (c->finalizing && c->inflight > 0) *err = ncclInProgress;
  else *err = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  std::shared_ptr<Comm> c = live(comm);
  if (!c || !count) return fail(ncclInvalidArgument, "ncclCommCount: not a live communicator");
  *count = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  std::shared_ptr<Comm> c = live(comm);
  if (!c || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: not a live communicator");
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  std::shared_ptr<Comm> c = live(comm);
  if (!c || !device) return fail(ncclInvalidArgument, "ncclCommCuDevice: not a live communicator");
  *device = c->device;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  std::shared_ptr<Comm> c = live(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommFinalize: not a live communicator");
  std::unique_lock<std::mutex> lk(c->mu);
  if (c->init != ncclSuccess) return fail(ncclInvalidUsage, "ncclCommFinalize: the communicator is not initialized");
  c->finalizing = true;
  if (!c->blocking) return c->inflight > 0 ? ncclInProgress : ncclSuccess;
  c->cv.wait(lk, [&] { return c->inflight == 0 || c->aborted; });
  return c->async;
}

static ncclResult_t end_comm(ncclComm_t comm, const char *fn) {
  std::shared_ptr<Comm> c;
  {
    std::lock_guard<std::mutex> g(g_live_mu);
    if (!comm || !g_live.erase(comm)) return fail(ncclInvalidArgument, fmt("%s: not a live communicator", fn));
    c = comm->st;
  }
  int inflight;
  {
    std::lock_guard<std::mutex> g(c->mu);
    inflight = c->inflight;
  }
  if (inflight > 0 && strcmp(fn, "ncclCommDestroy") == 0 && cudasim::sim_config().verbose)
    fprintf(stderr, "cudasim NCCL: ncclCommDestroy (rank %d) with %d operations in flight: released as by "
                    "ncclCommAbort\n", c->rank, inflight);
  shut_down(*c);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return end_comm(comm, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return end_comm(comm, "ncclCommAbort"); }

ncclResult_t ncclGroupStart() {
  ++tls_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (tls_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--tls_group_depth == 0 && !tls_group.empty()) {
    std::vector<Op> ops = std::move(tls_group);
    tls_group.clear();
    submit(std::move(ops));
  }
  return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(true, const_cast<void *>(sendbuff), count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(false, recvbuff, count, datatype, peer, comm, stream);
}

}  /* extern "C" */
