// Text end to end on the embedded SmolLM2-135M-Instruct: the chat template, the
// generation loop's stop at end of turn or at the token budget, whole vs split text
// (bit-identical logits at every step), a prompt longer than the context, and a second
// chat turn that continues the KV cache instead of starting over.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "mk_test_util.h"

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
        EXPECT_EQ(mk_pipeline_create(model_.get(), cuts.data(), cuts.size(), &o, true, &p), MK_OK) << mk_last_error();
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

} // namespace
