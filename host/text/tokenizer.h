/* Internal to the tokenizer files (tokenizer.c: loading and the encode driver,
 * tokenizer_bpe.c: byte-level BPE, tokenizer_spm.c: SentencePiece, detokenizer.c,
 * chat_template.c). */
#ifndef MK_TOKENIZER_H
#define MK_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meshkern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mk_gguf mk_gguf;

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
typedef enum mk_token_type {
    MK_TOKEN_UNDEFINED = 0,
    MK_TOKEN_NORMAL = 1,
    MK_TOKEN_UNKNOWN = 2,
    MK_TOKEN_CONTROL = 3,
    MK_TOKEN_USER_DEFINED = 4,
    MK_TOKEN_UNUSED = 5,
    MK_TOKEN_BYTE = 6,
} mk_token_type;

typedef enum mk_tokenizer_kind { MK_TOKENIZER_BPE = 1, MK_TOKENIZER_SPM = 2 } mk_tokenizer_kind;

/* Pre-tokenizers of byte-level BPE: which regex list splits the text into words. */
typedef enum mk_pretokenizer {
    MK_PRE_GPT2 = 1,   /* "gpt2", "default" */
    MK_PRE_SMOLLM = 2, /* "smollm": every digit alone, then the GPT-2 rule */
    MK_PRE_LLAMA3 = 3, /* "llama-bpe", "llama3", "llama-v3" */
} mk_pretokenizer;

/* Open-addressing map from a byte string (borrowed, stored elsewhere) to an int32. */
typedef struct mk_strmap {
    size_t cap;           /* power of two */
    const char **keys;    /* [cap], NULL = empty */
    uint32_t *key_lens;   /* [cap] */
    int32_t *values;      /* [cap] */
} mk_strmap;

mk_status mk_strmap_init(mk_strmap *m, size_t n_keys);
void mk_strmap_free(mk_strmap *m);
/* Insert unless present (the first insertion wins, as the vocabulary's lowest id does). */
void mk_strmap_put(mk_strmap *m, const char *key, size_t len, int32_t value);
/* Value of key or -1. */
int32_t mk_strmap_get(const mk_strmap *m, const char *key, size_t len);

typedef struct mk_pcre2_code mk_pcre2_code; /* pcre2_code_8, kept out of this header */

struct mk_tokenizer {
    mk_tokenizer_kind kind;
    mk_pretokenizer pre;
    char model_name[32]; /* tokenizer.ggml.model */
    char pre_name[32];   /* tokenizer.ggml.pre ("" for SentencePiece) */
    size_t n_vocab;
    char *arena;         /* every token text, then every merge, NUL-terminated */
    const char **text;   /* [n_vocab] into arena */
    uint32_t *text_len;  /* [n_vocab] */
    uint8_t *type;       /* [n_vocab] mk_token_type */
    float *score;        /* [n_vocab] (0 when the file has none) */
    bool *eog;           /* [n_vocab] end of generation */
    mk_strmap vocab;     /* text -> id */
    mk_strmap merges;    /* "left right" -> rank */
    int32_t *special;    /* ids split out before tokenizing, longest text first */
    size_t n_special;
    int32_t bos, eos, eot, eom, unk; /* -1 when absent */
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t byte_token[256];        /* SentencePiece byte fallback (<0xXX>), -1 if absent */
    char byte_char[256][3];         /* BPE: byte -> its printable code point, UTF-8 */
    uint8_t byte_char_len[256];
    int16_t char_byte[512];         /* BPE: code point (< 512) -> byte, -1 if none */
    mk_pcre2_code *regex[2];        /* BPE pre-tokenizer, applied in order */
    size_t n_regex;
    char *chat_template;            /* tokenizer.chat_template, NUL-terminated, or NULL */
};

/* Load from an open GGUF (used by mk_tokenizer_open and tests). */
mk_status mk_tokenizer_from_gguf(const mk_gguf *g, mk_tokenizer **out);

/* A growable array of ids that encode appends to. */
typedef struct mk_id_buf {
    int32_t *ids;
    size_t n, cap;
} mk_id_buf;
mk_status mk_id_buf_push(mk_id_buf *b, int32_t id);

/* A byte range [start, end) of a text. */
typedef struct mk_text_span {
    size_t start, end;
} mk_text_span;

/* mk_tokenizer_encode's work, with the text's control tokens found only outside the
 * `literal` spans (sorted, not overlapping): a control token's text inside one is encoded as
 * plain text (a chat message's content: chat_template.c). User-defined tokens are split
 * everywhere, as without MK_TOKENIZE_PARSE_SPECIAL. */
mk_status mk_tokenizer_encode_literal(const mk_tokenizer *t, const char *text, size_t len, unsigned flags,
                                      const mk_text_span *literal, size_t n_literal, int32_t **out_ids, size_t *out_n);

/* mk_chat_apply's text and, when spans is given, where each message's content sits in it
 * (sorted, not overlapping: mk_tokenizer_encode_literal's `literal`). *out and *spans are
 * malloc'd (free; *out also through mk_buffer_free). */
mk_status mk_chat_render_spans(const mk_tokenizer *t, const mk_chat_message *messages, size_t n, bool gen,
                               char **out, size_t *out_len, mk_text_span **spans, size_t *n_spans);
/* text[from, len) of a rendered conversation encoded as mk_chat_encode encodes the whole:
 * the template's control tokens parsed, what lies inside the contents' spans kept as text
 * (a conversation's new turns, fed after the part a KV cache holds: meshkern chat). */
mk_status mk_chat_encode_from(const mk_tokenizer *t, const char *text, size_t len, size_t from,
                              const mk_text_span *spans, size_t n_spans, int32_t **ids, size_t *n_ids);

/* Tokenize one piece of raw text (no special tokens inside) and append the ids. */
mk_status mk_bpe_setup(mk_tokenizer *t);
void mk_bpe_teardown(mk_tokenizer *t);
mk_status mk_bpe_encode(const mk_tokenizer *t, const char *text, size_t len, mk_id_buf *out);
/* `prefix_space`: SentencePiece's space prefix for this fragment. */
mk_status mk_spm_encode(const mk_tokenizer *t, const char *text, size_t len, bool prefix_space, mk_id_buf *out);

/* Bytes of one token as decode emits them, written to buf[cap] (*n set; a token's piece is
 * at most its text length + 3 bytes). */
void mk_token_piece(const mk_tokenizer *t, int32_t id, unsigned flags, char *buf, size_t cap, size_t *n);

/* Length of the valid UTF-8 sequence starting at s[0] (of len bytes), or 0 if invalid or
 * incomplete. */
size_t mk_utf8_valid_len(const unsigned char *s, size_t len);

#ifdef __cplusplus
}
#endif
#endif
