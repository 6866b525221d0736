// One forward over several sequences (mk_range_forward_batch, continuous batching): random
// schedules of sequences joining at different steps, prompts in chunks mixed with decode rows,
// on the cpu backend and on the cuda backend under cudasim; every entry's logits and token
// memcmp-equal to the same forwards of that sequence alone (the batch never changes a row's
// arithmetic where the product is computed row by row: cpu dots, cuda's GEMV up to 8 rows),
// whole or split into two ranges. And what a batch refuses, with nothing run.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "cudasim.h"
#include "meshkern.h"
#include "mk_test_util.h"
#include "backend/backend.h"
#include "model/gguf.h"
#include "protocol/boundary.h"
#include "range/range.h"

namespace {

struct BoundaryFree {
    void operator()(mk_boundary *b) const { mk_boundary_free(b); }
};
using BoundaryPtr = std::unique_ptr<mk_boundary, BoundaryFree>;

// One entry of a step: sequence `seq` feeds `ids` (a prompt chunk or one decode token).
struct Feed {
    size_t seq;
    std::vector<int32_t> ids;
};
using Plan = std::vector<std::vector<Feed>>; // steps, each a batch

// What each sequence's forwards produced, in order: the tail's logits and token.
struct Outputs {
    std::vector<std::vector<std::vector<float>>> logits; // [seq][forward][vocab]
    std::vector<std::vector<int32_t>> tokens;            // [seq][forward]
};

// A random schedule: n sequences, each joining at a random step with a prompt of 1..max_prompt
// tokens fed in chunks of 1..chunk, then `decode` single tokens; every step carries every
// sequence that has something to feed (at most max_rows rows: the rest wait a step).
Plan make_plan(std::mt19937 &rng, size_t n, size_t vocab, size_t max_prompt, size_t chunk, size_t decode,
               size_t max_rows) {
    struct Left {
        size_t join;
        std::vector<int32_t> prompt;
        size_t fed = 0, decoded = 0;
    };
    std::vector<Left> left(n);
    for (size_t i = 0; i < n; i++) {
        left[i].join = rng() % 4;
        left[i].prompt.resize(1 + rng() % max_prompt);
        for (auto &t : left[i].prompt) t = (int32_t)(rng() % vocab);
    }
    Plan plan;
    for (size_t step = 0;; step++) {
        std::vector<Feed> batch;
        size_t rows = 0;
        bool more = false;
        for (size_t i = 0; i < n; i++) {
            Left &l = left[i];
            if (l.decoded == decode) continue;
            more = true;
            if (step < l.join) continue;
            Feed f{i, {}};
            if (l.fed < l.prompt.size()) {
                const size_t take = std::min(l.prompt.size() - l.fed, 1 + rng() % chunk);
                f.ids.assign(l.prompt.begin() + (long)l.fed, l.prompt.begin() + (long)(l.fed + take));
            } else {
                f.ids = {(int32_t)((i * 7 + l.decoded * 3 + 1) % vocab)};
            }
            if (rows + f.ids.size() > max_rows) continue; // waits for the next step
            rows += f.ids.size();
            if (l.fed < l.prompt.size()) l.fed += f.ids.size();
            else l.decoded++;
            batch.push_back(std::move(f));
        }
        if (!more) break;
        if (!batch.empty()) plan.push_back(std::move(batch));
    }
    return plan;
}

// The weights a case runs: F32 (every product row by row alone on both backends), F16 on
// cuda (the GEMV kernels: 8 decode rows per product), native Q4_1 on cpu (the dot path: 31).
mk_dtype g_weights = MK_DTYPE_F32;
size_t g_context = 64; // KV positions per sequence

// A range's KV pool holds exactly `live` sequences of the full context, in blocks of
// `block` positions: the sequences interleave their blocks (tables out of order), and a
// block leaked or taken twice would run the pool dry.
mk_range_options options_for(mk_backend_kind kind, size_t max_seqs, size_t max_rows, size_t live, size_t block) {
    mk_range_options o = mk_range_options_default();
    o.kv_block_size = block;
    o.kv_pool_blocks = live * ((g_context + block - 1) / block);
    o.backend.kind = kind;
    o.backend.weight_dtype = g_weights;
    o.max_context = g_context;
    o.max_batch_tokens = max_rows;
    o.max_batch_sequences = max_seqs;
    o.eager_decode = false;
    return o;
}

// Every block back in the pool and no promise left (after the sequences closed).
void expect_pool_whole(const mk_range *r) {
    mk_kv_pool_info info{};
    ASSERT_EQ(mk_range_kv_pool(r, &info), MK_OK);
    EXPECT_EQ(info.free_blocks, info.blocks) << "KV blocks leaked";
    EXPECT_EQ(info.promised_blocks, 0u);
}

// Each sequence alone: the plan's feeds of a sequence in order, one forward each, through
// the whole model in one range.
Outputs run_alone(const mk_model *model, mk_backend_kind kind, const Plan &plan, size_t n, size_t max_rows) {
    const mk_range_options o = options_for(kind, 1, max_rows, n, 16);
    mk_range *r = nullptr;
    const mk_hparams *hp = mk_model_hparams(model);
    EXPECT_EQ(mk_range_create(model, 0, (int64_t)hp->n_layers - 1, &o, &r), MK_OK) << mk_last_error();
    RangePtr range(r);
    Outputs out{std::vector<std::vector<std::vector<float>>>(n), std::vector<std::vector<int32_t>>(n)};
    std::vector<SequencePtr> seqs;
    for (size_t i = 0; i < n; i++) {
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(r, &s), MK_OK);
        seqs.emplace_back(s);
    }
    for (const auto &batch : plan)
        for (const Feed &f : batch) {
            std::vector<float> logits(hp->vocab);
            int32_t token = -1;
            EXPECT_EQ(mk_range_forward_into(r, seqs[f.seq].get(), f.ids.data(), f.ids.size(), nullptr, nullptr,
                                            logits.data(), &token),
                      MK_OK)
                << mk_last_error();
            out.logits[f.seq].push_back(logits);
            out.tokens[f.seq].push_back(token);
        }
    seqs.clear();
    expect_pool_whole(r);
    return out;
}

// The plan's steps as batch forwards: through one range, or two (cut after layer `cut`)
// with each entry's boundary carried from the first range's batch into the second's.
Outputs run_batched(const mk_model *model, mk_backend_kind kind, const Plan &plan, size_t n, size_t max_rows,
                    int64_t cut /* -1: one range */) {
    const mk_hparams *hp = mk_model_hparams(model);
    const int64_t last = (int64_t)hp->n_layers - 1;
    const mk_range_options o = options_for(kind, n, max_rows, n, 4);
    mk_range *r0 = nullptr, *r1 = nullptr;
    EXPECT_EQ(mk_range_create(model, 0, cut < 0 ? last : cut, &o, &r0), MK_OK) << mk_last_error();
    if (cut >= 0) {
        EXPECT_EQ(mk_range_create(model, cut + 1, last, &o, &r1), MK_OK) << mk_last_error();
    }
    RangePtr head(r0), tail(r1);
    std::vector<SequencePtr> s0, s1;
    std::vector<BoundaryPtr> out0, in1;
    for (size_t i = 0; i < n; i++) {
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(r0, &s), MK_OK);
        s0.emplace_back(s);
        if (r1) {
            EXPECT_EQ(mk_sequence_open(r1, &s), MK_OK);
            s1.emplace_back(s);
            mk_boundary *b = nullptr;
            EXPECT_EQ(mk_boundary_create(r0, &b), MK_OK);
            out0.emplace_back(b);
            EXPECT_EQ(mk_boundary_create(r1, &b), MK_OK);
            in1.emplace_back(b);
        }
    }
    Outputs out{std::vector<std::vector<std::vector<float>>>(n), std::vector<std::vector<int32_t>>(n)};
    std::vector<std::vector<float>> logits(n, std::vector<float>(hp->vocab));
    std::vector<int32_t> token(n, -1);
    for (const auto &batch : plan) {
        std::vector<mk_forward_entry> e0, e1;
        for (const Feed &f : batch) {
            mk_forward_entry e{};
            e.seq = s0[f.seq].get();
            e.token_ids = f.ids.data();
            e.n_tokens = f.ids.size();
            if (r1) e.out = out0[f.seq].get();
            else e.logits = logits[f.seq].data(), e.token = &token[f.seq];
            e0.push_back(e);
        }
        EXPECT_EQ(mk_range_forward_batch(r0, e0.data(), e0.size()), MK_OK) << mk_last_error();
        if (r1) {
            for (const Feed &f : batch) {
                // the boundary as a seam would carry it: header and rows, into the next range's
                // backend memory (a download waits for the forward that wrote them)
                const mk_boundary *from = out0[f.seq].get();
                mk_boundary *to = in1[f.seq].get();
                to->h = from->h;
                std::vector<float> rows(from->h.rows * from->h.hidden);
                mk_backend *b0 = mk_range_backend(r0), *b1 = mk_range_backend(r1);
                EXPECT_EQ(b0->ops->download(b0, rows.data(), from->payload, rows.size() * sizeof(float)), MK_OK);
                EXPECT_EQ(b1->ops->upload(b1, to->payload, rows.data(), rows.size() * sizeof(float)), MK_OK);
                mk_forward_entry e{};
                e.seq = s1[f.seq].get();
                e.in = to;
                e.logits = logits[f.seq].data();
                e.token = &token[f.seq];
                e1.push_back(e);
            }
            EXPECT_EQ(mk_range_forward_batch(r1, e1.data(), e1.size()), MK_OK) << mk_last_error();
        }
        for (const Feed &f : batch) {
            out.logits[f.seq].push_back(logits[f.seq]);
            out.tokens[f.seq].push_back(token[f.seq]);
        }
    }
    s0.clear();
    s1.clear();
    expect_pool_whole(r0);
    if (r1) expect_pool_whole(r1);
    return out;
}

void expect_identical(const Outputs &alone, const Outputs &batched, size_t n) {
    for (size_t i = 0; i < n; i++) {
        SCOPED_TRACE("sequence " + std::to_string(i));
        ASSERT_EQ(alone.logits[i].size(), batched.logits[i].size());
        for (size_t k = 0; k < alone.logits[i].size(); k++) {
            EXPECT_EQ(std::memcmp(alone.logits[i][k].data(), batched.logits[i][k].data(),
                                  alone.logits[i][k].size() * sizeof(float)),
                      0)
                << "forward " << k << " of sequence " << i << ": logits differ (first: " << alone.logits[i][k][0]
                << " vs " << batched.logits[i][k][0] << ")";
            EXPECT_EQ(alone.tokens[i][k], batched.tokens[i][k]) << "forward " << k;
        }
    }
}

struct Case {
    mk_backend_kind kind;
    mk_dtype weights;
    bool smollm2; // the GGUF model (native weights) instead of the random one
    const char *name;
};

class BatchForward : public ::testing::TestWithParam<Case> {
  protected:
    void SetUp() override {
        g_weights = GetParam().weights;
        g_context = 64;
        if (GetParam().smollm2) {
            MK_REQUIRE_MODEL_FILE(mk_test_model_path());
            mk_model *m = nullptr;
            ASSERT_EQ(mk_model_open_gguf(mk_test_model_path().c_str(), &m), MK_OK) << mk_last_error();
            model.reset(m);
        } else {
            model = make_random_model(gqa_tied_hparams());
        }
        vocab = mk_model_hparams(model.get())->vocab;
    }
    ModelPtr model;
    size_t vocab = 0;
};

// How many decode rows one product of the case's weights takes together (the grouping the
// batch forward uses): more than one wherever the case is meant to share products.
TEST_P(BatchForward, DecodeRowsShareProductsWhereTheBackendComputesRowsAlone) {
    mk_range_options o = options_for(GetParam().kind, 8, 40, 8, 16); // cpu: enough rows for the tiled GEMM
    mk_range *r = nullptr;
    ASSERT_EQ(mk_range_create(model.get(), 0, 1, &o, &r), MK_OK) << mk_last_error();
    RangePtr range(r);
    mk_backend *b = mk_range_backend(r);
    ASSERT_NE(b->ops->gemm_rows_alone, nullptr);
    mk_weight probe{};
    probe.format = GetParam().weights == MK_DTYPE_F16 ? MK_GGML_TYPE_F16
                   : GetParam().smollm2             ? MK_GGML_TYPE_Q4_1
                                                    : MK_GGML_TYPE_F32;
    // cpu: the dot path at any count when asked (mk_gemm_input.alone); the range caps it at 64
    const size_t want = GetParam().weights == MK_DTYPE_F32 ? 1 : GetParam().kind == MK_BACKEND_CUDA ? 8 : SIZE_MAX;
    EXPECT_EQ(b->ops->gemm_rows_alone(b, &probe), want);
}

// Random mixes: 1..8 sequences (decode rows computed row by row on both backends), prompts in
// chunks beside decode rows, joins at different steps; whole and split.
TEST_P(BatchForward, EveryEntryEqualsItsSequenceAlone) {
    std::mt19937 rng(1234);
    const int64_t cut = (int64_t)mk_model_hparams(model.get())->n_layers / 2;
    for (size_t n : {1, 2, 3, 5, 8}) {
        for (int trial = 0; trial < (GetParam().smollm2 ? 1 : 3); trial++) {
            SCOPED_TRACE("n=" + std::to_string(n) + " trial " + std::to_string(trial));
            // trial 2: prompts of up to 20 in chunks of up to 12 rows beside decode rows (on
            // cuda more than the GEMV's 8: that chunk's products read a 16-bit copy)
            const size_t max_rows = trial == 2 ? 32 : 8 + rng() % 8;
            const Plan plan = make_plan(rng, n, vocab, trial == 2 ? 20 : 9, trial == 2 ? 12 : 3, 4, max_rows);
            const Outputs alone = run_alone(model.get(), GetParam().kind, plan, n, max_rows);
            expect_identical(alone, run_batched(model.get(), GetParam().kind, plan, n, max_rows, -1), n);
            expect_identical(alone, run_batched(model.get(), GetParam().kind, plan, n, max_rows, cut), n);
        }
    }
}

// Decode rows of many sequences at once: 8 at every step (cuda's GEMV path computes up to 8
// rows each alone; the cpu's dot path up to 31).
TEST_P(BatchForward, DecodeRowsOfManySequencesPerStepEqualEachAlone) {
    std::mt19937 rng(99);
    const size_t n = GetParam().kind == MK_BACKEND_CPU && GetParam().smollm2 ? 20 : 10; // over one group
    Plan plan;
    std::vector<Feed> prefill;
    for (size_t i = 0; i < n; i++) {
        std::vector<int32_t> p(2 + i % 3);
        for (auto &t : p) t = (int32_t)(rng() % vocab);
        prefill.push_back({i, p});
    }
    for (size_t i = 0; i < n; i += 6) // the prompts, 6 at a time (at most 24 rows)
        plan.emplace_back(prefill.begin() + (long)i, prefill.begin() + (long)std::min(n, i + 6));
    for (size_t step = 0; step < 6; step++) {
        std::vector<Feed> batch;
        for (size_t i = 0; i < n; i++) batch.push_back({i, {(int32_t)((i + step * 5) % vocab)}});
        plan.push_back(batch);
    }
    const Outputs alone = run_alone(model.get(), GetParam().kind, plan, n, 32);
    expect_identical(alone, run_batched(model.get(), GetParam().kind, plan, n, 32, -1), n);
}

// The most sequences a forward carries (64), prompts of up to 300 tokens (random model; 12 on
// SmolLM2) fed in chunks of up to 64 rows beside the others' decode rows: each alone.
TEST_P(BatchForward, SixtyFourSequencesWithLongPromptsEqualEachAlone) {
    // long prompts on the random model on cpu; short ones on SmolLM2 and under cudasim (its
    // kernels run on the host, slowly), chunks over the GEMV's 8 rows there too
    const bool small = GetParam().smollm2 || GetParam().kind == MK_BACKEND_CUDA;
    g_context = small ? 64 : 310;
    std::mt19937 rng(4242);
    const size_t n = MK_MAX_BATCH_SEQUENCES, max_rows = small ? 64 : 160;
    mk_hparams hp = gqa_tied_hparams();
    hp.max_context = 512;
    const ModelPtr long_model = GetParam().smollm2 ? nullptr : make_random_model(hp);
    const mk_model *m = GetParam().smollm2 ? model.get() : long_model.get();
    const size_t max_prompt = GetParam().smollm2 ? 6 : small ? 16 : 300;
    const Plan plan = make_plan(rng, n, vocab, max_prompt, small ? 12 : 64, 3, max_rows);
    const Outputs alone = run_alone(m, GetParam().kind, plan, n, max_rows);
    expect_identical(alone, run_batched(m, GetParam().kind, plan, n, max_rows, -1), n);
}

// On cuda a batch's decode rows take one RoPE + cache-write launch and one attention launch
// (a split and a combine) per layer together, each row through its own block table: a step
// of 8 decode rows launches exactly what a step of 2 launches (16-bit weights: the GEMV takes
// up to 8 rows in one product), not two more launches per layer and row.
TEST(BatchForwardCuda, DecodeRowsOfAnyCountShareEachLayersAttentionLaunches) {
    const mk_dtype saved = g_weights;
    g_weights = MK_DTYPE_F16;
    const ModelPtr model = make_random_model(mk_hparams_seed_default());
    const mk_hparams *hp = mk_model_hparams(model.get());
    mk_range_options o = options_for(MK_BACKEND_CUDA, 8, 16, 8, 4);
    o.eager_decode = true; // op by op: the launches themselves are counted
    g_weights = saved;
    mk_range *r = nullptr;
    ASSERT_EQ(mk_range_create(model.get(), 0, (int64_t)hp->n_layers - 1, &o, &r), MK_OK) << mk_last_error();
    RangePtr range(r);
    std::vector<SequencePtr> seqs;
    std::vector<std::vector<float>> logits(8, std::vector<float>(hp->vocab));
    std::vector<int32_t> tokens(8);
    for (size_t i = 0; i < 8; i++) {
        mk_sequence *s = nullptr;
        ASSERT_EQ(mk_sequence_open(r, &s), MK_OK);
        seqs.emplace_back(s);
        const std::vector<int32_t> prompt(1 + i % 5, (int32_t)(i + 1)); // other lengths, other blocks
        ASSERT_EQ(mk_range_forward_into(r, s, prompt.data(), prompt.size(), nullptr, nullptr, logits[i].data(), &tokens[i]),
                  MK_OK)
            << mk_last_error();
    }
    auto step_launches = [&](size_t n) {
        std::vector<mk_forward_entry> entries(n);
        for (size_t i = 0; i < n; i++)
            entries[i] = mk_forward_entry{seqs[i].get(), &tokens[i], 1, nullptr, nullptr, logits[i].data(), &tokens[i]};
        const uint64_t before = mk_range_backend_counters(r)->launches;
        EXPECT_EQ(mk_range_forward_batch(r, entries.data(), n), MK_OK) << mk_last_error();
        return mk_range_backend_counters(r)->launches - before;
    };
    const uint64_t two = step_launches(2), eight = step_launches(8);
    EXPECT_GT(two, 0u);
    EXPECT_EQ(eight, two) << "decode rows launched attention per sequence";
}

// Decode-only steps replay one captured graph per bucket of rows (1, 2, 4, 8), whatever the
// mix: 12 steps of random subsets of 8 sequences (1 to 8 rows, in random order, so rows move
// between sequences and buckets pad), each step exactly one graph launch and no allocation,
// one recording per bucket used, and every logit bit-identical to the same schedule run op by
// op (eager_decode): padding rows touch no sequence's cache or output.
TEST(BatchForwardCuda, DecodeStepsReplayOneGraphPerBucketWhateverTheMix) {
    const mk_dtype saved = g_weights;
    g_weights = MK_DTYPE_F16;
    const ModelPtr model = make_random_model(gqa_tied_hparams());
    const mk_hparams *hp = mk_model_hparams(model.get());
    std::mt19937 rng(77);
    std::vector<std::vector<size_t>> schedule; // each step: the sequences that decode, in row order
    for (int step = 0; step < 12; step++) {
        std::vector<size_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(1 + rng() % 8);
        schedule.push_back(all);
    }
    std::vector<std::vector<float>> logits[2]; // [eager, graph]: every step's rows in order
    for (const bool eager : {true, false}) {
        SCOPED_TRACE(eager ? "eager" : "graphs");
        mk_range_options o = options_for(MK_BACKEND_CUDA, 8, 16, 8, 4);
        o.eager_decode = eager;
        mk_range *r = nullptr;
        ASSERT_EQ(mk_range_create(model.get(), 0, (int64_t)hp->n_layers - 1, &o, &r), MK_OK) << mk_last_error();
        RangePtr range(r);
        const mk_backend_counters *k = mk_range_backend_counters(r);
        std::vector<SequencePtr> seqs;
        std::vector<std::vector<float>> l(8, std::vector<float>(hp->vocab));
        std::vector<int32_t> next(8);
        for (size_t i = 0; i < 8; i++) {
            mk_sequence *q = nullptr;
            ASSERT_EQ(mk_sequence_open(r, &q), MK_OK);
            seqs.emplace_back(q);
            const std::vector<int32_t> prompt(2 + i % 3, (int32_t)(3 * i + 1));
            ASSERT_EQ(mk_range_forward_into(r, q, prompt.data(), prompt.size(), nullptr, nullptr, l[i].data(), &next[i]),
                      MK_OK);
        }
        std::set<size_t> buckets;
        for (const auto &rows : schedule) {
            std::vector<mk_forward_entry> entries;
            for (size_t i : rows) entries.push_back({seqs[i].get(), &next[i], 1, nullptr, nullptr, l[i].data(), &next[i]});
            size_t bucket = 1;
            while (bucket < rows.size()) bucket <<= 1;
            buckets.insert(bucket);
            const uint64_t launches0 = k->graph_launches, allocs0 = cudasim::allocation_calls();
            ASSERT_EQ(mk_range_forward_batch(r, entries.data(), entries.size()), MK_OK) << mk_last_error();
            EXPECT_EQ(k->graph_launches - launches0, eager ? 0u : 1u) << rows.size() << " rows";
            EXPECT_EQ(cudasim::allocation_calls(), allocs0) << "a step allocated";
            for (size_t i : rows) logits[eager ? 0 : 1].push_back(l[i]);
        }
        EXPECT_EQ(k->graph_captures, eager ? 0u : buckets.size()) << "one recording per bucket";
    }
    g_weights = saved;
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t i = 0; i < logits[0].size(); i++)
        ASSERT_EQ(std::memcmp(logits[0][i].data(), logits[1][i].data(), logits[0][i].size() * sizeof(float)), 0)
            << "row " << i << ": the replayed step differs from op by op";
}

// What a batch refuses, before anything runs: the same sequence twice, more sequences than
// the range takes, more rows than it holds, an entry over its context (named), a missing
// output; the sequences are as they were.
TEST(BatchForwardRules, RefusalsNameTheEntryAndRunNothing) {
  for (mk_backend_kind kind : {MK_BACKEND_CPU, MK_BACKEND_CUDA}) {
    SCOPED_TRACE(kind == MK_BACKEND_CPU ? "cpu" : "cuda");
    g_weights = MK_DTYPE_F32;
    const ModelPtr model = make_random_model(gqa_tied_hparams());
    mk_range_options o = options_for(kind, 3, 8, 3, 16);
    o.max_context = 10;
    mk_range *r = nullptr;
    ASSERT_EQ(mk_range_create(model.get(), 0, 4, &o, &r), MK_OK) << mk_last_error();
    RangePtr range(r);
    mk_sequence *a = nullptr, *b = nullptr;
    ASSERT_EQ(mk_sequence_open(r, &a), MK_OK);
    ASSERT_EQ(mk_sequence_open(r, &b), MK_OK);
    SequencePtr pa(a), pb(b);
    const int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    std::vector<float> la(53), lb(53);
    int32_t ta = -1, tb = -1;
    mk_forward_entry e[4] = {{a, ids, 2, nullptr, nullptr, la.data(), &ta}, {b, ids, 3, nullptr, nullptr, lb.data(), &tb}};
    ASSERT_EQ(mk_range_forward_batch(r, e, 2), MK_OK) << mk_last_error();
    ASSERT_EQ(mk_sequence_length(a), 2u);
    ASSERT_EQ(mk_sequence_length(b), 3u);

    mk_forward_entry twice[2] = {e[0], e[0]};
    twice[0].n_tokens = twice[1].n_tokens = 1;
    EXPECT_EQ(mk_range_forward_batch(r, twice, 2), MK_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mk_last_error()).find("entries 0 and 1 are the same sequence"), std::string::npos)
        << mk_last_error();
    mk_forward_entry four[4] = {e[0], e[1], e[0], e[1]};
    EXPECT_EQ(mk_range_forward_batch(r, four, 4), MK_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mk_last_error()).find("at most 3 per forward"), std::string::npos) << mk_last_error();
    mk_forward_entry big[2] = {e[0], e[1]};
    big[0].n_tokens = 5, big[1].n_tokens = 4; // 9 rows > 8
    EXPECT_EQ(mk_range_forward_batch(r, big, 2), MK_ERR_SHAPE) << mk_last_error();
    mk_forward_entry over[2] = {e[0], e[1]};
    over[0].n_tokens = 1, over[1].n_tokens = 8; // b: 3 + 8 > 10 positions
    EXPECT_NE(mk_range_forward_batch(r, over, 2), MK_OK);
    EXPECT_NE(std::string(mk_last_error()).find("batch entry 1"), std::string::npos) << mk_last_error();
    mk_forward_entry no_out[2] = {e[0], e[1]};
    no_out[1].token = nullptr;
    EXPECT_EQ(mk_range_forward_batch(r, no_out, 2), MK_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mk_last_error()).find("batch entry 1"), std::string::npos) << mk_last_error();
    EXPECT_EQ(mk_range_forward_batch(r, e, 0), MK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(mk_sequence_length(a), 2u); // nothing ran
    EXPECT_EQ(mk_sequence_length(b), 3u);
    // and the range refuses a max_batch_sequences it cannot hold
    mk_range_options bad = options_for(kind, MK_MAX_BATCH_SEQUENCES + 1, 80, 1, 16);
    bad.max_context = 128;
    mk_range *none = nullptr;
    EXPECT_EQ(mk_range_create(model.get(), 0, 4, &bad, &none), MK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(none, nullptr);
    // ... or more sequences than a step has rows (each entry brings at least one)
    mk_range_options more_seqs_than_rows = options_for(kind, 8, 4, 1, 16);
    more_seqs_than_rows.max_context = 128;
    EXPECT_ERROR(mk_range_create(model.get(), 0, 4, &more_seqs_than_rows, &none), MK_ERR_INVALID_ARGUMENT,
                 "max_batch_sequences 8: at most 64, and at most max_batch_tokens (4)");
    EXPECT_EQ(none, nullptr);
    more_seqs_than_rows.max_batch_sequences = 4; // as many as the rows: taken
    MK_ASSERT_OK(mk_range_create(model.get(), 0, 4, &more_seqs_than_rows, &none));
    mk_range_free(none);
  }
}

// Each entry writes its own output: two entries naming one output boundary (a head) or one
// token or logits buffer (a tail) are refused before anything runs. Shared, the later entry's
// rows overwrote the earlier one's, which was lost without a word.
TEST(BatchForwardRules, EntriesSharingAnOutputAreRefused) {
    g_weights = MK_DTYPE_F32;
    const ModelPtr model = make_random_model(gqa_tied_hparams());
    mk_range_options o = options_for(MK_BACKEND_CPU, 4, 8, 4, 16);
    o.max_context = 10;
    mk_range *h = nullptr, *t = nullptr;
    ASSERT_EQ(mk_range_create(model.get(), 0, 1, &o, &h), MK_OK) << mk_last_error();
    RangePtr head(h);
    ASSERT_EQ(mk_range_create(model.get(), 2, 4, &o, &t), MK_OK) << mk_last_error();
    RangePtr tail(t);
    mk_sequence *ha = nullptr, *hb = nullptr, *ta = nullptr, *tb = nullptr;
    ASSERT_EQ(mk_sequence_open(h, &ha), MK_OK);
    ASSERT_EQ(mk_sequence_open(h, &hb), MK_OK);
    ASSERT_EQ(mk_sequence_open(t, &ta), MK_OK);
    ASSERT_EQ(mk_sequence_open(t, &tb), MK_OK);
    SequencePtr pha(ha), phb(hb), pta(ta), ptb(tb);
    mk_boundary *b[4] = {};
    for (int i = 0; i < 4; i++) ASSERT_EQ(mk_boundary_create(i < 2 ? h : t, &b[i]), MK_OK);
    BoundaryPtr b0(b[0]), b1(b[1]), b2(b[2]), b3(b[3]);
    const int32_t ids[2] = {3, 4};

    mk_forward_entry shared[2] = {{ha, ids, 2, nullptr, b[0], nullptr, nullptr}, {hb, ids, 1, nullptr, b[0], nullptr, nullptr}};
    EXPECT_ERROR(mk_range_forward_batch(h, shared, 2), MK_ERR_INVALID_ARGUMENT,
                 "batch entries 0 and 1 write the same output boundary");
    EXPECT_EQ(mk_sequence_length(ha), 0u); // nothing ran
    mk_forward_entry own[2] = {shared[0], shared[1]};
    own[1].out = b[1];
    ASSERT_EQ(mk_range_forward_batch(h, own, 2), MK_OK) << mk_last_error();
    ASSERT_EQ(mk_boundary_header_of(b[0])->rows, 2u);
    ASSERT_EQ(mk_boundary_header_of(b[1])->rows, 1u);

    // the head's boundaries into the tail's (a local seam each), then the tail's batch
    const mk_seam_options local = mk_seam_options_default(MK_SEAM_LOCAL);
    for (int i = 0; i < 2; i++) {
        mk_seam *tx = nullptr, *rx = nullptr;
        ASSERT_EQ(mk_seam_pair(&local, h, t, &tx, &rx), MK_OK) << mk_last_error();
        ASSERT_EQ(mk_seam_send(tx, b[i]), MK_OK) << mk_last_error();
        ASSERT_EQ(mk_seam_recv(rx, i == 0 ? ta : tb, b[2 + i]), MK_OK) << mk_last_error();
        mk_seam_free(tx);
        mk_seam_free(rx);
    }
    std::vector<float> la(53), lb(53);
    int32_t tok_a = -1, tok_b = -1;
    mk_forward_entry tails[2] = {{ta, nullptr, 0, b[2], nullptr, la.data(), &tok_a},
                                 {tb, nullptr, 0, b[3], nullptr, lb.data(), &tok_b}};
    mk_forward_entry same_token[2] = {tails[0], tails[1]};
    same_token[1].token = &tok_a;
    EXPECT_ERROR(mk_range_forward_batch(t, same_token, 2), MK_ERR_INVALID_ARGUMENT,
                 "batch entries 0 and 1 write the same output buffer");
    mk_forward_entry same_logits[2] = {tails[0], tails[1]};
    same_logits[1].logits = la.data();
    EXPECT_ERROR(mk_range_forward_batch(t, same_logits, 2), MK_ERR_INVALID_ARGUMENT,
                 "batch entries 0 and 1 write the same output buffer");
    EXPECT_EQ(mk_sequence_length(ta), 0u); // nothing ran
    EXPECT_EQ(mk_sequence_length(tb), 0u);
    ASSERT_EQ(mk_range_forward_batch(t, tails, 2), MK_OK) << mk_last_error();
    EXPECT_GE(tok_a, 0);
    EXPECT_GE(tok_b, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchForward,
                         ::testing::Values(Case{MK_BACKEND_CPU, MK_DTYPE_F32, false, "cpu_f32"},
                                           Case{MK_BACKEND_CPU, MK_DTYPE_NATIVE, true, "cpu_native_smollm2"},
                                           Case{MK_BACKEND_CUDA, MK_DTYPE_F32, false, "cuda_f32"},
                                           Case{MK_BACKEND_CUDA, MK_DTYPE_F16, false, "cuda_f16"}),
                         [](const ::testing::TestParamInfo<Case> &i) { return std::string(i.param.name); });

} // namespace
