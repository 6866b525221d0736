/* The model's tokenizer from the GGUF `tokenizer.ggml.*` metadata: loading, the special
 * token split, and the encode driver that hands the raw-text fragments to byte-level BPE
 * (tokenizer_bpe.c) or SentencePiece (tokenizer_spm.c). */
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "core/mk_size.h"
#include "mk_error.h"
#include "model/model.h"
#include "text/tokenizer.h"

/* ============================================================== string map == */

static uint64_t mk_hash(const char *s, size_t len) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

mk_status mk_strmap_init(mk_strmap *m, size_t n_keys) {
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < n_keys * 2) cap *= 2; /* load factor <= 1/2 keeps probes short */
    m->cap = cap;
    m->keys = calloc(cap, sizeof *m->keys);
    m->key_lens = calloc(cap, sizeof *m->key_lens);
    m->values = calloc(cap, sizeof *m->values);
    if (!m->keys || !m->key_lens || !m->values) {
        mk_strmap_free(m);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for a map of %zu keys", n_keys);
    }
    return MK_OK;
}

void mk_strmap_free(mk_strmap *m) {
    free(m->keys);
    free(m->key_lens);
    free(m->values);
    memset(m, 0, sizeof *m);
}

void mk_strmap_put(mk_strmap *m, const char *key, size_t len, int32_t value) {
    for (size_t i = (size_t)mk_hash(key, len) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i]) {
            m->keys[i] = key;
            m->key_lens[i] = (uint32_t)len;
            m->values[i] = value;
            return;
        }
        if (m->key_lens[i] == len && memcmp(m->keys[i], key, len) == 0) return;
    }
}

int32_t mk_strmap_get(const mk_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    for (size_t i = (size_t)mk_hash(key, len) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i]) return -1;
        if (m->key_lens[i] == len && memcmp(m->keys[i], key, len) == 0) return m->values[i];
    }
}

mk_status mk_id_buf_push(mk_id_buf *b, int32_t id) {
    MK_TRY(mk_grow_array(&b->ids, &b->cap, b->n + 1, sizeof *b->ids, 64, "tokenizer ids"));
    b->ids[b->n++] = id;
    return MK_OK;
}

size_t mk_utf8_valid_len(const unsigned char *s, size_t len) {
    if (len == 0) return 0;
    const unsigned c = s[0];
    size_t n;
    unsigned cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07;
    else return 0;
    if (len < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3fu);
    }
    /* overlong forms, surrogates and code points past U+10FFFF are not UTF-8 */
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* ================================================================= loading == */

/* End-of-turn control tokens known by their text (as llama.cpp recognises them). */
static const char *const mk_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "<|end_of_text|>", "<end_of_utterance>",
};

/* Optional integer id key: -1 when absent or outside the vocabulary. */
static int32_t mk_tok_id_key(const mk_gguf *g, const char *key, size_t n_vocab, int32_t fallback) {
    uint32_t v;
    if (mk_gguf_get_u32(g, key, &v) != MK_OK) return fallback;
    return v < n_vocab ? (int32_t)v : fallback;
}

static void mk_tok_bool_key(const mk_gguf *g, const char *key, bool *value) {
    bool v;
    if (mk_gguf_get_bool(g, key, &v) == MK_OK) *value = v;
}

/* GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the others
 * for 256 + n in byte order, so every byte has a visible code point. */
static void mk_tok_byte_map(mk_tokenizer *t) {
    unsigned n = 0;
    for (int i = 0; i < 512; i++) t->char_byte[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        const unsigned cp = self ? b : 256 + n++;
        if (cp < 0x80) {
            t->byte_char[b][0] = (char)cp;
            t->byte_char_len[b] = 1;
        } else {
            t->byte_char[b][0] = (char)(0xc0 | (cp >> 6));
            t->byte_char[b][1] = (char)(0x80 | (cp & 0x3f));
            t->byte_char_len[b] = 2;
        }
        t->char_byte[cp] = (int16_t)b;
    }
}

static int mk_tok_cmp_len_desc(const void *a, const void *b, void *ctx) {
    const mk_tokenizer *t = ctx;
    const uint32_t la = t->text_len[*(const int32_t *)a], lb = t->text_len[*(const int32_t *)b];
    if (la != lb) return la > lb ? -1 : 1;
    return *(const int32_t *)a < *(const int32_t *)b ? -1 : 1; /* stable: lower id first */
}

static mk_status mk_tok_read_kind(const mk_gguf *g, mk_tokenizer *t) {
    if (mk_gguf_find_key(g, "tokenizer.ggml.model") < 0 || mk_gguf_find_key(g, "tokenizer.ggml.tokens") < 0)
        return mk_fail(MK_ERR_TOKENIZER,
                       "tokenizer: the GGUF has no tokenizer metadata (tokenizer.ggml.model and tokenizer.ggml.tokens "
                       "are required)");
    if (mk_gguf_get_string_copy(g, "tokenizer.ggml.model", t->model_name, sizeof t->model_name) != MK_OK)
        return mk_fail(MK_ERR_TOKENIZER, "tokenizer: tokenizer.ggml.model is not a short string");
    if (strcmp(t->model_name, "gpt2") == 0) {
        t->kind = MK_TOKENIZER_BPE;
        if (mk_gguf_find_key(g, "tokenizer.ggml.pre") >= 0 &&
            mk_gguf_get_string_copy(g, "tokenizer.ggml.pre", t->pre_name, sizeof t->pre_name) != MK_OK)
            return mk_fail(MK_ERR_TOKENIZER, "tokenizer: tokenizer.ggml.pre is not a short string");
        static const struct { const char *name; mk_pretokenizer pre; bool ignore_merges, add_bos; } pres[] = {
            {"", MK_PRE_GPT2, false, false},          {"default", MK_PRE_GPT2, false, false},
            {"gpt2", MK_PRE_GPT2, false, false},      {"smollm", MK_PRE_SMOLLM, false, false},
            {"llama-bpe", MK_PRE_LLAMA3, true, true}, {"llama3", MK_PRE_LLAMA3, true, true},
            {"llama-v3", MK_PRE_LLAMA3, true, true},
        };
        for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++)
            if (strcmp(t->pre_name, pres[i].name) == 0) {
                t->pre = pres[i].pre;
                t->ignore_merges = pres[i].ignore_merges;
                t->add_bos = pres[i].add_bos;
                return MK_OK;
            }
        return mk_fail(MK_ERR_TOKENIZER,
                       "tokenizer: unknown pre-tokenizer tokenizer.ggml.pre = '%s' (known: smollm, llama-bpe, llama3, "
                       "llama-v3, gpt2, default)",
                       t->pre_name);
    }
    if (strcmp(t->model_name, "llama") == 0) {
        t->kind = MK_TOKENIZER_SPM;
        t->add_space_prefix = true;
        t->add_bos = true;
        return MK_OK;
    }
    return mk_fail(MK_ERR_TOKENIZER,
                   "tokenizer: unknown tokenizer.ggml.model = '%s' (known: gpt2 = byte-level BPE, llama = "
                   "SentencePiece)",
                   t->model_name);
}

/* Copy token texts (and merges) into one arena and index them. */
static mk_status mk_tok_read_vocab(const mk_gguf *g, mk_tokenizer *t) {
    mk_gguf_value_type et;
    size_t n = 0, n_merges = 0;
    if (mk_gguf_get_array_info(g, "tokenizer.ggml.tokens", &et, &n) != MK_OK || et != MK_GGUF_TYPE_STRING || n == 0 ||
        n > INT32_MAX)
        return mk_fail(MK_ERR_TOKENIZER, "tokenizer: tokenizer.ggml.tokens must be a non-empty array of strings");
    const bool has_merges = mk_gguf_find_key(g, "tokenizer.ggml.merges") >= 0;
    if (t->kind == MK_TOKENIZER_BPE && !has_merges)
        return mk_fail(MK_ERR_TOKENIZER, "tokenizer: a gpt2 (BPE) tokenizer needs tokenizer.ggml.merges");
    if (has_merges && (mk_gguf_get_array_info(g, "tokenizer.ggml.merges", &et, &n_merges) != MK_OK ||
                       et != MK_GGUF_TYPE_STRING || n_merges > INT32_MAX))
        return mk_fail(MK_ERR_TOKENIZER, "tokenizer: tokenizer.ggml.merges must be an array of strings");
    t->n_vocab = n;
    size_t bytes = 0;
    const char *s;
    size_t len;
    for (size_t i = 0; i < n; i++) {
        MK_TRY(mk_gguf_get_array_string(g, "tokenizer.ggml.tokens", i, &s, &len));
        bytes += len + 1;
    }
    for (size_t i = 0; i < n_merges; i++) {
        MK_TRY(mk_gguf_get_array_string(g, "tokenizer.ggml.merges", i, &s, &len));
        bytes += len + 1;
    }
    t->arena = malloc(bytes ? bytes : 1);
    t->text = calloc(n, sizeof *t->text);
    t->text_len = calloc(n, sizeof *t->text_len);
    t->type = calloc(n, sizeof *t->type);
    t->score = calloc(n, sizeof *t->score);
    t->eog = calloc(n, sizeof *t->eog);
    if (!t->arena || !t->text || !t->text_len || !t->type || !t->score || !t->eog)
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for %zu tokens", n);
    MK_TRY(mk_strmap_init(&t->vocab, n));
    MK_TRY(mk_strmap_init(&t->merges, n_merges));
    char *at = t->arena;
    for (size_t i = 0; i < n; i++) {
        MK_TRY(mk_gguf_get_array_string(g, "tokenizer.ggml.tokens", i, &s, &len));
        if (len > UINT32_MAX / 2) return mk_fail(MK_ERR_TOKENIZER, "tokenizer: token %zu is absurdly long", i);
        memcpy(at, s, len);
        at[len] = '\0';
        t->text[i] = at;
        t->text_len[i] = (uint32_t)len;
        t->type[i] = MK_TOKEN_NORMAL;
        if (len) mk_strmap_put(&t->vocab, at, len, (int32_t)i);
        at += len + 1;
    }
    for (size_t i = 0; i < n_merges; i++) {
        MK_TRY(mk_gguf_get_array_string(g, "tokenizer.ggml.merges", i, &s, &len));
        memcpy(at, s, len);
        at[len] = '\0';
        mk_strmap_put(&t->merges, at, len, (int32_t)i);
        at += len + 1;
    }
    /* token types and scores: optional, but when present they must cover the vocabulary */
    if (mk_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
        const void *data;
        size_t count;
        if (mk_gguf_get_array_info(g, "tokenizer.ggml.token_type", &et, &count) != MK_OK || et != MK_GGUF_TYPE_INT32 ||
            mk_gguf_get_array_data(g, "tokenizer.ggml.token_type", &data, &count) != MK_OK || count < n)
            return mk_fail(MK_ERR_TOKENIZER, "tokenizer: tokenizer.ggml.token_type must be int32[%zu]", n);
        for (size_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, (const char *)data + i * 4, 4);
            t->type[i] = v >= MK_TOKEN_NORMAL && v <= MK_TOKEN_BYTE ? (uint8_t)v : MK_TOKEN_UNDEFINED;
        }
    }
    if (mk_gguf_find_key(g, "tokenizer.ggml.scores") >= 0) {
        const void *data;
        size_t count;
        if (mk_gguf_get_array_info(g, "tokenizer.ggml.scores", &et, &count) != MK_OK || et != MK_GGUF_TYPE_FLOAT32 ||
            mk_gguf_get_array_data(g, "tokenizer.ggml.scores", &data, &count) != MK_OK || count < n)
            return mk_fail(MK_ERR_TOKENIZER, "tokenizer: tokenizer.ggml.scores must be float32[%zu]", n);
        memcpy(t->score, data, n * sizeof(float));
    }
    return MK_OK;
}

static mk_status mk_tok_read_specials(const mk_gguf *g, mk_tokenizer *t) {
    const size_t n = t->n_vocab;
    t->bos = mk_tok_id_key(g, "tokenizer.ggml.bos_token_id", n, -1);
    t->eos = mk_tok_id_key(g, "tokenizer.ggml.eos_token_id", n, -1);
    t->eot = mk_tok_id_key(g, "tokenizer.ggml.eot_token_id", n, -1);
    t->eom = mk_tok_id_key(g, "tokenizer.ggml.eom_token_id", n, -1);
    t->unk = mk_tok_id_key(g, "tokenizer.ggml.unknown_token_id", n, -1);
    mk_tok_bool_key(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    mk_tok_bool_key(g, "tokenizer.ggml.add_eos_token", &t->add_eos);
    mk_tok_bool_key(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
    if (t->kind == MK_TOKENIZER_BPE) t->add_space_prefix = false; /* a SentencePiece notion only */
    if (t->add_bos && t->bos < 0) return mk_fail(MK_ERR_TOKENIZER, "tokenizer: add_bos_token is set but there is no BOS id");
    if (t->add_eos && t->eos < 0) return mk_fail(MK_ERR_TOKENIZER, "tokenizer: add_eos_token is set but there is no EOS id");
    /* end of generation: the named ids, and the end-of-turn tokens known by their text
     * (a model that marks them normal by mistake gets them as control, as llama.cpp does) */
    for (size_t k = 0; k < sizeof mk_eog_texts / sizeof mk_eog_texts[0]; k++) {
        const int32_t id = mk_strmap_get(&t->vocab, mk_eog_texts[k], strlen(mk_eog_texts[k]));
        if (id >= 0) {
            t->eog[id] = true;
            if (t->type[id] != MK_TOKEN_CONTROL && t->type[id] != MK_TOKEN_USER_DEFINED) t->type[id] = MK_TOKEN_CONTROL;
        }
    }
    const int32_t named[] = {t->eos, t->eot, t->eom};
    for (size_t k = 0; k < 3; k++)
        if (named[k] >= 0) t->eog[named[k]] = true;
    /* split out before tokenizing: control, user-defined and unknown tokens, longest first */
    t->special = malloc(n * sizeof *t->special);
    if (!t->special) return mk_fail(MK_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        const uint8_t ty = t->type[i];
        if ((ty == MK_TOKEN_CONTROL || ty == MK_TOKEN_USER_DEFINED || ty == MK_TOKEN_UNKNOWN) && t->text_len[i] > 0)
            t->special[t->n_special++] = (int32_t)i;
    }
    qsort_r(t->special, t->n_special, sizeof *t->special, mk_tok_cmp_len_desc, t);
    /* SentencePiece byte fallback */
    for (unsigned b = 0; b < 256; b++) {
        char name[8];
        static const char hex[] = "0123456789ABCDEF";
        name[0] = '<', name[1] = '0', name[2] = 'x', name[3] = hex[b >> 4], name[4] = hex[b & 15], name[5] = '>';
        t->byte_token[b] = mk_strmap_get(&t->vocab, name, 6);
        if (t->byte_token[b] < 0) {
            const char c = (char)b;
            t->byte_token[b] = mk_strmap_get(&t->vocab, &c, 1);
        }
    }
    return MK_OK;
}

static mk_status mk_tok_read_template(const mk_gguf *g, mk_tokenizer *t) {
    if (mk_gguf_find_key(g, "tokenizer.chat_template") < 0) return MK_OK;
    const char *s;
    size_t len;
    if (mk_gguf_get_string(g, "tokenizer.chat_template", &s, &len) != MK_OK)
        return mk_fail(MK_ERR_TOKENIZER, "tokenizer: tokenizer.chat_template is not a string");
    t->chat_template = malloc(len + 1);
    if (!t->chat_template) return mk_fail(MK_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    memcpy(t->chat_template, s, len);
    t->chat_template[len] = '\0';
    return MK_OK;
}

mk_status mk_tokenizer_from_gguf(const mk_gguf *g, mk_tokenizer **out) {
    *out = NULL;
    mk_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return mk_fail(MK_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    mk_tok_byte_map(t);
    mk_status s = mk_tok_read_kind(g, t);
    if (s == MK_OK) s = mk_tok_read_vocab(g, t);
    if (s == MK_OK) s = mk_tok_read_specials(g, t);
    if (s == MK_OK) s = mk_tok_read_template(g, t);
    if (s == MK_OK && t->kind == MK_TOKENIZER_BPE) s = mk_bpe_setup(t);
    if (s != MK_OK) {
        mk_tokenizer_free(t);
        return s;
    }
    *out = t;
    return MK_OK;
}

mk_status mk_tokenizer_open(const mk_model *model, mk_tokenizer **out) {
    mk_clear_error();
    if (!model || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_tokenizer_open: NULL argument");
    *out = NULL;
    if (!model->gguf)
        return mk_fail(MK_ERR_TOKENIZER, "tokenizer: model '%s' has no GGUF file, so no tokenizer metadata",
                       model->architecture);
    return mk_tokenizer_from_gguf(model->gguf, out);
}

mk_status mk_tokenizer_open_file(const char *path, mk_tokenizer **out) {
    mk_clear_error();
    if (!path || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_tokenizer_open_file: NULL argument");
    *out = NULL;
    mk_gguf *g = NULL;
    MK_TRY(mk_gguf_open(path, &g));
    const mk_status s = mk_tokenizer_from_gguf(g, out);
    mk_gguf_close(g);
    return s;
}

void mk_tokenizer_free(mk_tokenizer *t) {
    if (!t) return; /* keeps the last error: freeing after a failure must not erase it */
    if (t->kind == MK_TOKENIZER_BPE) mk_bpe_teardown(t);
    mk_strmap_free(&t->vocab);
    mk_strmap_free(&t->merges);
    free(t->arena);
    free(t->text);
    free(t->text_len);
    free(t->type);
    free(t->score);
    free(t->eog);
    free(t->special);
    free(t->chat_template);
    free(t);
}

size_t mk_tokenizer_vocab_size(const mk_tokenizer *t) {
    return t ? t->n_vocab : 0;
}
int32_t mk_tokenizer_bos(const mk_tokenizer *t) {
    return t ? t->bos : -1;
}
int32_t mk_tokenizer_eos(const mk_tokenizer *t) {
    return t ? t->eos : -1;
}
bool mk_tokenizer_is_eog(const mk_tokenizer *t, int32_t id) {
    return t && id >= 0 && (size_t)id < t->n_vocab && t->eog[id];
}
const char *mk_tokenizer_token_text(const mk_tokenizer *t, int32_t id) {
    return t && id >= 0 && (size_t)id < t->n_vocab ? t->text[id] : NULL;
}

/* ================================================================== encode == */

/* A piece of the input: raw text still to tokenize, or a special token already found. */
typedef struct mk_fragment {
    size_t offset, len;
    int32_t token; /* -1 for raw text */
} mk_fragment;

typedef struct mk_fragments {
    mk_fragment *items;
    size_t n, cap;
} mk_fragments;

static mk_status mk_fragments_insert(mk_fragments *f, size_t at, mk_fragment item) {
    MK_TRY(mk_grow_array(&f->items, &f->cap, f->n + 1, sizeof *f->items, 16, "tokenizer fragments"));
    memmove(f->items + at + 1, f->items + at, (f->n - at) * sizeof *f->items);
    f->items[at] = item;
    f->n++;
    return MK_OK;
}

/* True when [at, at + n) overlaps one of the spans (sorted, not overlapping). */
static bool mk_in_literal(const mk_text_span *lit, size_t n_lit, size_t at, size_t n) {
    for (size_t i = 0; i < n_lit && lit[i].start < at + n; i++)
        if (lit[i].end > at) return true;
    return false;
}

/* The first occurrence of needle in fragment fr that a split may take: anywhere for a
 * user-defined token, outside the literal spans for a control token; NULL if none. */
static const char *mk_find_special(const mk_tokenizer *t, int32_t id, const char *text, const mk_fragment *fr,
                                   const mk_text_span *lit, size_t n_lit) {
    const char *needle = t->text[id];
    const size_t nlen = t->text_len[id];
    const bool anywhere = t->type[id] == MK_TOKEN_USER_DEFINED;
    for (size_t from = fr->offset; from + nlen <= fr->offset + fr->len;) {
        const char *hit = memmem(text + from, fr->offset + fr->len - from, needle, nlen);
        if (!hit) return NULL;
        const size_t at = (size_t)(hit - text);
        if (anywhere || !mk_in_literal(lit, n_lit, at, nlen)) return hit;
        from = at + 1;
    }
    return NULL;
}

/* Split every raw fragment at each occurrence of each special token, longest first. */
static mk_status mk_split_special(const mk_tokenizer *t, const char *text, bool parse_special, const mk_text_span *lit,
                                  size_t n_lit, mk_fragments *f) {
    for (size_t k = 0; k < t->n_special; k++) {
        const int32_t id = t->special[k];
        if (!parse_special && t->type[id] != MK_TOKEN_USER_DEFINED) continue;
        const size_t nlen = t->text_len[id];
        for (size_t i = 0; i < f->n; i++) {
            mk_fragment *fr = &f->items[i];
            if (fr->token >= 0 || fr->len < nlen) continue;
            const char *hit = mk_find_special(t, id, text, fr, lit, n_lit);
            if (!hit) continue;
            const size_t at = (size_t)(hit - text);
            const mk_fragment left = {fr->offset, at - fr->offset, -1};
            const mk_fragment right = {at + nlen, fr->offset + fr->len - at - nlen, -1};
            /* fragment i becomes [left] token [right]; the loop then looks at right */
            size_t j = i;
            if (left.len) f->items[j++] = left;
            else memmove(f->items + i, f->items + i + 1, (--f->n - i) * sizeof *f->items);
            MK_TRY(mk_fragments_insert(f, j, (mk_fragment){at, nlen, id}));
            if (right.len) MK_TRY(mk_fragments_insert(f, j + 1, right));
            i = j; /* next iteration visits j + 1: the right part */
        }
    }
    return MK_OK;
}

static mk_status mk_encode_into(const mk_tokenizer *t, const char *text, size_t len, unsigned flags,
                                const mk_text_span *lit, size_t n_lit, mk_id_buf *out) {
    for (size_t i = 0; i < len;) {
        const size_t n = mk_utf8_valid_len((const unsigned char *)text + i, len - i);
        if (n == 0)
            return mk_fail(MK_ERR_INVALID_UTF8, "tokenizer: the text is not valid UTF-8 (byte 0x%02x at offset %zu)",
                           (unsigned char)text[i], i);
        i += n;
    }
    const bool add_special = flags & MK_TOKENIZE_ADD_SPECIAL;
    if (add_special && t->add_bos) MK_TRY(mk_id_buf_push(out, t->bos));
    mk_fragments f = {0};
    mk_status s = MK_OK;
    if (len) s = mk_fragments_insert(&f, 0, (mk_fragment){0, len, -1});
    if (s == MK_OK) s = mk_split_special(t, text, flags & MK_TOKENIZE_PARSE_SPECIAL, lit, n_lit, &f);
    bool prev_special = true; /* SentencePiece puts its space prefix after a special token */
    for (size_t i = 0; s == MK_OK && i < f.n; i++) {
        const mk_fragment *fr = &f.items[i];
        if (fr->token >= 0) {
            s = mk_id_buf_push(out, fr->token);
            prev_special = true;
        } else if (t->kind == MK_TOKENIZER_BPE) {
            s = mk_bpe_encode(t, text + fr->offset, fr->len, out);
        } else {
            s = mk_spm_encode(t, text + fr->offset, fr->len, t->add_space_prefix && prev_special, out);
            prev_special = false;
        }
    }
    free(f.items);
    if (s == MK_OK && add_special && t->add_eos) s = mk_id_buf_push(out, t->eos);
    return s;
}

mk_status mk_tokenizer_encode(const mk_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **out_ids,
                              size_t *out_n) {
    mk_clear_error();
    return mk_tokenizer_encode_literal(t, text, len, flags, NULL, 0, out_ids, out_n);
}

mk_status mk_tokenizer_encode_literal(const mk_tokenizer *t, const char *text, size_t len, unsigned flags,
                                      const mk_text_span *literal, size_t n_literal, int32_t **out_ids, size_t *out_n) {
    if (!t || (!text && len) || !out_ids || !out_n || (!literal && n_literal))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_tokenizer_encode: NULL argument");
    *out_ids = NULL;
    *out_n = 0;
    mk_id_buf b = {0};
    const mk_status s = mk_encode_into(t, text, len, flags, literal, n_literal, &b);
    if (s != MK_OK) {
        free(b.ids);
        return s;
    }
    *out_ids = b.ids;
    *out_n = b.n;
    return MK_OK;
}

mk_status mk_tokenizer_count(const mk_tokenizer *t, const char *text, size_t len, unsigned flags, size_t *out_n) {
    mk_clear_error();
    if (!out_n) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_tokenizer_count: NULL argument");
    int32_t *ids = NULL;
    const mk_status s = mk_tokenizer_encode(t, text, len, flags, &ids, out_n);
    free(ids);
    return s;
}
