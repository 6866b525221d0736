/* SentencePiece (tokenizer.ggml.model = "llama"): spaces become U+2581, a space is put in
 * front of the text, and adjacent symbols merge while their concatenation is a token,
 * highest score (then leftmost) first. A symbol that is no token falls back to its bytes
 * (<0xXX>), or to the unknown token when the vocabulary lacks those too. */
#include <stdlib.h>
#include <string.h>

#include "core/mk_size.h"
#include "mk_error.h"
#include "text/tokenizer.h"

typedef struct mk_spm_sym {
    size_t offset, n;
    ptrdiff_t prev, next;
} mk_spm_sym;

typedef struct mk_spm_bigram {
    float score;
    ptrdiff_t left, right;
    size_t size;
} mk_spm_bigram;

typedef struct mk_spm_work {
    const mk_tokenizer *t;
    const char *text;
    mk_spm_sym *syms;
    mk_spm_bigram *heap;
    size_t heap_n, heap_cap;
} mk_spm_work;

static bool mk_spm_before(const mk_spm_bigram *a, const mk_spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static mk_status mk_spm_push(mk_spm_work *w, mk_spm_bigram b) {
    MK_TRY(mk_grow_array(&w->heap, &w->heap_cap, w->heap_n + 1, sizeof *w->heap, 64, "tokenizer merge heap"));
    size_t i = w->heap_n++;
    while (i > 0 && mk_spm_before(&b, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = b;
    return MK_OK;
}

static mk_spm_bigram mk_spm_pop(mk_spm_work *w) {
    const mk_spm_bigram top = w->heap[0];
    const mk_spm_bigram last = w->heap[--w->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= w->heap_n) break;
        if (c + 1 < w->heap_n && mk_spm_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!mk_spm_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (w->heap_n) w->heap[i] = last;
    return top;
}

static mk_status mk_spm_add(mk_spm_work *w, ptrdiff_t left, ptrdiff_t right) {
    if (left < 0 || right < 0) return MK_OK;
    const mk_spm_sym *l = &w->syms[left], *r = &w->syms[right];
    const int32_t id = mk_strmap_get(&w->t->vocab, w->text + l->offset, l->n + r->n); /* adjacent bytes */
    if (id < 0) return MK_OK;
    return mk_spm_push(w, (mk_spm_bigram){w->t->score[id], left, right, l->n + r->n});
}

static mk_status mk_spm_emit(const mk_tokenizer *t, const char *s, size_t n, mk_id_buf *out) {
    const int32_t id = mk_strmap_get(&t->vocab, s, n);
    if (id >= 0) return mk_id_buf_push(out, id);
    for (size_t i = 0; i < n; i++) {
        const int32_t b = t->byte_token[(unsigned char)s[i]];
        if (b >= 0) MK_TRY(mk_id_buf_push(out, b));
        else if (t->unk >= 0) MK_TRY(mk_id_buf_push(out, t->unk));
        else
            return mk_fail(MK_ERR_TOKENIZER, "tokenizer: byte 0x%02x has no token (no <0x%02X>, no unknown token)",
                           (unsigned char)s[i], (unsigned char)s[i]);
    }
    return MK_OK;
}

mk_status mk_spm_encode(const mk_tokenizer *t, const char *raw, size_t raw_len, bool prefix_space, mk_id_buf *out) {
    /* escape: ' ' -> U+2581 (3 bytes), with the optional space in front */
    size_t spaces = prefix_space ? 1 : 0;
    for (size_t i = 0; i < raw_len; i++) spaces += raw[i] == ' ';
    const size_t len = raw_len + 2 * spaces + (prefix_space ? 1 : 0);
    char *text = malloc(len ? len : 1);
    mk_spm_sym *syms = malloc((len ? len : 1) * sizeof *syms);
    mk_spm_work w = {t, text, syms, NULL, 0, 0};
    if (!text || !syms) {
        free(text);
        free(syms);
        return mk_fail(MK_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for %zu bytes", len);
    }
    size_t at = 0;
    for (size_t i = 0; i < raw_len + (prefix_space ? 1 : 0); i++) {
        const char c = prefix_space ? (i == 0 ? ' ' : raw[i - 1]) : raw[i];
        if (c == ' ') memcpy(text + at, "\xe2\x96\x81", 3), at += 3;
        else text[at++] = c;
    }
    /* one symbol per UTF-8 character (the input was validated) */
    size_t n = 0;
    for (size_t i = 0; i < at;) {
        size_t cl = mk_utf8_valid_len((const unsigned char *)text + i, at - i);
        if (cl == 0) cl = 1;
        syms[n] = (mk_spm_sym){i, cl, (ptrdiff_t)n - 1, -1};
        if (n) syms[n - 1].next = (ptrdiff_t)n;
        n++;
        i += cl;
    }
    mk_status s = MK_OK;
    for (size_t i = 1; s == MK_OK && i < n; i++) s = mk_spm_add(&w, (ptrdiff_t)i - 1, (ptrdiff_t)i);
    while (s == MK_OK && w.heap_n) {
        const mk_spm_bigram b = mk_spm_pop(&w);
        mk_spm_sym *l = &syms[b.left], *r = &syms[b.right];
        if (l->n == 0 || r->n == 0 || l->next != b.right || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) syms[r->next].prev = b.left;
        s = mk_spm_add(&w, l->prev, b.left);
        if (s == MK_OK) s = mk_spm_add(&w, b.left, l->next);
    }
    for (ptrdiff_t i = n ? 0 : -1; s == MK_OK && i >= 0; i = syms[i].next)
        s = mk_spm_emit(t, text + syms[i].offset, syms[i].n, out);
    free(w.heap);
    free(syms);
    free(text);
    return s;
}
