/* Byte-level BPE (tokenizer.ggml.model = "gpt2"): the pre-tokenizer's regexes split the
 * text into words (PCRE2 with UTF + UCP does the Unicode categories and the look-ahead),
 * each word's bytes become GPT-2's printable code points, and adjacent symbols merge by
 * the rank of their pair in tokenizer.ggml.merges, lowest rank (then leftmost) first. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "core/mk_size.h"
#include "mk_error.h"
#include "text/tokenizer.h"

/* The regex lists, applied in order: each one splits every piece the previous one left
 * (text between matches stays a piece of its own). */
static const char *const mk_re_gpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char *const mk_re_digits = "\\p{N}";
static const char *const mk_re_llama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static mk_status mk_bpe_compile(mk_tokenizer *t, const char *pattern) {
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK,
                                   &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(err, msg, sizeof msg);
        return mk_fail(MK_ERR_INTERNAL, "tokenizer: pre-tokenizer regex does not compile at %zu: %s", (size_t)at,
                       (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* interpreted when JIT is unavailable */
    t->regex[t->n_regex++] = (mk_pcre2_code *)re;
    return MK_OK;
}

mk_status mk_bpe_setup(mk_tokenizer *t) {
    switch (t->pre) {
    case MK_PRE_SMOLLM:
        MK_TRY(mk_bpe_compile(t, mk_re_digits));
        return mk_bpe_compile(t, mk_re_gpt2);
    case MK_PRE_LLAMA3: return mk_bpe_compile(t, mk_re_llama3);
    case MK_PRE_GPT2: return mk_bpe_compile(t, mk_re_gpt2);
    }
    return mk_fail(MK_ERR_INTERNAL, "tokenizer: no pre-tokenizer");
}

void mk_bpe_teardown(mk_tokenizer *t) {
    for (size_t i = 0; i < t->n_regex; i++) pcre2_code_free((pcre2_code *)t->regex[i]);
    t->n_regex = 0;
}

/* ============================================================= pre-tokenize == */

typedef struct mk_span {
    size_t offset, len;
} mk_span;

typedef struct mk_spans {
    mk_span *items;
    size_t n, cap;
} mk_spans;

static mk_status mk_spans_push(mk_spans *s, size_t offset, size_t len) {
    MK_TRY(mk_grow_array(&s->items, &s->cap, s->n + 1, sizeof *s->items, 64, "tokenizer words"));
    s->items[s->n++] = (mk_span){offset, len};
    return MK_OK;
}

/* Split each span of `in` by `re` into `out`: matches and the gaps between them. The
 * subject is the span alone, so a look-ahead never sees past it. */
static mk_status mk_regex_split(const pcre2_code *re, const char *text, const mk_spans *in, mk_spans *out,
                                pcre2_match_data *md, pcre2_match_context *mc) {
    for (size_t k = 0; k < in->n; k++) {
        const char *subject = text + in->items[k].offset;
        const size_t len = in->items[k].len, base = in->items[k].offset;
        size_t pos = 0, gap = 0;
        while (pos < len) {
            const int rc = pcre2_match(re, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK, md, mc);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[128];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return mk_fail(MK_ERR_TOKENIZER, "tokenizer: pre-tokenizer match failed at byte %zu: %s", base + pos,
                               (const char *)msg);
            }
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            const size_t s = ov[0], e = ov[1];
            if (e == s) { /* no pattern here matches empty; step over one character anyway */
                pos = s + 1;
                while (pos < len && ((unsigned char)subject[pos] & 0xc0) == 0x80) pos++;
                continue;
            }
            if (s > gap) MK_TRY(mk_spans_push(out, base + gap, s - gap));
            MK_TRY(mk_spans_push(out, base + s, e - s));
            pos = gap = e;
        }
        if (gap < len) MK_TRY(mk_spans_push(out, base + gap, len - gap));
    }
    return MK_OK;
}

/* ===================================================================== merge == */

typedef struct mk_sym {
    size_t offset, n;     /* bytes of the word (byte-encoded) */
    ptrdiff_t prev, next; /* -1 at the ends */
} mk_sym;

typedef struct mk_bigram {
    int32_t rank;
    ptrdiff_t left, right;
    size_t size; /* bytes of left + right when queued: a later merge makes it stale */
} mk_bigram;

typedef struct mk_bpe_work {
    char *word; /* the byte-encoded word */
    size_t word_cap;
    mk_sym *syms;
    size_t sym_cap;
    mk_bigram *heap;
    size_t heap_n, heap_cap;
    char *pair; /* "left right" lookup key */
    size_t pair_cap;
} mk_bpe_work;

static bool mk_bigram_before(const mk_bigram *a, const mk_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static mk_status mk_heap_push(mk_bpe_work *w, mk_bigram b) {
    MK_TRY(mk_grow_array(&w->heap, &w->heap_cap, w->heap_n + 1, sizeof *w->heap, 64, "tokenizer merge heap"));
    size_t i = w->heap_n++;
    while (i > 0 && mk_bigram_before(&b, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = b;
    return MK_OK;
}

static mk_bigram mk_heap_pop(mk_bpe_work *w) {
    const mk_bigram top = w->heap[0];
    const mk_bigram last = w->heap[--w->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->heap_n) break;
        if (c + 1 < w->heap_n && mk_bigram_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!mk_bigram_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->heap_n) w->heap[i] = last;
    return top;
}

static mk_status mk_add_bigram(const mk_tokenizer *t, mk_bpe_work *w, ptrdiff_t left, ptrdiff_t right) {
    if (left < 0 || right < 0) return MK_OK;
    const mk_sym *l = &w->syms[left], *r = &w->syms[right];
    const size_t n = l->n + 1 + r->n;
    MK_TRY(mk_grow_array(&w->pair, &w->pair_cap, n, 1, 64, "tokenizer merge pair"));
    memcpy(w->pair, w->word + l->offset, l->n);
    w->pair[l->n] = ' ';
    memcpy(w->pair + l->n + 1, w->word + r->offset, r->n);
    const int32_t rank = mk_strmap_get(&t->merges, w->pair, n);
    if (rank < 0) return MK_OK;
    return mk_heap_push(w, (mk_bigram){rank, left, right, l->n + r->n});
}

/* One word (raw bytes) to ids. */
static mk_status mk_bpe_word(const mk_tokenizer *t, const char *raw, size_t raw_len, mk_bpe_work *w, mk_id_buf *out) {
    MK_TRY(mk_grow_array(&w->word, &w->word_cap, raw_len * 2, 1, 64, "tokenizer word"));
    size_t len = 0;
    for (size_t i = 0; i < raw_len; i++) {
        const unsigned char b = (unsigned char)raw[i];
        memcpy(w->word + len, t->byte_char[b], t->byte_char_len[b]);
        len += t->byte_char_len[b];
    }
    if (t->ignore_merges) { /* a word that is a token is that token (Llama-3) */
        const int32_t id = mk_strmap_get(&t->vocab, w->word, len);
        if (id >= 0) return mk_id_buf_push(out, id);
    }
    /* one symbol per code point (1 or 2 bytes in the byte-level alphabet) */
    MK_TRY(mk_grow_array(&w->syms, &w->sym_cap, len, sizeof *w->syms, 64, "tokenizer symbols"));
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        const size_t cl = ((unsigned char)w->word[i] & 0x80) ? 2 : 1;
        w->syms[n] = (mk_sym){i, cl, (ptrdiff_t)n - 1, -1};
        if (n) w->syms[n - 1].next = (ptrdiff_t)n;
        n++;
        i += cl;
    }
    w->heap_n = 0;
    for (size_t i = 1; i < n; i++) MK_TRY(mk_add_bigram(t, w, (ptrdiff_t)i - 1, (ptrdiff_t)i));
    while (w->heap_n) {
        const mk_bigram b = mk_heap_pop(w);
        mk_sym *l = &w->syms[b.left], *r = &w->syms[b.right];
        if (l->n == 0 || r->n == 0 || l->next != b.right || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->syms[r->next].prev = b.left;
        MK_TRY(mk_add_bigram(t, w, l->prev, b.left));
        MK_TRY(mk_add_bigram(t, w, b.left, l->next));
    }
    for (ptrdiff_t i = 0; i >= 0 && (size_t)i < n; i = w->syms[i].next) {
        const mk_sym *s = &w->syms[i];
        const int32_t id = mk_strmap_get(&t->vocab, w->word + s->offset, s->n);
        if (id >= 0) {
            MK_TRY(mk_id_buf_push(out, id));
            continue;
        }
        /* a symbol the vocabulary lacks: its single bytes that are tokens (llama.cpp's rule) */
        for (size_t j = 0; j < s->n; j++) {
            const int32_t bid = mk_strmap_get(&t->vocab, w->word + s->offset + j, 1);
            if (bid >= 0) MK_TRY(mk_id_buf_push(out, bid));
        }
    }
    return MK_OK;
}

mk_status mk_bpe_encode(const mk_tokenizer *t, const char *text, size_t len, mk_id_buf *out) {
    mk_spans a = {0}, b = {0};
    mk_bpe_work w = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    /* a JIT stack per call: long runs of whitespace backtrack deeper than the default */
    pcre2_jit_stack *js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    mk_status s = md && mc ? mk_spans_push(&a, 0, len) : mk_fail(MK_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    if (s == MK_OK && js) pcre2_jit_stack_assign(mc, NULL, js);
    for (size_t r = 0; s == MK_OK && r < t->n_regex; r++) {
        b.n = 0;
        s = mk_regex_split((const pcre2_code *)t->regex[r], text, &a, &b, md, mc);
        const mk_spans tmp = a;
        a = b;
        b = tmp;
    }
    for (size_t i = 0; s == MK_OK && i < a.n; i++) s = mk_bpe_word(t, text + a.items[i].offset, a.items[i].len, &w, out);
    free(a.items);
    free(b.items);
    free(w.word);
    free(w.syms);
    free(w.heap);
    free(w.pair);
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    return s;
}
