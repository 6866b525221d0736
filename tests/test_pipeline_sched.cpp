// The placed pipeline (mk_sched) on the cpu backend: one worker thread per range, many
// sequences in flight, continuous admission, per-sequence statuses, injected stage
// failures, the stage timeline, and the balanced cut chooser.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <thread>
#include <string>

#include "mk_native_gguf.h"
#include "sched/sched.h"
#include "sched_test_util.h"

namespace {

mk_range_options cpu_options() {
    mk_range_options o = mk_range_options_default();
    o.max_context = 64;
    return o;
}

mk_sched_options sched_options(size_t in_flight, const std::vector<int64_t> *cuts, mk_seam_kind seam) {
    mk_sched_options o = mk_sched_options_default();
    o.range = cpu_options();
    o.max_sequences = in_flight;
    o.seam = seam;
    if (cuts) {
        o.cuts = cuts->data();
        o.n_cuts = cuts->size();
    }
    return o;
}

// The queue between stages: first in, first out across the ring's wrap; a push into a full
// ring is refused (never a wait), naming its capacity, and takes nothing.
TEST(PipelineQueue, FifoAcrossTheWrapAndFullIsRefused) {
    mk_queue q;
    MK_ASSERT_OK(mk_queue_init(&q, 3));
    mk_sched_item items[5];
    for (int i = 0; i < 3; i++) MK_ASSERT_OK(mk_queue_push(&q, &items[i]));
    EXPECT_ERROR(mk_queue_push(&q, &items[3]), MK_ERR_INTERNAL, "pipeline queue of 3 items is full");
    EXPECT_EQ(mk_queue_pop(&q), &items[0]);
    MK_ASSERT_OK(mk_queue_push(&q, &items[3]));
    EXPECT_EQ(mk_queue_pop(&q), &items[1]);
    MK_ASSERT_OK(mk_queue_push(&q, &items[4]));
    EXPECT_EQ(mk_queue_pop(&q), &items[2]);
    EXPECT_EQ(mk_queue_pop(&q), &items[3]);
    EXPECT_EQ(mk_queue_pop(&q), &items[4]);
    mk_queue_destroy(&q);
    mk_queue_destroy(&q); // twice is harmless
}

// ============================================================ cut chooser ==

// Largest stage cost of a partition (cuts = last layer of each stage but the last).
double worst_stage(const std::vector<double> &cost, double head, double tail, const std::vector<int64_t> &cuts) {
    double worst = 0;
    size_t layer = 0;
    for (size_t i = 0; i <= cuts.size(); i++) {
        const size_t end = i < cuts.size() ? (size_t)cuts[i] : cost.size() - 1;
        double c = (i == 0 ? head : 0) + (i == cuts.size() ? tail : 0);
        for (; layer <= end; layer++) c += cost[layer];
        worst = std::max(worst, c);
    }
    return worst;
}

// Every partition of n layers into k stages, by recursion (small n only).
void best_by_brute_force(const std::vector<double> &cost, double head, double tail, size_t k,
                         std::vector<int64_t> &cuts, double &best) {
    if (cuts.size() + 1 == k) {
        best = std::min(best, worst_stage(cost, head, tail, cuts));
        return;
    }
    const int64_t from = cuts.empty() ? 0 : cuts.back() + 1;
    const int64_t stages_left = (int64_t)(k - cuts.size() - 1);
    for (int64_t c = from; c <= (int64_t)cost.size() - 1 - stages_left; c++) {
        cuts.push_back(c);
        best_by_brute_force(cost, head, tail, k, cuts, best);
        cuts.pop_back();
    }
}

TEST(SplitAuto, UniformLayersSplitEvenly) {
    const std::vector<double> cost(12, 5.0);
    int64_t cuts[3];
    MK_ASSERT_OK(mk_choose_cuts(cost.data(), cost.size(), 0, 0, 4, cuts));
    EXPECT_EQ(cuts[0], 2);
    EXPECT_EQ(cuts[1], 5);
    EXPECT_EQ(cuts[2], 8);
}

TEST(SplitAuto, HeavyLmHeadGivesTheTailFewerLayers) {
    // 10 layers of 1; the tail's lm_head weighs 4 layers: 14 units, 7 per stage.
    const std::vector<double> cost(10, 1.0);
    int64_t cut = -1;
    MK_ASSERT_OK(mk_choose_cuts(cost.data(), cost.size(), 0.0, 4.0, 2, &cut));
    EXPECT_EQ(cut, 6) << "head 0-6 (7), tail 7-9 + lm_head (7)";
    // A heavy head (embedding) moves the cut the other way.
    MK_ASSERT_OK(mk_choose_cuts(cost.data(), cost.size(), 4.0, 0.0, 2, &cut));
    EXPECT_EQ(cut, 2);
}

TEST(SplitAuto, ChooserIsOptimalOnRandomCosts) {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 60; trial++) {
        const size_t n = 2 + rng() % 9, k = 1 + rng() % std::min<size_t>(n, 4);
        std::vector<double> cost(n);
        for (double &c : cost) c = 1 + rng() % 50;
        const double head = rng() % 30, tail = rng() % 120;
        std::vector<int64_t> cuts(k > 1 ? k - 1 : 1);
        MK_ASSERT_OK(mk_choose_cuts(cost.data(), n, head, tail, k, cuts.data()));
        cuts.resize(k - 1);
        for (size_t i = 0; i < cuts.size(); i++) {
            ASSERT_GE(cuts[i], i == 0 ? 0 : cuts[i - 1] + 1);
            ASSERT_LT(cuts[i], (int64_t)n - 1);
        }
        std::vector<int64_t> scratch;
        double best = 1e300;
        best_by_brute_force(cost, head, tail, k, scratch, best);
        EXPECT_EQ(worst_stage(cost, head, tail, cuts), best) << "trial " << trial << " n " << n << " k " << k;
    }
}

TEST(SplitAuto, MoreStagesThanLayersIsRefused) {
    const std::vector<double> cost(3, 1.0);
    int64_t cuts[4];
    EXPECT_EQ(mk_choose_cuts(cost.data(), 3, 0, 0, 4, cuts), MK_ERR_INVALID_RANGE);
    EXPECT_EQ(mk_choose_cuts(cost.data(), 3, 0, 0, 0, cuts), MK_ERR_INVALID_RANGE);
}

// The refusals of the cut chooser, each by message; the edges it accepts: one stage (no
// cut written), as many stages as layers (one layer each).
TEST(SplitAuto, ChooserEdges) {
    const std::vector<double> cost = {1, 2, 3};
    int64_t cuts[3] = {-7, -7, -7};
    EXPECT_ERROR(mk_choose_cuts(cost.data(), 3, 0, 0, 4, cuts), MK_ERR_INVALID_RANGE,
                 "4 ranges over 3 layers: each range needs a layer");
    EXPECT_ERROR(mk_choose_cuts(cost.data(), 3, 0, 0, 0, cuts), MK_ERR_INVALID_RANGE, "0 ranges over 3 layers");
    EXPECT_ERROR(mk_choose_cuts(nullptr, 3, 0, 0, 2, cuts), MK_ERR_INVALID_ARGUMENT, "mk_choose_cuts: NULL argument");
    EXPECT_ERROR(mk_choose_cuts(cost.data(), 3, 0, 0, 2, nullptr), MK_ERR_INVALID_ARGUMENT, "NULL argument");
    MK_ASSERT_OK(mk_choose_cuts(cost.data(), 3, 0, 0, 1, nullptr));
    MK_ASSERT_OK(mk_choose_cuts(cost.data(), 3, 0, 0, 3, cuts));
    EXPECT_EQ(cuts[0], 0);
    EXPECT_EQ(cuts[1], 1);
    EXPECT_EQ(cuts[2], -7) << "wrote past the k - 1 cuts";
}

// The cost of a layer is the weight elements one decode step reads: Q and O (hidden x
// n_heads * head_dim each), K and V (hidden x n_kv_heads * head_dim each: narrower under
// GQA), gate, up and down (hidden x intermediate each) and the two norms; the head adds the
// one embedding row a token gathers, the tail the final norm and the lm_head.
TEST(SplitAuto, CostsCountEachMatrixWithTheKeyValueWidthOfGqa) {
    const mk_hparams hp = gqa_tied_hparams(); // 6 heads, 2 kv heads of 6, hidden 36, ffn 72, vocab 53
    ModelPtr model = make_random_model(hp);
    ASSERT_TRUE(model);
    std::vector<double> cost(hp.n_layers, -1);
    double head = -1, tail = -1;
    MK_ASSERT_OK(mk_split_costs(model.get(), cost.data(), &head, &tail));
    const double q = 6 * 6, kv = 2 * 6, layer = 36 * q * 2 + 36 * kv * 2 + 36 * 72 * 3 + 36 * 2;
    for (size_t l = 0; l < hp.n_layers; l++) EXPECT_EQ(cost[l], layer) << "layer " << l;
    EXPECT_EQ(head, 36.0);
    EXPECT_EQ(tail, 36.0 + 53.0 * 36);
    // the same shapes with as many KV heads as heads cost more by the wider K and V
    mk_hparams mha = hp;
    mha.n_kv_heads = 6;
    ModelPtr wide = make_random_model(mha);
    std::vector<double> cost_mha(hp.n_layers);
    MK_ASSERT_OK(mk_split_costs(wide.get(), cost_mha.data(), &head, &tail));
    EXPECT_EQ(cost_mha[0] - cost[0], 2.0 * 36 * (q - kv));
    // the shares of a split are those costs over the total
    int64_t cut = -1;
    double shares[2] = {0, 0};
    MK_ASSERT_OK(mk_split_auto(model.get(), 2, &cut, shares));
    const double total = 5 * layer + 36 + 36 + 53.0 * 36;
    EXPECT_DOUBLE_EQ(shares[0], ((double)(cut + 1) * layer + 36) / total);
    EXPECT_DOUBLE_EQ(shares[1], ((double)(4 - cut) * layer + 36 + 53.0 * 36) / total);
}

// SmolLM2-135M's shapes: the 49152 x 576 lm_head is ~8 layers, so the tail takes 11 of 30.
TEST(SplitAuto, SmolLM2ShapesPutElevenLayersOnTheTail) {
    mk_hparams hp = mk_hparams_seed_default();
    hp.vocab = 49152;
    hp.hidden = 576;
    hp.n_layers = 30;
    hp.n_heads = 9;
    hp.n_kv_heads = 3;
    hp.head_dim = 64;
    hp.intermediate = 1536;
    hp.tied_embeddings = true;
    ModelPtr model = make_random_model(hp);
    ASSERT_TRUE(model);
    int64_t cut = -1;
    double shares[2];
    MK_ASSERT_OK(mk_split_auto(model.get(), 2, &cut, shares));
    EXPECT_EQ(cut, 18);
    EXPECT_NEAR(shares[0] + shares[1], 1.0, 1e-12);
    EXPECT_NEAR(shares[0], 0.5, 0.02);
    int64_t cuts3[2];
    MK_ASSERT_OK(mk_split_auto(model.get(), 3, cuts3, nullptr));
    EXPECT_GT(cuts3[1] - cuts3[0], 0);
    EXPECT_LT(29 - cuts3[1], cuts3[0] + 1) << "the tail stage holds fewer layers than the head";
}

// ================================================================ parity ==

// 1..8 sequences in flight (two more queued than slots, so slots are handed on), mixed
// prompt lengths and limits, some stopping early; 2 stages through the wire and 3
// balanced stages in process; both random model shapes.
TEST(PipelineSched, EverySequenceMatchesItsWholeModelRunForOneToEightInFlight) {
    for (const ModelCase &mc : model_cases()) {
        ModelPtr model = make_random_model(mc.hp);
        for (size_t m = 1; m <= 8; m++) {
            const std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), m + 2, (uint32_t)m);
            const std::vector<int64_t> two = {2};
            for (int variant = 0; variant < 2; variant++) {
                mk_sched_options o = sched_options(m, variant == 0 ? &two : nullptr,
                                                   variant == 0 ? MK_SEAM_WIRE : MK_SEAM_LOCAL);
                if (variant == 1) {
                    o.split_auto = true;
                    o.n_workers = 3;
                }
                Collector c;
                SchedPtr s = make_sched(model.get(), o, &c);
                ASSERT_TRUE(s);
                ASSERT_EQ(mk_sched_worker_count(s.get()), variant == 0 ? 2u : 3u);
                const std::vector<uint64_t> ids = submit_all(s.get(), specs);
                ASSERT_TRUE(wait_all_within(s.get(), 120));
                const std::string what = std::string(mc.name) + (variant == 0 ? " 2 stages wire" : " 3 stages auto") +
                                         " m=" + std::to_string(m);
                expect_all_match_whole(model.get(), cpu_options(), specs, collect(s.get(), &c, ids), what);
                if (HasFatalFailure()) return;
            }
        }
    }
}

// Every transport of the seams API joins the stages (3 balanced stages, so two seams, each
// a stream connection / copy / pack of its own): 1..8 sequences in flight, nine sequences
// rotated through the slots, each bit-identical to its whole-model run. 0 is the placement
// rule (local on the cpu backend).
TEST(PipelineSched, EverySeamTransportMatchesWholeForOneToEightInFlight) {
    ModelPtr model = make_random_model(gqa_tied_hparams());
    const std::vector<SeqSpec> pool = mixed_specs(model.get(), cpu_options(), 9, 21, 5);
    ReferenceCache refs;
    for (mk_seam_kind kind : {MK_SEAM_UNIX, MK_SEAM_TCP, MK_SEAM_LOCAL, MK_SEAM_WIRE, (mk_seam_kind)0}) {
        for (size_t m = 1; m <= 8; m++) {
            std::vector<SeqSpec> specs;
            for (size_t k = 0; k <= m; k++) specs.push_back(pool[(m + k) % pool.size()]);
            mk_sched_options o = sched_options(m, nullptr, kind);
            o.split_auto = true;
            o.n_workers = 3;
            Collector c;
            SchedPtr s = make_sched(model.get(), o, &c);
            ASSERT_TRUE(s);
            const mk_seam_kind built = kind ? kind : MK_SEAM_LOCAL;
            EXPECT_EQ(mk_sched_seam_kind(s.get(), 0), built);
            EXPECT_EQ(mk_sched_seam_kind(s.get(), 1), built);
            EXPECT_EQ(mk_sched_seam_kind(s.get(), 2), (mk_seam_kind)0) << "past the last seam";
            const std::vector<uint64_t> ids = submit_all(s.get(), specs);
            ASSERT_TRUE(wait_all_within(s.get(), 120));
            const std::string what = std::string(mk_seam_kind_name(built)) + " m=" + std::to_string(m);
            expect_all_match_whole(model.get(), cpu_options(), specs, collect(s.get(), &c, ids), what, &refs);
            if (HasFatalFailure()) return;
            size_t rows = 0; // every boundary crossed both seams: its rows as f32 at least
            for (const SeqSpec &sp : specs) rows += sp.prompt.size();
            EXPECT_GE(mk_sched_seam_bytes(s.get(), 1), rows * mk_model_hparams(model.get())->hidden * sizeof(float))
                << what;
        }
    }
}

// Continuous batching: each stage's step takes every item already waiting (up to 6, the
// sequences in flight), so boundaries of several sequences leave a step together and cross
// every transport one by one; sequences join as others finish, some stop early; each is
// bit-identical to its whole-model run, and the steps really carried several sequences.
TEST(PipelineSched, BatchedStepsMatchWholeOverEverySeam) {
    ModelPtr model = make_random_model(gqa_tied_hparams());
    const std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 11, 77, 5);
    ReferenceCache refs;
    for (mk_seam_kind kind : {MK_SEAM_UNIX, MK_SEAM_TCP, MK_SEAM_LOCAL, MK_SEAM_WIRE}) {
        mk_sched_options o = sched_options(6, nullptr, kind);
        o.split_auto = true;
        o.n_workers = 3;
        o.range.max_batch_sequences = 6;
        Collector c;
        SchedPtr s = make_sched(model.get(), o, &c);
        ASSERT_TRUE(s);
        const std::vector<uint64_t> ids = submit_all(s.get(), specs);
        ASSERT_TRUE(wait_all_within(s.get(), 120));
        const std::string what = std::string("batched, ") + mk_seam_kind_name(kind);
        const std::vector<SeqResult> results = collect(s.get(), &c, ids);
        expect_all_match_whole(model.get(), cpu_options(), specs, results, what, &refs);
        if (HasFatalFailure()) return;
        // some step of the tail carried more than one sequence: fewer steps than tokens (one
        // step yields one token of each sequence it carries)
        mk_worker_stats tail{};
        ASSERT_EQ(mk_sched_worker_stats(s.get(), 2, &tail), MK_OK);
        size_t tokens = 0;
        for (const SeqResult &r : results) tokens += r.tokens.size();
        EXPECT_LT(tail.steps, tokens) << what << ": the tail ran a step per token, never a batch";
    }
}

// A KV pool smaller than the sequences in flight need: admission waits for blocks (first
// come, first served), every sequence completes with the whole model's tokens and none fails
// for want of a block, and every block comes back; a sequence no pool could ever hold is
// refused at submit by name.
TEST(PipelineSched, SmallKvPoolQueuesSequencesUntilTheirBlocksAreFree) {
    ModelPtr model = make_random_model(gqa_tied_hparams());
    const std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 12, 31, 7);
    ReferenceCache refs;
    mk_sched_options o = sched_options(6, nullptr, MK_SEAM_LOCAL);
    o.split_auto = true;
    o.n_workers = 2;
    o.range.max_batch_sequences = 6;
    o.range.kv_block_size = 4;
    o.range.kv_pool_blocks = 6; // about two sequences' worth; six slots
    Collector c;
    SchedPtr s = make_sched(model.get(), o, &c);
    ASSERT_TRUE(s);
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 120));
    const std::vector<SeqResult> results = collect(s.get(), &c, ids);
    expect_all_match_whole(model.get(), cpu_options(), specs, results, "small KV pool", &refs);
    for (size_t i = 0; i < 2; i++) {
        mk_kv_pool_info info{};
        ASSERT_EQ(mk_range_kv_pool(mk_sched_worker_range(s.get(), i), &info), MK_OK);
        EXPECT_EQ(info.free_blocks, info.blocks) << "stage " << i << " kept blocks";
        EXPECT_EQ(info.promised_blocks, 0u) << "stage " << i;
    }
    const std::vector<int32_t> long_prompt(20, 5);
    uint64_t id = 0;
    EXPECT_ERROR(mk_sched_submit(s.get(), long_prompt.data(), long_prompt.size(), 10, nullptr, 0, &id),
                 MK_ERR_KV_POOL_FULL, "stage 0: a sequence of up to 29 positions needs");

    // Cancels while sequences wait for blocks and while they run: each cancelled sequence's
    // tokens are a prefix of the whole model's, the others equal it, every block comes back.
    Collector c2;
    SchedPtr s2 = make_sched(model.get(), o, &c2);
    ASSERT_TRUE(s2);
    const std::vector<uint64_t> ids2 = submit_all(s2.get(), specs);
    for (size_t k : {1u, 7u, 11u}) EXPECT_EQ(mk_sched_cancel(s2.get(), ids2[k]), MK_OK);
    ASSERT_TRUE(wait_all_within(s2.get(), 120));
    const std::vector<SeqResult> after = collect(s2.get(), &c2, ids2);
    for (size_t k = 0; k < specs.size(); k++) {
        const Decode &ref = refs.get(model.get(), cpu_options(), specs[k]);
        ASSERT_EQ(after[k].info.state, MK_SEQ_DONE) << "seq " << k << ": " << after[k].error;
        const bool cancelled = k == 1 || k == 7 || k == 11;
        if (!cancelled) {
            EXPECT_EQ(after[k].tokens, ref.tokens) << "seq " << k;
            continue;
        }
        ASSERT_LE(after[k].tokens.size(), ref.tokens.size()) << "seq " << k;
        EXPECT_TRUE(std::equal(after[k].tokens.begin(), after[k].tokens.end(), ref.tokens.begin())) << "seq " << k;
    }
    for (size_t i = 0; i < 2; i++) {
        mk_kv_pool_info info{};
        ASSERT_EQ(mk_range_kv_pool(mk_sched_worker_range(s2.get(), i), &info), MK_OK);
        EXPECT_EQ(info.free_blocks, info.blocks) << "stage " << i << " kept blocks after cancels";
        EXPECT_EQ(info.promised_blocks, 0u) << "stage " << i;
    }
}

// What joins a worker's step from its queue: items while their rows fit, never the stop
// item (it ends the worker; taken into a step it would be run as a sequence); the front item
// is taken only when it fits, and the room grows by what was taken.
TEST(PipelineQueue, ABatchTakesWhatFitsAndNeverTheStopItem) {
    mk_queue q{};
    ASSERT_EQ(mk_queue_init(&q, 4), MK_OK);
    mk_sched_item a{}, b{}, stop{};
    a.kind = MK_ITEM_DECODE, a.n_tokens = 1;
    b.kind = MK_ITEM_PREFILL, b.n_tokens = 5;
    stop.kind = MK_ITEM_STOP;
    ASSERT_EQ(mk_queue_push(&q, &a), MK_OK);
    ASSERT_EQ(mk_queue_push(&q, &b), MK_OK);
    ASSERT_EQ(mk_queue_push(&q, &stop), MK_OK);
    mk_batch_room room = {2, 7};
    EXPECT_EQ(mk_queue_pop_if(&q, mk_sched_item_fits, &room), &a);
    EXPECT_EQ(room.rows, 3u);
    EXPECT_EQ(mk_queue_pop_if(&q, mk_sched_item_fits, &room), nullptr) << "3 + 5 rows do not fit 7";
    EXPECT_EQ(room.rows, 3u);
    mk_batch_room exact = {2, 7};
    EXPECT_EQ(mk_queue_pop_if(&q, mk_sched_item_fits, &exact), &b) << "2 + 5 rows fit 7 exactly";
    EXPECT_EQ(exact.rows, 7u);
    mk_batch_room wide = {0, 100};
    ASSERT_EQ(mk_queue_pop_if(&q, mk_sched_item_fits, &wide), nullptr) << "the stop item never joins a step";
    EXPECT_EQ(mk_queue_pop(&q), &stop);
    EXPECT_EQ(mk_queue_pop_if(&q, mk_sched_item_fits, &wide), nullptr) << "empty";
    mk_queue_destroy(&q);
}

// Taking from the front while items fit goes around the ring as popping does: pushes and
// takes interleaved over several turns of a 3-item ring come out in order, each once.
TEST(PipelineQueue, TakingWhatFitsGoesAroundTheRing) {
    mk_queue q{};
    ASSERT_EQ(mk_queue_init(&q, 3), MK_OK);
    mk_sched_item items[11]{};
    auto any = [](const mk_sched_item *, void *) { return true; };
    size_t pushed = 0, taken = 0;
    for (int turn = 0; turn < 5; turn++) {
        const size_t burst = turn % 2 ? 3 : 2;
        for (size_t i = 0; i < burst && pushed < 11; i++) ASSERT_EQ(mk_queue_push(&q, &items[pushed++]), MK_OK);
        while (taken < pushed) {
            mk_sched_item *got = mk_queue_pop_if(&q, any, nullptr);
            ASSERT_EQ(got, &items[taken]) << "turn " << turn << " item " << taken;
            taken++;
        }
        EXPECT_EQ(mk_queue_pop_if(&q, any, nullptr), nullptr) << "turn " << turn << ": empty";
    }
    EXPECT_EQ(taken, 11u);
    mk_queue_destroy(&q);
}

// NCCL needs the cuda backend on distinct devices: on the cpu backend it is refused clearly.
TEST(PipelineSched, NcclSeamOnTheCpuBackendIsRefused) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_sched_options o = sched_options(2, nullptr, MK_SEAM_NCCL);
    o.split_auto = true;
    o.n_workers = 2;
    mk_sched *s = nullptr;
    const mk_status st = mk_sched_create(model.get(), &o, &s);
    EXPECT_EQ(st, MK_ERR_UNSUPPORTED);
    EXPECT_EQ(s, nullptr);
    const std::string err = mk_last_error();
    EXPECT_TRUE(err.find("cpu backend") != std::string::npos || err.find("no NCCL seam") != std::string::npos) << err;
}

// The pipeline stays usable: a second wave on the same mk_sched (slots reused, caches reset).
TEST(PipelineSched, SecondWaveOnTheSameSlotsMatches) {
    ModelPtr model = make_random_model(gqa_tied_hparams());
    const std::vector<int64_t> cuts = {1, 3};
    Collector c;
    SchedPtr s = make_sched(model.get(), sched_options(3, &cuts, MK_SEAM_LOCAL), &c);
    ASSERT_TRUE(s);
    for (uint32_t wave = 0; wave < 2; wave++) {
        const std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 5, 40 + wave);
        const std::vector<uint64_t> ids = submit_all(s.get(), specs);
        ASSERT_TRUE(wait_all_within(s.get(), 120));
        expect_all_match_whole(model.get(), cpu_options(), specs, collect(s.get(), &c, ids), "wave");
    }
}

// mk_sched_cancel: a queued sequence leaves at once, a running one within a step (the
// queued one behind it then runs and matches its whole-model run); mk_sched_release frees a
// finished record at once and a running one when it retires.
TEST(PipelineSched, CancelAndReleaseFreeTheSlotAndTheRecord) {
    ModelPtr model = make_random_model(gqa_tied_hparams());
    const std::vector<int64_t> cuts = {2};
    Collector c;
    c.hold_at = 2; // the long one (the only slot's) waits at its 2nd token: running, not done
    SchedPtr s = make_sched(model.get(), sched_options(1, &cuts, MK_SEAM_LOCAL), &c);
    ASSERT_TRUE(s);
    std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 4, 7);
    specs[0].max_new = 50;
    specs[0].stop.clear();
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    mk_seq_info info{};
    ASSERT_EQ(mk_sched_cancel(s.get(), ids[1]), MK_OK); // queued behind the one slot
    ASSERT_EQ(mk_sched_poll(s.get(), ids[1], &info, nullptr, 0), MK_OK);
    EXPECT_EQ(info.state, MK_SEQ_DONE);
    EXPECT_EQ(info.n_tokens, 0u);
    // the last of the queue cancelled: the next submitted joins the queue behind the one
    // before it (not behind the cancelled record) and runs
    const uint64_t tail = submit_all(s.get(), {specs[2]})[0];
    ASSERT_EQ(mk_sched_cancel(s.get(), tail), MK_OK);
    const uint64_t after_tail = submit_all(s.get(), {specs[1]})[0];
    ASSERT_EQ(c.wait_held(), ids[0]) << "the long one has begun";
    const mk_status cancelled = mk_sched_cancel(s.get(), ids[0]);
    c.release();
    ASSERT_EQ(cancelled, MK_OK);
    ASSERT_EQ(mk_sched_release(s.get(), ids[3]), MK_OK); // still queued: freed when it ends
    ASSERT_TRUE(wait_all_within(s.get(), 120));
    ASSERT_EQ(mk_sched_poll(s.get(), ids[0], &info, nullptr, 0), MK_OK);
    EXPECT_EQ(info.state, MK_SEQ_DONE);
    EXPECT_FALSE(info.stopped);
    EXPECT_LT(info.n_tokens, 50u) << "cancelled within a step";
    const std::vector<SeqResult> rest = collect(s.get(), &c, {ids[2], after_tail});
    expect_all_match_whole(model.get(), cpu_options(), {specs[2], specs[1]}, rest, "after cancel");
    ASSERT_EQ(mk_sched_poll(s.get(), tail, &info, nullptr, 0), MK_OK);
    EXPECT_EQ(info.n_tokens, 0u) << "the cancelled tail never ran";
    EXPECT_EQ(mk_sched_poll(s.get(), ids[3], &info, nullptr, 0), MK_ERR_INVALID_ARGUMENT) << "released";
    for (size_t i = 0; i < 3; i++) {
        EXPECT_EQ(mk_sched_release(s.get(), ids[i]), MK_OK);
        EXPECT_EQ(mk_sched_poll(s.get(), ids[i], &info, nullptr, 0), MK_ERR_INVALID_ARGUMENT);
    }
    EXPECT_EQ(mk_sched_cancel(s.get(), ids[0]), MK_ERR_INVALID_ARGUMENT);
}

// A worker's share of the pipeline's work: its layers' cost, the head's extra (the embedding
// row a token gathers) on the first, the tail's (final norm and lm_head) on the last, over
// the whole; given cuts 1 and 3 of the 6-layer model: layers 0-1, 2-3, 4-5.
TEST(PipelineSched, SharesCountTheHeadAndTheTailOnTheirWorkers) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<int64_t> cuts = {1, 3};
    Collector c;
    SchedPtr s = make_sched(model.get(), sched_options(1, &cuts, MK_SEAM_LOCAL), &c);
    ASSERT_TRUE(s);
    std::vector<double> layer(6);
    double head = 0, tail = 0;
    MK_ASSERT_OK(mk_split_costs(model.get(), layer.data(), &head, &tail));
    ASSERT_GT(head, 0.0);
    const double total = head + tail + layer[0] * 6;
    EXPECT_NEAR(mk_sched_worker_share(s.get(), 0), (head + 2 * layer[0]) / total, 1e-12);
    EXPECT_NEAR(mk_sched_worker_share(s.get(), 1), (2 * layer[0]) / total, 1e-12);
    EXPECT_NEAR(mk_sched_worker_share(s.get(), 2), (tail + 2 * layer[0]) / total, 1e-12);
}

// mk_sched_poll copies at most `cap` tokens (the caller's array), and says how many there are.
TEST(PipelineSched, PollCopiesAtMostCapTokens) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    Collector c;
    SchedPtr s = make_sched(model.get(), sched_options(1, nullptr, MK_SEAM_LOCAL), &c);
    ASSERT_TRUE(s);
    std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 1, 5);
    specs[0].max_new = 6;
    specs[0].stop.clear();
    const uint64_t id = submit_all(s.get(), specs)[0];
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    std::vector<int32_t> all(6, -7), some(6, -7);
    mk_seq_info info{};
    MK_ASSERT_OK(mk_sched_poll(s.get(), id, &info, all.data(), all.size()));
    ASSERT_EQ(info.n_tokens, 6u);
    MK_ASSERT_OK(mk_sched_poll(s.get(), id, &info, some.data(), 2));
    EXPECT_EQ(info.n_tokens, 6u);
    EXPECT_EQ(std::vector<int32_t>(some.begin(), some.begin() + 2), std::vector<int32_t>(all.begin(), all.begin() + 2));
    EXPECT_EQ(std::vector<int32_t>(some.begin() + 2, some.end()), std::vector<int32_t>(4, -7)) << "written past cap";
}

// ============================================================ statuses ==

// A prompt with a token outside the vocabulary is refused at submit, by name (found by the
// batched forward it failed every sequence sharing its step); the others run and match.
TEST(PipelineSched, ABadSequenceIsRefusedAtSubmitAndTheOthersMatch) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 6, 3);
    const std::vector<int64_t> cuts = {2};
    mk_sched_options o = sched_options(3, &cuts, MK_SEAM_LOCAL);
    o.range.max_batch_sequences = 6;
    Collector c;
    SchedPtr s = make_sched(model.get(), o, &c);
    ASSERT_TRUE(s);
    for (const int32_t bad : {4000, 48, -1}) {
        std::vector<int32_t> prompt = specs[2].prompt;
        prompt.back() = bad;
        uint64_t id = 0;
        EXPECT_EQ(mk_sched_submit(s.get(), prompt.data(), prompt.size(), 4, nullptr, 0, &id), MK_ERR_TOKEN_OUT_OF_RANGE);
        EXPECT_NE(std::string(mk_last_error()).find("id " + std::to_string(bad) + ", outside the vocabulary (48)"),
                  std::string::npos) << mk_last_error();
    }
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    expect_all_match_whole(model.get(), cpu_options(), specs, collect(s.get(), &c, ids), "beside refused prompts");
}

// A sequence that runs into its context in a batched step fails alone, with why: the
// sequences sharing its steps go on and match the whole model (they failed with it, the
// second and later ones with an empty message).
TEST(PipelineSched, ASequencePastItsContextFailsAloneInABatchedStep) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 5, 9);
    for (size_t i = 0; i < specs.size(); i++) {
        specs[i].prompt.resize(2, 5 + (int32_t)i);
        specs[i].max_new = 14;  // 2 prompt positions + 13: within a context of 16, past the step below
        specs[i].stop.clear();
    }
    specs[1].prompt.resize(4, 7);
    specs[1].max_new = 100;  // at its 13th token it needs position 16: the others decode beside it
    mk_sched_options o = sched_options(5, nullptr, MK_SEAM_LOCAL);
    o.range.max_batch_sequences = 5;
    o.range.max_context = 16;
    Collector c;
    SchedPtr s = make_sched(model.get(), o, &c);
    ASSERT_TRUE(s);
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    std::vector<SeqResult> results = collect(s.get(), &c, ids);
    EXPECT_EQ(results[1].info.state, MK_SEQ_FAILED);
    EXPECT_EQ(results[1].info.status, MK_ERR_CONTEXT_OVERFLOW);
    EXPECT_NE(results[1].error.find("exceeds max_context 16"), std::string::npos) << results[1].error;
    specs.erase(specs.begin() + 1);
    results.erase(results.begin() + 1);
    for (const SeqResult &r : results) EXPECT_EQ(r.info.state, MK_SEQ_DONE) << r.error;
    expect_all_match_whole(model.get(), cpu_options(), specs, results, "beside a sequence past its context");
}

TEST(PipelineSched, SubmitRefusesWhatCannotRun) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    Collector c;
    mk_sched_options o = sched_options(2, nullptr, MK_SEAM_LOCAL);
    o.range.max_batch_tokens = 8;
    SchedPtr s = make_sched(model.get(), o, &c);
    ASSERT_TRUE(s);
    const std::vector<int32_t> long_prompt(9, 1);
    uint64_t id = 0;
    EXPECT_EQ(mk_sched_submit(s.get(), long_prompt.data(), long_prompt.size(), 4, nullptr, 0, &id),
              MK_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mk_last_error()).find("max_batch_tokens"), std::string::npos) << mk_last_error();
    EXPECT_EQ(mk_sched_submit(s.get(), long_prompt.data(), 0, 4, nullptr, 0, &id), MK_ERR_EMPTY_INPUT);
    EXPECT_EQ(mk_sched_submit(s.get(), long_prompt.data(), 3, 0, nullptr, 0, &id), MK_ERR_INVALID_ARGUMENT);
    mk_seq_info info;
    EXPECT_EQ(mk_sched_poll(s.get(), 99, &info, nullptr, 0), MK_ERR_INVALID_ARGUMENT);
}

// A sequence longer than the KV cache fails with the context error; the others finish.
TEST(PipelineSched, ContextOverflowFailsThatSequenceOnly) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range_options ro = cpu_options();
    ro.max_context = 12;
    mk_sched_options o = sched_options(2, nullptr, MK_SEAM_LOCAL);
    o.range = ro;
    o.split_auto = true;
    o.n_workers = 2;
    Collector c;
    SchedPtr s = make_sched(model.get(), o, &c);
    ASSERT_TRUE(s);
    const std::vector<SeqSpec> specs = {{{3, 4, 5, 6, 7, 8, 9, 10}, 10, {}}, {{1, 2}, 4, {}}, {{11}, 3, {}}};
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    const std::vector<SeqResult> results = collect(s.get(), &c, ids);
    EXPECT_EQ(results[0].info.state, MK_SEQ_FAILED);
    EXPECT_EQ(results[0].info.status, MK_ERR_CONTEXT_OVERFLOW) << results[0].error;
    EXPECT_EQ(results[0].tokens.size(), 5u) << "8 prompt positions + 4 decodes fill 12; the 6th token overflows";
    const Decode ref = whole_reference(model.get(), ro, {{3, 4, 5, 6, 7, 8, 9, 10}, 5, {}});
    EXPECT_EQ(results[0].tokens, ref.tokens) << "tokens before the failure are kept";
    expect_all_match_whole(model.get(), ro, {specs[1], specs[2]}, {results[1], results[2]}, "others");
}

// A token limit from outside that wraps when multiplied by 4 bytes (2^62) or is as large as
// size_t goes is bounded by the context: a one-token prompt yields exactly max_context
// tokens (the buffer's last element) and then fails with the context error; nothing is
// written past the buffer (ASan in CI), the other sequence is untouched.
TEST(PipelineSched, HugeTokenLimitIsBoundedByTheContext) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_range_options ro = cpu_options();
    ro.max_context = 12;
    mk_sched_options o = sched_options(2, nullptr, MK_SEAM_LOCAL);
    o.range = ro;
    Collector c;
    SchedPtr s = make_sched(model.get(), o, &c);
    ASSERT_TRUE(s);
    const std::vector<SeqSpec> specs = {{{11}, (size_t)1 << 62, {}}, {{1, 2}, SIZE_MAX, {}}};
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    const std::vector<SeqResult> results = collect(s.get(), &c, ids);
    for (size_t i = 0; i < results.size(); i++) {
        EXPECT_EQ(results[i].info.status, MK_ERR_CONTEXT_OVERFLOW) << results[i].error;
        EXPECT_EQ(results[i].tokens.size(), 12 - specs[i].prompt.size() + 1) << "sequence " << i;
    }
    const Decode ref = whole_reference(model.get(), ro, {{11}, 12, {}});
    EXPECT_EQ(results[0].tokens, ref.tokens);
}

// ============================================================== faults ==

// One failed step (injected) on stage 1 fails exactly the sequence it belonged to. Over a
// socket the failing stage still consumed that step's frame: the stream stays in step and
// the survivors' boundaries are the right ones.
class PipelineSchedSeam : public ::testing::TestWithParam<mk_seam_kind> {};

TEST_P(PipelineSchedSeam, InjectedStepFailureFailsOneSequenceAndTheOthersMatch) {
    ModelPtr model = make_random_model(gqa_tied_hparams());
    const std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 7, 5);
    const std::vector<int64_t> cuts = {1, 3};
    Collector c;
    SchedPtr s = make_sched(model.get(), sched_options(4, &cuts, GetParam()), &c);
    ASSERT_TRUE(s);
    MK_ASSERT_OK(mk_sched_inject_fault(s.get(), 1, 6, false));
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    const std::vector<SeqResult> results = collect(s.get(), &c, ids);
    std::vector<SeqSpec> ok_specs;
    std::vector<SeqResult> ok_results;
    size_t failed = 0;
    for (size_t i = 0; i < results.size(); i++) {
        if (results[i].info.state == MK_SEQ_FAILED) {
            failed++;
            EXPECT_EQ(results[i].info.status, MK_ERR_INTERNAL);
            EXPECT_NE(results[i].error.find("worker 1 (layers 2-3): worker 1: injected failure at its step 6"),
                      std::string::npos)
                << results[i].error;
            const Decode ref = whole_reference(model.get(), cpu_options(), specs[i]);
            ASSERT_LT(results[i].tokens.size(), ref.tokens.size());
            EXPECT_TRUE(std::equal(results[i].tokens.begin(), results[i].tokens.end(), ref.tokens.begin()))
                << "tokens before the failure are the whole model's";
        } else {
            ok_specs.push_back(specs[i]);
            ok_results.push_back(results[i]);
        }
    }
    EXPECT_EQ(failed, 1u);
    expect_all_match_whole(model.get(), cpu_options(), ok_specs, ok_results, "survivors");
}

// Every sequence after the first failed with a status and an error naming `needle`, and
// the tokens it did emit are a prefix of the whole model's greedy decode (nothing wrong,
// nothing lost before the failure).
static void expect_failed_keeping_prefixes(const mk_model *model, const std::vector<SeqSpec> &specs,
                                           const std::vector<SeqResult> &results, const char *needle) {
    for (size_t i = 1; i < results.size(); i++) {
        EXPECT_EQ(results[i].info.state, MK_SEQ_FAILED) << "seq " << i;
        EXPECT_NE(results[i].info.status, MK_OK) << "seq " << i;
        EXPECT_NE(results[i].error.find(needle), std::string::npos) << results[i].error;
        const Decode ref = whole_reference(model, cpu_options(), specs[i]);
        ASSERT_LE(results[i].tokens.size(), ref.tokens.size());
        EXPECT_TRUE(std::equal(results[i].tokens.begin(), results[i].tokens.end(), ref.tokens.begin()));
    }
}

// Stage 1 dies mid-run (every step from its 4th on fails, as on a lost device): the
// sequences it holds fail with a clear status, nothing hangs, finished outputs stay intact,
// and later submissions fail the same way.
TEST_P(PipelineSchedSeam, StageThatDiesFailsItsSequencesWithoutHangingOrLosingFinishedOutputs) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<SeqSpec> specs = {{{5, 6, 7}, 1, {}},      // done after its prefill
                                        {{9, 1}, 30, {}},        // running when the stage dies
                                        {{2, 2, 4, 8}, 12, {}},  // queued until the first finishes
                                        {{13}, 6, {}}};
    const std::vector<int64_t> cuts = {2, 4};
    Collector c;
    SchedPtr s = make_sched(model.get(), sched_options(2, &cuts, GetParam()), &c);
    ASSERT_TRUE(s);
    MK_ASSERT_OK(mk_sched_inject_fault(s.get(), 1, 4, true));
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    const std::vector<SeqResult> results = collect(s.get(), &c, ids);
    expect_all_match_whole(model.get(), cpu_options(), {specs[0]}, {results[0]}, "finished before the fault");
    expect_failed_keeping_prefixes(model.get(), specs, results, "worker 1");
    for (size_t i = 1; i < results.size(); i++) EXPECT_EQ(results[i].info.status, MK_ERR_INTERNAL) << "seq " << i;
    const std::vector<uint64_t> late = submit_all(s.get(), {{{4, 4}, 3, {}}});
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    const std::vector<SeqResult> late_results = collect(s.get(), &c, late);
    EXPECT_EQ(late_results[0].info.state, MK_SEQ_FAILED);
    EXPECT_NE(late_results[0].error.find("worker 1 is down"), std::string::npos) << late_results[0].error;
}

// The receiving stage of seam 0 loses its connection mid-run (its ends close after 5
// boundaries, as when that stage's process dies): the sender's writes fail on the closed
// socket, the receiver reports its closed end, every sequence still in flight fails with a
// status and an error naming the stage, the sequence that finished first keeps its
// output, a later submission fails too, and nothing waits out a deadline.
TEST_P(PipelineSchedSeam, ConnectionLostMidRunFailsTheSequencesInFlightWithoutHanging) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<SeqSpec> specs = {{{5, 6, 7}, 1, {}}, {{9, 1}, 30, {}}, {{2, 2, 4, 8}, 12, {}},
                                        {{13}, 6, {}},     {{3, 1, 4}, 9, {}}};
    const std::vector<int64_t> cuts = {2};
    Collector c;
    SchedPtr s = make_sched(model.get(), sched_options(3, &cuts, GetParam()), &c);
    ASSERT_TRUE(s);
    MK_ASSERT_OK(mk_sched_inject_seam_cut(s.get(), 0, 5));
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 20));
    const std::vector<SeqResult> results = collect(s.get(), &c, ids);
    expect_all_match_whole(model.get(), cpu_options(), {specs[0]}, {results[0]}, "finished before the cut");
    expect_failed_keeping_prefixes(model.get(), specs, results, "worker ");
    const std::vector<uint64_t> late = submit_all(s.get(), {{{4, 4}, 3, {}}});
    ASSERT_TRUE(wait_all_within(s.get(), 20));
    EXPECT_EQ(collect(s.get(), &c, late)[0].info.state, MK_SEQ_FAILED);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "a failure waited out a deadline";
}

INSTANTIATE_TEST_SUITE_P(Transports, PipelineSchedSeam,
                         ::testing::Values(MK_SEAM_LOCAL, MK_SEAM_WIRE, MK_SEAM_UNIX, MK_SEAM_TCP),
                         [](const ::testing::TestParamInfo<mk_seam_kind> &p) {
                             return std::string(mk_seam_kind_name(p.param));
                         });

// Freeing with sequences in flight neither hangs nor leaks (ASan build).
TEST(PipelineSched, FreeWithSequencesInFlightReturns) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<int64_t> cuts = {0, 2, 4};
    for (mk_seam_kind seam : {MK_SEAM_LOCAL, MK_SEAM_WIRE, MK_SEAM_UNIX, MK_SEAM_TCP})
      for (size_t batch : {1, 3}) { // 3: the stop item reaches workers with items queued to batch
        Collector c;
        mk_sched_options o = sched_options(3, &cuts, seam);
        o.range.max_batch_sequences = batch;
        SchedPtr s = make_sched(model.get(), o, &c);
        ASSERT_TRUE(s);
        submit_all(s.get(), mixed_specs(model.get(), cpu_options(), 9, 2));
        auto freed = std::async(std::launch::async, [&s] { s.reset(); });
        ASSERT_EQ(freed.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "mk_sched_free hung";
    }
}

// ============================================================== SmolLM2 ==

// The real model with its weights kept native (GGUF blocks) as the CLI runs it, with an
// F32 and an F16 KV cache: every sequence through 2 stages over a unix seam is
// bit-identical to its whole-model run with the same options.
TEST(PipelineSchedSmolLM2, NativeWeightsEverySequenceMatchesWhole) {
    MK_REQUIRE_MODEL_FILE(mk_test_model_path());
    mk_model *raw = nullptr;
    ASSERT_EQ(mk_model_open_gguf(mk_test_model_path().c_str(), &raw), MK_OK)
        << mk_test_model_path() << " is present but does not open: " << mk_last_error();
    ModelPtr model(raw);
    const struct {
        mk_dtype kv;
        size_t batch, chunk;
    } cases[] = {{MK_DTYPE_F32, 1, 0}, {MK_DTYPE_F16, 1, 0}, {MK_DTYPE_F32, 3, 0}, {MK_DTYPE_F32, 3, 2}};
    for (const auto &cs : cases) {
        const mk_dtype kv = cs.kv;
        mk_range_options ro = cpu_options();
        ro.max_context = 24;
        ro.max_batch_tokens = 9;
        ro.backend.weight_dtype = MK_DTYPE_NATIVE;
        ro.backend.kv_dtype = kv;
        ro.backend.threads = 1;
        ro.max_batch_sequences = cs.batch; // 3: decode rows share the products (31 rows alone)
        const std::vector<SeqSpec> specs = mixed_specs(model.get(), ro, 5, 3, 3);
        mk_sched_options o = sched_options(3, nullptr, MK_SEAM_UNIX);
        o.range = ro;
        o.split_auto = true;
        o.n_workers = 2;
        o.prefill_chunk = cs.chunk; // 2: prompts of up to 9 tokens in chunks, against unchunked runs
        Collector c;
        SchedPtr s = make_sched(model.get(), o, &c);
        ASSERT_TRUE(s);
        const std::vector<uint64_t> ids = submit_all(s.get(), specs);
        ASSERT_TRUE(wait_all_within(s.get(), 300));
        mk_range_options alone = ro;
        alone.max_batch_sequences = 1;
        expect_all_match_whole(model.get(), alone, specs, collect(s.get(), &c, ids),
                               std::string("native, kv ") + mk_dtype_name(kv) + ", batch " + std::to_string(cs.batch) +
                                   ", prefill chunk " + std::to_string(cs.chunk));
        if (HasFatalFailure()) return;
    }
}

// ======================================================== chunked prefill ==

// Prompts through in chunks of 1, 2 or 3 rows (mk_sched_options.prefill_chunk), one step per
// chunk, alone or batched with the other sequences' steps, 2 stages: every sequence's tokens
// and logits equal its whole-model run with the prompt in one forward (each prompt row's
// products and attention are those it has in the whole prompt).
TEST(PipelineSched, ChunkedPrefillMatchesTheWholePromptRun) {
    for (const ModelCase &mc : model_cases()) {
        ModelPtr model = make_random_model(mc.hp);
        const std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 7, 11);
        for (size_t chunk : {1, 2, 3})
        for (size_t batch : {1, 4}) {
            const std::vector<int64_t> two = {2};
            mk_sched_options o = sched_options(4, &two, MK_SEAM_WIRE);
            o.range.max_batch_sequences = batch;
            o.prefill_chunk = chunk;
            Collector c;
            SchedPtr s = make_sched(model.get(), o, &c);
            ASSERT_TRUE(s);
            const std::vector<uint64_t> ids = submit_all(s.get(), specs);
            ASSERT_TRUE(wait_all_within(s.get(), 120));
            expect_all_match_whole(model.get(), cpu_options(), specs, collect(s.get(), &c, ids),
                                   std::string(mc.name) + " chunk " + std::to_string(chunk) + " batch " +
                                       std::to_string(batch));
            if (HasFatalFailure()) return;
        }
    }
}

// A long prompt does not hold the others' decoding for its whole prefill: in chunks of 2 its
// steps take at most 2 rows, and the sequence decoding beside it gets a step between each
// two of its chunks (the next chunk queues behind the steps already waiting).
TEST(PipelineSched, ALongPromptGoesInChunksBetweenTheOthersDecodeSteps) {
    // native Q8_0 weights: every prompt row's products are its own (the dot kernels), so the
    // chunked prompt's logits are the whole prompt's bit for bit at any length (F32 SGEMM
    // gives a 21-row product other roundings than 2-row ones: tolerance there, not bits)
    mk_native_gguf::TempModel tm([](const std::string &) { return (uint32_t)MK_GGML_TYPE_Q8_0; }, true);
    ASSERT_TRUE(tm.model);
    const mk_model *model = tm.model.get();
    mk_sched_options o = sched_options(2, nullptr, MK_SEAM_LOCAL);
    o.range.backend.weight_dtype = MK_DTYPE_NATIVE;
    o.range.backend.threads = 1;
    o.range.max_batch_sequences = 2;
    o.prefill_chunk = 2;
    o.timeline_capacity = 512;
    Collector c;
    // The decoding sequence is held at its first token until the long prompt is in: on a
    // loaded machine the submitting thread can otherwise lose the CPU between the two
    // submissions for as long as the first sequence needs to finish alone.
    c.hold_at = 1;
    SchedPtr s = make_sched(model, o, &c);
    ASSERT_TRUE(s);
    std::vector<SeqSpec> specs(2);
    specs[0].prompt = {3, 1};
    specs[0].max_new = 30;
    for (int32_t t = 0; t < 21; t++) specs[1].prompt.push_back((t * 7 + 2) % 40);
    specs[1].max_new = 3;
    std::vector<uint64_t> ids = submit_all(s.get(), {specs[0]});
    ASSERT_EQ(c.wait_held(), ids[0]);
    ids.push_back(submit_all(s.get(), {specs[1]})[0]);
    c.release();
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    mk_range_options alone = o.range;
    alone.max_batch_sequences = 1;
    expect_all_match_whole(model, alone, specs, collect(s.get(), &c, ids), "long prompt");
    char *json = nullptr;
    size_t len = 0;
    MK_ASSERT_OK(mk_sched_timeline_json(s.get(), &json, &len));
    const std::string text(json, len);
    mk_buffer_free(json);
    // the long prompt's steps in order: rows and start; the other's step starts
    std::vector<std::pair<unsigned, double>> longs;
    std::vector<double> others;
    for (size_t p = text.find("{\"worker\":"); p != std::string::npos; p = text.find("{\"worker\":", p + 1)) {
        unsigned worker = 0, rows = 0;
        unsigned long long seq = 0;
        double start = 0, end = 0;
        ASSERT_EQ(sscanf(text.c_str() + p, "{\"worker\":%u,\"seq\":%llu,\"rows\":%u,\"start_us\":%lf,\"end_us\":%lf", &worker,
                         &seq, &rows, &start, &end), 5);
        if (seq == ids[1]) longs.push_back({rows, start});
        if (seq == ids[0]) others.push_back(start);
    }
    std::vector<unsigned> rows;
    for (const auto &l : longs) rows.push_back(l.first);
    const std::vector<unsigned> want = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1}; // 21 prompt rows, then 2 decode rows
    EXPECT_EQ(rows, want);
    ASSERT_EQ(longs.size(), want.size());
    const double first = longs[0].second, last_chunk = longs[10].second;
    size_t beside = 0;
    for (double t : others) beside += t > first && t <= last_chunk;
    EXPECT_GE(beside, 10u) << "the decoding sequence's steps during the long prompt's 11 chunks; timeline: " << text;
}

// ============================================================== options ==

TEST(PipelineSched, OptionsAreChecked) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_sched *s = nullptr;
    mk_sched_options o = mk_sched_options_default();
    EXPECT_EQ(o.struct_size, sizeof(mk_sched_options));
    o.struct_size = 0;
    EXPECT_EQ(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mk_last_error()).find("mk_sched_options_default"), std::string::npos);
    o = mk_sched_options_default();
    const int devices[3] = {0, 1, 2};
    o.split_auto = true;
    o.n_workers = 2;
    o.devices = devices;
    o.n_devices = 3;
    EXPECT_EQ(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_ARGUMENT);
    o = mk_sched_options_default();
    const int64_t bad_cuts[2] = {3, 2};
    o.cuts = bad_cuts;
    o.n_cuts = 2;
    EXPECT_EQ(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_RANGE);
    o = mk_sched_options_default();
    o.split_auto = true;
    o.n_workers = 7; // 6 layers
    EXPECT_EQ(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_RANGE);
    o = mk_sched_options_default();
    o.max_sequences = 0;
    EXPECT_EQ(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
}

// ============================================================= timeline ==

// The statistics and the timeline count one record per step and stage; the JSON names
// every stage and sequence.
TEST(PipelineSched, TimelineHasOneRecordPerStepAndStage) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    mk_sched_options o = sched_options(4, nullptr, MK_SEAM_LOCAL);
    o.split_auto = true;
    o.n_workers = 2;
    o.timeline_capacity = 256;
    Collector c;
    SchedPtr s = make_sched(model.get(), o, &c);
    ASSERT_TRUE(s);
    const std::vector<SeqSpec> specs = mixed_specs(model.get(), cpu_options(), 6, 9);
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    size_t steps = 0;
    for (const SeqResult &r : collect(s.get(), &c, ids)) steps += r.tokens.size();
    double share_sum = 0;
    for (size_t i = 0; i < 2; i++) {
        mk_worker_stats st;
        MK_ASSERT_OK(mk_sched_worker_stats(s.get(), i, &st));
        EXPECT_EQ(st.steps, steps) << "stage " << i;
        EXPECT_GT(st.busy_ns, 0u);
        EXPECT_GT(st.cpu_ns, 0u);
        EXPECT_LE(st.busy_ns, st.last_ns - st.first_ns);
        share_sum += mk_sched_worker_share(s.get(), i);
    }
    EXPECT_NEAR(share_sum, 1.0, 1e-12);
    char *json = nullptr;
    size_t len = 0;
    MK_ASSERT_OK(mk_sched_timeline_json(s.get(), &json, &len));
    const std::string text(json, len);
    mk_buffer_free(json);
    size_t records = 0;
    for (size_t p = text.find("{\"worker\":"); p != std::string::npos; p = text.find("{\"worker\":", p + 1)) records++;
    EXPECT_EQ(records, 2 * steps);
    EXPECT_NE(text.find("\"worker\":1,\"seq\":6,"), std::string::npos);
    // times count from the earliest step's start: one step starts at 0, none before, and the
    // whole run (well under a minute) ends within a minute of it
    EXPECT_NE(text.find("\"start_us\":0.000,"), std::string::npos) << text.substr(0, 300);
    for (size_t p = text.find("\"end_us\":"); p != std::string::npos; p = text.find("\"end_us\":", p + 1)) {
        const double end_us = atof(text.c_str() + p + 9);
        EXPECT_GE(end_us, 0.0);
        EXPECT_LT(end_us, 60e6);
    }
    MK_ASSERT_OK(mk_sched_reset_stats(s.get()));
    mk_worker_stats st;
    MK_ASSERT_OK(mk_sched_worker_stats(s.get(), 0, &st));
    EXPECT_EQ(st.steps, 0u);
    // the timeline is reset with the statistics: no record of the run before
    MK_ASSERT_OK(mk_sched_timeline_json(s.get(), &json, &len));
    const std::string after(json, len);
    mk_buffer_free(json);
    EXPECT_EQ(after.find("{\"worker\":"), std::string::npos) << after.substr(0, 300);
}

// Every refusal of mk_sched_create and of the calls on a pipeline, each with its own input
// and message, next to the edge value that is accepted.
TEST(PipelineSched, RefusalsNameTheirCause) {
    ModelPtr model = make_random_model(mk_hparams_seed_default()); // 6 layers
    mk_sched *s = nullptr;
    mk_sched_options o = mk_sched_options_default();
    o.struct_size = offsetof(mk_sched_options, seam) - 1;
    EXPECT_ERROR(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_ARGUMENT,
                 ("mk_sched_options.struct_size " + std::to_string(offsetof(mk_sched_options, seam) - 1) +
                  " is not a version this meshkern knows").c_str());
    o.struct_size = offsetof(mk_sched_options, seam); // an older header: the later fields default
    MK_ASSERT_OK(mk_sched_create(model.get(), &o, &s));
    mk_sched_free(s);
    s = nullptr;
    const int64_t last[1] = {5}, below_last[1] = {4}, negative[1] = {-1}, equal[2] = {2, 2};
    for (const int64_t *cuts : {last, negative}) {
        o = mk_sched_options_default();
        o.cuts = cuts;
        o.n_cuts = 1;
        EXPECT_ERROR(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_RANGE,
                     ("cut 0 is layer " + std::to_string(cuts[0]) + ", out of range").c_str());
    }
    o.cuts = equal;
    o.n_cuts = 2;
    EXPECT_ERROR(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_RANGE, "cut 1 repeats layer 2: range 1 would be empty");
    o.cuts = nullptr;
    o.n_cuts = 1;
    EXPECT_ERROR(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_ARGUMENT, "n_cuts set but cuts is NULL");
    o.cuts = below_last;
    MK_ASSERT_OK(mk_sched_create(model.get(), &o, &s));
    EXPECT_EQ(mk_sched_worker_count(s), 2u);
    mk_sched_free(s);
    s = nullptr;
    o = mk_sched_options_default();
    o.split_auto = true;
    o.n_workers = 7;
    EXPECT_ERROR(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_RANGE, "a pipeline of 7 workers over 6 layers");
    o.n_workers = 6;
    MK_ASSERT_OK(mk_sched_create(model.get(), &o, &s));
    EXPECT_EQ(mk_sched_worker_count(s), 6u);
    mk_sched_free(s);
    s = nullptr;
    const int devices[3] = {0, 1, 2};
    o.n_workers = 2;
    o.devices = devices;
    o.n_devices = 3;
    EXPECT_ERROR(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_ARGUMENT, "3 devices for 2 workers");
    o.devices = nullptr;
    o.n_devices = 2;
    EXPECT_ERROR(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_ARGUMENT, "n_devices set but devices is NULL");
    o = mk_sched_options_default();
    o.max_sequences = 0;
    EXPECT_ERROR(mk_sched_create(model.get(), &o, &s), MK_ERR_INVALID_ARGUMENT, "max_sequences must be at least 1");
    EXPECT_ERROR(mk_sched_create(nullptr, &o, &s), MK_ERR_INVALID_ARGUMENT, "mk_sched_create: NULL argument");
    EXPECT_EQ(s, nullptr);

    // on a pipeline of 2 stages taking prompts of up to 8 tokens
    Collector c;
    mk_sched_options so = sched_options(1, nullptr, MK_SEAM_LOCAL);
    so.split_auto = true;
    so.n_workers = 2;
    so.range.max_batch_tokens = 8;
    SchedPtr p = make_sched(model.get(), so, &c);
    ASSERT_TRUE(p);
    const std::vector<int32_t> prompt(9, 1);
    uint64_t id = 0;
    EXPECT_ERROR(mk_sched_submit(p.get(), prompt.data(), 9, 2, nullptr, 0, &id), MK_ERR_INVALID_ARGUMENT,
                 "prompt of 9 tokens exceeds the pipeline's max_batch_tokens 8");
    EXPECT_ERROR(mk_sched_submit(p.get(), prompt.data(), 0, 2, nullptr, 0, &id), MK_ERR_EMPTY_INPUT,
                 "at least one prompt token");
    EXPECT_ERROR(mk_sched_submit(p.get(), prompt.data(), 3, 0, nullptr, 0, &id), MK_ERR_INVALID_ARGUMENT,
                 "allowed at least one token");
    EXPECT_ERROR(mk_sched_submit(p.get(), prompt.data(), 3, 2, nullptr, 1, &id), MK_ERR_INVALID_ARGUMENT,
                 "mk_sched_submit: NULL argument");
    MK_ASSERT_OK(mk_sched_submit(p.get(), prompt.data(), 8, 2, nullptr, 0, &id));
    EXPECT_EQ(id, 1u) << "refused submissions took no id";
    ASSERT_TRUE(wait_all_within(p.get(), 60));
    mk_seq_info info;
    MK_ASSERT_OK(mk_sched_poll(p.get(), 1, &info, nullptr, 0));
    EXPECT_EQ(info.state, MK_SEQ_DONE);
    EXPECT_EQ(info.n_tokens, 2u);
    EXPECT_ERROR(mk_sched_poll(p.get(), 0, &info, nullptr, 0), MK_ERR_INVALID_ARGUMENT, "no sequence 0 in this pipeline");
    EXPECT_ERROR(mk_sched_poll(p.get(), 2, &info, nullptr, 0), MK_ERR_INVALID_ARGUMENT, "no sequence 2 in this pipeline");
    EXPECT_ERROR(mk_sched_wait(p.get(), 2), MK_ERR_INVALID_ARGUMENT, "no sequence 2 in this pipeline");
    MK_ASSERT_OK(mk_sched_wait(p.get(), 1));
    mk_worker_stats st;
    MK_ASSERT_OK(mk_sched_worker_stats(p.get(), 1, &st));
    EXPECT_ERROR(mk_sched_worker_stats(p.get(), 2, &st), MK_ERR_INVALID_ARGUMENT, "no worker 2");
    EXPECT_ERROR(mk_sched_inject_fault(p.get(), 2, 0, false), MK_ERR_INVALID_ARGUMENT, "inject fault: no worker 2");
    EXPECT_ERROR(mk_sched_inject_seam_cut(p.get(), 1, 0), MK_ERR_INVALID_ARGUMENT, "inject seam cut: no seam 1");
    EXPECT_EQ(mk_sched_worker_share(p.get(), 2), 0.0);
    EXPECT_EQ(mk_sched_worker_range(p.get(), 2), nullptr);
    EXPECT_EQ(mk_sched_seam_kind(p.get(), 1), (mk_seam_kind)0);
    EXPECT_EQ(mk_sched_seam_kind(p.get(), 0), MK_SEAM_LOCAL);
}

// A sequence stops at any of its stop ids, the last of the list included, with that token
// kept; its limit stops it at exactly max_new tokens otherwise.
TEST(PipelineSched, EveryStopIdStopsTheSequence) {
    ModelPtr model = make_random_model(mk_hparams_seed_default());
    const std::vector<int32_t> prompt = {4, 9, 1, 30};
    const Decode whole = decode_greedy(model.get(), {}, cpu_options(), prompt, 6);
    ASSERT_EQ(whole.tokens.size(), 6u);
    size_t k = 1; // the first token not seen before: stopping there is visible
    while (k < 6 && std::find(whole.tokens.begin(), whole.tokens.begin() + (long)k, whole.tokens[k]) !=
                        whole.tokens.begin() + (long)k)
        k++;
    ASSERT_LT(k, 6u);
    const int32_t vocab = (int32_t)mk_model_hparams(model.get())->vocab;
    const std::vector<SeqSpec> specs = {
        {prompt, 6, {vocab + 1, vocab + 2, whole.tokens[k]}}, // the last of three
        {prompt, 6, {whole.tokens[k]}},                       // the only one
        {prompt, 6, {vocab + 1}},                             // never emitted: the limit
        {prompt, k, {}},                                      // exactly k tokens
    };
    Collector c;
    mk_sched_options o = sched_options(2, nullptr, MK_SEAM_LOCAL);
    o.split_auto = true;
    o.n_workers = 2;
    SchedPtr s = make_sched(model.get(), o, &c);
    ASSERT_TRUE(s);
    const std::vector<uint64_t> ids = submit_all(s.get(), specs);
    ASSERT_TRUE(wait_all_within(s.get(), 60));
    const std::vector<SeqResult> r = collect(s.get(), &c, ids);
    for (size_t i = 0; i < 2; i++) {
        EXPECT_TRUE(r[i].info.stopped) << i;
        EXPECT_EQ(r[i].tokens, std::vector<int32_t>(whole.tokens.begin(), whole.tokens.begin() + (long)k + 1)) << i;
    }
    EXPECT_FALSE(r[2].info.stopped);
    EXPECT_EQ(r[2].tokens, whole.tokens);
    EXPECT_FALSE(r[3].info.stopped);
    EXPECT_EQ(r[3].tokens.size(), k);
}

} // namespace
