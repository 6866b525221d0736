// The NCCL seam transport (MK_SEAM_NCCL) end to end on the cuda backend under cudasim:
// whole vs split over NCCL within one process (2 and 3 simulated devices) and across two
// processes, bit for bit; and its faults, each a clear status within the deadline: a
// header for another model or layer, header and payload sizes that disagree, a peer that
// aborts, a peer process that exits mid-step; placement errors (one device, cpu backend).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "protocol/boundary.h"
#include "cudasim.h"
#include "mk_test_util.h"
#include "seam/nccl/nccl_comm.h"
#include "seam/nccl/nccl_seam.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDeadlineMs = 300;
/* How late a fault may surface past its deadline on a loaded CI machine (sanitizers,
 * parallel tests): generous, yet a hang still fails. */
constexpr double kSlackMs = kDeadlineMs + 2000.0;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

void need_sim_devices(int n) {
    int have = 0;
    cudaGetDeviceCount(&have);
    if (have < n) cudasim::set_device_count(n);
}

mk_range_options cuda_on(int device) {
    mk_range_options o = mk_range_options_default();
    o.backend = mk_backend_config_default(MK_BACKEND_CUDA);
    o.backend.device = device;
    return o;
}

mk_seam_options nccl_options(const char *address = nullptr) {
    mk_seam_options s = mk_seam_options_default(MK_SEAM_NCCL);
    s.address = address;
    s.io_timeout_ms = kDeadlineMs;
    s.connect_timeout_ms = 5000;
    return s;
}

struct PipelineDeleter { void operator()(mk_pipeline *p) const { mk_pipeline_free(p); } };
using PipelinePtr = std::unique_ptr<mk_pipeline, PipelineDeleter>;
struct BoundaryDeleter { void operator()(mk_boundary *b) const { mk_boundary_free(b); } };
using BoundaryPtr = std::unique_ptr<mk_boundary, BoundaryDeleter>;
struct SeamDeleter { void operator()(mk_seam *s) const { mk_seam_free(s); } };
using SeamPtr = std::unique_ptr<mk_seam, SeamDeleter>;

// Greedy decode through a pipeline whose ranges sit on `devices`.
Decode decode_placed(const mk_model *model, const std::vector<int64_t> &cuts, const std::vector<int> &devices,
                     const mk_seam_options &seam, const std::vector<int32_t> &prompt, size_t n_steps,
                     size_t max_context = 0) {
    Decode d;
    mk_range_options o = cuda_on(devices[0]);
    o.max_context = max_context;
    mk_pipeline *p = nullptr;
    const mk_pipeline_options po = pipeline_options(cuts.data(), cuts.size(), &o, &seam, devices.data(), devices.size());
    const mk_status s = mk_pipeline_create(model, &po, &p);
    EXPECT_EQ(s, MK_OK) << mk_status_name(s) << ": " << mk_last_error();
    if (s != MK_OK) return d;
    PipelinePtr pipe(p);
    std::vector<int32_t> next = prompt;
    for (size_t i = 0; i < n_steps; i++) {
        mk_tail_output *t = nullptr;
        const mk_status st = mk_pipeline_step(p, next.data(), next.size(), &t);
        TailPtr out(t);
        EXPECT_EQ(st, MK_OK) << mk_status_name(st) << ": " << mk_last_error();
        if (st != MK_OK) return d;
        d.logits.push_back(logits_of(out));
        d.tokens.push_back(out->token_ids[0]);
        next = {out->token_ids[0]};
    }
    if (!cuts.empty()) {
        EXPECT_GT(mk_pipeline_seam_bytes(p), 0u);
    }
    return d;
}

void expect_identical(const Decode &a, const Decode &b, const char *what) {
    ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
    for (size_t i = 0; i < a.logits.size(); i++) {
        ASSERT_EQ(a.logits[i].size(), b.logits[i].size()) << what;
        EXPECT_EQ(memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)), 0)
            << what << ": step " << i;
    }
    EXPECT_EQ(a.tokens, b.tokens) << what;
}

// ============================================================ in-process parity ==

class NcclPipeline : public ::testing::TestWithParam<size_t> {};

TEST_P(NcclPipeline, WholeAndSplitsOverTwoAndThreeDevicesAreBitIdentical) {
    need_sim_devices(3);
    const ModelCase c = model_cases()[GetParam()];
    ModelPtr model = make_random_model(c.hp);
    const int64_t L = (int64_t)c.hp.n_layers;
    const size_t n = 5;
    ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
    const Decode whole = decode_placed(model.get(), {}, {0}, mk_seam_options_default(MK_SEAM_LOCAL), c.prompt, n);
    ASSERT_EQ(whole.tokens.size(), n);
    expect_identical(whole, decode_placed(model.get(), {L / 2}, {0, 1}, nccl_options(), c.prompt, n), "2 devices");
    expect_identical(whole, decode_placed(model.get(), {1, L - 2}, {0, 1, 2}, nccl_options(), c.prompt, n),
                     "3 devices");
    // Placement is not fixed to ascending devices: the head on device 2.
    expect_identical(whole, decode_placed(model.get(), {L / 2}, {2, 0}, nccl_options(), c.prompt, n), "devices 2,0");
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 2) << "the caller's current device must survive the seams";
}

INSTANTIATE_TEST_SUITE_P(RandomModels, NcclPipeline, ::testing::Values(size_t{0}, size_t{1}),
                         [](const ::testing::TestParamInfo<size_t> &i) { return std::string(model_cases()[i.param].name); });

TEST(NcclPipelineSmolLM2, WholeAndTwoDeviceSplitAreBitIdentical) {
    need_sim_devices(2);
    const std::string path = mk_test_model_path();
    MK_REQUIRE_MODEL_FILE(path);
    mk_model *m = nullptr;
    ASSERT_EQ(mk_model_open_gguf(path.c_str(), &m), MK_OK) << path << " is present but does not open: " << mk_last_error();
    ModelPtr model(m);
    const std::vector<int32_t> prompt = {1, 9690, 28, 198, 504};
    const size_t n = 2; // seconds a step simulated: a prefill and one decode step each way
    const Decode whole = decode_placed(model.get(), {}, {0}, mk_seam_options_default(MK_SEAM_LOCAL), prompt, n, 32);
    ASSERT_EQ(whole.tokens.size(), n);
    // The seam's deadline runs while the device still computes what was queued before the
    // send (stream work is asynchronous, under cudasim as on a GPU): a simulated SmolLM2
    // range takes seconds, so this test, which is not about deadlines, allows for that.
    mk_seam_options seam = nccl_options();
    seam.io_timeout_ms = 60000;
    expect_identical(whole, decode_placed(model.get(), {14}, {0, 1}, seam, prompt, n, 32), "SmolLM2 2 devices");
}

// ================================================================ placement ==

TEST(NcclPipeline, RangesOnOneDeviceOrOnTheCpuAreRefusedClearly) {
    need_sim_devices(2);
    const ModelCase c = model_cases()[0];
    ModelPtr model = make_random_model(c.hp);
    const mk_seam_options seam = nccl_options();
    mk_range_options o = cuda_on(0);
    const int64_t cut = 1;
    mk_pipeline *p = nullptr;
    const int same[] = {1, 1};
    const mk_pipeline_options on_same = pipeline_options(&cut, 1, &o, &seam, same, 2);
    EXPECT_ERROR(mk_pipeline_create(model.get(), &on_same, &p), MK_ERR_UNSUPPORTED,
                 "distinct devices");
    EXPECT_EQ(p, nullptr);
    const int one[] = {0};
    const mk_pipeline_options on_one = pipeline_options(&cut, 1, &o, &seam, one, 1);
    EXPECT_ERROR(mk_pipeline_create(model.get(), &on_one, &p), MK_ERR_INVALID_ARGUMENT,
                 "one per range");
    mk_range_options cpu = mk_range_options_default();
    const mk_pipeline_options on_cpu = pipeline_options(&cut, 1, &cpu, &seam);
    EXPECT_ERROR(mk_pipeline_create(model.get(), &on_cpu, &p), MK_ERR_UNSUPPORTED,
                 "needs the cuda backend");
    EXPECT_EQ(p, nullptr);
    mk_seam_kind k{};
    ASSERT_EQ(mk_seam_kind_from_name("nccl", &k), MK_OK);
    EXPECT_EQ(k, MK_SEAM_NCCL);
    EXPECT_STREQ(mk_seam_kind_name(MK_SEAM_NCCL), "nccl");
}

// ============================================================ contract faults ==

// A head and a tail joined by an NCCL pair; one step's boundary sent and received.
struct Hop {
    RangePtr head, tail;
    SequencePtr hs, ts;
    BoundaryPtr out, in;
    SeamPtr tx, rx;
    Hop(const mk_model *head_model, int64_t head_end, const mk_model *tail_model, int64_t tail_start) {
        mk_range *r = nullptr;
        mk_range_options o0 = cuda_on(0), o1 = cuda_on(1);
        EXPECT_EQ(mk_range_create(head_model, 0, head_end, &o0, &r), MK_OK) << mk_last_error();
        head.reset(r);
        const int64_t L = (int64_t)mk_model_hparams(tail_model)->n_layers;
        EXPECT_EQ(mk_range_create(tail_model, tail_start, L - 1, &o1, &r), MK_OK) << mk_last_error();
        tail.reset(r);
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(head.get(), &s), MK_OK);
        hs.reset(s);
        EXPECT_EQ(mk_sequence_open(tail.get(), &s), MK_OK);
        ts.reset(s);
        mk_boundary *b = nullptr;
        EXPECT_EQ(mk_boundary_create(head.get(), &b), MK_OK);
        out.reset(b);
        EXPECT_EQ(mk_boundary_create(tail.get(), &b), MK_OK);
        in.reset(b);
        const mk_seam_options seam = nccl_options();
        mk_seam *t = nullptr, *x = nullptr;
        EXPECT_EQ(mk_seam_pair(&seam, head.get(), tail.get(), &t, &x), MK_OK) << mk_last_error();
        tx.reset(t);
        rx.reset(x);
    }
    mk_status head_forward(const std::vector<int32_t> &tokens) {
        return mk_range_forward_boundary(head.get(), hs.get(), tokens.data(), tokens.size(), nullptr, nullptr,
                                         out.get(), nullptr);
    }
};

void expect_refused_then_dead(Hop &h, mk_status want, const char *needle) {
    const std::vector<int32_t> prompt = {3, 9, 27, 4};
    ASSERT_EQ(h.head_forward(prompt), MK_OK) << mk_last_error();
    ASSERT_EQ(mk_seam_send(h.tx.get(), h.out.get()), MK_OK) << mk_last_error();
    const auto t0 = Clock::now();
    EXPECT_ERROR(mk_seam_recv(h.rx.get(), h.ts.get(), h.in.get()), want, needle);
    EXPECT_LT(ms_since(t0), kSlackMs);
    EXPECT_EQ(mk_boundary_header_of(h.in.get())->rows, 0u) << "a refused boundary must stay empty";
    // The sender learns within its deadline that the exchange is gone (no hang).
    const auto t1 = Clock::now();
    const mk_status ws = mk_seam_send_wait(h.tx.get());
    EXPECT_NE(ws, MK_OK);
    EXPECT_TRUE(ws == MK_ERR_PEER_CLOSED || ws == MK_ERR_PEER_TIMEOUT) << mk_status_name(ws) << ": " << mk_last_error();
    EXPECT_LT(ms_since(t1), kSlackMs);
    // The communicator was aborted: the seam stays dead, clearly.
    EXPECT_ERROR(mk_seam_recv(h.rx.get(), h.ts.get(), h.in.get()), MK_ERR_PEER_CLOSED, "aborted");
}

TEST(NcclSeamFaults, HeaderForAnotherModelIsRefusedByTheContract) {
    need_sim_devices(2);
    const ModelCase c = model_cases()[0];
    ModelPtr a = make_random_model(c.hp, 1), b = make_random_model(c.hp, 2);
    Hop h(a.get(), 1, b.get(), 2);
    ASSERT_STRNE(mk_range_recipe_digest(h.head.get()), mk_range_recipe_digest(h.tail.get()));
    expect_refused_then_dead(h, MK_ERR_RECIPE_DIGEST, "recipe digest");
}

TEST(NcclSeamFaults, HeaderForAnotherLayerIsRefusedByTheContract) {
    need_sim_devices(2);
    const ModelCase c = model_cases()[1];
    ModelPtr m = make_random_model(c.hp);
    Hop h(m.get(), 1, m.get(), 3); // the head ends at layer 1, the tail starts at 3
    expect_refused_then_dead(h, MK_ERR_SEAM_MISMATCH, "");
}

// In one process one thread drives both nccl ends and cannot wait for itself: there a
// batch of several is refused before anything is posted, and the single boundary still
// crosses after. (Across processes a batch is one exchange per entry: the stage runs.)
TEST(NcclSeamFaults, ABatchOfSeveralIsRefusedBeforeAnythingIsPosted) {
    need_sim_devices(2);
    const ModelCase c = model_cases()[0];
    ModelPtr m = make_random_model(c.hp);
    Hop h(m.get(), 1, m.get(), 2);
    ASSERT_EQ(h.head_forward({3, 9}), MK_OK) << mk_last_error();
    mk_boundary *b = nullptr;
    ASSERT_EQ(mk_boundary_create(h.head.get(), &b), MK_OK);
    BoundaryPtr second(b);
    mk_sequence *s = nullptr;
    ASSERT_EQ(mk_sequence_open(h.head.get(), &s), MK_OK);
    SequencePtr other(s);
    const std::vector<int32_t> one = {5};
    ASSERT_EQ(mk_range_forward_boundary(h.head.get(), s, one.data(), 1, nullptr, nullptr, b, nullptr), MK_OK);
    snprintf(h.out->h.request_id, sizeof h.out->h.request_id, "a");
    snprintf(b->h.request_id, sizeof b->h.request_id, "b");
    const mk_boundary *both[2] = {h.out.get(), b};
    EXPECT_ERROR(mk_seam_send_batch(h.tx.get(), both, 2), MK_ERR_UNSUPPORTED, "in one process a message is one sequence");
    EXPECT_EQ(mk_seam_bytes(h.tx.get()), 0u);
    ASSERT_EQ(mk_seam_send_batch(h.tx.get(), both, 1), MK_OK) << mk_last_error();
    ASSERT_EQ(mk_seam_recv(h.rx.get(), h.ts.get(), h.in.get()), MK_OK) << mk_last_error();
    EXPECT_EQ(mk_boundary_header_of(h.in.get())->rows, 2u);
    EXPECT_EQ(mk_seam_send_wait(h.tx.get()), MK_OK) << mk_last_error();
}

// Three sequences of 3, 1 and 2 rows through `head` (boundaries named "e0".."e2"), each
// with a sequence and an empty boundary on `tail` to receive into; route() names an
// entry's tail sequence; expect_arrived() compares every received entry bit for bit.
struct ThreeEntries {
    static constexpr size_t kRows[3] = {3, 1, 2};
    std::vector<SequencePtr> hs, ts;
    std::vector<BoundaryPtr> outs, ins;
    std::vector<const mk_boundary *> send;
    std::vector<mk_boundary *> into;
    void fill(mk_range *head, mk_range *tail, size_t vocab) {
        for (size_t k = 0; k < 3; k++) {
            mk_sequence *q = nullptr;
            ASSERT_EQ(mk_sequence_open(head, &q), MK_OK);
            hs.emplace_back(q);
            ASSERT_EQ(mk_sequence_open(tail, &q), MK_OK);
            ts.emplace_back(q);
            mk_boundary *b = nullptr;
            ASSERT_EQ(mk_boundary_create(head, &b), MK_OK);
            outs.emplace_back(b);
            send.push_back(b);
            ASSERT_EQ(mk_boundary_create(tail, &b), MK_OK);
            ins.emplace_back(b);
            into.push_back(b);
            std::vector<int32_t> ids(kRows[k]);
            for (size_t i = 0; i < kRows[k]; i++) ids[i] = (int32_t)((k * 7 + i * 3 + 1) % vocab);
            ASSERT_EQ(mk_range_forward_boundary(head, hs[k].get(), ids.data(), ids.size(), nullptr, nullptr,
                                                outs[k].get(), nullptr),
                      MK_OK)
                << mk_last_error();
            ASSERT_EQ(mk_boundary_set_request(outs[k].get(), ("e" + std::to_string(k)).c_str(), 0), MK_OK);
        }
    }
    static const mk_sequence *route(void *user, const mk_boundary_header *h) {
        const auto *e = static_cast<const ThreeEntries *>(user);
        return h->request_id[0] == 'e' && h->request_id[1] >= '0' && h->request_id[1] <= '2' && !h->request_id[2]
                   ? e->ts[(size_t)(h->request_id[1] - '0')].get()
                   : nullptr;
    }
    void expect_arrived(const mk_status st[3], size_t hidden) const {
        for (size_t k = 0; k < 3; k++) {
            EXPECT_EQ(st[k], MK_OK) << k;
            const size_t floats = kRows[k] * hidden;
            std::vector<float> a(floats), b(floats);
            ASSERT_EQ(mk_boundary_read(outs[k].get(), a.data(), floats), MK_OK);
            ASSERT_EQ(mk_boundary_read(ins[k].get(), b.data(), floats), MK_OK);
            EXPECT_EQ(memcmp(a.data(), b.data(), floats * sizeof(float)), 0) << "entry " << k;
            EXPECT_STREQ(mk_boundary_header_of(ins[k].get())->request_id, ("e" + std::to_string(k)).c_str());
        }
    }
};

// On the cuda backend the host-staged transports download each entry of a batch into the
// pinned staging buffer at its row offset (the cpu backend packs from where the rows lie):
// three sequences of 3, 1 and 2 rows as one message over wire and unix, each arriving
// bit-identical in its own boundary on the other device.
TEST(NcclSeamFaults, BatchEntriesAreStagedFromDeviceMemoryOverHostTransports) {
    need_sim_devices(2);
    const ModelCase c = model_cases()[0];
    ModelPtr m = make_random_model(c.hp);
    for (mk_seam_kind kind : {MK_SEAM_WIRE, MK_SEAM_UNIX}) {
        SCOPED_TRACE(mk_seam_kind_name(kind));
        mk_range *r = nullptr;
        mk_range_options o0 = cuda_on(0), o1 = cuda_on(1);
        ASSERT_EQ(mk_range_create(m.get(), 0, 1, &o0, &r), MK_OK) << mk_last_error();
        RangePtr head(r);
        const int64_t L = (int64_t)c.hp.n_layers;
        ASSERT_EQ(mk_range_create(m.get(), 2, L - 1, &o1, &r), MK_OK) << mk_last_error();
        RangePtr tail(r);
        const mk_seam_options so = mk_seam_options_default(kind);
        mk_seam *t = nullptr, *x = nullptr;
        ASSERT_EQ(mk_seam_pair(&so, head.get(), tail.get(), &t, &x), MK_OK) << mk_last_error();
        SeamPtr tx(t), rx(x);
        {
            ThreeEntries e;
            ASSERT_NO_FATAL_FAILURE(e.fill(head.get(), tail.get(), c.hp.vocab));
            ASSERT_EQ(mk_seam_send_batch(tx.get(), e.send.data(), 3), MK_OK) << mk_last_error();
            ASSERT_EQ(mk_seam_send_wait(tx.get()), MK_OK) << mk_last_error();
            size_t n = 0;
            mk_status st[3] = {MK_ERR_INTERNAL, MK_ERR_INTERNAL, MK_ERR_INTERNAL};
            ASSERT_EQ(mk_seam_recv_batch(rx.get(), &ThreeEntries::route, &e, e.into.data(), 3, &n, st), MK_OK)
                << mk_last_error();
            ASSERT_EQ(n, 3u);
            e.expect_arrived(st, c.hp.hidden);
        }
        rx.reset();
        tx.reset();
    }
}

// ===================================================== lying and dying peers ==

// The receiving end: a tail range on device 1 behind an NCCL listener (the id file).
struct Receiver {
    char dir[32] = "/tmp/mk_nccl_pipe_XXXXXX";
    std::string id_path;
    RangePtr tail;
    SequencePtr ts;
    BoundaryPtr in;
    mk_seam_listener *listener = nullptr;
    Receiver(const mk_model *model, int64_t start, int device) {
        EXPECT_NE(mkdtemp(dir), nullptr);
        id_path = std::string(dir) + "/id";
        mk_range_options o = cuda_on(device);
        mk_range *r = nullptr;
        const int64_t L = (int64_t)mk_model_hparams(model)->n_layers;
        EXPECT_EQ(mk_range_create(model, start, L - 1, &o, &r), MK_OK) << mk_last_error();
        tail.reset(r);
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(tail.get(), &s), MK_OK);
        ts.reset(s);
        mk_boundary *b = nullptr;
        EXPECT_EQ(mk_boundary_create(tail.get(), &b), MK_OK);
        in.reset(b);
        const mk_seam_options opt = nccl_options(id_path.c_str());
        EXPECT_EQ(mk_seam_listen(&opt, &listener), MK_OK) << mk_last_error();
        EXPECT_STREQ(mk_seam_listener_address(listener), id_path.c_str());
    }
    ~Receiver() {
        mk_seam_listener_free(listener); // removes the id file
        rmdir(dir);
    }
};

// A head range's first boundary (prompt on device 0), for a raw peer to misrepresent.
struct HeadOutput {
    RangePtr head;
    SequencePtr hs;
    BoundaryPtr out;
    HeadOutput(const mk_model *model, int64_t end) {
        mk_range_options o = cuda_on(0);
        mk_range *r = nullptr;
        EXPECT_EQ(mk_range_create(model, 0, end, &o, &r), MK_OK) << mk_last_error();
        head.reset(r);
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(head.get(), &s), MK_OK);
        hs.reset(s);
        mk_boundary *b = nullptr;
        EXPECT_EQ(mk_boundary_create(head.get(), &b), MK_OK);
        out.reset(b);
        const std::vector<int32_t> prompt = {5, 1, 30, 2, 8};
        EXPECT_EQ(mk_range_forward_boundary(head.get(), hs.get(), prompt.data(), prompt.size(), nullptr, nullptr,
                                            out.get(), nullptr),
                  MK_OK)
            << mk_last_error();
        // The payload is complete on the range's stream before a raw peer reads it.
        std::vector<float> host(mk_boundary_header_of(out.get())->rows * mk_model_hparams(model)->hidden);
        EXPECT_EQ(mk_boundary_read(out.get(), host.data(), host.size()), MK_OK) << mk_last_error();
    }
};

enum class Lie { kShortPayload, kLongPayload, kAbort };

// A raw sender (the primitives, rank 0 on device 0) on its own thread: joins through the
// id file, then declares a payload one row short of its header or one float longer, or
// aborts.
void raw_peer(const std::string &id_path, const mk_boundary *b, Lie lie, mk_status *result) {
    ncclUniqueId id;
    *result = mk_nccl_id_read_file(id_path.c_str(), &id, 5000);
    if (*result != MK_OK) return;
    mk_nccl_ctx ctx;
    *result = mk_nccl_init_rank(&ctx, 2, 0, &id, 0, nullptr, 5000);
    if (*result != MK_OK) return;
    *result = mk_nccl_warmup(&ctx, -1, 1);
    if (*result == MK_OK) {
        if (lie == Lie::kAbort) {
            ncclCommAbort(ctx.comm);
            ctx.comm = nullptr;
        } else {
            unsigned char header[MK_NCCL_BOUNDARY_HEADER_BYTES];
            mk_nccl_header_encode(&b->h, 0, header);
            const size_t floats = b->h.rows * b->h.hidden;
            const size_t bytes = (lie == Lie::kShortPayload ? floats - b->h.hidden : floats + 1) * sizeof(float);
            *result = mk_nccl_send_post(&ctx, 1, header, sizeof header, b->payload, bytes);
            if (*result == MK_OK) (void)mk_nccl_send_wait(&ctx); // released by the receiver's abort
        }
    }
    mk_nccl_ctx_destroy(&ctx);
}

void lying_peer_case(Lie lie, mk_status want, const char *needle) {
    need_sim_devices(2);
    const ModelCase c = model_cases()[1];
    ModelPtr model = make_random_model(c.hp);
    HeadOutput head(model.get(), 1);
    Receiver rx(model.get(), 2, 1);
    ASSERT_NE(rx.listener, nullptr);
    mk_status peer = MK_OK;
    std::thread t(raw_peer, rx.id_path, head.out.get(), lie, &peer);
    mk_seam *s = nullptr;
    const mk_status as = mk_seam_accept(rx.listener, rx.tail.get(), &s);
    SeamPtr end(s);
    if (as != MK_OK) {
        t.join();
        FAIL() << mk_status_name(as) << ": " << mk_last_error();
    }
    const auto t0 = Clock::now();
    EXPECT_ERROR(mk_seam_recv(end.get(), rx.ts.get(), rx.in.get()), want, needle);
    EXPECT_LT(ms_since(t0), kSlackMs);
    EXPECT_EQ(mk_boundary_header_of(rx.in.get())->rows, 0u);
    // The refusal took the communicator with it: the seam stays dead, clearly.
    EXPECT_ERROR(mk_seam_recv(end.get(), rx.ts.get(), rx.in.get()), MK_ERR_PEER_CLOSED, "aborted after an earlier failure");
    t.join();
    EXPECT_EQ(peer, MK_OK) << "the raw peer itself failed to set up";
}

// Across endpoints (a sender of its own, as another process would be) a batch is one
// exchange per entry, each header saying how many follow: three sequences' boundaries sent
// with one mk_seam_send_batch are taken by one mk_seam_recv_batch, each bit-identical in its
// own boundary. A receiver with room for fewer refuses the batch.
void nccl_batch_case(size_t room) {
    need_sim_devices(2);
    const ModelCase c = model_cases()[1];
    ModelPtr model = make_random_model(c.hp);
    Receiver rx(model.get(), 2, 1);
    ASSERT_NE(rx.listener, nullptr);
    mk_range_options o = cuda_on(0);
    mk_range *r = nullptr;
    ASSERT_EQ(mk_range_create(model.get(), 0, 1, &o, &r), MK_OK) << mk_last_error();
    RangePtr head(r);
    ThreeEntries e;
    ASSERT_NO_FATAL_FAILURE(e.fill(head.get(), rx.tail.get(), c.hp.vocab));
    mk_status sent = MK_ERR_INTERNAL;
    std::thread sender([&] {
        const mk_seam_options opt = nccl_options(rx.id_path.c_str());
        mk_seam *tx = nullptr;
        sent = mk_seam_connect(&opt, head.get(), &tx);
        if (sent == MK_OK) sent = mk_seam_send_batch(tx, e.send.data(), e.send.size());
        if (sent == MK_OK) sent = mk_seam_send_wait(tx);
        mk_seam_free(tx);
    });
    mk_seam *s = nullptr;
    const mk_status accepted = mk_seam_accept(rx.listener, rx.tail.get(), &s);
    SeamPtr end(s);
    if (accepted != MK_OK) {
        sender.join();
        FAIL() << mk_status_name(accepted) << ": " << mk_last_error();
    }
    size_t n = 0;
    mk_status st[3] = {MK_ERR_INTERNAL, MK_ERR_INTERNAL, MK_ERR_INTERNAL};
    const mk_status got = mk_seam_recv_batch(end.get(), &ThreeEntries::route, &e, e.into.data(), room, &n, st);
    if (room < 3) {
        EXPECT_EQ(got, MK_ERR_SHAPE) << mk_last_error();
        EXPECT_NE(std::string(mk_last_error()).find("more than the 2 entries this receiver takes"), std::string::npos)
            << mk_last_error();
        EXPECT_EQ(n, 0u);
        for (size_t k = 0; k < room; k++) EXPECT_EQ(mk_boundary_header_of(e.ins[k].get())->rows, 0u) << k;
        end.reset(); // the sender's last entry is never taken: it ends at its deadline or on the close
        sender.join();
        return;
    }
    ASSERT_EQ(got, MK_OK) << mk_last_error();
    ASSERT_EQ(n, 3u) << "one receive takes the whole batch";
    e.expect_arrived(st, c.hp.hidden);
    sender.join();
    EXPECT_EQ(sent, MK_OK) << mk_status_name(sent);
}

TEST(NcclSeamFaults, ABatchAcrossEndpointsIsTakenByOneReceive) { nccl_batch_case(3); }
TEST(NcclSeamFaults, ABatchLargerThanTheReceiversRoomIsRefused) { nccl_batch_case(2); }

TEST(NcclSeamFaults, HeaderAndPayloadSizesThatDisagreeAreRefused) {
    lying_peer_case(Lie::kShortPayload, MK_ERR_FRAME, "(720 bytes), the payload is 576 bytes");
}

// One float more than the header describes (within the receiver's buffer): refused too.
TEST(NcclSeamFaults, PayloadOneFloatLongerThanTheHeaderIsRefused) {
    lying_peer_case(Lie::kLongPayload, MK_ERR_FRAME, "1 x 5 x 36 floats (720 bytes), the payload is 724 bytes");
}

TEST(NcclSeamFaults, PeerThatAbortsIsReportedClosedWithinTheDeadline) {
    lying_peer_case(Lie::kAbort, MK_ERR_PEER_CLOSED, "");
}

// ============================================================ two processes ==

// The head of the two-process cases runs in a fresh process: this test binary started
// again (posix_spawn, no fork of the simulator's threads) with MK_NCCL_HEAD_CHILD set to
// "<id path>|<vanish 0/1>|<token>,<token>,...", running one two-process test, whose body
// sees the variable, runs the head and reports through the exit status alone: 0 ok, 9-15
// the step that failed. (Not from a static initializer: the simulator's statics may not
// be constructed yet.)
constexpr const char *kHeadChildEnv = "MK_NCCL_HEAD_CHILD";
constexpr int64_t kTwoProcessCut = 2;
constexpr size_t kTwoProcessSteps = 5;

int run_head_child(const std::string &spec) {
    const size_t bar1 = spec.find('|'), bar2 = spec.find('|', bar1 + 1);
    if (bar1 == std::string::npos || bar2 == std::string::npos) return 9;
    const std::string id_path = spec.substr(0, bar1);
    const bool vanish = spec[bar1 + 1] == '1';
    std::vector<int32_t> fed; // the whole run's tokens: each next step's input
    for (const char *p = spec.c_str() + bar2 + 1; *p;) {
        char *end = nullptr;
        fed.push_back((int32_t)strtol(p, &end, 10));
        if (end == p) return 9;
        p = *end == ',' ? end + 1 : end;
    }
    need_sim_devices(2);
    const ModelCase c = model_cases()[1];
    ModelPtr model = make_random_model(c.hp);
    mk_range_options o = cuda_on(0);
    mk_range *head = nullptr;
    mk_sequence *hs = nullptr;
    mk_boundary *out = nullptr;
    mk_seam *tx = nullptr;
    if (mk_range_create(model.get(), 0, kTwoProcessCut, &o, &head) != MK_OK) return 10;
    if (mk_sequence_open(head, &hs) != MK_OK || mk_boundary_create(head, &out) != MK_OK) return 11;
    const mk_seam_options opt = nccl_options(id_path.c_str());
    if (mk_seam_connect(&opt, head, &tx) != MK_OK) return 12;
    std::vector<int32_t> next = c.prompt;
    for (size_t i = 0; i < kTwoProcessSteps; i++) {
        if (mk_range_forward_boundary(head, hs, next.data(), next.size(), nullptr, nullptr, out, nullptr) != MK_OK)
            return 13;
        if (mk_seam_send(tx, out) != MK_OK) return 14;
        if (vanish) _exit(0); // mid-step for the parent: nothing torn down
        if (mk_seam_send_wait(tx) != MK_OK) return 15;
        if (i < fed.size()) next = {fed[i]};
    }
    mk_seam_free(tx);
    mk_boundary_free(out);
    mk_sequence_close(hs);
    mk_range_free(head);
    return 0;
}

// Starts this binary again as the head; -1 when it cannot be started.
pid_t spawn_head_child(const std::string &id_path, bool vanish, const std::vector<int32_t> &tokens) {
    std::string spec = id_path + (vanish ? "|1|" : "|0|");
    for (size_t i = 0; i < tokens.size(); i++) spec += (i ? "," : "") + std::to_string(tokens[i]);
    const std::string env_entry = std::string(kHeadChildEnv) + "=" + spec;
    std::vector<char *> envp;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, kHeadChildEnv, strlen(kHeadChildEnv)) != 0) envp.push_back(*e);
    envp.push_back(const_cast<char *>(env_entry.c_str()));
    envp.push_back(nullptr);
    char self[] = "/proc/self/exe";
    char filter[] = "--gtest_filter=NcclTwoProcesses.HeadInAChildTailInTheParentAreBitIdenticalToWhole";
    char *argv[] = {self, filter, nullptr};
    pid_t pid = -1;
    return posix_spawn(&pid, self, nullptr, nullptr, argv, envp.data()) == 0 ? pid : -1;
}

// The head in another process (sim device 0) sends each step's boundary over NCCL, fed the
// whole-model run's tokens; the tail in this process (device 1) decodes. `vanish`: the
// child exits right after posting its first send (mid-step for the parent).
void two_process_case(bool vanish) {
    if (const char *spec = getenv(kHeadChildEnv)) _exit(run_head_child(spec));
    need_sim_devices(2);
    const ModelCase c = model_cases()[1];
    ModelPtr model = make_random_model(c.hp);
    const int64_t cut = kTwoProcessCut;
    const size_t n = kTwoProcessSteps;
    const Decode whole = decode_placed(model.get(), {}, {0}, mk_seam_options_default(MK_SEAM_LOCAL), c.prompt, n);
    ASSERT_EQ(whole.tokens.size(), n);
    Receiver rx(model.get(), cut + 1, 1);
    ASSERT_NE(rx.listener, nullptr);
    const pid_t pid = spawn_head_child(rx.id_path, vanish, whole.tokens);
    ASSERT_GT(pid, 0) << "posix_spawn of the head process failed";
    mk_seam *s = nullptr;
    const mk_status as = mk_seam_accept(rx.listener, rx.tail.get(), &s);
    SeamPtr end(s);
    Decode split;
    mk_status st = as;
    Clock::time_point t0 = Clock::now();
    for (size_t i = 0; st == MK_OK && i < n; i++) {
        t0 = Clock::now();
        st = mk_seam_recv(end.get(), rx.ts.get(), rx.in.get());
        if (st != MK_OK) break;
        mk_tail_output *t = nullptr;
        st = mk_range_forward_boundary(rx.tail.get(), rx.ts.get(), nullptr, 0, rx.in.get(), nullptr, nullptr, &t);
        TailPtr o(t);
        if (st != MK_OK) break;
        split.logits.push_back(logits_of(o));
        split.tokens.push_back(o->token_ids[0]);
    }
    const mk_status failed = st;
    const std::string why = mk_last_error();
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child exit " << WEXITSTATUS(status);
    ASSERT_EQ(as, MK_OK) << why;
    if (vanish) {
        EXPECT_TRUE(failed == MK_ERR_PEER_CLOSED) << mk_status_name(failed) << ": " << why;
        EXPECT_LT(ms_since(t0), kSlackMs);
        EXPECT_LE(split.tokens.size(), 1u) << "the child exited while its first step was in flight";
    } else {
        ASSERT_EQ(failed, MK_OK) << mk_status_name(failed) << ": " << why;
        expect_identical(whole, split, "head in another process over NCCL");
    }
}

TEST(NcclTwoProcesses, HeadInAChildTailInTheParentAreBitIdenticalToWhole) { two_process_case(false); }
TEST(NcclTwoProcesses, PeerProcessExitingMidStepIsReportedClosed) { two_process_case(true); }

} // namespace
