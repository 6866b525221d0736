// A decode step allocates nothing, host or backend, on the paths that run per token: the
// scheduler's and the stage runtime's mk_range_forward_into across a seam, and
// mk_range_forward_boundary between ranges (its tail hands the caller exactly one tail
// output: three allocations, nothing else). And the contract a seam ran on a received
// boundary vouches only for the sequence and length it was run for.
//
// Every malloc, calloc, realloc, posix_memalign and aligned_alloc the library makes is
// counted: this binary links the library statically with -Wl,--wrap for each, so only
// calls from the library's own objects (and this file's) reach the counters. Backend
// memory comes from those too (the cpu backend's arenas; cudasim's cudaMalloc in the sim
// flavour), so one counter sees both.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "meshkern.h"
#include "mk_test_util.h"
#include "protocol/boundary.h"
#include "range/range.h"

extern "C" {
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);

static std::atomic<uint64_t> g_allocs{0};
void *__wrap_malloc(size_t n) {
    g_allocs++;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t size) {
    g_allocs++;
    return __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n) {
    g_allocs++;
    return __real_realloc(p, n);
}
int __wrap_posix_memalign(void **p, size_t align, size_t n) {
    g_allocs++;
    return __real_posix_memalign(p, align, n);
}
void *__wrap_aligned_alloc(size_t align, size_t n) {
    g_allocs++;
    return __real_aligned_alloc(align, n);
}
}

namespace {

struct BoundaryFree {
    void operator()(mk_boundary *b) const { mk_boundary_free(b); }
};
struct SeamFree {
    void operator()(mk_seam *s) const { mk_seam_free(s); }
};
// A head [0, 1] and a tail [2, 4] of one random model (GQA, tied embeddings), a seam between them, a sequence and a
// boundary at each end.
struct Split {
    ModelPtr model;
    RangePtr head, tail;
    SequencePtr head_seq, tail_seq;
    std::unique_ptr<mk_boundary, BoundaryFree> out, in;
    std::unique_ptr<mk_seam, SeamFree> tx, rx;

    Split(mk_backend_kind kind, mk_seam_kind seam) {
        model = make_random_model(gqa_tied_hparams(), 29);
        mk_model *m = model.get();
        mk_range_options o = mk_range_options_default();
        o.backend = mk_backend_config_default(kind);
        o.max_context = 64;
        o.max_batch_tokens = 16;
        mk_range *r = nullptr;
        EXPECT_EQ(mk_range_create(m, 0, 1, &o, &r), MK_OK) << mk_last_error();
        head.reset(r);
        EXPECT_EQ(mk_range_create(m, 2, 4, &o, &r), MK_OK) << mk_last_error();
        tail.reset(r);
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(head.get(), &s), MK_OK) << mk_last_error();
        head_seq.reset(s);
        EXPECT_EQ(mk_sequence_open(tail.get(), &s), MK_OK) << mk_last_error();
        tail_seq.reset(s);
        mk_boundary *b = nullptr;
        EXPECT_EQ(mk_boundary_create(head.get(), &b), MK_OK) << mk_last_error();
        out.reset(b);
        EXPECT_EQ(mk_boundary_create(tail.get(), &b), MK_OK) << mk_last_error();
        in.reset(b);
        const mk_seam_options so = mk_seam_options_default(seam);
        mk_seam *t = nullptr, *x = nullptr;
        EXPECT_EQ(mk_seam_pair(&so, head.get(), tail.get(), &t, &x), MK_OK) << mk_last_error();
        tx.reset(t);
        rx.reset(x);
    }

    // One step through both ranges with forward_into: the scheduler's and stage runtime's path.
    int32_t step_into(const int32_t *ids, size_t n) {
        int32_t token = -1;
        std::vector<float> &l = logits;
        EXPECT_EQ(mk_range_forward_into(head.get(), head_seq.get(), ids, n, nullptr, out.get(), nullptr, nullptr), MK_OK)
            << mk_last_error();
        EXPECT_EQ(mk_seam_send(tx.get(), out.get()), MK_OK) << mk_last_error();
        EXPECT_EQ(mk_seam_recv(rx.get(), tail_seq.get(), in.get()), MK_OK) << mk_last_error();
        EXPECT_EQ(mk_seam_send_wait(tx.get()), MK_OK) << mk_last_error();
        EXPECT_EQ(mk_range_forward_into(tail.get(), tail_seq.get(), nullptr, 0, in.get(), nullptr, l.data(), &token), MK_OK)
            << mk_last_error();
        return token;
    }
    std::vector<float> logits = std::vector<float>(gqa_tied_hparams().vocab);
};

void decode_allocates_nothing(mk_backend_kind kind, mk_seam_kind seam) {
    const uint64_t at_start = g_allocs.load();
    Split s(kind, seam);
    ASSERT_FALSE(::testing::Test::HasFailure());
    ASSERT_GT(g_allocs.load() - at_start, 10u) << "the counters do not see the library's allocations";
    const int32_t prompt[5] = {3, 17, 40, 9, 52};
    int32_t next = s.step_into(prompt, 5);
    next = s.step_into(&next, 1); // the first decode step records the graph (cuda) and warms up
    const uint64_t before = g_allocs.load();
    for (int i = 0; i < 8; i++) next = s.step_into(&next, 1);
    EXPECT_EQ(g_allocs.load() - before, 0u) << "8 decode steps over the " << mk_seam_kind_name(seam) << " seam";
    EXPECT_GE(next, 0);
    EXPECT_EQ(mk_sequence_length(s.tail_seq.get()), 14u);
}

} // namespace

TEST(StepAllocs, CpuDecodeOverLocalSeamAllocatesNothing) { decode_allocates_nothing(MK_BACKEND_CPU, MK_SEAM_LOCAL); }
TEST(StepAllocs, CpuDecodeOverWireSeamAllocatesNothing) { decode_allocates_nothing(MK_BACKEND_CPU, MK_SEAM_WIRE); }

#ifdef MK_TEST_CUDASIM
TEST(StepAllocs, CudaDecodeOverLocalSeamAllocatesNothing) { decode_allocates_nothing(MK_BACKEND_CUDA, MK_SEAM_LOCAL); }
#endif

// mk_range_forward_boundary: the non-tail range allocates nothing; the tail allocates the
// tail output it hands over (the struct, logits, token: three) and nothing more.
TEST(StepAllocs, ForwardBoundaryTailAllocatesOnlyItsOutput) {
    Split s(MK_BACKEND_CPU, MK_SEAM_LOCAL);
    ASSERT_FALSE(HasFailure());
    const int32_t prompt[3] = {5, 6, 7};
    int32_t next = s.step_into(prompt, 3);
    for (int i = 0; i < 4; i++) {
        const uint64_t a0 = g_allocs.load();
        MK_ASSERT_OK(mk_range_forward_boundary(s.head.get(), s.head_seq.get(), &next, 1, nullptr, nullptr, s.out.get(),
                                               nullptr));
        EXPECT_EQ(g_allocs.load() - a0, 0u) << "head step " << i;
        MK_ASSERT_OK(mk_seam_send(s.tx.get(), s.out.get()));
        MK_ASSERT_OK(mk_seam_recv(s.rx.get(), s.tail_seq.get(), s.in.get()));
        MK_ASSERT_OK(mk_seam_send_wait(s.tx.get()));
        mk_tail_output *t = nullptr;
        const uint64_t a1 = g_allocs.load();
        MK_ASSERT_OK(mk_range_forward_boundary(s.tail.get(), s.tail_seq.get(), nullptr, 0, s.in.get(), nullptr, nullptr, &t));
        EXPECT_EQ(g_allocs.load() - a1, 3u) << "tail step " << i;
        TailPtr keep(t);
        next = t->token_ids[0];
    }
}

// The stamp a receive leaves vouches for one sequence at one length, nothing else: the same
// boundary offered to another sequence, or to its own once that has moved on, is checked
// again and refused.
TEST(StepAllocs, ReceivedBoundaryIsTrustedOnlyForItsSequenceAndLength) {
    Split s(MK_BACKEND_CPU, MK_SEAM_LOCAL);
    ASSERT_FALSE(HasFailure());
    const int32_t prompt[4] = {1, 2, 3, 4};
    MK_ASSERT_OK(mk_range_forward_into(s.head.get(), s.head_seq.get(), prompt, 4, nullptr, s.out.get(), nullptr, nullptr));
    MK_ASSERT_OK(mk_seam_send(s.tx.get(), s.out.get()));
    MK_ASSERT_OK(mk_seam_recv(s.rx.get(), s.tail_seq.get(), s.in.get()));
    MK_ASSERT_OK(mk_seam_send_wait(s.tx.get()));
    EXPECT_EQ(s.in->checked_seq, s.tail_seq.get());
    EXPECT_EQ(s.in->checked_length, 0u);
    // another sequence of the tail range that already holds 2 positions
    mk_sequence *other_raw = nullptr;
    MK_ASSERT_OK(mk_sequence_open(s.tail.get(), &other_raw));
    SequencePtr other(other_raw);
    {
        mk_sequence *hs = nullptr;
        MK_ASSERT_OK(mk_sequence_open(s.head.get(), &hs));
        SequencePtr head2(hs);
        mk_boundary *b = nullptr;
        MK_ASSERT_OK(mk_boundary_create(s.head.get(), &b));
        std::unique_ptr<mk_boundary, BoundaryFree> out2(b);
        MK_ASSERT_OK(mk_boundary_create(s.tail.get(), &b));
        std::unique_ptr<mk_boundary, BoundaryFree> in2(b);
        MK_ASSERT_OK(mk_range_forward_into(s.head.get(), head2.get(), prompt, 2, nullptr, out2.get(), nullptr, nullptr));
        MK_ASSERT_OK(mk_seam_send(s.tx.get(), out2.get()));
        MK_ASSERT_OK(mk_seam_recv(s.rx.get(), other.get(), in2.get()));
        MK_ASSERT_OK(mk_seam_send_wait(s.tx.get()));
        int32_t tok = -1;
        MK_ASSERT_OK(mk_range_forward_into(s.tail.get(), other.get(), nullptr, 0, in2.get(), nullptr, s.logits.data(), &tok));
    }
    int32_t token = -1;
    EXPECT_ERROR(mk_range_forward_into(s.tail.get(), other.get(), nullptr, 0, s.in.get(), nullptr, s.logits.data(), &token),
                 MK_ERR_POSITIONS_SHAPE, "does not continue the sequence (expected 2)");
    // its own sequence, consumed once: offered again at the new length, refused
    MK_ASSERT_OK(mk_range_forward_into(s.tail.get(), s.tail_seq.get(), nullptr, 0, s.in.get(), nullptr, s.logits.data(), &token));
    EXPECT_ERROR(mk_range_forward_into(s.tail.get(), s.tail_seq.get(), nullptr, 0, s.in.get(), nullptr, s.logits.data(), &token),
                 MK_ERR_POSITIONS_SHAPE, "does not continue the sequence (expected 4)");
    // a forward's output boundary carries no stamp
    EXPECT_EQ(s.out->checked_seq, nullptr);
}

// A receive that fails after the header passed (the wire seam finds a NaN in the payload)
// leaves no stamp: the boundary is not vouched for, and a forward of it is refused.
TEST(StepAllocs, FailedReceiveLeavesNoStamp) {
    Split s(MK_BACKEND_CPU, MK_SEAM_WIRE);
    ASSERT_FALSE(HasFailure());
    const int32_t prompt[3] = {8, 9, 10};
    MK_ASSERT_OK(mk_range_forward_into(s.head.get(), s.head_seq.get(), prompt, 3, nullptr, s.out.get(), nullptr, nullptr));
    s.out->payload[s.out->h.hidden + 5] = std::numeric_limits<float>::quiet_NaN(); // cpu: host memory
    MK_ASSERT_OK(mk_seam_send(s.tx.get(), s.out.get()));
    EXPECT_ERROR(mk_seam_recv(s.rx.get(), s.tail_seq.get(), s.in.get()), MK_ERR_NONFINITE, "NaN or infinite");
    (void)mk_seam_send_wait(s.tx.get());
    EXPECT_EQ(s.in->checked_seq, nullptr);
    int32_t token = -1;
    EXPECT_NE(mk_range_forward_into(s.tail.get(), s.tail_seq.get(), nullptr, 0, s.in.get(), nullptr, s.logits.data(), &token),
              MK_OK);
    EXPECT_EQ(mk_sequence_length(s.tail_seq.get()), 0u);
}

// mk_pipeline_step over three ranges and two seams (local, then wire): a decode step allocates
// exactly the tail output it hands to the caller (the struct, logits, token), nothing else.
TEST(StepAllocs, PipelineStepAllocatesOnlyItsTailOutput) {
    for (const mk_seam_kind kind : {MK_SEAM_LOCAL, MK_SEAM_WIRE}) {
        SCOPED_TRACE(mk_seam_kind_name(kind));
        ModelPtr model = make_random_model(gqa_tied_hparams(), 31);
        mk_model *m = model.get();
        mk_range_options ro = mk_range_options_default();
        ro.max_context = 64;
        ro.max_batch_tokens = 16;
        const mk_seam_options so = mk_seam_options_default(kind);
        const int64_t cuts[2] = {0, 2};
        const mk_pipeline_options po = pipeline_options(cuts, 2, &ro, &so);
        mk_pipeline *p = nullptr;
        MK_ASSERT_OK(mk_pipeline_create(m, &po, &p));
        std::unique_ptr<mk_pipeline, void (*)(mk_pipeline *)> owner(p, mk_pipeline_free);
        const int32_t prompt[4] = {11, 12, 13, 14};
        mk_tail_output *t = nullptr;
        MK_ASSERT_OK(mk_pipeline_step(p, prompt, 4, &t));
        int32_t next = t->token_ids[0];
        mk_tail_output_free(t);
        for (int i = 0; i < 6; i++) {
            const uint64_t before = g_allocs.load();
            MK_ASSERT_OK(mk_pipeline_step(p, &next, 1, &t));
            EXPECT_EQ(g_allocs.load() - before, 3u) << "decode step " << i;
            next = t->token_ids[0];
            mk_tail_output_free(t);
        }
    }
}
