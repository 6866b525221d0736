// The library's tokenizer and chat templates against llama.cpp (llama-cpp-python, vocab
// only) on the same GGUFs: SmolLM2's byte-level BPE ("smollm" pre-tokenizer), a tiny
// Llama-3-style BPE ("llama-bpe") and a tiny SentencePiece vocabulary with byte fallback.
// Fixtures: scripts/make_tokenizer_goldens.py -> tests/fixtures/tokenizer/.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mk_test_util.h"
#include "tokenizer.h"

namespace {

const std::string kDir = std::string(MK_FIXTURE_DIR) + "/tokenizer/";
const std::string kSmolLM2 = std::string(MK_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct TokDeleter { void operator()(mk_tokenizer *t) const { mk_tokenizer_free(t); } };
using TokPtr = std::unique_ptr<mk_tokenizer, TokDeleter>;

std::string path_of(const std::string &model) {
    if (model == "smollm2") return kSmolLM2;
    if (model == "llama3") return kDir + "llama3_tiny.gguf";
    return kDir + "spm_tiny.gguf";
}

TokPtr open_tok(const std::string &path, mk_status *status = nullptr) {
    mk_tokenizer *t = nullptr;
    const mk_status s = mk_tokenizer_open_file(path.c_str(), &t);
    if (status) *status = s;
    return TokPtr(t);
}

std::string unhex(const std::string &h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back((char)std::strtol(h.substr(i, 2).c_str(), nullptr, 16));
    return out;
}

std::vector<int32_t> parse_ids(const std::string &s) {
    std::vector<int32_t> v;
    std::istringstream in(s);
    std::string x;
    while (std::getline(in, x, ',')) v.push_back(std::stoi(x));
    return v;
}

std::vector<std::vector<std::string>> read_tsv(const std::string &name) {
    std::vector<std::vector<std::string>> rows;
    std::ifstream f(kDir + name);
    std::string line;
    while (std::getline(f, line)) {
        std::vector<std::string> cols;
        size_t start = 0;
        for (size_t i = 0; i <= line.size(); i++)
            if (i == line.size() || line[i] == '\t') {
                cols.push_back(line.substr(start, i - start));
                start = i + 1;
            }
        rows.push_back(cols);
    }
    return rows;
}

std::vector<int32_t> encode(const mk_tokenizer *t, const std::string &s, unsigned flags, mk_status *status = nullptr) {
    int32_t *ids = nullptr;
    size_t n = 0;
    const mk_status st = mk_tokenizer_encode(t, s.data(), s.size(), flags, &ids, &n);
    if (status) *status = st;
    else EXPECT_EQ(st, MK_OK) << mk_last_error();
    std::vector<int32_t> v(ids, ids + n);
    mk_buffer_free(ids);
    return v;
}

std::string decode(const mk_tokenizer *t, const std::vector<int32_t> &ids, unsigned flags) {
    char *text = nullptr;
    size_t len = 0;
    EXPECT_EQ(mk_tokenizer_decode(t, ids.data(), ids.size(), flags, &text, &len), MK_OK) << mk_last_error();
    std::string s(text ? text : "", len);
    mk_buffer_free(text);
    return s;
}

std::string show(const std::vector<int32_t> &v) {
    std::string s;
    for (int32_t x : v) s += std::to_string(x) + ",";
    return s;
}

bool have_smollm2() { return std::ifstream(kSmolLM2).good(); }

// ------------------------------------------------------------------- goldens --

TEST(TokenizerGoldens, EncodeMatchesLlamaCppAndDecodeRoundTrips) {
    const auto rows = read_tsv("goldens.tsv");
    ASSERT_GE(rows.size(), 3u * 2u * 300u) << "goldens.tsv missing or short; run scripts/make_tokenizer_goldens.py";
    std::map<std::string, TokPtr> toks;
    std::map<std::string, size_t> checked;
    size_t mismatches = 0;
    for (const auto &r : rows) {
        ASSERT_EQ(r.size(), 5u);
        const std::string &model = r[0];
        if (model == "smollm2" && !have_smollm2()) GTEST_SKIP() << "run scripts/fetch_model.sh";
        if (!toks.count(model)) {
            mk_status s;
            toks[model] = open_tok(path_of(model), &s);
            ASSERT_EQ(s, MK_OK) << model << ": " << mk_last_error();
        }
        const mk_tokenizer *t = toks[model].get();
        const unsigned flags = (r[1] == "1" ? MK_TOKENIZE_ADD_SPECIAL : 0u) | (r[2] == "1" ? MK_TOKENIZE_PARSE_SPECIAL : 0u);
        const std::string text = unhex(r[3]);
        const std::vector<int32_t> want = parse_ids(r[4]);
        const std::vector<int32_t> got = encode(t, text, flags);
        if (got != want && ++mismatches <= 10)
            ADD_FAILURE() << model << " flags " << flags << " text '" << text << "'\n want " << show(want) << "\n got  "
                          << show(got);
        if (flags == 0) {
            EXPECT_EQ(decode(t, got, 0), text) << model << ": decode(encode(s)) != s for '" << text << "'";
        }
        checked[model]++;
    }
    EXPECT_EQ(mismatches, 0u);
    for (const char *m : {"smollm2", "llama3", "spm"}) EXPECT_GE(checked[m], 600u) << m;
}

TEST(TokenizerGoldens, TemplatedConversationEqualsReferenceIds) {
    const auto rows = read_tsv("chat.tsv");
    ASSERT_GE(rows.size(), 6u);
    for (const auto &r : rows) {
        ASSERT_EQ(r.size(), 4u);
        if (r[0] == "smollm2" && !have_smollm2()) GTEST_SKIP() << "run scripts/fetch_model.sh";
        mk_status s;
        TokPtr t = open_tok(path_of(r[0]), &s);
        ASSERT_EQ(s, MK_OK) << mk_last_error();
        std::vector<mk_chat_message> msgs;
        if (r[1] == "two_turns") {
            msgs = {{"user", "What is the capital of France?"},
                    {"assistant", "The capital of France is Paris."},
                    {"user", "And of Italy?"}};
        } else {
            ASSERT_EQ(r[1], "system_two_turns");
            msgs = {{"system", "You answer in one word."},
                    {"user", "Colour of the sky?"},
                    {"assistant", " Blue. "},
                    {"user", "And grass?"}};
        }
        char *text = nullptr;
        size_t len = 0;
        ASSERT_EQ(mk_chat_apply(t.get(), msgs.data(), msgs.size(), true, &text, &len), MK_OK) << mk_last_error();
        const std::string rendered(text, len);
        mk_buffer_free(text);
        EXPECT_EQ(rendered, unhex(r[2])) << r[0] << " " << r[1];
        EXPECT_EQ(encode(t.get(), rendered, MK_TOKENIZE_PARSE_SPECIAL), parse_ids(r[3])) << r[0] << " " << r[1];
    }
}

// ------------------------------------------------------------- special ids --

TEST(Tokenizer, EndOfGenerationSets) {
    mk_status s;
    TokPtr l3 = open_tok(path_of("llama3"), &s);
    ASSERT_EQ(s, MK_OK) << mk_last_error();
    const size_t n = mk_tokenizer_vocab_size(l3.get());
    ASSERT_GT(n, 5u);
    // the five control tokens are the last ids of the tiny vocabulary
    for (size_t i = 0; i < n; i++) {
        const std::string text = mk_tokenizer_token_text(l3.get(), (int32_t)i);
        const bool eog = text == "<|eot_id|>" || text == "<|end_of_text|>";
        EXPECT_EQ(mk_tokenizer_is_eog(l3.get(), (int32_t)i), eog) << text;
    }
    EXPECT_EQ(std::string(mk_tokenizer_token_text(l3.get(), mk_tokenizer_bos(l3.get()))), "<|begin_of_text|>");
    EXPECT_FALSE(mk_tokenizer_is_eog(l3.get(), -1));
    EXPECT_FALSE(mk_tokenizer_is_eog(l3.get(), (int32_t)n));
    EXPECT_EQ(mk_tokenizer_token_text(l3.get(), (int32_t)n), nullptr);

    TokPtr spm = open_tok(path_of("spm"), &s);
    ASSERT_EQ(s, MK_OK) << mk_last_error();
    EXPECT_EQ(std::string(mk_tokenizer_token_text(spm.get(), mk_tokenizer_eos(spm.get()))), "</s>");
    EXPECT_TRUE(mk_tokenizer_is_eog(spm.get(), mk_tokenizer_eos(spm.get())));
    EXPECT_FALSE(mk_tokenizer_is_eog(spm.get(), mk_tokenizer_bos(spm.get())));

    if (!have_smollm2()) GTEST_SKIP() << "run scripts/fetch_model.sh";
    TokPtr sm = open_tok(kSmolLM2, &s);
    ASSERT_EQ(s, MK_OK) << mk_last_error();
    EXPECT_EQ(mk_tokenizer_vocab_size(sm.get()), 49152u);
    EXPECT_TRUE(mk_tokenizer_is_eog(sm.get(), 2));  // <|im_end|> (also EOS)
    EXPECT_TRUE(mk_tokenizer_is_eog(sm.get(), 0));  // <|endoftext|>
    EXPECT_FALSE(mk_tokenizer_is_eog(sm.get(), 1)); // <|im_start|>
    EXPECT_FALSE(mk_tokenizer_is_eog(sm.get(), 3)); // <repo_name>
    EXPECT_FALSE(mk_tokenizer_is_eog(sm.get(), 4649));
    EXPECT_EQ(mk_tokenizer_bos(sm.get()), 1);
    EXPECT_EQ(mk_tokenizer_eos(sm.get()), 2);
    size_t count = 0;
    ASSERT_EQ(mk_tokenizer_count(sm.get(), "What is the capital of France?", 30, 0, &count), MK_OK);
    EXPECT_EQ(count, 7u);
}

// --------------------------------------------------------- streaming decode --

TEST(Tokenizer, StreamingDecodeHoldsUnfinishedUtf8) {
    if (!have_smollm2()) GTEST_SKIP() << "run scripts/fetch_model.sh";
    mk_status s;
    TokPtr t = open_tok(kSmolLM2, &s);
    ASSERT_EQ(s, MK_OK) << mk_last_error();
    const std::string text = "Family: 👨‍👩‍👧‍👦, 日本語 and Ελληνικά — ok 🎉";
    const std::vector<int32_t> ids = encode(t.get(), text, 0);
    mk_detokenizer *d = nullptr;
    ASSERT_EQ(mk_detokenizer_create(t.get(), 0, &d), MK_OK);
    std::string joined;
    size_t held = 0; // tokens that completed no character
    for (int32_t id : ids) {
        const char *chunk;
        size_t len;
        ASSERT_EQ(mk_detokenizer_push(d, id, &chunk, &len), MK_OK) << mk_last_error();
        const std::string piece(chunk, len);
        // every chunk is whole UTF-8 on its own
        for (size_t i = 0; i < piece.size();) {
            const size_t n = mk_utf8_valid_len((const unsigned char *)piece.data() + i, piece.size() - i);
            ASSERT_GT(n, 0u) << "chunk of token " << id << " is not whole UTF-8";
            i += n;
        }
        held += len == 0;
        joined += piece;
    }
    const char *tail;
    size_t tail_len;
    ASSERT_EQ(mk_detokenizer_flush(d, &tail, &tail_len), MK_OK);
    EXPECT_EQ(tail_len, 0u);
    EXPECT_EQ(joined, text);
    EXPECT_GT(held, 0u) << "no token ended inside a character: the test does not exercise holding";

    // a stream cut inside a character ends with U+FFFD, and the decoder starts afresh
    const std::vector<int32_t> euro = encode(t.get(), "ꙮ", 0); // 3 bytes, one token each
    ASSERT_GE(euro.size(), 2u);
    const char *chunk;
    size_t len;
    ASSERT_EQ(mk_detokenizer_push(d, euro[0], &chunk, &len), MK_OK);
    EXPECT_EQ(len, 0u);
    ASSERT_EQ(mk_detokenizer_flush(d, &chunk, &len), MK_OK);
    EXPECT_EQ(std::string(chunk, len), "\xef\xbf\xbd");
    EXPECT_EQ(mk_detokenizer_push(d, 1 << 30, &chunk, &len), MK_ERR_TOKEN_OUT_OF_RANGE);
    mk_detokenizer_free(d);
}

TEST(Tokenizer, DecodeRendersControlTokensOnlyWhenAsked) {
    if (!have_smollm2()) GTEST_SKIP() << "run scripts/fetch_model.sh";
    mk_status s;
    TokPtr t = open_tok(kSmolLM2, &s);
    ASSERT_EQ(s, MK_OK);
    const std::string text = "<|im_start|>user\nhi<|im_end|>\n";
    const std::vector<int32_t> ids = encode(t.get(), text, MK_TOKENIZE_PARSE_SPECIAL);
    ASSERT_EQ(ids.front(), 1);
    EXPECT_EQ(decode(t.get(), ids, MK_DECODE_SPECIAL), text);
    EXPECT_EQ(decode(t.get(), ids, 0), "user\nhi\n");
    // without parse_special the same text is plain text, not the control token
    const std::vector<int32_t> plain = encode(t.get(), text, 0);
    for (int32_t id : plain) EXPECT_NE(id, 1);
    const int32_t bad = -3;
    char *out = nullptr;
    size_t len = 0;
    EXPECT_EQ(mk_tokenizer_decode(t.get(), &bad, 1, 0, &out, &len), MK_ERR_TOKEN_OUT_OF_RANGE);
}

// ----------------------------------------------------------------- bad input --

TEST(Tokenizer, InvalidUtf8IsRefusedWithItsOffset) {
    mk_status s;
    TokPtr t = open_tok(path_of("llama3"), &s);
    ASSERT_EQ(s, MK_OK) << mk_last_error();
    TokPtr spm = open_tok(path_of("spm"), &s);
    ASSERT_EQ(s, MK_OK) << mk_last_error();
    const std::vector<std::string> bad = {
        std::string("ab\x80", 3),              // lone continuation byte
        std::string("ab\xe2\x82", 4),          // truncated 3-byte sequence
        std::string("ab\xc0\xaf", 4),          // overlong '/'
        std::string("ab\xed\xa0\x80", 5),      // UTF-16 surrogate
        std::string("ab\xf4\x90\x80\x80", 6),  // past U+10FFFF
        std::string("ab\xff", 3),              // never valid
        std::string("ab\xe0\x80\x80", 5),      // overlong 3-byte
    };
    for (const std::string &b : bad) {
        for (const mk_tokenizer *tok : {t.get(), spm.get()}) {
            mk_status st;
            const std::vector<int32_t> ids = encode(tok, b, MK_TOKENIZE_ADD_SPECIAL, &st);
            EXPECT_EQ(st, MK_ERR_INVALID_UTF8);
            EXPECT_TRUE(ids.empty());
            EXPECT_NE(std::string(mk_last_error()).find("offset 2"), std::string::npos) << mk_last_error();
        }
    }
}

TEST(Tokenizer, GgufWithoutOrWithUnknownTokenizerIsRefused) {
    struct Case {
        const char *file;
        const char *says;
    } cases[] = {
        {"no_tokenizer.gguf", "no tokenizer metadata"},
        {"unknown_model.gguf", "unknown tokenizer.ggml.model = 'bert'"},
        {"unknown_pre.gguf", "unknown pre-tokenizer tokenizer.ggml.pre = 'qwen2'"},
    };
    for (const Case &c : cases) {
        mk_status s;
        TokPtr t = open_tok(kDir + c.file, &s);
        EXPECT_EQ(s, MK_ERR_TOKENIZER) << c.file;
        EXPECT_EQ(t, nullptr);
        EXPECT_NE(std::string(mk_last_error()).find(c.says), std::string::npos) << mk_last_error();
    }
    // a model without a GGUF has no tokenizer
    ModelPtr random = make_random_model(mk_hparams_seed_default());
    mk_tokenizer *t = nullptr;
    EXPECT_EQ(mk_tokenizer_open(random.get(), &t), MK_ERR_TOKENIZER);
    EXPECT_EQ(t, nullptr);
    EXPECT_EQ(mk_tokenizer_open(nullptr, &t), MK_ERR_INVALID_ARGUMENT);
    EXPECT_STREQ(mk_status_name(MK_ERR_TOKENIZER), "MK_ERR_TOKENIZER");
    EXPECT_STREQ(mk_status_name(MK_ERR_INVALID_UTF8), "MK_ERR_INVALID_UTF8");
    EXPECT_STREQ(mk_status_name(MK_ERR_CHAT_TEMPLATE), "MK_ERR_CHAT_TEMPLATE");
}

TEST(ChatTemplate, DetectsShapesAndRefusesOthersByName) {
    mk_status s;
    TokPtr l3 = open_tok(path_of("llama3"), &s);
    ASSERT_EQ(s, MK_OK);
    TokPtr spm = open_tok(path_of("spm"), &s);
    ASSERT_EQ(s, MK_OK);
    mk_chat_template_kind kind;
    ASSERT_EQ(mk_chat_template_detect(l3.get(), &kind), MK_OK);
    EXPECT_EQ(kind, MK_CHAT_TEMPLATE_LLAMA3);
    ASSERT_EQ(mk_chat_template_detect(spm.get(), &kind), MK_OK);
    EXPECT_EQ(kind, MK_CHAT_TEMPLATE_LLAMA2);

    // a message that is not UTF-8 is named, with its own offset
    const mk_chat_message broken[] = {{"user", "caf\xe9 au lait"}};
    char *o = nullptr;
    size_t l = 0;
    EXPECT_EQ(mk_chat_apply(l3.get(), broken, 1, true, &o, &l), MK_ERR_INVALID_UTF8);
    EXPECT_NE(std::string(mk_last_error()).find("message 0 (user)"), std::string::npos) << mk_last_error();
    EXPECT_NE(std::string(mk_last_error()).find("offset 3"), std::string::npos) << mk_last_error();

    // Llama-2's template raises on roles that do not alternate; so does the renderer
    const mk_chat_message twice[] = {{"user", "a"}, {"user", "b"}};
    char *out = nullptr;
    size_t len = 0;
    EXPECT_EQ(mk_chat_apply(spm.get(), twice, 2, true, &out, &len), MK_ERR_CHAT_TEMPLATE);
    EXPECT_NE(std::string(mk_last_error()).find("alternate"), std::string::npos);

    // an unrecognised template is named in the error; no template at all points to --raw
    mk_tokenizer *t = l3.get();
    char *saved = t->chat_template;
    std::string odd = "{% for m in messages %}<<<{{ m.content }}>>>{% endfor %}";
    t->chat_template = odd.data();
    EXPECT_EQ(mk_chat_template_detect(t, &kind), MK_ERR_CHAT_TEMPLATE);
    EXPECT_NE(std::string(mk_last_error()).find("<<<{{ m.content }}>>>"), std::string::npos) << mk_last_error();
    const mk_chat_message one[] = {{"user", "hi"}};
    EXPECT_EQ(mk_chat_apply(t, one, 1, true, &out, &len), MK_ERR_CHAT_TEMPLATE);
    t->chat_template = nullptr;
    EXPECT_EQ(mk_chat_template_detect(t, &kind), MK_ERR_CHAT_TEMPLATE);
    EXPECT_NE(std::string(mk_last_error()).find("--raw"), std::string::npos);
    t->chat_template = saved;
}

TEST(Tokenizer, LongRunsOfOneCharacterRoundTrip) {
    // long runs (whitespace, one word, digits, a 2-byte letter) through the regexes and the merge heap
    mk_status s;
    TokPtr t = open_tok(path_of("llama3"), &s);
    ASSERT_EQ(s, MK_OK);
    for (const std::string &unit : {std::string(" "), std::string("a"), std::string("7"), std::string("\n "),
                                    std::string("é")}) {
        std::string text;
        for (int i = 0; i < 20000; i++) text += unit;
        const std::vector<int32_t> ids = encode(t.get(), text, 0);
        EXPECT_FALSE(ids.empty());
        EXPECT_EQ(decode(t.get(), ids, 0), text);
    }
}

} // namespace
