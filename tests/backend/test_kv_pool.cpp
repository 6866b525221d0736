// The paged KV cache (host/range/kv_pool.c): one pool of blocks per range, shared by its
// sequences through block tables. On the cpu backend and the cuda backend under cudasim:
// results never depend on where a sequence's blocks sit (block size, tables out of order);
// a forward that cannot get a block fails by name with nothing run and nothing taken; a
// reservation is never handed to another sequence; every block comes back (the pool's
// accounting is checked after each test); bad pool options are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "meshkern.h"
#include "mk_test_util.h"
#include "range/range.h"

namespace {

mk_range_options pool_options(mk_backend_kind kind, size_t block, size_t blocks, size_t context = 64) {
    mk_range_options o = mk_range_options_default();
    o.backend.kind = kind;
    o.max_context = context;
    o.max_batch_sequences = 4;
    o.kv_block_size = block;
    o.kv_pool_blocks = blocks;
    return o;
}

mk_kv_pool_info pool_of(const mk_range *r) {
    mk_kv_pool_info info{};
    EXPECT_EQ(mk_range_kv_pool(r, &info), MK_OK);
    return info;
}

struct Step {
    std::vector<float> logits;
    int32_t token;
};

// One forward of `ids` on `seq` through a whole-model range: its logits and token.
Step forward(mk_range *r, mk_sequence *seq, const std::vector<int32_t> &ids, mk_status want = MK_OK) {
    Step s{{}, -1};
    mk_tail_output *t = nullptr;
    const mk_status got = mk_range_forward(r, seq, ids.data(), ids.size(), nullptr, nullptr, nullptr, &t);
    EXPECT_EQ(got, want) << mk_last_error();
    if (t) {
        s.logits.assign(t->logits, t->logits + t->vocab);
        s.token = t->token_ids[0];
        mk_tail_output_free(t);
    }
    return s;
}

class KvPool : public ::testing::TestWithParam<mk_backend_kind> {
protected:
    void SetUp() override { model_ = make_random_model(gqa_tied_hparams()); }
    mk_range *make(const mk_range_options &o) {
        mk_range *r = nullptr;
        EXPECT_EQ(mk_range_create(model_.get(), 0, 4, &o, &r), MK_OK) << mk_last_error();
        ranges_.emplace_back(r);
        return r;
    }
    mk_sequence *open(mk_range *r) {
        mk_sequence *s = nullptr;
        EXPECT_EQ(mk_sequence_open(r, &s), MK_OK) << mk_last_error();
        return s;
    }
    ModelPtr model_;
    std::vector<RangePtr> ranges_;
};

// The same prompt and decode through blocks of 4, 16, 64 and 256 positions (one block), with another
// sequence growing in between (so the first one's table goes out of order): the logits of
// every step memcmp-equal whatever the layout.
TEST_P(KvPool, ResultsDoNotDependOnWhereTheBlocksSit) {
    std::mt19937 rng(7);
    std::vector<int32_t> prompt(23), other(9);
    for (auto &t : prompt) t = (int32_t)(rng() % 53);
    for (auto &t : other) t = (int32_t)(rng() % 53);
    std::vector<std::vector<float>> reference;
    for (size_t block : {4u, 16u, 64u, 256u}) {
        SCOPED_TRACE("block " + std::to_string(block));
        mk_range *r = make(pool_options(GetParam(), block, 0, 256));
        SequencePtr a(open(r)), b(open(r));
        std::vector<std::vector<float>> got;
        // a's prompt in three chunks, b growing between them: a's blocks interleave with b's
        const std::vector<int32_t> c0(prompt.begin(), prompt.begin() + 5), c1(prompt.begin() + 5, prompt.begin() + 14),
            c2(prompt.begin() + 14, prompt.end());
        got.push_back(forward(r, a.get(), c0).logits);
        forward(r, b.get(), other);
        got.push_back(forward(r, a.get(), c1).logits);
        forward(r, b.get(), other);
        Step s = forward(r, a.get(), c2);
        got.push_back(s.logits);
        for (int i = 0; i < 12; i++) {
            s = forward(r, a.get(), {s.token});
            got.push_back(s.logits);
            if (i % 3 == 0) forward(r, b.get(), {(int32_t)i});
        }
        if (reference.empty()) reference = got;
        ASSERT_EQ(got.size(), reference.size());
        for (size_t i = 0; i < got.size(); i++)
            EXPECT_EQ(std::memcmp(got[i].data(), reference[i].data(), got[i].size() * sizeof(float)), 0)
                << "forward " << i << " differs from the blocks of 4";
        a.reset();
        b.reset();
        const mk_kv_pool_info info = pool_of(r);
        EXPECT_EQ(info.block_size, block);
        EXPECT_EQ(info.free_blocks, info.blocks) << "blocks leaked";
    }
}

// A forward the pool cannot serve: MK_ERR_KV_POOL_FULL, the sequence where it was, no block
// taken; the others carry on; the blocks come back at close.
TEST_P(KvPool, FullPoolRefusesByNameAndRunsNothing) {
    mk_range *r = make(pool_options(GetParam(), 4, 3)); // 12 positions in all
    SequencePtr a(open(r)), b(open(r));
    forward(r, a.get(), {1, 2, 3, 4, 5, 6, 7, 8}); // two blocks
    EXPECT_EQ(pool_of(r).free_blocks, 1u);
    forward(r, b.get(), {9, 10, 11, 12, 13}, MK_ERR_KV_POOL_FULL); // needs two
    EXPECT_NE(std::string(mk_last_error()).find("KV pool full"), std::string::npos) << mk_last_error();
    EXPECT_EQ(mk_sequence_length(b.get()), 0u);
    EXPECT_EQ(pool_of(r).free_blocks, 1u) << "a refused forward took a block";
    forward(r, b.get(), {9, 10, 11, 12}); // one block: fits
    forward(r, a.get(), {14}, MK_ERR_KV_POOL_FULL); // a's third block: none left
    EXPECT_EQ(mk_sequence_length(a.get()), 8u);
    b.reset(); // b's block back: a goes on
    forward(r, a.get(), {14});
    EXPECT_EQ(mk_sequence_length(a.get()), 9u);
    MK_ASSERT_OK(mk_sequence_reset(a.get()));
    EXPECT_EQ(pool_of(r).free_blocks, 3u);
}

// Whether the pool could ever hold a sequence (mk_range_kv_fits, the admission rules'
// refusal): up to its blocks' positions, and any count past max_context counts as
// max_context (a sequence never holds more); one block short is refused by name.
TEST_P(KvPool, ASequenceFitsUpToThePoolCappedAtTheContext) {
    mk_range *whole = make(pool_options(GetParam(), 16, 4, 64)); // one full context
    MK_ASSERT_OK(mk_range_kv_fits(whole, 64));
    MK_ASSERT_OK(mk_range_kv_fits(whole, 1000)); // positions past the context count as the context
    {
        SequencePtr s(open(whole)); // and a reservation of them promises one context's blocks
        MK_ASSERT_OK(mk_sequence_reserve(s.get(), 1000));
        EXPECT_EQ(pool_of(whole).promised_blocks, 4u);
    }
    mk_range *short_one = make(pool_options(GetParam(), 16, 3, 64)); // a block short
    MK_ASSERT_OK(mk_range_kv_fits(short_one, 48));
    EXPECT_ERROR(mk_range_kv_fits(short_one, 49), MK_ERR_KV_POOL_FULL,
                 "a sequence of up to 49 positions needs 4 KV blocks; the pool holds 3 of 16");
    EXPECT_ERROR(mk_range_kv_fits(short_one, 1000), MK_ERR_KV_POOL_FULL, "up to 64 positions needs 4 KV blocks");
}

// A reservation sets blocks aside: another sequence cannot take them, the reserving one
// always can, and reset drops the promise.
TEST_P(KvPool, ReservedBlocksAreNeverGivenToAnother) {
    mk_range *r = make(pool_options(GetParam(), 4, 4)); // 16 positions
    SequencePtr a(open(r)), b(open(r)), c(open(r));
    MK_ASSERT_OK(mk_sequence_reserve(a.get(), 12)); // three blocks promised
    mk_kv_pool_info info = pool_of(r);
    EXPECT_EQ(info.promised_blocks, 3u);
    EXPECT_EQ(info.free_blocks, 4u);
    MK_ASSERT_OK(mk_sequence_reserve(a.get(), 12)); // the same again: what it was promised covers it
    MK_ASSERT_OK(mk_sequence_reserve(a.get(), 9));
    EXPECT_EQ(pool_of(r).promised_blocks, 3u) << "a repeated reservation promised its blocks twice";
    EXPECT_EQ(mk_sequence_reserve(c.get(), 8), MK_ERR_KV_POOL_FULL); // one unpromised block left
    EXPECT_EQ(pool_of(r).promised_blocks, 3u) << "a refused reservation set blocks aside";
    forward(r, b.get(), {1, 2, 3, 4, 5}, MK_ERR_KV_POOL_FULL);
    forward(r, b.get(), {1, 2, 3, 4});
    for (int i = 0; i < 12; i++) forward(r, a.get(), {(int32_t)(i + 1)}); // every promised block there
    info = pool_of(r);
    EXPECT_EQ(info.free_blocks, 0u);
    EXPECT_EQ(info.promised_blocks, 0u);
    EXPECT_EQ(mk_sequence_reserve(a.get(), 8), MK_OK) << "asking for less than held is no new promise";
    MK_ASSERT_OK(mk_sequence_reset(a.get()));
    MK_ASSERT_OK(mk_sequence_reserve(a.get(), 7)); // two blocks promised ...
    EXPECT_EQ(pool_of(r).promised_blocks, 2u);
    MK_ASSERT_OK(mk_sequence_reset(a.get())); // ... and dropped by reset
    EXPECT_EQ(pool_of(r).promised_blocks, 0u);
    a.reset();
    b.reset();
    c.reset();
    info = pool_of(r);
    EXPECT_EQ(info.free_blocks, info.blocks);
}

// A batch whose second entry cannot get a block: refused naming the entry, no sequence
// advanced.
TEST_P(KvPool, BatchEntryWithoutABlockFailsByName) {
    mk_range *r = make(pool_options(GetParam(), 4, 2));
    SequencePtr a(open(r)), b(open(r));
    const int32_t ids_a[3] = {1, 2, 3}, ids_b[6] = {4, 5, 6, 7, 8, 9};
    const size_t vocab = mk_model_hparams(model_.get())->vocab;
    std::vector<float> la(vocab), lb(vocab);
    int32_t ta = -1, tb = -1;
    mk_forward_entry e[2] = {};
    e[0].seq = a.get(), e[0].token_ids = ids_a, e[0].n_tokens = 3, e[0].logits = la.data(), e[0].token = &ta;
    e[1].seq = b.get(), e[1].token_ids = ids_b, e[1].n_tokens = 6, e[1].logits = lb.data(), e[1].token = &tb;
    EXPECT_ERROR(mk_range_forward_batch(r, e, 2), MK_ERR_KV_POOL_FULL, "batch entry 1");
    EXPECT_EQ(mk_sequence_length(a.get()), 0u);
    EXPECT_EQ(mk_sequence_length(b.get()), 0u);
    EXPECT_EQ(pool_of(r).free_blocks, 2u) << "the block entry 0 took stayed taken";
    // the same with entry 0's block promised: the promise stands again after the refusal
    MK_ASSERT_OK(mk_sequence_reserve(a.get(), 4));
    EXPECT_ERROR(mk_range_forward_batch(r, e, 2), MK_ERR_KV_POOL_FULL, "batch entry 1");
    EXPECT_EQ(pool_of(r).free_blocks, 2u);
    EXPECT_EQ(pool_of(r).promised_blocks, 1u);
    e[1].n_tokens = 4;
    EXPECT_EQ(mk_range_forward_batch(r, e, 2), MK_OK) << mk_last_error();
    EXPECT_EQ(mk_sequence_length(b.get()), 4u);
    a.reset();
    b.reset();
    EXPECT_EQ(pool_of(r).free_blocks, 2u);
}

TEST_P(KvPool, BadPoolOptionsAreRefused) {
    mk_range *r = nullptr;
    for (size_t block : {3u, 2u, 2048u}) {
        mk_range_options o = pool_options(GetParam(), block, 0);
        EXPECT_ERROR(mk_range_create(model_.get(), 0, 4, &o, &r), MK_ERR_INVALID_ARGUMENT, "kv_block_size");
        EXPECT_EQ(r, nullptr);
    }
    mk_range_options o = pool_options(GetParam(), 16, 0);
    o.kv_pool_bytes = 5; // less than a block
    EXPECT_ERROR(mk_range_create(model_.get(), 0, 4, &o, &r), MK_ERR_INVALID_ARGUMENT, "less than one block");
    // in bytes: whole blocks; the default: four sequences of the full context
    mk_range *d = make(pool_options(GetParam(), 16, 0));
    const mk_kv_pool_info def = pool_of(d);
    EXPECT_EQ(def.blocks, 4u * (64 / 16));
    o.kv_pool_bytes = 3 * def.block_bytes + def.block_bytes / 2;
    mk_range *sized = make(o);
    EXPECT_EQ(pool_of(sized).blocks, 3u);
    // blocks win over bytes
    o.kv_pool_blocks = 5;
    EXPECT_EQ(pool_of(make(o)).blocks, 5u);
    // the default holds as many full contexts as a step carries sequences, when that is more
    mk_range_options six = pool_options(GetParam(), 16, 0);
    six.max_batch_sequences = 6;
    EXPECT_EQ(pool_of(make(six)).blocks, 6u * (64 / 16));
}

// The default context of a range is the model's, at most 4096 positions (a model of 8192 would
// otherwise reserve twice the memory nobody asked for); a context asked for is the one given.
TEST_P(KvPool, TheDefaultContextIsTheModelsCappedAt4096) {
    mk_hparams hp = gqa_tied_hparams();
    hp.max_context = 8192;
    ModelPtr big = make_random_model(hp);
    for (const size_t asked : {size_t{0}, size_t{8192}}) {
        mk_range_options o = pool_options(GetParam(), 64, 0, asked);
        mk_range *r = nullptr;
        ASSERT_EQ(mk_range_create(big.get(), 0, 4, &o, &r), MK_OK) << mk_last_error();
        RangePtr owned(r);
        EXPECT_EQ(mk_range_max_context(r), asked ? asked : 4096u);
        EXPECT_EQ(pool_of(r).blocks, 4u * (asked ? asked : 4096u) / 64);
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, KvPool, ::testing::Values(MK_BACKEND_CPU, MK_BACKEND_CUDA),
                         [](const ::testing::TestParamInfo<mk_backend_kind> &i) {
                             return std::string(i.param == MK_BACKEND_CPU ? "cpu" : "cuda_sim");
                         });

} // namespace
