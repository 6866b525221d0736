// mk_vocab_gguf.h - vocabulary-only GGUFs built in memory, so that each tokenizer rule
// (the end-of-generation set, the special-token split, the refusals of bad metadata) and
// the generation loop's stops can be shown on the smallest vocabulary that shows them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "mk_error.h"
#include "mk_test_util.h"
#include "text/tokenizer.h"

struct VocabGguf {
    std::vector<uint8_t> kv;
    uint64_t n_kv = 0;

    static void put(std::vector<uint8_t> &o, const void *p, size_t n) {
        o.insert(o.end(), (const uint8_t *)p, (const uint8_t *)p + n);
    }
    static void put_str(std::vector<uint8_t> &o, const std::string &s) {
        const uint64_t n = s.size();
        put(o, &n, 8);
        put(o, s.data(), s.size());
    }
    void key(const std::string &k, uint32_t type) {
        put_str(kv, k);
        put(kv, &type, 4);
        n_kv++;
    }
    VocabGguf &u32(const std::string &k, uint32_t v) {
        key(k, MK_GGUF_TYPE_UINT32);
        put(kv, &v, 4);
        return *this;
    }
    VocabGguf &boolean(const std::string &k, bool v) {
        key(k, MK_GGUF_TYPE_BOOL);
        const uint8_t b = v ? 1 : 0;
        put(kv, &b, 1);
        return *this;
    }
    VocabGguf &str(const std::string &k, const std::string &v) {
        key(k, MK_GGUF_TYPE_STRING);
        put_str(kv, v);
        return *this;
    }
    void array_head(const std::string &k, uint32_t elem, uint64_t n) {
        key(k, MK_GGUF_TYPE_ARRAY);
        put(kv, &elem, 4);
        put(kv, &n, 8);
    }
    VocabGguf &strings(const std::string &k, const std::vector<std::string> &v) {
        array_head(k, MK_GGUF_TYPE_STRING, v.size());
        for (const std::string &s : v) put_str(kv, s);
        return *this;
    }
    VocabGguf &int32s(const std::string &k, const std::vector<int32_t> &v) {
        array_head(k, MK_GGUF_TYPE_INT32, v.size());
        put(kv, v.data(), v.size() * 4);
        return *this;
    }
    VocabGguf &floats(const std::string &k, const std::vector<float> &v) {
        array_head(k, MK_GGUF_TYPE_FLOAT32, v.size());
        put(kv, v.data(), v.size() * 4);
        return *this;
    }
    std::vector<uint8_t> bytes() const {
        std::vector<uint8_t> f;
        put(f, "GGUF", 4);
        const uint32_t version = 3;
        const uint64_t n_tensors = 0;
        put(f, &version, 4);
        put(f, &n_tensors, 8);
        put(f, &n_kv, 8);
        put(f, kv.data(), kv.size());
        while (f.size() % 32) f.push_back(0);
        return f;
    }
};

struct VocabTokDeleter { void operator()(mk_tokenizer *t) const { mk_tokenizer_free(t); } };
using VocabTokPtr = std::unique_ptr<mk_tokenizer, VocabTokDeleter>;

// The tokenizer of an in-memory GGUF; *status gets the loader's status.
inline VocabTokPtr tokenizer_of(const VocabGguf &g, mk_status *status) {
    const std::vector<uint8_t> b = g.bytes();
    mk_gguf *gg = nullptr;
    mk_clear_error();
    *status = mk_gguf_open_memory(b.data(), b.size(), &gg);
    if (*status != MK_OK) return nullptr;
    mk_tokenizer *t = nullptr;
    *status = mk_tokenizer_from_gguf(gg, &t);
    mk_gguf_close(gg);
    return VocabTokPtr(t);
}

// A SentencePiece ("llama") vocabulary of n tokens: <unk>, <s>, </s>, then "t3", "t4", ...
// (all normal), with the given texts replacing some of them and BOS 1; no EOS unless set.
inline VocabGguf spm_vocab(size_t n, const std::vector<std::pair<int32_t, std::string>> &texts = {},
                           const std::vector<std::pair<int32_t, int32_t>> &types = {}) {
    std::vector<std::string> tokens(n);
    std::vector<int32_t> type(n, MK_TOKEN_NORMAL);
    for (size_t i = 0; i < n; i++) tokens[i] = "t" + std::to_string(i);
    tokens[0] = "<unk>", type[0] = MK_TOKEN_UNKNOWN;
    tokens[1] = "<s>", type[1] = MK_TOKEN_CONTROL;
    tokens[2] = "</s>", type[2] = MK_TOKEN_CONTROL;
    for (const auto &t : texts) tokens[(size_t)t.first] = t.second;
    for (const auto &t : types) type[(size_t)t.first] = t.second;
    VocabGguf g;
    g.str("general.architecture", "llama").str("tokenizer.ggml.model", "llama").strings("tokenizer.ggml.tokens", tokens);
    g.int32s("tokenizer.ggml.token_type", type).u32("tokenizer.ggml.bos_token_id", 1);
    return g;
}
