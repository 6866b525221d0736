// Split-vs-whole parity, bit-exact, for prefill and KV-cached greedy decode, on the seed
// shapes and on a GQA + tied-embedding model; KV-cached decode vs full recomputation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mk_test_util.h"
#include "range/range.h" // mk_sequence_rewind: internal

namespace {

class SplitParity : public ::testing::TestWithParam<size_t> {};

TEST_P(SplitParity, PrefillAndDecodeAreBitIdentical) {
    const ModelCase c = model_cases()[GetParam()];
    SCOPED_TRACE(c.name);
    ModelPtr model = make_random_model(c.hp);
    const int64_t L = (int64_t)c.hp.n_layers;
    const Decode whole = decode_greedy(model.get(), {}, mk_range_options_default(), c.prompt, 12);
    ASSERT_EQ(whole.tokens.size(), 12u);
    for (const std::vector<int64_t> &cuts :
         std::vector<std::vector<int64_t>>{{0}, {L / 2}, {L - 2}, {0, L - 2}, {1, 3}, {0, 1, 2}}) {
        const Decode split = decode_greedy(model.get(), cuts, mk_range_options_default(), c.prompt, 12);
        ASSERT_EQ(split.logits.size(), whole.logits.size());
        for (size_t i = 0; i < whole.logits.size(); i++)
            EXPECT_TRUE(bit_identical(whole.logits[i], split.logits[i])) << "cut " << cuts[0] << " step " << i;
        EXPECT_EQ(whole.tokens, split.tokens);
    }
    // Without the wire (bundle handed over in memory) the result is the same bits.
    Pipeline direct(model.get(), {L / 2}, mk_range_options_default(), false);
    TailPtr out;
    MK_ASSERT_OK(direct.step(c.prompt, &out));
    EXPECT_TRUE(bit_identical(whole.logits[0], logits_of(out)));
}

TEST_P(SplitParity, CachedDecodeMatchesFullRecomputation) {
    const ModelCase c = model_cases()[GetParam()];
    SCOPED_TRACE(c.name);
    ModelPtr model = make_random_model(c.hp);
    const Decode cached = decode_greedy(model.get(), {1}, mk_range_options_default(), c.prompt, 12);
    ASSERT_EQ(cached.tokens.size(), 12u);
    std::vector<int32_t> seq = c.prompt;
    for (size_t i = 0; i < cached.tokens.size(); i++) {
        Pipeline fresh(model.get(), {1});
        TailPtr out;
        MK_ASSERT_OK(fresh.step(seq, &out));
        EXPECT_EQ(out->token_ids[0], cached.tokens[i]) << "step " << i;
        float max_abs = 0.0f;
        for (size_t j = 0; j < out->vocab; j++) max_abs = std::fmax(max_abs, std::fabs(out->logits[j]));
        for (size_t j = 0; j < out->vocab; j++)
            ASSERT_LE(std::fabs(out->logits[j] - cached.logits[i][j]), 1e-5f * max_abs) << "step " << i << " vocab " << j;
        seq.push_back(cached.tokens[i]);
    }
}

INSTANTIATE_TEST_SUITE_P(Models, SplitParity, ::testing::Values(0, 1));

TEST(Parity, ReducedPrecisionWeightsStillSplitExactly) {
    ModelPtr model = make_random_model(gqa_tied_hparams());
    for (mk_dtype dtype : {MK_DTYPE_F16, MK_DTYPE_BF16}) {
        mk_range_options opt = mk_range_options_default();
        opt.backend.weight_dtype = dtype;
        const Decode whole = decode_greedy(model.get(), {}, opt, {1, 2, 3, 4}, 6);
        const Decode split = decode_greedy(model.get(), {2}, opt, {1, 2, 3, 4}, 6);
        ASSERT_EQ(whole.logits.size(), 6u);
        for (size_t i = 0; i < whole.logits.size(); i++) EXPECT_TRUE(bit_identical(whole.logits[i], split.logits[i]));
        // And it is a different model from the F32 one: the logits differ.
        const Decode f32 = decode_greedy(model.get(), {}, mk_range_options_default(), {1, 2, 3, 4}, 1);
        EXPECT_FALSE(bit_identical(f32.logits[0], whole.logits[0]));
    }
}

// A range holds its own weights only: the head the embedding, the tail the final norm and
// head (the embedding, where the model ties them). Untied, the head and tail of a split hold
// exactly what the whole model holds; tied, the tail holds the embedding a second time.
TEST(Parity, EachRangeHoldsOnlyTheWeightsItsRoleNeeds) {
    for (const bool tied : {false, true}) {
        mk_hparams hp = tied ? gqa_tied_hparams() : mk_hparams_seed_default();
        ASSERT_EQ(hp.tied_embeddings, tied);
        ModelPtr model = make_random_model(hp);
        const int64_t L = (int64_t)hp.n_layers;
        const mk_range_options o = mk_range_options_default();
        mk_range *whole = nullptr, *head = nullptr, *tail = nullptr;
        MK_ASSERT_OK(mk_range_create(model.get(), 0, L - 1, &o, &whole));
        MK_ASSERT_OK(mk_range_create(model.get(), 0, L / 2 - 1, &o, &head));
        MK_ASSERT_OK(mk_range_create(model.get(), L / 2, L - 1, &o, &tail));
        const size_t w = mk_range_weight_bytes(whole), h = mk_range_weight_bytes(head), t = mk_range_weight_bytes(tail);
        const size_t embedding = (hp.vocab * hp.hidden * sizeof(float) + 255) / 256 * 256; // slices are 256-aligned
        if (tied) EXPECT_EQ(h + t, w + embedding) << "tied: the tail's head is the embedding";
        else EXPECT_EQ(h + t, w) << "untied: no weight held twice; head " << h << ", tail " << t << ", whole " << w;
        mk_range_free(whole);
        mk_range_free(head);
        mk_range_free(tail);
    }
}

TEST(Sequences, ResetStartsOverAndIndependentSequencesDoNotInterfere) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range *r = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 5, nullptr, &r));
    RangePtr full(r);
    mk_sequence *a = nullptr, *b = nullptr;
    MK_ASSERT_OK(mk_sequence_open(full.get(), &a));
    MK_ASSERT_OK(mk_sequence_open(full.get(), &b));
    SequencePtr sa(a), sb(b);
    const int32_t p1[] = {1, 2, 3}, p2[] = {9, 8};
    mk_tail_output *t1 = nullptr, *t2 = nullptr, *t3 = nullptr;
    MK_ASSERT_OK(mk_range_forward(full.get(), a, p1, 3, nullptr, nullptr, nullptr, &t1));
    MK_ASSERT_OK(mk_range_forward(full.get(), b, p2, 2, nullptr, nullptr, nullptr, &t2));
    EXPECT_EQ(mk_sequence_length(a), 3u);
    EXPECT_EQ(mk_sequence_length(b), 2u);
    MK_ASSERT_OK(mk_sequence_reset(a));
    EXPECT_EQ(mk_sequence_length(a), 0u);
    MK_ASSERT_OK(mk_range_forward(full.get(), a, p1, 3, nullptr, nullptr, nullptr, &t3));
    TailPtr o1(t1), o2(t2), o3(t3);
    EXPECT_TRUE(bit_identical(logits_of(o1), logits_of(o3)));
    EXPECT_FALSE(bit_identical(logits_of(o1), logits_of(o2)));
}

// A rewind goes back, never forward: past the sequence's length it is refused and changes
// nothing; back to an earlier length, the next forward writes over the rows after it and
// gives the bits of a sequence that never held them.
TEST(Sequences, RewindGoesBackOnly) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range *r = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 5, nullptr, &r));
    RangePtr full(r);
    mk_sequence *a = nullptr, *b = nullptr;
    MK_ASSERT_OK(mk_sequence_open(full.get(), &a));
    MK_ASSERT_OK(mk_sequence_open(full.get(), &b));
    SequencePtr sa(a), sb(b);
    const int32_t held[] = {1, 7, 9}, first[] = {1}, rest[] = {2, 3};
    mk_tail_output *t = nullptr;
    MK_ASSERT_OK(mk_range_forward(full.get(), a, held, 3, nullptr, nullptr, nullptr, &t));
    mk_tail_output_free(t);
    EXPECT_ERROR(mk_sequence_rewind(a, 4), MK_ERR_INVALID_ARGUMENT, "mk_sequence_rewind: 4 is past the sequence's 3 positions");
    EXPECT_EQ(mk_sequence_length(a), 3u);
    MK_ASSERT_OK(mk_sequence_rewind(a, 3));
    EXPECT_EQ(mk_sequence_length(a), 3u);
    MK_ASSERT_OK(mk_sequence_rewind(a, 1));
    EXPECT_EQ(mk_sequence_length(a), 1u);
    EXPECT_ERROR(mk_sequence_rewind(a, 2), MK_ERR_INVALID_ARGUMENT, "2 is past the sequence's 1 positions");
    EXPECT_EQ(mk_sequence_length(a), 1u);
    mk_tail_output *ta = nullptr, *tb = nullptr;
    MK_ASSERT_OK(mk_range_forward(full.get(), b, first, 1, nullptr, nullptr, nullptr, &t));
    mk_tail_output_free(t);
    MK_ASSERT_OK(mk_range_forward(full.get(), a, rest, 2, nullptr, nullptr, nullptr, &ta));
    MK_ASSERT_OK(mk_range_forward(full.get(), b, rest, 2, nullptr, nullptr, nullptr, &tb));
    TailPtr oa(ta), ob(tb);
    EXPECT_EQ(mk_sequence_length(a), 3u);
    EXPECT_TRUE(bit_identical(logits_of(oa), logits_of(ob)));
}

// A boundary carries its sequence's step: 0 for the first forward, one more for each after;
// a rewind (a failed step to be retried) takes the step back with it, a rewind to the same
// length changes nothing, and a reset starts the count again.
TEST(Sequences, BoundariesCountTheirSequencesSteps) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range *r = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 2, nullptr, &r));
    RangePtr head(r);
    mk_sequence *a = nullptr;
    MK_ASSERT_OK(mk_sequence_open(head.get(), &a));
    SequencePtr sa(a);
    auto step_of_next = [&](const std::vector<int32_t> &ids) -> int64_t {
        mk_bundle *out = nullptr;
        const mk_status s = mk_range_forward(head.get(), a, ids.data(), ids.size(), nullptr, nullptr, &out, nullptr);
        EXPECT_EQ(s, MK_OK) << mk_last_error();
        const int64_t step = out ? (int64_t)mk_bundle_header_of(out)->step : -1;
        mk_bundle_free(out);
        return step;
    };
    EXPECT_EQ(step_of_next({1, 2, 3}), 0);
    EXPECT_EQ(step_of_next({4}), 1);
    EXPECT_EQ(step_of_next({5}), 2);
    MK_ASSERT_OK(mk_sequence_rewind(a, 5)); // the same length: nothing taken back
    EXPECT_EQ(step_of_next({6}), 3);
    MK_ASSERT_OK(mk_sequence_rewind(a, 5)); // step 3 failed downstream: retried as step 3
    EXPECT_EQ(step_of_next({6}), 3);
    MK_ASSERT_OK(mk_sequence_reset(a));
    EXPECT_EQ(step_of_next({1, 2}), 0);
}

TEST(Sequences, ForwardLargerThanMaxBatchTokensIsRefused) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range_options opt = mk_range_options_default();
    opt.max_context = 8;
    opt.max_batch_tokens = 4;
    mk_range *r = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 5, &opt, &r));
    RangePtr full(r);
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(full.get(), &s));
    SequencePtr seq(s);
    const int32_t ids[5] = {1, 2, 3, 4, 5};
    mk_tail_output *t = nullptr;
    EXPECT_ERROR(mk_range_forward(full.get(), s, ids, 5, nullptr, nullptr, nullptr, &t), MK_ERR_INVALID_ARGUMENT,
                 "forward of 5 rows exceeds this range's max_batch_tokens 4");
    MK_ASSERT_OK(mk_range_forward(full.get(), s, ids, 4, nullptr, nullptr, nullptr, &t));
    mk_tail_output_free(t);
}

TEST(Sequences, ContextOverflowAndBadTokensAreRefused) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range_options opt = mk_range_options_default();
    opt.max_context = 8;
    mk_range *r = nullptr;
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 5, &opt, &r));
    RangePtr full(r);
    mk_sequence *s = nullptr;
    MK_ASSERT_OK(mk_sequence_open(full.get(), &s));
    SequencePtr seq(s);
    const int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    mk_tail_output *t = nullptr;
    // A prompt longer than the whole context is a context overflow (checked before the
    // batch limit, which defaults to max_context).
    EXPECT_ERROR(mk_range_forward(full.get(), s, ids, 9, nullptr, nullptr, nullptr, &t), MK_ERR_CONTEXT_OVERFLOW,
                 "sequence of 0 positions plus 9 rows exceeds max_context 8");
    MK_ASSERT_OK(mk_range_forward(full.get(), s, ids, 8, nullptr, nullptr, nullptr, &t));
    mk_tail_output_free(t);
    t = nullptr;
    EXPECT_ERROR(mk_range_forward(full.get(), s, ids, 1, nullptr, nullptr, nullptr, &t), MK_ERR_CONTEXT_OVERFLOW,
                 "sequence of 8 positions plus 1 rows exceeds max_context 8");
    MK_ASSERT_OK(mk_sequence_reset(s));
    const int32_t bad[] = {1, 48};
    EXPECT_ERROR(mk_range_forward(full.get(), s, bad, 2, nullptr, nullptr, nullptr, &t), MK_ERR_TOKEN_OUT_OF_RANGE,
                 "token id 48 at index 1 is outside the vocabulary (48)");
    const int32_t negative[] = {-1};
    EXPECT_ERROR(mk_range_forward(full.get(), s, negative, 1, nullptr, nullptr, nullptr, &t), MK_ERR_TOKEN_OUT_OF_RANGE,
                 "token id -1 at index 0");
    EXPECT_ERROR(mk_range_forward(full.get(), s, ids, 0, nullptr, nullptr, nullptr, &t), MK_ERR_EMPTY_INPUT,
                 "requires at least one token id");
    EXPECT_EQ(t, nullptr);
    EXPECT_EQ(mk_sequence_length(s), 0u);
}

TEST(Sequences, BundlePositionsMustContinueTheSequence) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    Pipeline p(model.get(), {2});
    ASSERT_EQ(p.status(), MK_OK);
    mk_sequence *hs = nullptr, *ts = nullptr;
    MK_ASSERT_OK(mk_sequence_open(p.range(0), &hs));
    MK_ASSERT_OK(mk_sequence_open(p.range(1), &ts));
    SequencePtr head_seq(hs), tail_seq(ts);
    const int32_t ids[] = {4, 5, 6};
    mk_bundle *b = nullptr;
    MK_ASSERT_OK(mk_range_forward(p.range(0), hs, ids, 3, nullptr, nullptr, &b, nullptr));
    BundlePtr bundle(b);
    mk_bundle_positions(bundle.get())[1] = 7;
    mk_tail_output *t = nullptr;
    EXPECT_ERROR(mk_range_forward(p.range(1), ts, nullptr, 0, bundle.get(), nullptr, nullptr, &t), MK_ERR_POSITIONS_SHAPE,
                 "bundle position 7 at row 1 does not continue the sequence (expected 1)");
    EXPECT_EQ(mk_sequence_length(ts), 0u);
}

}  // namespace
