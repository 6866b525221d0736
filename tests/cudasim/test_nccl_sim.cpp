/* test_nccl_sim.cpp - the NCCL stand-in (cudasim_nccl.cpp): matching, strictness, groups,
 * abort, non-blocking init, stream order, and two processes. */
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cudasim.h"
#include "test_kernels.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (float &x : v) x = d(rng);
  return v;
}

/* A device buffer on device d holding v. */
float *upload(int d, const std::vector<float> &v) {
  cudaSetDevice(d);
  void *p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  /* From pageable memory cudaMemcpy returns before the copy lands (libcudart's documented
   * behaviour, and cudasim's): the streams the test sends on do not wait for it. */
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return static_cast<float *>(p);
}

float *device_floats(int d, size_t n) {
  cudaSetDevice(d);
  void *p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
  return static_cast<float *>(p); /* 0xff bytes: NaN until written */
}

std::vector<float> download(int d, const float *p, size_t n) {
  cudaSetDevice(d);
  std::vector<float> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

bool same(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

ncclResult_t async_error(ncclComm_t c) {
  ncclResult_t r = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(c, &r), ncclSuccess);
  return r;
}

/* Poll until the communicator's asynchronous state leaves ncclSuccess/ncclInProgress. */
ncclResult_t wait_async_error(ncclComm_t c, double limit_ms) {
  const auto t0 = Clock::now();
  ncclResult_t r;
  while ((r = async_error(c)) == ncclSuccess || r == ncclInProgress) {
    if (ms_since(t0) > limit_ms) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return r;
}

/* N ranks on N simulated devices in this process, one stream each. */
struct Clique {
  std::vector<ncclComm_t> comm;
  std::vector<cudaStream_t> stream;
  explicit Clique(int n) : comm(static_cast<size_t>(n)), stream(static_cast<size_t>(n)) {
    cudasim::set_device_count(std::max(2, n));
    EXPECT_EQ(ncclCommInitAll(comm.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    for (int d = 0; d < n; ++d) {
      cudaSetDevice(d);
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream[static_cast<size_t>(d)], cudaStreamNonBlocking), cudaSuccess);
    }
    cudaSetDevice(0);
  }
  ~Clique() {
    for (ncclComm_t c : comm)
      if (c) ncclCommDestroy(c);
    for (size_t d = 0; d < stream.size(); ++d) {
      cudaSetDevice(static_cast<int>(d));
      cudaStreamDestroy(stream[d]);
    }
    cudaSetDevice(0);
  }
  void sync(int d) {
    cudaSetDevice(d);
    EXPECT_EQ(cudaStreamSynchronize(stream[static_cast<size_t>(d)]), cudaSuccess);
  }
};

TEST(NcclSim, VersionStringsAndCommunicatorQueries) {
  int v = 0;
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_STRNE(ncclGetErrorString(ncclRemoteError), ncclGetErrorString(ncclInvalidUsage));
  Clique q(3);
  for (int r = 0; r < 3; ++r) {
    int n = 0, rank = -1, dev = -1;
    ASSERT_EQ(ncclCommCount(q.comm[static_cast<size_t>(r)], &n), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(q.comm[static_cast<size_t>(r)], &rank), ncclSuccess);
    ASSERT_EQ(ncclCommCuDevice(q.comm[static_cast<size_t>(r)], &dev), ncclSuccess);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(dev, r);
    EXPECT_EQ(async_error(q.comm[static_cast<size_t>(r)]), ncclSuccess);
  }
}

/* Three messages from 0 to 1 and two from 2 to 1, issued without groups: each pair's
 * messages land in the order they were sent, whatever the interleaving across pairs. */
TEST(NcclSim, SendsAndReceivesMatchInOrderPerPeerPair) {
  Clique q(3);
  const size_t n = 1001;
  std::vector<std::vector<float>> from0, from2;
  std::vector<float *> src0, src2, dst0, dst2;
  for (unsigned i = 0; i < 3; ++i) {
    from0.push_back(random_floats(n, 10 + i));
    src0.push_back(upload(0, from0.back()));
    dst0.push_back(device_floats(1, n));
  }
  for (unsigned i = 0; i < 2; ++i) {
    from2.push_back(random_floats(n, 20 + i));
    src2.push_back(upload(2, from2.back()));
    dst2.push_back(device_floats(1, n));
  }
  /* Receives first, from both peers interleaved; the sends follow. */
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(ncclRecv(dst0[i], n, ncclFloat32, 0, q.comm[1], q.stream[1]), ncclSuccess);
    if (i < 2) {
      ASSERT_EQ(ncclRecv(dst2[i], n, ncclFloat32, 2, q.comm[1], q.stream[1]), ncclSuccess);
    }
  }
  for (size_t i = 0; i < 2; ++i) ASSERT_EQ(ncclSend(src2[i], n, ncclFloat32, 1, q.comm[2], q.stream[2]), ncclSuccess);
  for (size_t i = 0; i < 3; ++i) ASSERT_EQ(ncclSend(src0[i], n, ncclFloat32, 1, q.comm[0], q.stream[0]), ncclSuccess);
  for (int d = 0; d < 3; ++d) q.sync(d);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(same(download(1, dst0[i], n), from0[i])) << "message " << i << " from 0";
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(same(download(1, dst2[i], n), from2[i])) << "message " << i << " from 2";
  for (int r = 0; r < 3; ++r) EXPECT_EQ(async_error(q.comm[static_cast<size_t>(r)]), ncclSuccess);
  for (float *p : src0) cudaFree(p);
  for (float *p : src2) cudaFree(p);
  for (float *p : dst0) cudaFree(p);
  for (float *p : dst2) cudaFree(p);
}

/* A count or a type that differs between the two sides fails both sides; the receive buffer
 * is left as it was. Same byte count with another type is still a mismatch. */
TEST(NcclSim, CountOrTypeMismatchIsAnErrorOnBothSides) {
  struct Case {
    size_t send_n, recv_n;
    ncclDataType_t send_t, recv_t;
  };
  const Case cases[] = {{10, 11, ncclFloat32, ncclFloat32}, {10, 10, ncclFloat32, ncclInt32},
                        {0, 3, ncclFloat32, ncclFloat32}};
  for (const Case &c : cases) {
    Clique q(2);
    const std::vector<float> payload = random_floats(16, 5);
    float *src = upload(0, payload);
    const std::vector<float> before = random_floats(16, 6);
    float *dst = upload(1, before);
    ASSERT_EQ(ncclSend(src, c.send_n, c.send_t, 1, q.comm[0], q.stream[0]), ncclSuccess);
    ASSERT_EQ(ncclRecv(dst, c.recv_n, c.recv_t, 0, q.comm[1], q.stream[1]), ncclSuccess);
    EXPECT_EQ(wait_async_error(q.comm[1], 5000), ncclInvalidUsage);
    EXPECT_EQ(wait_async_error(q.comm[0], 5000), ncclInvalidUsage);
    EXPECT_NE(std::string(ncclGetLastError(q.comm[1])).find("does not match"), std::string::npos)
        << ncclGetLastError(q.comm[1]);
    q.sync(0);
    q.sync(1);
    EXPECT_TRUE(same(download(1, dst, 16), before)) << "the receive buffer was written despite the mismatch";
    /* The error is sticky: further operations are refused. */
    EXPECT_EQ(ncclSend(src, 1, ncclFloat32, 1, q.comm[0], q.stream[0]), ncclInvalidUsage);
    cudaFree(src);
    cudaFree(dst);
  }
}

/* A receive with no matching send blocks its stream (asynchronously: the host thread goes
 * on); aborting the communicator releases it. */
TEST(NcclSim, AbortReleasesABlockedReceive) {
  Clique q(2);
  float *dst = device_floats(1, 64);
  cudaEvent_t ev;
  cudaSetDevice(1);
  ASSERT_EQ(cudaEventCreate(&ev), cudaSuccess);
  float *copy = device_floats(1, 64);
  ASSERT_EQ(ncclRecv(dst, 64, ncclFloat32, 0, q.comm[1], q.stream[1]), ncclSuccess);
  /* A copy behind the blocked receive is queued: the host thread is not held. */
  const auto tq = Clock::now();
  ASSERT_EQ(cudaMemcpyAsync(copy, dst, 64 * sizeof(float), cudaMemcpyDeviceToDevice, q.stream[1]), cudaSuccess);
  EXPECT_LT(ms_since(tq), 1000.0);
  ASSERT_EQ(cudaEventRecord(ev, q.stream[1]), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(q.stream[1]), cudaErrorNotReady);
  const auto t0 = Clock::now();
  ASSERT_EQ(ncclCommAbort(q.comm[1]), ncclSuccess);
  q.comm[1] = nullptr;
  q.sync(1);
  EXPECT_EQ(cudaEventQuery(ev), cudaSuccess);
  EXPECT_LT(ms_since(t0), 5000.0);
  /* The peer learns: its send to the aborted rank fails, within a bound. */
  float *src = upload(0, random_floats(64, 3));
  ASSERT_EQ(ncclSend(src, 64, ncclFloat32, 1, q.comm[0], q.stream[0]), ncclSuccess);
  EXPECT_EQ(wait_async_error(q.comm[0], 5000), ncclRemoteError);
  q.sync(0);
  cudaEventDestroy(ev);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(copy);
}

/* The peer aborting releases our blocked receive with ncclRemoteError. */
TEST(NcclSim, PeerAbortFailsABlockedReceive) {
  Clique q(2);
  float *dst = device_floats(1, 8);
  ASSERT_EQ(ncclRecv(dst, 8, ncclFloat32, 0, q.comm[1], q.stream[1]), ncclSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(async_error(q.comm[1]), ncclSuccess);
  ASSERT_EQ(ncclCommAbort(q.comm[0]), ncclSuccess);
  q.comm[0] = nullptr;
  EXPECT_EQ(wait_async_error(q.comm[1], 5000), ncclRemoteError);
  q.sync(1);
  cudaFree(dst);
}

/* Each rank on its own thread sends to and receives from the other on one stream. In a
 * group that completes; the same two calls outside a group block (every send is a
 * rendezvous) until aborted. */
TEST(NcclSim, GroupPostsSendAndReceiveTogether) {
  for (bool grouped : {true, false}) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    const size_t n = 4099;
    std::vector<std::vector<float>> got(2);
    std::vector<ncclComm_t> comms(2, nullptr);
    std::vector<bool> finished(2, false);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        cudaSetDevice(r);
        ncclComm_t c;
        ASSERT_EQ(ncclCommInitRank(&c, 2, id, r), ncclSuccess);
        comms[static_cast<size_t>(r)] = c;
        cudaStream_t s;
        cudaStreamCreate(&s);
        float *src = upload(r, random_floats(n, 100 + static_cast<unsigned>(r)));
        float *dst = device_floats(r, n);
        if (grouped) ncclGroupStart();
        EXPECT_EQ(ncclSend(src, n, ncclFloat32, 1 - r, c, s), ncclSuccess);
        EXPECT_EQ(ncclRecv(dst, n, ncclFloat32, 1 - r, c, s), ncclSuccess);
        if (grouped) {
          EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
        }
        cudaStreamSynchronize(s); /* returns once the exchange is done or the comm aborted */
        finished[static_cast<size_t>(r)] = true;
        got[static_cast<size_t>(r)] = download(r, dst, n);
        cudaStreamDestroy(s);
        cudaFree(src);
        cudaFree(dst);
      });
    if (!grouped) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_FALSE(finished[0] || finished[1]) << "an ungrouped send/recv pair completed";
      while (!comms[0] || !comms[1]) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      for (ncclComm_t c : comms) ncclCommAbort(c);
    }
    for (auto &t : ts) t.join();
    if (grouped) {
      EXPECT_TRUE(same(got[0], random_floats(n, 101)));
      EXPECT_TRUE(same(got[1], random_floats(n, 100)));
      for (ncclComm_t c : comms) {
        EXPECT_EQ(async_error(c), ncclSuccess);
        ncclCommDestroy(c);
      }
    }
  }
}

/* One thread driving all devices: a ring exchange among three ranks in one group. */
TEST(NcclSim, OneThreadRingInOneGroup) {
  Clique q(3);
  const size_t n = 777;
  std::vector<float *> src, dst;
  for (int r = 0; r < 3; ++r) {
    src.push_back(upload(r, random_floats(n, 200 + static_cast<unsigned>(r))));
    dst.push_back(device_floats(r, n));
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    const size_t i = static_cast<size_t>(r);
    ASSERT_EQ(ncclSend(src[i], n, ncclFloat32, (r + 1) % 3, q.comm[i], q.stream[i]), ncclSuccess);
    ASSERT_EQ(ncclRecv(dst[i], n, ncclFloat32, (r + 2) % 3, q.comm[i], q.stream[i]), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 3; ++r) q.sync(r);
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(same(download(r, dst[static_cast<size_t>(r)], n), random_floats(n, 200 + static_cast<unsigned>((r + 2) % 3))));
  for (int r = 0; r < 3; ++r) {
    cudaFree(src[static_cast<size_t>(r)]);
    cudaFree(dst[static_cast<size_t>(r)]);
  }
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
}

/* Stream order: a kernel and a copy issued after a receive on the same stream see the
 * received data, even though the send is posted 150 ms later. */
TEST(NcclSim, WorkAfterAReceiveOnItsStreamSeesTheData) {
  Clique q(2);
  const int blocks = 3, per = 256;
  const std::vector<float> payload = random_floats(size_t(blocks) * per, 42);
  float *src = upload(0, payload);
  float *dst = device_floats(1, payload.size());
  float *copy = device_floats(1, payload.size());
  float *sums = device_floats(1, blocks);
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    EXPECT_EQ(ncclSend(src, payload.size(), ncclFloat32, 1, q.comm[0], q.stream[0]), ncclSuccess);
  });
  cudaSetDevice(1);
  ASSERT_EQ(ncclRecv(dst, payload.size(), ncclFloat32, 0, q.comm[1], q.stream[1]), ncclSuccess);
  ASSERT_EQ(tk_block_sum(sums, dst, per, blocks, q.stream[1]), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(copy, dst, payload.size() * sizeof(float), cudaMemcpyDeviceToDevice, q.stream[1]),
            cudaSuccess);
  q.sync(1);
  sender.join();
  EXPECT_TRUE(same(download(1, copy, payload.size()), payload));
  const std::vector<float> s = download(1, sums, blocks);
  for (int b = 0; b < blocks; ++b) {
    double ref = 0;
    for (int i = 0; i < per; ++i) ref += payload[size_t(b) * per + size_t(i)];
    EXPECT_NEAR(s[size_t(b)], ref, 1e-3) << "block " << b;
  }
  q.sync(0);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(copy);
  cudaFree(sums);
}

/* A middle rank forwards: receive from 0, then send the same buffer to 2, both queued on
 * one stream before rank 0 has sent anything. The send reads the buffer only after the
 * receive filled it. */
TEST(NcclSim, ForwardingOnOneStreamSendsWhatWasReceived) {
  Clique q(3);
  const size_t n = 2049;
  const std::vector<float> payload = random_floats(n, 55);
  float *src = upload(0, payload);
  float *mid = device_floats(1, n);
  float *dst = device_floats(2, n);
  ASSERT_EQ(ncclRecv(mid, n, ncclFloat32, 0, q.comm[1], q.stream[1]), ncclSuccess);
  ASSERT_EQ(ncclSend(mid, n, ncclFloat32, 2, q.comm[1], q.stream[1]), ncclSuccess);
  ASSERT_EQ(ncclRecv(dst, n, ncclFloat32, 1, q.comm[2], q.stream[2]), ncclSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_EQ(ncclSend(src, n, ncclFloat32, 1, q.comm[0], q.stream[0]), ncclSuccess);
  for (int d = 0; d < 3; ++d) q.sync(d);
  EXPECT_TRUE(same(download(2, dst, n), payload));
  cudaFree(src);
  cudaFree(mid);
  cudaFree(dst);
}

/* Non-blocking init reports ncclInProgress until every rank joined; operations before that
 * are refused; aborting a communicator still in init returns promptly. */
TEST(NcclSim, NonBlockingInitAndAbortDuringInit) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c0 = nullptr, c1 = nullptr;
  cudaSetDevice(0);
  ASSERT_EQ(ncclCommInitRankConfig(&c0, 2, id, 0, &cfg), ncclInProgress);
  ASSERT_NE(c0, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(async_error(c0), ncclInProgress);
  float *buf = device_floats(0, 4);
  EXPECT_EQ(ncclSend(buf, 4, ncclFloat32, 1, c0, nullptr), ncclInvalidUsage);
  cudaSetDevice(1);
  ASSERT_EQ(ncclCommInitRankConfig(&c1, 2, id, 1, &cfg), ncclInProgress);
  const auto t0 = Clock::now();
  while ((async_error(c0) == ncclInProgress || async_error(c1) == ncclInProgress) && ms_since(t0) < 5000)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(async_error(c0), ncclSuccess);
  EXPECT_EQ(async_error(c1), ncclSuccess);
  ncclCommDestroy(c0);
  ncclCommDestroy(c1);

  /* A rank whose peer never comes: abort it while it waits. */
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  cudaSetDevice(0);
  ASSERT_EQ(ncclCommInitRankConfig(&c0, 2, id, 0, &cfg), ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const auto t1 = Clock::now();
  ASSERT_EQ(ncclCommAbort(c0), ncclSuccess);
  EXPECT_LT(ms_since(t1), 5000.0);
  cudaFree(buf);
}

/* A blocking init whose peer never comes fails at the bootstrap timeout, not never. */
TEST(NcclSim, BlockingInitFailsAtTheBootstrapTimeout) {
  setenv("CUDASIM_NCCL_TIMEOUT_MS", "200", 1);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c = reinterpret_cast<ncclComm_t>(&id); /* must be cleared */
  cudaSetDevice(0);
  const auto t0 = Clock::now();
  EXPECT_EQ(ncclCommInitRank(&c, 2, id, 0), ncclSystemError);
  const double ms = ms_since(t0);
  unsetenv("CUDASIM_NCCL_TIMEOUT_MS");
  EXPECT_EQ(c, nullptr);
  EXPECT_GE(ms, 150.0);
  EXPECT_LT(ms, 5000.0);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 0"), std::string::npos) << ncclGetLastError(nullptr);
}

TEST(NcclSim, InvalidArgumentsAreRefused) {
  Clique q(2);
  float *on0 = device_floats(0, 8), *on1 = device_floats(1, 8);
  std::vector<float> host(8);
  EXPECT_EQ(ncclSend(host.data(), 8, ncclFloat32, 1, q.comm[0], q.stream[0]), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(on1, 8, ncclFloat32, 1, q.comm[0], q.stream[0]), ncclInvalidArgument);  /* other device */
  EXPECT_EQ(ncclSend(on0, 9, ncclFloat32, 1, q.comm[0], q.stream[0]), ncclInvalidArgument);  /* past the end */
  EXPECT_EQ(ncclSend(on0, 8, ncclFloat32, 2, q.comm[0], q.stream[0]), ncclInvalidArgument);  /* no rank 2 */
  EXPECT_EQ(ncclSend(on0, 8, ncclNumTypes, 1, q.comm[0], q.stream[0]), ncclInvalidArgument); /* bad type */
  EXPECT_EQ(ncclSend(on0, 8, ncclFloat32, 1, q.comm[0], q.stream[1]), ncclInvalidArgument);  /* other device's stream */
  EXPECT_EQ(ncclSend(on0, 8, ncclFloat32, 1, nullptr, q.stream[0]), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)), "");
  ncclUniqueId junk;
  memset(&junk, 7, sizeof junk);
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRank(&c, 2, junk, 0), ncclInvalidArgument);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(async_error(q.comm[static_cast<size_t>(r)]), ncclSuccess);
  cudaFree(on0);
  cudaFree(on1);
}

/* Two processes: the child echoes a payload back doubled; the unique id crosses the fork. */
TEST(NcclSim, TwoProcessesExchangePayloads) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const size_t n = 100003; /* > a socket buffer: the payload moves in pieces */
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ncclComm_t c;
    if (ncclCommInitRank(&c, 2, id, 1) != ncclSuccess) _exit(2);
    float *buf = device_floats(0, n);
    if (ncclRecv(buf, n, ncclFloat32, 0, c, nullptr) != ncclSuccess) _exit(3);
    std::vector<float> v = download(0, buf, n); /* cudaMemcpy waits for the receive */
    /* Kernels run in a forked child too (the parent's block-runner threads are not there). */
    float *sum = device_floats(0, 1);
    if (tk_block_sum(sum, buf, 256, 1, nullptr) != cudaSuccess) _exit(7);
    double ref = 0;
    for (size_t i = 0; i < 256; ++i) ref += v[i];
    if (std::fabs(download(0, sum, 1)[0] - ref) > 1e-3) _exit(8);
    for (float &x : v) x *= 2.0f;
    float *out = upload(0, v);
    if (ncclSend(out, n, ncclFloat32, 0, c, nullptr) != ncclSuccess) _exit(4);
    if (cudaStreamSynchronize(nullptr) != cudaSuccess) _exit(5);
    ncclResult_t e;
    ncclCommGetAsyncError(c, &e);
    ncclCommDestroy(c);
    _exit(e == ncclSuccess ? 0 : 6);
  }
  ncclComm_t c;
  cudaSetDevice(0);
  ASSERT_EQ(ncclCommInitRank(&c, 2, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
  const std::vector<float> payload = random_floats(n, 77);
  float *src = upload(0, payload);
  float *back = device_floats(0, n);
  ASSERT_EQ(ncclSend(src, n, ncclFloat32, 1, c, nullptr), ncclSuccess);
  ASSERT_EQ(ncclRecv(back, n, ncclFloat32, 1, c, nullptr), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(async_error(c), ncclSuccess) << ncclGetLastError(c);
  std::vector<float> want = payload;
  for (float &x : want) x *= 2.0f;
  EXPECT_TRUE(same(download(0, back, n), want));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ncclCommDestroy(c);
  cudaFree(src);
  cudaFree(back);
}

/* The peer process exits while our receive waits: ncclRemoteError, the stream is released. */
TEST(NcclSim, PeerProcessExitFailsTheReceive) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ncclComm_t c;
    if (ncclCommInitRank(&c, 2, id, 1) != ncclSuccess) _exit(2);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    _exit(0); /* no destroy: the process just goes */
  }
  ncclComm_t c;
  cudaSetDevice(0);
  ASSERT_EQ(ncclCommInitRank(&c, 2, id, 0), ncclSuccess);
  float *dst = device_floats(0, 32);
  ASSERT_EQ(ncclRecv(dst, 32, ncclFloat32, 1, c, nullptr), ncclSuccess);
  EXPECT_EQ(wait_async_error(c, 5000), ncclRemoteError);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  int status = 0;
  waitpid(pid, &status, 0);
  ncclCommDestroy(c);
  cudaFree(dst);
}

}  // namespace
