/* The NCCL seam primitives (host/seam/nccl/): header + payload exchange within one process
 * (2 and 3 devices) and across two processes, bootstrap hand-over, and the faults that must
 * end in a clear status within the deadline: sizes that disagree, a header the contract
 * refuses, a lying peer, a peer that aborts, goes silent or exits. Then each rule at its
 * boundary (envelope, header and payload limits; every refusal aborts the endpoint), the
 * id bootstrap's refusals, and the boundary header's encoding (nccl_seam.c). */
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "meshkern.h"
#include "mk_error.h"
#include "mk_test_util.h"
#include "seam/nccl/nccl_comm.h"
#include "seam/nccl/nccl_seam.h"
extern "C" {
#include "seam/seam.h"
}

#ifdef MK_TEST_CUDASIM
#include "cudasim.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDeadlineMs = 300; /* short: every fault must surface well within a test */
/* Upper bound on how late a fault may surface past its deadline on a loaded CI machine
 * (sanitizers, parallel tests): generous, yet a hang still fails. */
constexpr double kSlackMs = kDeadlineMs + 1500.0;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

/* Devices for an in-process clique: simulated ones are added; real NCCL needs one GPU per rank. */
bool have_devices(int n) {
#ifdef MK_TEST_CUDASIM
  int have = 0;
  cudaGetDeviceCount(&have);
  if (have < n) cudasim::set_device_count(n);
  return true;
#else
  int have = 0;
  if (cudaGetDeviceCount(&have) != cudaSuccess) have = 0;
  (void)cudaGetLastError();
  return have >= n;
#endif
}
#define NEED_DEVICES(n)                                                                      \
  do {                                                                                       \
    if (!have_devices(n)) GTEST_SKIP() << "needs " << (n) << " CUDA devices (one per NCCL rank)"; \
  } while (0)

/* A stand-in for the boundary header: what the contract checks before the payload. */
struct Header {
  uint32_t next_layer;
  uint32_t rows;
  uint32_t hidden;
  uint32_t step;
};

struct Expect {
  uint32_t next_layer;
  uint32_t hidden;
  const float *payload_dev; /* the receiver's buffer: must be untouched when the check runs */
  size_t payload_cap;
  bool payload_untouched_at_check = false;
  int calls = 0;
};

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float &x : v) x = d(rng);
  return v;
}

const float kSentinel = -12345.5f;

mk_status contract_check(void *user, const void *header, size_t header_bytes, size_t payload_bytes) {
  Expect *e = static_cast<Expect *>(user);
  ++e->calls;
  std::vector<float> now(e->payload_cap / sizeof(float));
  if (cudaMemcpy(now.data(), e->payload_dev, e->payload_cap, cudaMemcpyDeviceToHost) == cudaSuccess) {
    e->payload_untouched_at_check = true;
    for (float x : now) e->payload_untouched_at_check &= x == kSentinel;
  }
  if (header_bytes != sizeof(Header))
    return mk_fail(MK_ERR_FRAME, "header of %zu bytes, expected %zu", header_bytes, sizeof(Header));
  Header h;
  memcpy(&h, header, sizeof h);
  if (h.next_layer != e->next_layer)
    return mk_fail(MK_ERR_SEAM_MISMATCH, "boundary for layer %u, this range starts at layer %u", h.next_layer,
                   e->next_layer);
  if (h.hidden != e->hidden) return mk_fail(MK_ERR_HIDDEN_WIDTH, "hidden %u, expected %u", h.hidden, e->hidden);
  if (payload_bytes != size_t(h.rows) * h.hidden * sizeof(float))
    return mk_fail(MK_ERR_DATA_LENGTH, "payload of %zu bytes for %u rows x %u", payload_bytes, h.rows, h.hidden);
  return MK_OK;
}

/* A device buffer on the endpoint's device, filled with v (or the sentinel). */
float *device_buffer(int device, const std::vector<float> &v) {
  cudaSetDevice(device);
  void *p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  /* From pageable memory cudaMemcpy returns before the copy lands (as libcudart documents):
   * the seam's non-blocking stream does not wait for the legacy stream. */
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return static_cast<float *>(p);
}

std::vector<float> read_back(int device, const float *p, size_t n) {
  cudaSetDevice(device);
  std::vector<float> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

struct Clique {
  std::vector<mk_nccl_ctx> ctx;
  std::vector<void *> raw; /* device buffers of raw sends, freed with the clique */
  explicit Clique(int n) : ctx(static_cast<size_t>(n)) {
    std::vector<int> devices(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) devices[static_cast<size_t>(i)] = i;
    status = mk_nccl_init_all(ctx.data(), n, devices.data(), nullptr, kDeadlineMs);
  }
  ~Clique() {
    for (mk_nccl_ctx &c : ctx) mk_nccl_ctx_destroy(&c);
    for (void *p : raw) cudaFree(p);
  }
  mk_status status;
};

/* One residual hop from ctx[from] to ctx[to], driven by one thread. */
mk_status hop(Clique &q, int from, int to, const Header &h, const float *src, float *dst, size_t cap, Expect *e,
              size_t *got_bytes) {
  mk_nccl_ctx &s = q.ctx[static_cast<size_t>(from)], &r = q.ctx[static_cast<size_t>(to)];
  const size_t bytes = size_t(h.rows) * h.hidden * sizeof(float);
  MK_TRY(mk_nccl_send_post(&s, to, &h, sizeof h, src, bytes));
  Header got{};
  size_t hb = 0;
  const mk_status st = mk_nccl_recv(&r, from, contract_check, e, &got, sizeof got, &hb, dst, cap, got_bytes);
  const mk_status ss = mk_nccl_send_wait(&s);
  return st != MK_OK ? st : ss;
}

TEST(NcclSeam, TwoDevicesInOneProcessCarryTheResidualExactly) {
  NEED_DEVICES(2);
  Clique q(2);
  ASSERT_EQ(q.status, MK_OK) << mk_last_error();
  for (uint32_t rows : {1u, 7u, 512u}) {
    const uint32_t hidden = 96;
    const size_t n = size_t(rows) * hidden;
    const std::vector<float> payload = random_floats(n, rows);
    float *src = device_buffer(0, payload);
    float *dst = device_buffer(1, std::vector<float>(n, kSentinel));
    Expect e{5, hidden, dst, n * sizeof(float)};
    size_t got = 0;
    ASSERT_EQ(hop(q, 0, 1, Header{5, rows, hidden, 1}, src, dst, n * sizeof(float), &e, &got), MK_OK)
        << mk_last_error();
    EXPECT_EQ(got, n * sizeof(float));
    EXPECT_EQ(e.calls, 1);
    EXPECT_TRUE(e.payload_untouched_at_check) << "the payload arrived before the header was checked";
    const std::vector<float> back = read_back(1, dst, n);
    EXPECT_EQ(memcmp(back.data(), payload.data(), n * sizeof(float)), 0) << rows << " rows";
    cudaFree(src);
    cudaFree(dst);
  }
  EXPECT_EQ(q.ctx[0].sent, 3u);
  EXPECT_EQ(q.ctx[1].received, 3u);
#ifdef MK_TEST_CUDASIM
  const size_t live = cudasim::live_allocations();
  for (mk_nccl_ctx &c : q.ctx) mk_nccl_ctx_destroy(&c);
  EXPECT_EQ(cudasim::live_allocations(), live - 8) << "each endpoint owns two device and two pinned blocks";
#endif
}

TEST(NcclSeam, ThreeDevicesChainForwardsTheResidual) {
  NEED_DEVICES(3);
  Clique q(3);
  ASSERT_EQ(q.status, MK_OK) << mk_last_error();
  const uint32_t rows = 3, hidden = 577; /* odd sizes */
  const size_t n = size_t(rows) * hidden;
  const std::vector<float> payload = random_floats(n, 9);
  float *a = device_buffer(0, payload);
  float *b = device_buffer(1, std::vector<float>(n, kSentinel));
  float *c = device_buffer(2, std::vector<float>(n, kSentinel));
  Expect e1{4, hidden, b, n * sizeof(float)}, e2{8, hidden, c, n * sizeof(float)};
  size_t got = 0;
  ASSERT_EQ(hop(q, 0, 1, Header{4, rows, hidden, 0}, a, b, n * sizeof(float), &e1, &got), MK_OK) << mk_last_error();
  ASSERT_EQ(hop(q, 1, 2, Header{8, rows, hidden, 0}, b, c, n * sizeof(float), &e2, &got), MK_OK) << mk_last_error();
  const std::vector<float> back = read_back(2, c, n);
  EXPECT_EQ(memcmp(back.data(), payload.data(), n * sizeof(float)), 0);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
}

/* The header says 4 rows, the payload holds 5: the contract check refuses it before the
 * payload is received; the sender learns its peer went away. */
TEST(NcclSeam, HeaderAndPayloadSizesThatDisagreeAreRefused) {
  NEED_DEVICES(2);
  Clique q(2);
  ASSERT_EQ(q.status, MK_OK) << mk_last_error();
  const uint32_t hidden = 64;
  const std::vector<float> payload = random_floats(5 * hidden, 2);
  float *src = device_buffer(0, payload);
  float *dst = device_buffer(1, std::vector<float>(8 * hidden, kSentinel));
  Expect e{2, hidden, dst, 8 * hidden * sizeof(float)};
  const Header h{2, 4, hidden, 0};
  ASSERT_EQ(mk_nccl_send_post(&q.ctx[0], 1, &h, sizeof h, src, payload.size() * sizeof(float)), MK_OK);
  Header got{};
  size_t hb = 0, pb = 0;
  const auto t0 = Clock::now();
  EXPECT_EQ(mk_nccl_recv(&q.ctx[1], 0, contract_check, &e, &got, sizeof got, &hb, dst, 8 * hidden * sizeof(float), &pb),
            MK_ERR_DATA_LENGTH);
  EXPECT_NE(std::string(mk_last_error()).find("payload of 1280 bytes for 4 rows"), std::string::npos) << mk_last_error();
  EXPECT_EQ(q.ctx[1].comm, nullptr) << "the communicator must be aborted";
  const mk_status ss = mk_nccl_send_wait(&q.ctx[0]);
  EXPECT_TRUE(ss == MK_ERR_PEER_CLOSED || ss == MK_ERR_PEER_TIMEOUT) << mk_status_name(ss);
  EXPECT_LT(ms_since(t0), 2.0 * kSlackMs);
  const std::vector<float> back = read_back(1, dst, 8 * hidden);
  for (float x : back) ASSERT_EQ(x, kSentinel) << "payload written after the header was refused";
  /* The dead endpoint says so. */
  EXPECT_EQ(mk_nccl_send(&q.ctx[1], 0, &h, sizeof h, nullptr, 0), MK_ERR_PEER_CLOSED);
  cudaFree(src);
  cudaFree(dst);
}

/* A header for another layer (the contract's own status), and a payload larger than the
 * receiver's buffer (a limit of the receiver, whatever the sender says). */
TEST(NcclSeam, HeaderRefusedByTheContractAndPayloadOverTheReceiversLimit) {
  NEED_DEVICES(2);
  for (int variant = 0; variant < 2; ++variant) {
    Clique q(2);
    ASSERT_EQ(q.status, MK_OK) << mk_last_error();
    const uint32_t hidden = 32, rows = variant == 0 ? 2 : 9;
    const std::vector<float> payload = random_floats(size_t(rows) * hidden, 3);
    float *src = device_buffer(0, payload);
    float *dst = device_buffer(1, std::vector<float>(4 * hidden, kSentinel));
    Expect e{6, hidden, dst, 4 * hidden * sizeof(float)};
    size_t got = 0;
    const Header h{variant == 0 ? 7u : 6u, rows, hidden, 0};
    const mk_status st = hop(q, 0, 1, h, src, dst, 4 * hidden * sizeof(float), &e, &got);
    if (variant == 0) {
      EXPECT_EQ(st, MK_ERR_SEAM_MISMATCH) << mk_last_error();
      EXPECT_EQ(e.calls, 1);
    } else {
      EXPECT_EQ(st, MK_ERR_FRAME) << mk_last_error();
      EXPECT_EQ(e.calls, 0) << "an oversized payload must be refused before the contract check";
    }
    const std::vector<float> back = read_back(1, dst, 4 * hidden);
    for (float x : back) ASSERT_EQ(x, kSentinel);
    cudaFree(src);
    cudaFree(dst);
  }
}

/* A peer that does not speak the seam protocol: a block without the envelope, and a block
 * of the wrong size (NCCL sizes that disagree: the stand-in reports it, real NCCL would
 * leave it to the deadline). */
TEST(NcclSeam, LyingPeerBlocksAreRefused) {
  NEED_DEVICES(2);
  for (size_t block : {size_t(MK_NCCL_HEADER_BLOCK), size_t(100)}) {
    Clique q(2);
    ASSERT_EQ(q.status, MK_OK) << mk_last_error();
    float *junk = device_buffer(0, random_floats(MK_NCCL_HEADER_BLOCK / 4, 4));
    cudaSetDevice(0);
    ASSERT_EQ(ncclSend(junk, block, ncclUint8, 1, q.ctx[0].comm, q.ctx[0].stream), ncclSuccess);
    float *dst = device_buffer(1, std::vector<float>(16, kSentinel));
    Expect e{1, 4, dst, 64};
    Header got{};
    size_t hb = 0, pb = 0;
    const auto t0 = Clock::now();
    const mk_status st = mk_nccl_recv(&q.ctx[1], 0, contract_check, &e, &got, sizeof got, &hb, dst, 64, &pb);
#ifdef MK_TEST_CUDASIM
    EXPECT_EQ(st, MK_ERR_FRAME) << mk_last_error();
#else
    EXPECT_TRUE(st == MK_ERR_FRAME || st == MK_ERR_PEER_TIMEOUT) << mk_last_error();
#endif
    EXPECT_LT(ms_since(t0), kSlackMs);
    EXPECT_EQ(e.calls, 0);
    cudaFree(junk);
    cudaFree(dst);
  }
}

TEST(NcclSeam, PeerThatAbortsItsCommunicatorIsReportedClosed) {
  NEED_DEVICES(2);
  Clique q(2);
  ASSERT_EQ(q.status, MK_OK) << mk_last_error();
  ncclCommAbort(q.ctx[0].comm);
  q.ctx[0].comm = nullptr;
  float *dst = device_buffer(1, std::vector<float>(16, kSentinel));
  Expect e{1, 4, dst, 64};
  Header got{};
  size_t hb = 0, pb = 0;
  const auto t0 = Clock::now();
  const mk_status st = mk_nccl_recv(&q.ctx[1], 0, contract_check, &e, &got, sizeof got, &hb, dst, 64, &pb);
#ifdef MK_TEST_CUDASIM
  EXPECT_EQ(st, MK_ERR_PEER_CLOSED) << mk_last_error();
#else
  EXPECT_TRUE(st == MK_ERR_PEER_CLOSED || st == MK_ERR_PEER_TIMEOUT) << mk_last_error();
#endif
  EXPECT_LT(ms_since(t0), kSlackMs);
  cudaFree(dst);
}

TEST(NcclSeam, SilentPeerTimesOutAtTheDeadline) {
  NEED_DEVICES(2);
  Clique q(2);
  ASSERT_EQ(q.status, MK_OK) << mk_last_error();
  float *dst = device_buffer(1, std::vector<float>(16, kSentinel));
  Expect e{1, 4, dst, 64};
  Header got{};
  size_t hb = 0, pb = 0;
  const auto t0 = Clock::now();
  EXPECT_EQ(mk_nccl_recv(&q.ctx[1], 0, contract_check, &e, &got, sizeof got, &hb, dst, 64, &pb), MK_ERR_PEER_TIMEOUT);
  const double ms = ms_since(t0);
  EXPECT_GE(ms, kDeadlineMs - 1.0);
  EXPECT_LT(ms, kSlackMs);
  EXPECT_NE(std::string(mk_last_error()).find("within 300 ms"), std::string::npos) << mk_last_error();
  cudaFree(dst);
}

TEST(NcclSeam, SendNobodyReceivesTimesOutAtTheDeadline) {
  NEED_DEVICES(2);
  Clique q(2);
  ASSERT_EQ(q.status, MK_OK) << mk_last_error();
  /* 8 MiB: beyond any eager buffering, so real NCCL waits for the receiver as well. */
  const std::vector<float> payload = random_floats(size_t(2) << 20, 8);
  float *src = device_buffer(0, payload);
  const Header h{1, 512, 4096, 0};
  const auto t0 = Clock::now();
  EXPECT_EQ(mk_nccl_send(&q.ctx[0], 1, &h, sizeof h, src, payload.size() * sizeof(float)), MK_ERR_PEER_TIMEOUT)
      << mk_last_error();
  const double ms = ms_since(t0);
  EXPECT_GE(ms, kDeadlineMs - 1.0);
  EXPECT_LT(ms, kSlackMs);
  cudaFree(src);
}

TEST(NcclSeam, InitTimesOutWhenARankNeverJoins) {
  NEED_DEVICES(1); /* only rank 0 is created here */
  ncclUniqueId id;
  ASSERT_EQ(mk_nccl_id_create(&id), MK_OK);
  mk_nccl_ctx ctx;
  const auto t0 = Clock::now();
  EXPECT_EQ(mk_nccl_init_rank(&ctx, 2, 0, &id, 0, nullptr, kDeadlineMs), MK_ERR_PEER_TIMEOUT);
  EXPECT_LT(ms_since(t0), kSlackMs);
  EXPECT_EQ(ctx.comm, nullptr);
  mk_nccl_ctx_destroy(&ctx); /* harmless after a failed init */
}

/* NCCL refusing the communicator itself at init (here: two ranks that disagree on the rank
 * count; on a GPU also two ranks on one device) fails asynchronously on a non-blocking
 * communicator: MK_ERR_NCCL naming the init and NCCL's reason, not a frame error. */
TEST(NcclSeam, CommunicatorRefusedAtInitIsAnNcclError) {
  NEED_DEVICES(2);
  ncclUniqueId id;
  ASSERT_EQ(mk_nccl_id_create(&id), MK_OK);
  mk_nccl_ctx ctx[2];
  mk_status st[2] = {MK_OK, MK_OK};
  std::string msg[2];
  const auto t0 = Clock::now();
  std::thread t[2];
  for (int r = 0; r < 2; r++)
    t[r] = std::thread([&, r] {
      st[r] = mk_nccl_init_rank(&ctx[r], 2 + r, r, &id, r, nullptr, kDeadlineMs); /* rank 1 says 3 ranks */
      msg[r] = mk_last_error();
    });
  for (std::thread &x : t) x.join();
  EXPECT_LT(ms_since(t0), kSlackMs);
  int refused = 0;
  for (int r = 0; r < 2; r++) {
    EXPECT_NE(st[r], MK_OK) << "rank " << r;
    EXPECT_NE(st[r], MK_ERR_FRAME) << "rank " << r << ": " << msg[r];
    if (st[r] == MK_ERR_NCCL) {
      refused++;
      EXPECT_NE(msg[r].find("NCCL refused the communicator at init"), std::string::npos) << msg[r];
      EXPECT_NE(msg[r].find("nranks"), std::string::npos) << "NCCL's own reason is kept: " << msg[r];
    }
    EXPECT_EQ(ctx[r].comm, nullptr);
    mk_nccl_ctx_destroy(&ctx[r]);
  }
  EXPECT_GE(refused, 1) << "the rank whose count disagrees is refused by NCCL";
}

/* A device that does not exist: a clear status, every other rank's communicator released,
 * nothing left allocated. */
TEST(NcclSeam, InitAllWithABadDeviceFailsAndLeavesNothing) {
  NEED_DEVICES(2);
#ifdef MK_TEST_CUDASIM
  const size_t live_before = cudasim::live_allocations();
#endif
  std::vector<mk_nccl_ctx> ctx(2);
  const int devices[2] = {0, 99};
  const auto t0 = Clock::now();
  EXPECT_EQ(mk_nccl_init_all(ctx.data(), 2, devices, nullptr, kDeadlineMs), MK_ERR_NCCL);
  EXPECT_LT(ms_since(t0), kSlackMs);
  for (const mk_nccl_ctx &c : ctx) {
    EXPECT_EQ(c.comm, nullptr);
    EXPECT_EQ(c.send_block_dev, nullptr);
  }
#ifdef MK_TEST_CUDASIM
  EXPECT_EQ(cudasim::live_allocations(), live_before);
#endif
  cudaSetDevice(0);
}

TEST(NcclSeam, BootstrapHandOverFailsClearly) {
  char dir[] = "/tmp/mk_nccl_seam_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string missing = std::string(dir) + "/none", junk = std::string(dir) + "/junk",
                    good = std::string(dir) + "/id";
  ncclUniqueId id, back;
  auto t0 = Clock::now();
  EXPECT_EQ(mk_nccl_id_read_file(missing.c_str(), &back, 100), MK_ERR_PEER_TIMEOUT);
  EXPECT_LT(ms_since(t0), kSlackMs);
  FILE *f = fopen(junk.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fwrite("not an id at all, just some bytes of text padding it out past the record size to be sure ......"
         "..........................................................................",
         1, 8 + sizeof(ncclUniqueId), f);
  fclose(f);
  EXPECT_EQ(mk_nccl_id_read_file(junk.c_str(), &back, 100), MK_ERR_FRAME);
  ASSERT_EQ(mk_nccl_id_create(&id), MK_OK);
  ASSERT_EQ(mk_nccl_id_write_file(good.c_str(), &id), MK_OK);
  ASSERT_EQ(mk_nccl_id_read_file(good.c_str(), &back, 100), MK_OK);
  EXPECT_EQ(memcmp(&id, &back, sizeof id), 0);
  /* Nobody serving: the fetch gives up at its deadline. */
  uint16_t port = 0;
  int fd = -1;
  ASSERT_EQ(mk_nccl_id_listen(nullptr, &port, &fd), MK_OK);
  close(fd); /* the port is now (almost certainly) closed */
  t0 = Clock::now();
  EXPECT_EQ(mk_nccl_id_fetch(nullptr, port, &back, 150), MK_ERR_PEER_TIMEOUT);
  EXPECT_LT(ms_since(t0), kSlackMs);
  /* Served to two joiners. */
  port = 0;
  ASSERT_EQ(mk_nccl_id_listen(nullptr, &port, &fd), MK_OK);
  std::vector<ncclUniqueId> fetched(2);
  std::vector<mk_status> fst(2, MK_ERR_INTERNAL);
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&, i] { fst[static_cast<size_t>(i)] = mk_nccl_id_fetch(nullptr, port, &fetched[static_cast<size_t>(i)], 2000); });
  EXPECT_EQ(mk_nccl_id_serve(fd, 2, &id, 2000), MK_OK);
  for (auto &t : ts) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(fst[static_cast<size_t>(i)], MK_OK);
    EXPECT_EQ(memcmp(&fetched[static_cast<size_t>(i)], &id, sizeof id), 0);
  }
  unlink(good.c_str());
  unlink(junk.c_str());
  rmdir(dir);
}

// ==================================================================== rules ==
// Each rule of the exchange on the smallest input that shows it: the receiver's limits at
// their boundary (exactly at: accepted; one past: refused), each refusal with its own
// message, and after every refusal the endpoint aborted (later calls say so at once).

/* A header block as a peer might write it: envelope fields as given, zero padded. */
std::vector<unsigned char> envelope(uint64_t magic, uint64_t version, uint64_t header_bytes, uint64_t payload_bytes) {
  std::vector<unsigned char> b(MK_NCCL_HEADER_BLOCK, 0);
  for (int i = 0; i < 4; ++i) b[size_t(i)] = (unsigned char)(magic >> (8 * i));
  for (int i = 0; i < 4; ++i) b[size_t(4 + i)] = (unsigned char)(version >> (8 * i));
  for (int i = 0; i < 8; ++i) b[size_t(8 + i)] = (unsigned char)(header_bytes >> (8 * i));
  for (int i = 0; i < 8; ++i) b[size_t(16 + i)] = (unsigned char)(payload_bytes >> (8 * i));
  return b;
}
constexpr uint64_t kEnvelopeMagic = 0x484e4b4du; /* "MKNH" */

/* Rank 0 sends a raw block to rank 1 (no payload follows). */
void send_raw_block(Clique &q, const std::vector<unsigned char> &block) {
  cudaSetDevice(0);
  void *dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, block.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, block.data(), block.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(ncclSend(dev, block.size(), ncclUint8, 1, q.ctx[0].comm, q.ctx[0].stream), ncclSuccess);
  q.raw.push_back(dev);
}

/* The receiving endpoint was aborted: its communicator gone, every later call refused. */
void expect_aborted(mk_nccl_ctx *ctx) {
  EXPECT_EQ(ctx->comm, nullptr) << "the communicator must be aborted after a refusal";
  Header got{};
  size_t hb = 0, pb = 0;
  EXPECT_ERROR(mk_nccl_recv(ctx, 0, nullptr, nullptr, &got, sizeof got, &hb, nullptr, 0, &pb), MK_ERR_PEER_CLOSED,
               "the endpoint was aborted after an earlier failure");
  const Header h{1, 1, 1, 0};
  EXPECT_ERROR(mk_nccl_send(ctx, 0, &h, sizeof h, nullptr, 0), MK_ERR_PEER_CLOSED, "aborted after an earlier failure");
}

TEST(NcclSeamRules, EnvelopeMagicAndVersionAreEachChecked) {
  NEED_DEVICES(2);
  struct Case {
    uint64_t magic, version;
    const char *text;
  };
  for (const Case &c : {Case{kEnvelopeMagic ^ 0x01000000u, 1, "magic 494e4b4d version 1"},
                        Case{kEnvelopeMagic, 2, "magic 484e4b4d version 2, want 484e4b4d version 1"},
                        Case{kEnvelopeMagic, 0, "version 0, want"}}) {
    Clique q(2);
    ASSERT_EQ(q.status, MK_OK) << mk_last_error();
    send_raw_block(q, envelope(c.magic, c.version, sizeof(Header), 0));
    Expect e{1, 4, nullptr, 0};
    Header got{};
    size_t hb = 0, pb = 0;
    EXPECT_ERROR(mk_nccl_recv(&q.ctx[1], 0, contract_check, &e, &got, sizeof got, &hb, nullptr, 0, &pb), MK_ERR_FRAME,
                 c.text);
    EXPECT_EQ(e.calls, 0) << "a block that is not a seam block never reaches the contract";
    expect_aborted(&q.ctx[1]);
  }
}

TEST(NcclSeamRules, HeaderLengthUpToTheReceiversCapacity) {
  NEED_DEVICES(2);
  const uint32_t hidden = 4;
  float *dst = device_buffer(1, std::vector<float>(hidden, kSentinel));
  /* Exactly the receiver's capacity: accepted (the other tests). One byte more: refused
   * before the contract. Past the largest header any block holds: refused too. */
  struct Case {
    size_t sent, cap;
    const char *text;
  };
  for (const Case &c : {Case{sizeof(Header) + 1, sizeof(Header), "declares 17 bytes; the receiver takes at most 16"},
                        Case{MK_NCCL_HEADER_MAX + 1, 1000, "declares 489 bytes; the receiver takes at most 488"}}) {
    Clique q(2);
    ASSERT_EQ(q.status, MK_OK) << mk_last_error();
    send_raw_block(q, envelope(kEnvelopeMagic, 1, c.sent, 0));
    Expect e{1, hidden, dst, hidden * sizeof(float)};
    std::vector<unsigned char> got(c.cap);
    size_t hb = 7, pb = 7;
    EXPECT_ERROR(mk_nccl_recv(&q.ctx[1], 0, contract_check, &e, got.data(), got.size(), &hb, dst,
                              hidden * sizeof(float), &pb),
                 MK_ERR_FRAME, c.text);
    EXPECT_EQ(e.calls, 0);
    EXPECT_EQ(hb, 0u);
    EXPECT_EQ(pb, 0u);
    expect_aborted(&q.ctx[1]);
  }
  cudaFree(dst);
}

TEST(NcclSeamRules, PayloadUpToTheReceiversBufferAndNotOneByteMore) {
  NEED_DEVICES(2);
  const uint32_t hidden = 8, rows = 2;
  const size_t cap = size_t(rows) * hidden * sizeof(float);
  const std::vector<float> payload = random_floats(size_t(rows) * hidden + 1, 5);
  for (size_t bytes : {cap, cap + 1}) {
    Clique q(2);
    ASSERT_EQ(q.status, MK_OK) << mk_last_error();
    float *src = device_buffer(0, payload);
    float *dst = device_buffer(1, std::vector<float>(size_t(rows) * hidden, kSentinel));
    const Header h{3, rows, hidden, 0};
    ASSERT_EQ(mk_nccl_send_post(&q.ctx[0], 1, &h, sizeof h, src, bytes), MK_OK) << mk_last_error();
    /* A check that accepts any size: the limit here is the receiver's buffer alone. */
    Header got{};
    size_t hb = 0, pb = 0;
    const mk_status st = mk_nccl_recv(&q.ctx[1], 0, nullptr, nullptr, &got, sizeof got, &hb, dst, cap, &pb);
    const std::string msg = mk_last_error();
    const mk_status ss = mk_nccl_send_wait(&q.ctx[0]);
    if (bytes == cap) {
      ASSERT_EQ(st, MK_OK) << mk_last_error();
      EXPECT_EQ(ss, MK_OK);
      EXPECT_EQ(pb, cap);
      EXPECT_EQ(hb, sizeof(Header));
      EXPECT_EQ(got.next_layer, 3u);
      const std::vector<float> back = read_back(1, dst, size_t(rows) * hidden);
      EXPECT_EQ(memcmp(back.data(), payload.data(), cap), 0);
      EXPECT_EQ(q.ctx[1].received, 1u);
    } else {
      EXPECT_EQ(st, MK_ERR_FRAME);
      EXPECT_NE(msg.find("declares a payload of 65 bytes; the receiver's buffer holds 64"), std::string::npos) << msg;
      EXPECT_TRUE(ss == MK_ERR_PEER_CLOSED || ss == MK_ERR_PEER_TIMEOUT) << mk_status_name(ss);
      for (float x : read_back(1, dst, size_t(rows) * hidden)) ASSERT_EQ(x, kSentinel);
      expect_aborted(&q.ctx[1]);
    }
    cudaFree(src);
    cudaFree(dst);
  }
}

/* The contract's refusal is the status reported, and the endpoint goes with it. */
TEST(NcclSeamRules, ContractRefusalAbortsTheEndpoint) {
  NEED_DEVICES(2);
  Clique q(2);
  ASSERT_EQ(q.status, MK_OK) << mk_last_error();
  const uint32_t hidden = 4;
  float *src = device_buffer(0, random_floats(hidden, 6));
  float *dst = device_buffer(1, std::vector<float>(hidden, kSentinel));
  Expect e{2, hidden, dst, hidden * sizeof(float)};
  const Header h{9, 1, hidden, 0};
  ASSERT_EQ(mk_nccl_send_post(&q.ctx[0], 1, &h, sizeof h, src, hidden * sizeof(float)), MK_OK) << mk_last_error();
  Header got{};
  size_t hb = 0, pb = 7;
  EXPECT_ERROR(mk_nccl_recv(&q.ctx[1], 0, contract_check, &e, &got, sizeof got, &hb, dst, hidden * sizeof(float), &pb),
               MK_ERR_SEAM_MISMATCH, "boundary for layer 9, this range starts at layer 2");
  EXPECT_EQ(pb, 0u);
  EXPECT_EQ(e.calls, 1);
  const mk_status ss = mk_nccl_send_wait(&q.ctx[0]);
  EXPECT_TRUE(ss == MK_ERR_PEER_CLOSED || ss == MK_ERR_PEER_TIMEOUT) << mk_status_name(ss);
  expect_aborted(&q.ctx[1]);
  cudaFree(src);
  cudaFree(dst);
}

TEST(NcclSeamRules, ArgumentsAreCheckedBeforeAnythingIsPosted) {
  NEED_DEVICES(2);
  Clique q(2);
  ASSERT_EQ(q.status, MK_OK) << mk_last_error();
  std::vector<unsigned char> header(MK_NCCL_HEADER_MAX + 1, 1);
  EXPECT_ERROR(mk_nccl_send_post(&q.ctx[0], 1, header.data(), header.size(), nullptr, 0), MK_ERR_INVALID_ARGUMENT,
               "header 489 bytes (max 488)");
  EXPECT_ERROR(mk_nccl_send_post(&q.ctx[0], 2, header.data(), 4, nullptr, 0), MK_ERR_INVALID_ARGUMENT,
               "send to rank 2 of 2");
  EXPECT_ERROR(mk_nccl_send_post(&q.ctx[0], -1, header.data(), 4, nullptr, 0), MK_ERR_INVALID_ARGUMENT,
               "send to rank -1 of 2");
  EXPECT_ERROR(mk_nccl_send_post(&q.ctx[0], 1, nullptr, 4, nullptr, 0), MK_ERR_INVALID_ARGUMENT, "header 4 bytes");
  EXPECT_ERROR(mk_nccl_send_post(&q.ctx[0], 1, header.data(), 4, nullptr, 8), MK_ERR_INVALID_ARGUMENT,
               "payload 8 bytes");
  EXPECT_ERROR(mk_nccl_send_wait(&q.ctx[0]), MK_ERR_INVALID_ARGUMENT, "no send pending");
  Header got{};
  size_t hb = 0, pb = 0;
  EXPECT_ERROR(mk_nccl_recv(&q.ctx[1], 2, nullptr, nullptr, &got, sizeof got, &hb, nullptr, 0, &pb),
               MK_ERR_INVALID_ARGUMENT, "receive from rank 2 of 2: bad arguments");
  EXPECT_ERROR(mk_nccl_recv(&q.ctx[1], 0, nullptr, nullptr, &got, sizeof got, nullptr, nullptr, 0, &pb),
               MK_ERR_INVALID_ARGUMENT, "bad arguments");
  EXPECT_ERROR(mk_nccl_recv(&q.ctx[1], 0, nullptr, nullptr, &got, sizeof got, &hb, nullptr, 4, &pb),
               MK_ERR_INVALID_ARGUMENT, "bad arguments");
  EXPECT_ERROR(mk_nccl_warmup(&q.ctx[0], 2, -1), MK_ERR_INVALID_ARGUMENT, "warm-up peers 2/-1 of 2 ranks");
  EXPECT_ERROR(mk_nccl_warmup(&q.ctx[0], -1, 2), MK_ERR_INVALID_ARGUMENT, "warm-up peers -1/2 of 2 ranks");
  EXPECT_ERROR(mk_nccl_warmup(nullptr, -1, 1), MK_ERR_INVALID_ARGUMENT, "NULL endpoint");
  /* One send pending per endpoint: the largest header, then a second post refused. */
  ASSERT_EQ(mk_nccl_send_post(&q.ctx[0], 1, header.data(), MK_NCCL_HEADER_MAX, nullptr, 0), MK_OK) << mk_last_error();
  EXPECT_ERROR(mk_nccl_send_post(&q.ctx[0], 1, header.data(), 4, nullptr, 0), MK_ERR_INVALID_ARGUMENT,
               "a send is already pending");
  std::vector<unsigned char> big(MK_NCCL_HEADER_MAX);
  ASSERT_EQ(mk_nccl_recv(&q.ctx[1], 0, nullptr, nullptr, big.data(), big.size(), &hb, nullptr, 0, &pb), MK_OK)
      << mk_last_error();
  EXPECT_EQ(hb, size_t(MK_NCCL_HEADER_MAX));
  EXPECT_EQ(big[MK_NCCL_HEADER_MAX - 1], 1) << "the header's last byte";
  EXPECT_EQ(mk_nccl_send_wait(&q.ctx[0]), MK_OK) << mk_last_error();
  EXPECT_EQ(q.ctx[0].send_pending, 0);
  /* The endpoints are still alive after refused arguments and the exchange. */
  EXPECT_NE(q.ctx[0].comm, nullptr);
  EXPECT_NE(q.ctx[1].comm, nullptr);
}

/* A warm-up that receives a block not of the seam protocol refuses it and aborts. */
TEST(NcclSeamRules, WarmupBlockFromAStrangerIsRefused) {
  NEED_DEVICES(2);
  Clique q(2);
  ASSERT_EQ(q.status, MK_OK) << mk_last_error();
  send_raw_block(q, std::vector<unsigned char>(MK_NCCL_HEADER_BLOCK, 0x5a));
  EXPECT_ERROR(mk_nccl_warmup(&q.ctx[1], 0, -1), MK_ERR_FRAME, "warm-up block from rank 0 is not a meshkern seam block");
  expect_aborted(&q.ctx[1]);
}

TEST(NcclSeamRules, InitArgumentsAreChecked) {
  ncclUniqueId id{};
  mk_nccl_ctx ctx;
  EXPECT_ERROR(mk_nccl_init_rank(&ctx, 2, 2, &id, 0, nullptr, 100), MK_ERR_INVALID_ARGUMENT, "init of rank 2 of 2");
  EXPECT_ERROR(mk_nccl_init_rank(&ctx, 2, -1, &id, 0, nullptr, 100), MK_ERR_INVALID_ARGUMENT, "init of rank -1 of 2");
  EXPECT_ERROR(mk_nccl_init_rank(&ctx, 0, 0, &id, 0, nullptr, 100), MK_ERR_INVALID_ARGUMENT, "rank 0 of 0");
  EXPECT_ERROR(mk_nccl_init_rank(&ctx, 2, 0, &id, 0, nullptr, 0), MK_ERR_INVALID_ARGUMENT, "(deadline 0 ms)");
  EXPECT_ERROR(mk_nccl_init_rank(&ctx, 2, 0, nullptr, 0, nullptr, 100), MK_ERR_INVALID_ARGUMENT, "init of rank 0 of 2");
  std::vector<mk_nccl_ctx> ctxs(2);
  const int devices[2] = {0, 1};
  EXPECT_ERROR(mk_nccl_init_all(ctxs.data(), 0, devices, nullptr, 100), MK_ERR_INVALID_ARGUMENT, "init of 0 devices");
  EXPECT_ERROR(mk_nccl_init_all(ctxs.data(), 2, devices, nullptr, 0), MK_ERR_INVALID_ARGUMENT, "(deadline 0 ms)");
  EXPECT_ERROR(mk_nccl_init_all(ctxs.data(), 2, nullptr, nullptr, 100), MK_ERR_INVALID_ARGUMENT, "init of 2 devices");
}

// ================================================================ bootstrap ==

TEST(NcclBootstrap, IdFilesAreWholeRecordsOrRefused) {
  char dir[] = "/tmp/mk_nccl_boot_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/id", short_file = std::string(dir) + "/short",
                    missing_dir = std::string(dir) + "/no/such/dir/id", under_file = path + "/id";
  ncclUniqueId id, back;
  ASSERT_EQ(mk_nccl_id_create(&id), MK_OK);
  ASSERT_EQ(mk_nccl_id_write_file(path.c_str(), &id), MK_OK) << mk_last_error();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "whoever reads the id can join: owner only";
  EXPECT_EQ(st.st_size, off_t(8 + sizeof(ncclUniqueId)));
  FILE *f = fopen(short_file.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fwrite("mkncclid", 1, 8, f); /* the magic, then nothing */
  fclose(f);
  const std::string want = "holds 8 bytes, a unique id record is " + std::to_string(8 + sizeof(ncclUniqueId));
  EXPECT_ERROR(mk_nccl_id_read_file(short_file.c_str(), &back, 100), MK_ERR_FRAME, want.c_str());
  EXPECT_ERROR(mk_nccl_id_read_file(dir, &back, 100), MK_ERR_FRAME, "holds -1 bytes");
  EXPECT_ERROR(mk_nccl_id_read_file(under_file.c_str(), &back, 100), MK_ERR_IO, "cannot open");
  EXPECT_ERROR(mk_nccl_id_read_file(path.c_str(), &back, 0), MK_ERR_INVALID_ARGUMENT, "bad arguments");
  EXPECT_ERROR(mk_nccl_id_write_file(missing_dir.c_str(), &id), MK_ERR_IO, "cannot create");
  EXPECT_ERROR(mk_nccl_id_write_file(nullptr, &id), MK_ERR_INVALID_ARGUMENT, "NULL path or id");
  const std::string long_path = std::string(dir) + "/" + std::string(4096, 'p');
  EXPECT_ERROR(mk_nccl_id_write_file(long_path.c_str(), &id), MK_ERR_INVALID_ARGUMENT, "path too long");
  EXPECT_ERROR(mk_nccl_id_create(nullptr), MK_ERR_INVALID_ARGUMENT, "NULL id");
  /* A file that appears while the reader waits is read. */
  unlink(path.c_str());
  std::thread writer([&]() {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    EXPECT_EQ(mk_nccl_id_write_file(path.c_str(), &id), MK_OK);
  });
  EXPECT_EQ(mk_nccl_id_read_file(path.c_str(), &back, 2000), MK_OK) << mk_last_error();
  writer.join();
  EXPECT_EQ(memcmp(&id, &back, sizeof id), 0);
  unlink(path.c_str());
  unlink(short_file.c_str());
  rmdir(dir);
}

/* A one-shot TCP server on loopback that writes `bytes` to its first client and closes. */
struct OneShotServer {
  int fd = -1;
  uint16_t port = 0;
  std::thread t;
  explicit OneShotServer(std::vector<unsigned char> bytes) {
    EXPECT_EQ(mk_nccl_id_listen(nullptr, &port, &fd), MK_OK);
    t = std::thread([this, bytes]() {
      const int c = accept(fd, nullptr, nullptr);
      if (c >= 0) {
        if (!bytes.empty()) (void)!write(c, bytes.data(), bytes.size());
        close(c);
      }
    });
  }
  ~OneShotServer() {
    t.join();
    close(fd);
  }
};

TEST(NcclBootstrap, FetchRefusesAStrangerAndAShortRecord) {
  ncclUniqueId back;
  {
    OneShotServer junk(std::vector<unsigned char>(8 + sizeof(ncclUniqueId), 'j'));
    EXPECT_ERROR(mk_nccl_id_fetch(nullptr, junk.port, &back, 2000), MK_ERR_FRAME,
                 "the bootstrap connection does not hold a meshkern NCCL unique id");
  }
  {
    OneShotServer cut(std::vector<unsigned char>{'m', 'k', 'n'});
    const std::string want = "the server closed after 3 of " + std::to_string(8 + sizeof(ncclUniqueId)) + " bytes";
    EXPECT_ERROR(mk_nccl_id_fetch(nullptr, cut.port, &back, 2000), MK_ERR_PEER_CLOSED, want.c_str());
  }
  uint16_t port = 0;
  int fd = -1;
  EXPECT_ERROR(mk_nccl_id_listen("not-an-address", &port, &fd), MK_ERR_INVALID_ARGUMENT,
               "'not-an-address' is not an IPv4 address");
  EXPECT_EQ(fd, -1);
  EXPECT_ERROR(mk_nccl_id_fetch("256.1.1.1", 5, &back, 100), MK_ERR_INVALID_ARGUMENT, "is not an IPv4 address");
  EXPECT_ERROR(mk_nccl_id_fetch(nullptr, 0, &back, 100), MK_ERR_INVALID_ARGUMENT, "bad arguments");
  EXPECT_ERROR(mk_nccl_id_listen(nullptr, nullptr, &fd), MK_ERR_INVALID_ARGUMENT, "NULL port or fd");
  port = 0;
  EXPECT_ERROR(mk_nccl_id_listen("192.0.2.1", &port, &fd), MK_ERR_IO, "cannot listen on 192.0.2.1:0"); /* not ours */
  EXPECT_EQ(fd, -1);
  ncclUniqueId id{};
  EXPECT_ERROR(mk_nccl_id_serve(-1, 1, &id, 100), MK_ERR_INVALID_ARGUMENT, "bad arguments to serve");
  ASSERT_EQ(mk_nccl_id_listen("127.0.0.1", &port, &fd), MK_OK);
  EXPECT_ERROR(mk_nccl_id_serve(fd, 1, &id, 0), MK_ERR_INVALID_ARGUMENT, "bad arguments to serve"); /* closes fd */
  ASSERT_EQ(mk_nccl_id_listen("127.0.0.1", &port, &fd), MK_OK);
  const auto t0 = Clock::now();
  EXPECT_ERROR(mk_nccl_id_serve(fd, 2, &id, 100), MK_ERR_PEER_TIMEOUT, "0 of 2 joiners fetched the unique id within 100 ms");
  EXPECT_LT(ms_since(t0), kSlackMs);
}

// ============================================== the boundary header encoding ==
// nccl_seam.c's fixed layout of mk_boundary_header inside the header block.

mk_boundary_header full_header() {
  mk_boundary_header h;
  memset(&h, 0, sizeof h);
  h.schema_version = 3;
  h.architecture = (mk_protocol_arch)2;
  snprintf(h.adapter, sizeof h.adapter, "dense-llama");
  memset(h.tensor_name, 't', sizeof h.tensor_name - 1); /* the longest a field holds */
  snprintf(h.boundary_point, sizeof h.boundary_point, "bp");
  h.next_layer = (int64_t(1) << 40) + 5;
  h.normalized = true;
  memset(h.recipe_digest, 'd', sizeof h.recipe_digest - 1);
  memset(h.request_id, 'r', sizeof h.request_id - 1);
  h.batch = 2;
  h.rows = 7;
  h.hidden = 4097;
  h.dtype = MK_DTYPE_F16;
  h.step = uint64_t(1) << 50;
  h.position = -3;
  return h;
}

TEST(NcclHeader, EveryFieldRoundTripsAtItsWidestValue) {
  const mk_boundary_header h = full_header();
  unsigned char block[MK_NCCL_BOUNDARY_HEADER_BYTES];
  mk_nccl_header_encode(&h, MK_MAX_BATCH_SEQUENCES - 1, block);
  EXPECT_EQ(block[0], 'M');
  EXPECT_EQ(block[3], '2');
  mk_boundary_header back;
  unsigned more = 0;
  ASSERT_EQ(mk_nccl_header_decode(block, sizeof block, &back, &more), MK_OK) << mk_last_error();
  EXPECT_EQ(more, unsigned(MK_MAX_BATCH_SEQUENCES - 1)) << "the entries of its batch still to come";
  EXPECT_EQ(back.schema_version, h.schema_version);
  EXPECT_EQ(back.architecture, h.architecture);
  EXPECT_STREQ(back.adapter, h.adapter);
  EXPECT_STREQ(back.tensor_name, h.tensor_name);
  EXPECT_STREQ(back.boundary_point, h.boundary_point);
  EXPECT_EQ(back.next_layer, h.next_layer);
  EXPECT_EQ(back.normalized, true);
  EXPECT_STREQ(back.recipe_digest, h.recipe_digest);
  EXPECT_STREQ(back.request_id, h.request_id);
  EXPECT_EQ(back.batch, h.batch);
  EXPECT_EQ(back.rows, h.rows);
  EXPECT_EQ(back.hidden, h.hidden);
  EXPECT_EQ(back.dtype, h.dtype);
  EXPECT_EQ(back.step, h.step);
  EXPECT_EQ(back.position, -3);
  /* A string that fills its whole field (no NUL) is cut to the field less one. */
  mk_boundary_header over = h;
  memset(over.adapter, 'a', sizeof over.adapter);
  mk_nccl_header_encode(&over, 0, block);
  ASSERT_EQ(mk_nccl_header_decode(block, sizeof block, &back, &more), MK_OK) << mk_last_error();
  EXPECT_EQ(more, 0u);
  EXPECT_EQ(strlen(back.adapter), sizeof back.adapter - 1);
  EXPECT_STREQ(back.tensor_name, h.tensor_name) << "the next field is intact";
  /* A count past what a batch holds is a lie: refused. */
  mk_nccl_header_encode(&h, MK_MAX_BATCH_SEQUENCES, block);
  EXPECT_ERROR(mk_nccl_header_decode(block, sizeof block, &back, &more), MK_ERR_FRAME,
               "a header says 64 entries of its batch follow; a batch holds 64");
}

TEST(NcclHeader, LengthTagAndEveryStringAreChecked) {
  const mk_boundary_header h = full_header();
  unsigned char block[MK_NCCL_BOUNDARY_HEADER_BYTES + 1];
  mk_nccl_header_encode(&h, 0, block);
  mk_boundary_header back;
  EXPECT_ERROR(mk_nccl_header_decode(block, MK_NCCL_BOUNDARY_HEADER_BYTES - 1, &back, nullptr), MK_ERR_FRAME,
               "a boundary header is 292 bytes, the peer sent 291");
  EXPECT_ERROR(mk_nccl_header_decode(block, MK_NCCL_BOUNDARY_HEADER_BYTES + 1, &back, nullptr), MK_ERR_FRAME,
               "the peer sent 293");
  for (int at : {0, 3}) { /* every byte of the tag */
    unsigned char bad[MK_NCCL_BOUNDARY_HEADER_BYTES];
    memcpy(bad, block, sizeof bad);
    bad[at] ^= 0x40;
    EXPECT_ERROR(mk_nccl_header_decode(bad, sizeof bad, &back, nullptr), MK_ERR_FRAME, "holds no boundary header") << at;
  }
  /* Offsets of the string fields: adapter, tensor_name, boundary_point, recipe_digest, request_id. */
  struct Field {
    size_t offset, width;
  };
  for (const Field &f : {Field{12, 32}, Field{44, 32}, Field{76, 32}, Field{117, 65}, Field{182, 64}}) {
    unsigned char bad[MK_NCCL_BOUNDARY_HEADER_BYTES];
    memcpy(bad, block, sizeof bad);
    memset(bad + f.offset, 'x', f.width);
    EXPECT_ERROR(mk_nccl_header_decode(bad, sizeof bad, &back, nullptr), MK_ERR_FRAME,
                 "a string of the boundary header is not terminated")
        << f.offset;
    bad[f.offset + f.width - 1] = 0; /* terminated in its last byte: accepted */
    EXPECT_EQ(mk_nccl_header_decode(bad, sizeof bad, &back, nullptr), MK_OK) << f.offset << ": " << mk_last_error();
  }
}

TEST(NcclHeader, UniqueIdsHaveTheirSize) {
  unsigned char id[MK_SEAM_NCCL_ID_BYTES];
  EXPECT_ERROR(mk_seam_nccl_id_new(id, sizeof(ncclUniqueId) - 1), MK_ERR_INTERNAL, "an id needs 128 bytes");
  ASSERT_EQ(mk_seam_nccl_id_new(id, sizeof id), MK_OK) << mk_last_error();
  mk_seam s;
  memset(&s, 0, sizeof s);
  EXPECT_ERROR(mk_seam_nccl_join_id(&s, id, sizeof(ncclUniqueId) - 1), MK_ERR_FRAME, "a unique id is 128 bytes, not 127");
  EXPECT_ERROR(mk_seam_nccl_join_id(&s, id, sizeof(ncclUniqueId) + 1), MK_ERR_FRAME, "not 129");
  EXPECT_EQ(s.impl, nullptr);
}

#ifdef MK_TEST_CUDASIM
/* ---- two processes (under cudasim: fork after CUDA initialization is unsupported on GPUs) -- */

/* The child's side: join through the file, warm up, receive one residual, send it back
 * doubled (or, when `vanish`, exit right after receiving: mid-exchange). */
int child_main(const std::string &id_path, uint32_t rows, uint32_t hidden, bool vanish) {
  ncclUniqueId id;
  if (mk_nccl_id_read_file(id_path.c_str(), &id, 5000) != MK_OK) return 10;
  mk_nccl_ctx ctx;
  if (mk_nccl_init_rank(&ctx, 2, 1, &id, 0, nullptr, 5000) != MK_OK) return 11;
  if (mk_nccl_warmup(&ctx, 0, 0) != MK_OK) return 12;
  const size_t n = size_t(rows) * hidden;
  float *buf = device_buffer(0, std::vector<float>(n, kSentinel));
  Expect e{3, hidden, buf, n * sizeof(float)};
  Header h{};
  size_t hb = 0, pb = 0;
  if (mk_nccl_recv(&ctx, 0, contract_check, &e, &h, sizeof h, &hb, buf, n * sizeof(float), &pb) != MK_OK) return 13;
  if (vanish) _exit(0);
  std::vector<float> v = read_back(0, buf, n);
  for (float &x : v) x *= 2.0f;
  float *out = device_buffer(0, v);
  const Header back{4, rows, hidden, h.step + 1};
  if (mk_nccl_send(&ctx, 0, &back, sizeof back, out, n * sizeof(float)) != MK_OK) return 14;
  cudaFree(buf);
  cudaFree(out);
  mk_nccl_ctx_destroy(&ctx);
  return 0;
}

void two_process_exchange(bool vanish) {
  char dir[] = "/tmp/mk_nccl_seam_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string id_path = std::string(dir) + "/id";
  const uint32_t rows = 5, hidden = 4096 / 4; /* 5 decode rows of a 1024-wide model: 20 KB */
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(child_main(id_path, rows, hidden, vanish));
  ncclUniqueId id;
  ASSERT_EQ(mk_nccl_id_create(&id), MK_OK);
  ASSERT_EQ(mk_nccl_id_write_file(id_path.c_str(), &id), MK_OK);
  mk_nccl_ctx ctx;
  ASSERT_EQ(mk_nccl_init_rank(&ctx, 2, 0, &id, 0, nullptr, 5000), MK_OK) << mk_last_error();
  ctx.deadline_ms = 5000; /* the warm-up waits for the child's start */
  ASSERT_EQ(mk_nccl_warmup(&ctx, 1, 1), MK_OK) << mk_last_error();
  ctx.deadline_ms = kDeadlineMs;
  const size_t n = size_t(rows) * hidden;
  const std::vector<float> payload = random_floats(n, 31);
  float *src = device_buffer(0, payload);
  float *dst = device_buffer(0, std::vector<float>(n, kSentinel));
  const Header h{3, rows, hidden, 7};
  ASSERT_EQ(mk_nccl_send(&ctx, 1, &h, sizeof h, src, n * sizeof(float)), MK_OK) << mk_last_error();
  Expect e{4, hidden, dst, n * sizeof(float)};
  Header got{};
  size_t hb = 0, pb = 0;
  const auto t0 = Clock::now();
  const mk_status st = mk_nccl_recv(&ctx, 1, contract_check, &e, &got, sizeof got, &hb, dst, n * sizeof(float), &pb);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child exit " << WEXITSTATUS(status);
  if (vanish) {
    EXPECT_EQ(st, MK_ERR_PEER_CLOSED) << mk_last_error();
    EXPECT_LT(ms_since(t0), kSlackMs);
    for (float x : read_back(0, dst, n)) ASSERT_EQ(x, kSentinel);
  } else {
    ASSERT_EQ(st, MK_OK) << mk_last_error();
    EXPECT_EQ(got.step, 8u);
    std::vector<float> want = payload;
    for (float &x : want) x *= 2.0f;
    const std::vector<float> back = read_back(0, dst, n);
    EXPECT_EQ(memcmp(back.data(), want.data(), n * sizeof(float)), 0);
  }
  mk_nccl_ctx_destroy(&ctx);
  cudaFree(src);
  cudaFree(dst);
  unlink(id_path.c_str());
  rmdir(dir);
}

TEST(NcclSeam, TwoProcessesExchangeThroughAFileBootstrap) { two_process_exchange(false); }
TEST(NcclSeam, PeerProcessExitingMidExchangeIsReportedClosed) { two_process_exchange(true); }
#endif

}  // namespace
