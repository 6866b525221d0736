// Text end to end on the embedded SmolLM2-135M-Instruct: the chat template, the
// generation loop's stop at end of turn or at the token budget, whole vs split text
// (bit-identical logits at every step), a prompt longer than the context, and a second
// chat turn that continues the KV cache instead of starting over.
#include <gtest/gtest.h>

#include <chrono>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "mk_test_util.h"
#include "mk_vocab_gguf.h"

namespace {

const std::string kModelPath = std::string(MK_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct TokDeleter { void operator()(mk_tokenizer *t) const { mk_tokenizer_free(t); } };
struct PipeDeleter { void operator()(mk_pipeline *p) const { mk_pipeline_free(p); } };
using TokPtr = std::unique_ptr<mk_tokenizer, TokDeleter>;
using PipePtr = std::unique_ptr<mk_pipeline, PipeDeleter>;

struct Generated {
    std::vector<int32_t> tokens;
    std::vector<float> logits; // [tokens, vocab]
    mk_generate_stats stats{};
    mk_status status = MK_OK;
};

mk_status collect(void *user, int32_t token, const float *logits, size_t vocab) {
    auto *g = static_cast<Generated *>(user);
    g->tokens.push_back(token);
    g->logits.insert(g->logits.end(), logits, logits + vocab);
    return MK_OK;
}

class Generate : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        mk_model *m = nullptr;
        if (mk_model_open_gguf(kModelPath.c_str(), &m) != MK_OK) return;
        model_.reset(m);
        mk_tokenizer *t = nullptr;
        if (mk_tokenizer_open(m, &t) == MK_OK) tok_.reset(t);
    }
    static void TearDownTestSuite() {
        tok_.reset();
        model_.reset();
    }
    void SetUp() override {
        if (!model_) GTEST_SKIP() << "default model not available; run scripts/fetch_model.sh";
        ASSERT_TRUE(tok_) << mk_last_error();
    }
    static std::vector<int32_t> chat_ids(const std::vector<mk_chat_message> &msgs) {
        char *text = nullptr;
        size_t len = 0;
        EXPECT_EQ(mk_chat_apply(tok_.get(), msgs.data(), msgs.size(), true, &text, &len), MK_OK) << mk_last_error();
        int32_t *ids = nullptr;
        size_t n = 0;
        EXPECT_EQ(mk_tokenizer_encode(tok_.get(), text, len, MK_TOKENIZE_PARSE_SPECIAL, &ids, &n), MK_OK);
        std::vector<int32_t> v(ids, ids + n);
        mk_buffer_free(ids);
        mk_buffer_free(text);
        return v;
    }
    static PipePtr pipeline(const std::vector<int64_t> &cuts, size_t context) {
        mk_range_options o = mk_range_options_default();
        o.max_context = context;
        mk_pipeline *p = nullptr;
        const mk_seam_options wire = mk_seam_options_default(MK_SEAM_WIRE);
        const mk_pipeline_options po = pipeline_options(cuts.data(), cuts.size(), &o, &wire);
        EXPECT_EQ(mk_pipeline_create(model_.get(), &po, &p), MK_OK) << mk_last_error();
        return PipePtr(p);
    }
    static Generated generate(mk_pipeline *p, const std::vector<int32_t> &prompt, size_t max_new) {
        Generated g;
        g.status = mk_pipeline_generate(p, tok_.get(), prompt.data(), prompt.size(), max_new, collect, &g, &g.stats);
        return g;
    }
    static std::string text_of(const std::vector<int32_t> &ids) {
        char *text = nullptr;
        size_t len = 0;
        EXPECT_EQ(mk_tokenizer_decode(tok_.get(), ids.data(), ids.size(), 0, &text, &len), MK_OK);
        std::string s(text, len);
        mk_buffer_free(text);
        return s;
    }
    static ModelPtr model_;
    static TokPtr tok_;
};
ModelPtr Generate::model_;
TokPtr Generate::tok_;

TEST_F(Generate, SplitYieldsExactlyTheWholeModelTextAndStopsAtImEnd) {
    const std::vector<int32_t> prompt = chat_ids({{"user", "What is the capital of France?"}});
    ASSERT_EQ(prompt.size(), 37u); // SmolLM2's default system turn + the question + assistant header
    PipePtr whole_p = pipeline({}, 128), split_p = pipeline({14}, 128);
    const Generated whole = generate(whole_p.get(), prompt, 64);
    const Generated split = generate(split_p.get(), prompt, 64);
    ASSERT_EQ(whole.status, MK_OK) << mk_last_error();
    ASSERT_EQ(split.status, MK_OK) << mk_last_error();
    EXPECT_EQ(text_of(whole.tokens), "The capital of France is Paris.");
    EXPECT_TRUE(whole.stats.stopped_at_eog);
    EXPECT_EQ(whole.stats.eog_token, 2); // <|im_end|>
    EXPECT_EQ(whole.stats.n_generated, whole.tokens.size());
    EXPECT_EQ(whole.stats.n_prompt, prompt.size());
    EXPECT_EQ(split.tokens, whole.tokens);
    EXPECT_EQ(split.stats.eog_token, whole.stats.eog_token);
    EXPECT_TRUE(bit_identical(split.logits, whole.logits));
    // time was spent in both ranges of the split
    EXPECT_GT(mk_pipeline_range_seconds(split_p.get(), 0), 0.0);
    EXPECT_GT(mk_pipeline_range_seconds(split_p.get(), 1), 0.0);
    EXPECT_EQ(mk_pipeline_range_seconds(split_p.get(), 2), 0.0);
}

TEST_F(Generate, StopsAtTheTokenBudgetFirst) {
    const std::vector<int32_t> prompt = chat_ids({{"user", "What is the capital of France?"}});
    PipePtr p = pipeline({9, 19}, 64);
    const Generated g = generate(p.get(), prompt, 3);
    ASSERT_EQ(g.status, MK_OK) << mk_last_error();
    EXPECT_EQ(g.tokens.size(), 3u);
    EXPECT_FALSE(g.stats.stopped_at_eog);
    EXPECT_EQ(g.stats.eog_token, -1);
    EXPECT_EQ(text_of(g.tokens), "The capital of");
}

TEST_F(Generate, PromptLongerThanTheContextIsRefused) {
    const std::vector<int32_t> prompt = chat_ids({{"user", "What is the capital of France?"}});
    PipePtr p = pipeline({14}, 16);
    const Generated g = generate(p.get(), prompt, 8);
    EXPECT_EQ(g.status, MK_ERR_CONTEXT_OVERFLOW);
    EXPECT_NE(std::string(mk_last_error()).find("prompt of 37 tokens does not fit"), std::string::npos) << mk_last_error();
    EXPECT_TRUE(g.tokens.empty());
    EXPECT_EQ(g.stats.n_generated, 0u);
}

TEST_F(Generate, SecondChatTurnContinuesTheCache) {
    std::vector<mk_chat_message> msgs = {{"user", "What is the capital of France?"}};
    const std::vector<int32_t> turn1 = chat_ids(msgs);
    PipePtr p = pipeline({14}, 256);
    const Generated a1 = generate(p.get(), turn1, 64);
    ASSERT_EQ(a1.status, MK_OK);
    ASSERT_TRUE(a1.stats.stopped_at_eog);
    const std::string answer1 = text_of(a1.tokens);
    msgs.push_back({"assistant", answer1.c_str()});
    msgs.push_back({"user", "And of Italy?"});
    // the cache holds turn1 + answer; feed only the rest of the rendered conversation
    char *full = nullptr;
    size_t len = 0;
    ASSERT_EQ(mk_chat_apply(tok_.get(), msgs.data(), msgs.size(), true, &full, &len), MK_OK);
    char *prev = nullptr;
    size_t prev_len = 0;
    ASSERT_EQ(mk_chat_apply(tok_.get(), msgs.data(), 1, true, &prev, &prev_len), MK_OK);
    const std::string cached = std::string(prev, prev_len) + answer1;
    const std::string rendered(full, len);
    mk_buffer_free(full);
    mk_buffer_free(prev);
    ASSERT_EQ(rendered.compare(0, cached.size(), cached), 0);
    const std::string delta = rendered.substr(cached.size());
    EXPECT_EQ(delta.rfind("<|im_end|>\n<|im_start|>user\nAnd of Italy?", 0), 0u) << delta;
    int32_t *ids = nullptr;
    size_t n = 0;
    ASSERT_EQ(mk_tokenizer_encode(tok_.get(), delta.data(), delta.size(), MK_TOKENIZE_PARSE_SPECIAL, &ids, &n), MK_OK);
    const std::vector<int32_t> turn2(ids, ids + n);
    mk_buffer_free(ids);
    const Generated a2 = generate(p.get(), turn2, 64);
    ASSERT_EQ(a2.status, MK_OK) << mk_last_error();
    EXPECT_TRUE(a2.stats.stopped_at_eog);
    EXPECT_NE(text_of(a2.tokens).find("Rome"), std::string::npos) << text_of(a2.tokens);

    // the same conversation fed at once to a fresh pipeline answers the same
    std::vector<int32_t> all = turn1;
    all.insert(all.end(), a1.tokens.begin(), a1.tokens.end());
    all.insert(all.end(), turn2.begin(), turn2.end());
    PipePtr fresh = pipeline({}, 256);
    const Generated b = generate(fresh.get(), all, 64);
    ASSERT_EQ(b.status, MK_OK);
    EXPECT_EQ(b.tokens, a2.tokens);
}


// ================================================= the loop's rules, small ==
// The stops and statuses of mk_pipeline_generate on the seed-shaped random model (fast,
// no download) with vocabularies built in memory: each rule on the smallest input.

struct GenRun {
    std::vector<int32_t> tokens;
    mk_generate_stats stats{};
    mk_status status = MK_OK;
    std::string error;
    size_t calls = 0;
    size_t fail_at = 0; // the callback fails on this call (1-based); 0: never
};

mk_status record(void *user, int32_t token, const float *logits, size_t vocab) {
    auto *r = static_cast<GenRun *>(user);
    r->calls++;
    EXPECT_NE(logits, nullptr);
    EXPECT_EQ(vocab, 48u);
    if (r->fail_at && r->calls == r->fail_at)
        return mk_fail(MK_ERR_PEER_CLOSED, "the reader of token %d went away", (int)token);
    r->tokens.push_back(token);
    return MK_OK;
}

class GenerateRules : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = make_random_model(mk_hparams_seed_default());
        ASSERT_TRUE(model_);
        // the reference: greedy tokens with no end-of-generation set at all
        ref_ = run(nullptr, prompt_, 8);
        ASSERT_EQ(ref_.status, MK_OK) << ref_.error;
        ASSERT_EQ(ref_.tokens.size(), 8u);
        // the first token that did not come before: stopping there is visible
        for (k_ = 1; k_ < ref_.tokens.size(); k_++)
            if (std::find(ref_.tokens.begin(), ref_.tokens.begin() + (long)k_, ref_.tokens[k_]) ==
                ref_.tokens.begin() + (long)k_)
                break;
        ASSERT_LT(k_, ref_.tokens.size()) << "the random model repeats one token: pick another prompt";
    }
    GenRun run(const mk_tokenizer *tok, const std::vector<int32_t> &prompt, size_t max_new, size_t fail_at = 0,
            size_t context = 64, mk_pipeline *on = nullptr) {
        PipePtr own;
        if (!on) {
            mk_range_options o = mk_range_options_default();
            o.max_context = context;
            mk_pipeline *p = nullptr;
            const mk_pipeline_options po = pipeline_options(nullptr, 0, &o);
            EXPECT_EQ(mk_pipeline_create(model_.get(), &po, &p), MK_OK) << mk_last_error();
            own.reset(p);
            on = p;
        }
        GenRun r;
        r.fail_at = fail_at;
        r.status = mk_pipeline_generate(on, tok, prompt.data(), prompt.size(), max_new, record, &r, &r.stats);
        r.error = mk_last_error();
        return r;
    }
    ModelPtr model_;
    const std::vector<int32_t> prompt_ = {5, 17, 3, 40, 22};
    GenRun ref_;
    size_t k_ = 0; // ref_.tokens[k_] appears first at k_
};

// Without a tokenizer (or with one whose end set never comes) only the budget stops.
TEST_F(GenerateRules, WithoutAnEndTokenTheBudgetStops) {
    EXPECT_FALSE(ref_.stats.stopped_at_eog);
    EXPECT_EQ(ref_.stats.eog_token, -1);
    EXPECT_EQ(ref_.stats.n_generated, 8u);
    EXPECT_EQ(ref_.stats.n_prompt, prompt_.size());
    EXPECT_GT(ref_.stats.prefill_s, 0.0);
    EXPECT_GT(ref_.stats.decode_s, 0.0);
    // one token: the prompt's forward alone, no decode step
    const GenRun one = run(nullptr, prompt_, 1);
    ASSERT_EQ(one.status, MK_OK) << one.error;
    EXPECT_EQ(one.tokens, std::vector<int32_t>{ref_.tokens[0]});
    EXPECT_EQ(one.stats.n_generated, 1u);
    EXPECT_EQ(one.stats.decode_s, 0.0);
    // decode_s sums every decode step: 40 steps take most of the call's time (one step, the
    // last alone, would be a fortieth of it)
    const auto t0 = std::chrono::steady_clock::now();
    const GenRun many = run(nullptr, prompt_, 41);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(many.status, MK_OK) << many.error;
    ASSERT_EQ(many.stats.n_generated, 41u);
    EXPECT_LE(many.stats.prefill_s + many.stats.decode_s, wall);
    EXPECT_GE(many.stats.decode_s, 0.3 * wall) << "prefill " << many.stats.prefill_s << " s, call " << wall << " s";
    // no budget: nothing reaches the callback
    const GenRun none = run(nullptr, prompt_, 0);
    EXPECT_EQ(none.status, MK_OK);
    EXPECT_EQ(none.calls, 0u);
    EXPECT_EQ(none.stats.n_generated, 0u);
}

// Every member of the tokenizer's end-of-generation set stops generation, not only EOS:
// EOS, EOT and EOM by their ids, and an end-of-turn token known by its text. The end token
// is not handed to the callback, and is the one the stats name.
TEST_F(GenerateRules, EveryEndOfGenerationTokenStopsAndIsNotPassedOn) {
    const int32_t end = ref_.tokens[k_];
    struct Case {
        const char *what;
        VocabGguf vocab;
    };
    std::vector<Case> cases = {
        {"eos id", spm_vocab(48).u32("tokenizer.ggml.eos_token_id", (uint32_t)end)},
        {"eot id", spm_vocab(48).u32("tokenizer.ggml.eot_token_id", (uint32_t)end)},
        {"eom id", spm_vocab(48).u32("tokenizer.ggml.eom_token_id", (uint32_t)end)},
        {"<|im_end|> by text", spm_vocab(48, {{end, "<|im_end|>"}})},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.what);
        mk_status s;
        VocabTokPtr tok = tokenizer_of(c.vocab, &s);
        ASSERT_EQ(s, MK_OK) << mk_last_error();
        ASSERT_TRUE(mk_tokenizer_is_eog(tok.get(), end));
        const GenRun r = run(tok.get(), prompt_, 8);
        ASSERT_EQ(r.status, MK_OK) << r.error;
        EXPECT_EQ(r.tokens, std::vector<int32_t>(ref_.tokens.begin(), ref_.tokens.begin() + (long)k_));
        EXPECT_TRUE(r.stats.stopped_at_eog);
        EXPECT_EQ(r.stats.eog_token, end);
        EXPECT_EQ(r.stats.n_generated, k_);
        EXPECT_EQ(r.calls, k_) << "the end token reached the callback";
    }
    // an end set that does not meet the sequence changes nothing
    const int32_t absent = [&] {
        for (int32_t id = 3; id < 48; id++)
            if (std::find(ref_.tokens.begin(), ref_.tokens.end(), id) == ref_.tokens.end()) return id;
        return -1;
    }();
    ASSERT_GE(absent, 0);
    mk_status s;
    VocabTokPtr other = tokenizer_of(spm_vocab(48).u32("tokenizer.ggml.eos_token_id", (uint32_t)absent), &s);
    ASSERT_EQ(s, MK_OK) << mk_last_error();
    const GenRun r = run(other.get(), prompt_, 8);
    EXPECT_EQ(r.tokens, ref_.tokens);
    EXPECT_FALSE(r.stats.stopped_at_eog);
}

// The budget and the end token at the same step: the end token wins when it is the
// max_new-th token (nothing handed on), the budget when it comes one step later.
TEST_F(GenerateRules, EndTokenAtTheBudgetEdge) {
    const int32_t end = ref_.tokens[k_];
    mk_status s;
    VocabTokPtr tok = tokenizer_of(spm_vocab(48).u32("tokenizer.ggml.eot_token_id", (uint32_t)end), &s);
    ASSERT_EQ(s, MK_OK) << mk_last_error();
    const GenRun at = run(tok.get(), prompt_, k_ + 1);
    EXPECT_TRUE(at.stats.stopped_at_eog);
    EXPECT_EQ(at.stats.n_generated, k_);
    const GenRun before = run(tok.get(), prompt_, k_);
    EXPECT_FALSE(before.stats.stopped_at_eog);
    EXPECT_EQ(before.stats.eog_token, -1);
    EXPECT_EQ(before.stats.n_generated, k_);
    EXPECT_EQ(before.tokens, std::vector<int32_t>(ref_.tokens.begin(), ref_.tokens.begin() + (long)k_));
}

// A callback's failure stops generation at once and is returned with the callback's own
// message; the tokens before it were handed over.
TEST_F(GenerateRules, FailingCallbackStatusIsReturned) {
    const GenRun r = run(nullptr, prompt_, 8, 3);
    EXPECT_EQ(r.status, MK_ERR_PEER_CLOSED) << r.error;
    EXPECT_NE(r.error.find("the reader of token " + std::to_string(ref_.tokens[2]) + " went away"), std::string::npos)
        << r.error;
    EXPECT_EQ(r.calls, 3u) << "generation went on after the callback failed";
    EXPECT_EQ(r.tokens, std::vector<int32_t>(ref_.tokens.begin(), ref_.tokens.begin() + 2));
    EXPECT_EQ(r.stats.n_generated, 3u);
    EXPECT_FALSE(r.stats.stopped_at_eog);
    // the first call failing
    const GenRun first = run(nullptr, prompt_, 8, 1);
    EXPECT_EQ(first.status, MK_ERR_PEER_CLOSED);
    EXPECT_EQ(first.calls, 1u);
}

// The last token sampled is not fed back: a second call whose prompt is that token
// continues exactly where one longer call would be.
TEST_F(GenerateRules, TheLastTokenIsNotFedBack) {
    mk_range_options o = mk_range_options_default();
    o.max_context = 64;
    mk_pipeline *p = nullptr;
    const mk_pipeline_options po = pipeline_options(nullptr, 0, &o);
    MK_ASSERT_OK(mk_pipeline_create(model_.get(), &po, &p));
    PipePtr pipe(p);
    const GenRun a = run(nullptr, prompt_, 3, 0, 64, p);
    ASSERT_EQ(a.status, MK_OK) << a.error;
    const GenRun b = run(nullptr, {a.tokens.back()}, 5, 0, 64, p);
    ASSERT_EQ(b.status, MK_OK) << b.error;
    std::vector<int32_t> both = a.tokens;
    both.insert(both.end(), b.tokens.begin(), b.tokens.end());
    EXPECT_EQ(std::vector<int32_t>(both.begin(), both.begin() + 8), ref_.tokens);
}

// Refusals: no pipeline, no prompt; the stats still say the prompt length and no end token.
TEST_F(GenerateRules, RefusesNoPipelineOrNoPrompt) {
    mk_generate_stats st;
    std::memset(&st, 0x5a, sizeof st);
    EXPECT_ERROR(mk_pipeline_generate(nullptr, nullptr, prompt_.data(), prompt_.size(), 4, nullptr, nullptr, &st),
                 MK_ERR_INVALID_ARGUMENT, "NULL pipeline or empty prompt");
    EXPECT_EQ(st.n_prompt, prompt_.size());
    EXPECT_EQ(st.n_generated, 0u);
    EXPECT_EQ(st.eog_token, -1);
    EXPECT_FALSE(st.stopped_at_eog);
    mk_range_options o = mk_range_options_default();
    o.max_context = 64;
    mk_pipeline *p = nullptr;
    const mk_pipeline_options po = pipeline_options(nullptr, 0, &o);
    MK_ASSERT_OK(mk_pipeline_create(model_.get(), &po, &p));
    PipePtr pipe(p);
    EXPECT_ERROR(mk_pipeline_generate(p, nullptr, prompt_.data(), 0, 4, nullptr, nullptr, nullptr),
                 MK_ERR_INVALID_ARGUMENT, "empty prompt");
    EXPECT_ERROR(mk_pipeline_generate(p, nullptr, nullptr, 3, 4, nullptr, nullptr, nullptr), MK_ERR_INVALID_ARGUMENT,
                 "empty prompt");
}

// The context: a prompt one longer than the cache is refused before any decoding, named
// as the prompt; a prompt that fills it exactly is read, and the overflow of the first
// decode step is the range's own error (not blamed on the prompt).
TEST_F(GenerateRules, ContextOverflowOfThePromptAndOfADecodeStep) {
    const std::vector<int32_t> nine = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const GenRun over = run(nullptr, nine, 4, 0, 8);
    EXPECT_EQ(over.status, MK_ERR_CONTEXT_OVERFLOW);
    EXPECT_NE(over.error.find("the prompt of 9 tokens does not fit the context"), std::string::npos) << over.error;
    EXPECT_EQ(over.calls, 0u);
    const GenRun full = run(nullptr, std::vector<int32_t>(nine.begin(), nine.begin() + 8), 4, 0, 8);
    EXPECT_EQ(full.status, MK_ERR_CONTEXT_OVERFLOW);
    EXPECT_EQ(full.error.find("prompt of"), std::string::npos) << full.error;
    EXPECT_EQ(full.calls, 1u);
    EXPECT_EQ(full.stats.n_generated, 1u);
}

} // namespace
