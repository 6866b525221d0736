/* Ids back to text: each token's piece (byte-level code points back to bytes, U+2581 back
 * to a space, <0xXX> to its byte, control tokens to nothing unless asked), and a streaming
 * decoder that holds the bytes of an unfinished UTF-8 sequence until it completes. */
#include <stdlib.h>
#include <string.h>

#include "core/mk_size.h"
#include "mk_error.h"
#include "text/tokenizer.h"

static int mk_hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

void mk_token_piece(const mk_tokenizer *t, int32_t id, unsigned flags, char *buf, size_t cap, size_t *n) {
    *n = 0;
    const char *s = t->text[id];
    const size_t len = t->text_len[id];
    const uint8_t type = t->type[id];
    if (type == MK_TOKEN_CONTROL || type == MK_TOKEN_UNKNOWN || type == MK_TOKEN_USER_DEFINED) {
        if (type != MK_TOKEN_USER_DEFINED && !(flags & MK_DECODE_SPECIAL)) return;
        *n = len < cap ? len : cap;
        memcpy(buf, s, *n);
        return;
    }
    if (type == MK_TOKEN_BYTE) { /* "<0xXX>" */
        if (len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && mk_hex_digit(s[3]) >= 0 && mk_hex_digit(s[4]) >= 0 &&
            cap) {
            buf[0] = (char)(mk_hex_digit(s[3]) * 16 + mk_hex_digit(s[4]));
            *n = 1;
        }
        return;
    }
    if (type != MK_TOKEN_NORMAL) return; /* unused / undefined: nothing, as llama.cpp */
    size_t o = 0;
    if (t->kind == MK_TOKENIZER_SPM) {
        for (size_t i = 0; i < len && o < cap;) {
            if (i + 3 <= len && memcmp(s + i, "\xe2\x96\x81", 3) == 0) buf[o++] = ' ', i += 3;
            else buf[o++] = s[i++];
        }
    } else { /* byte-level: each code point below 512 stands for one byte */
        for (size_t i = 0; i < len && o < cap;) {
            const unsigned char c = (unsigned char)s[i];
            unsigned cp = c;
            size_t cl = 1;
            if ((c & 0xe0) == 0xc0 && i + 1 < len) cp = ((c & 0x1fu) << 6) | ((unsigned char)s[i + 1] & 0x3fu), cl = 2;
            const int b = cp < 512 ? t->char_byte[cp] : -1;
            if (b >= 0) {
                buf[o++] = (char)b;
            } else { /* not in the byte alphabet: keep the bytes as they are */
                const size_t keep = (c >= 0xc0) ? (c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2) : 1;
                for (size_t k = 0; k < keep && i + k < len && o < cap; k++) buf[o++] = s[i + k];
                cl = keep;
            }
            i += cl;
        }
    }
    *n = o;
}

/* ============================================================ whole decode == */

mk_status mk_tokenizer_decode(const mk_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **out,
                              size_t *out_len) {
    mk_clear_error();
    if (!t || (!ids && n) || !out || !out_len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_tokenizer_decode: NULL argument");
    *out = NULL;
    *out_len = 0;
    size_t cap = 1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_vocab)
            return mk_fail(MK_ERR_TOKEN_OUT_OF_RANGE, "decode: token id %d at %zu is outside the vocabulary of %zu",
                           ids[i], i, t->n_vocab);
        cap += t->text_len[ids[i]] + 1;
    }
    char *buf = malloc(cap);
    if (!buf) return mk_fail(MK_ERR_OUT_OF_MEMORY, "decode: out of memory for %zu bytes", cap);
    size_t len = 0;
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        size_t m;
        mk_token_piece(t, ids[i], flags, buf + len, cap - 1 - len, &m);
        /* SentencePiece: the space the encoder put in front is not part of the text */
        if (first && m) {
            if (t->add_space_prefix && buf[len] == ' ') memmove(buf + len, buf + len + 1, --m);
            first = false; /* only the first non-empty piece carries the prefix */
        }
        len += m;
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return MK_OK;
}

/* ========================================================== stream decode == */

struct mk_detokenizer {
    const mk_tokenizer *tok;
    unsigned flags;
    bool first;
    char held[4]; /* start of an unfinished UTF-8 sequence */
    size_t n_held;
    char *buf;
    size_t cap;
};

mk_status mk_detokenizer_create(const mk_tokenizer *t, unsigned flags, mk_detokenizer **out) {
    mk_clear_error();
    if (!t || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_detokenizer_create: NULL argument");
    *out = NULL;
    mk_detokenizer *d = calloc(1, sizeof *d);
    if (!d) return mk_fail(MK_ERR_OUT_OF_MEMORY, "detokenizer: out of memory");
    d->tok = t;
    d->flags = flags;
    d->first = true;
    *out = d;
    return MK_OK;
}

void mk_detokenizer_free(mk_detokenizer *d) {
    if (!d) return; /* keeps the last error: freeing after a failure must not erase it */
    free(d->buf);
    free(d);
}

static mk_status mk_detok_reserve(mk_detokenizer *d, size_t need) {
    return mk_grow_array(&d->buf, &d->cap, need, 1, 64, "detokenizer");
}

/* Does s[0..len) start an unfinished (but so far valid) UTF-8 sequence? */
static bool mk_utf8_incomplete(const unsigned char *s, size_t len) {
    const unsigned c = s[0];
    const size_t need = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (need == 0 || len >= need) return false;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return false;
    /* the second byte's range rules out overlongs and surrogates early */
    if (len >= 2 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) ||
                     (c == 0xf4 && s[1] > 0x8f)))
        return false;
    return true;
}

mk_status mk_detokenizer_push(mk_detokenizer *d, int32_t id, const char **text, size_t *len) {
    mk_clear_error();
    if (!d || !text || !len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_detokenizer_push: NULL argument");
    *text = "";
    *len = 0;
    const mk_tokenizer *t = d->tok;
    if (id < 0 || (size_t)id >= t->n_vocab)
        return mk_fail(MK_ERR_TOKEN_OUT_OF_RANGE, "decode: token id %d is outside the vocabulary of %zu", id, t->n_vocab);
    const size_t piece_cap = t->text_len[id] + 4;
    /* raw = held bytes + piece; out (after it) gets at most 3 bytes per raw byte */
    MK_TRY(mk_detok_reserve(d, (d->n_held + piece_cap) * 4));
    char *raw = d->buf;
    memcpy(raw, d->held, d->n_held);
    size_t m;
    mk_token_piece(t, id, d->flags, raw + d->n_held, piece_cap, &m);
    if (d->first && m) {
        if (t->add_space_prefix && d->n_held == 0 && raw[0] == ' ') memmove(raw, raw + 1, --m);
        d->first = false; /* only the first non-empty piece carries the prefix */
    }
    const size_t n = d->n_held + m;
    d->n_held = 0;
    char *o = raw + n;
    size_t olen = 0;
    for (size_t i = 0; i < n;) {
        const size_t cl = mk_utf8_valid_len((const unsigned char *)raw + i, n - i);
        if (cl) {
            memcpy(o + olen, raw + i, cl);
            olen += cl;
            i += cl;
        } else if (mk_utf8_incomplete((const unsigned char *)raw + i, n - i)) {
            memcpy(d->held, raw + i, n - i); /* < 4 bytes: the rest of the stream */
            d->n_held = n - i;
            break;
        } else {
            memcpy(o + olen, "\xef\xbf\xbd", 3); /* U+FFFD for a byte that cannot start UTF-8 here */
            olen += 3;
            i++;
        }
    }
    *text = o;
    *len = olen;
    return MK_OK;
}

mk_status mk_detokenizer_flush(mk_detokenizer *d, const char **text, size_t *len) {
    mk_clear_error();
    if (!d || !text || !len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_detokenizer_flush: NULL argument");
    *text = "";
    *len = 0;
    if (d->n_held) {
        MK_TRY(mk_detok_reserve(d, 4));
        memcpy(d->buf, "\xef\xbf\xbd", 3);
        *text = d->buf;
        *len = 3;
    }
    d->n_held = 0;
    d->first = true;
    return MK_OK;
}
