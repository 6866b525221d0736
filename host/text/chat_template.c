/* Chat templates: tokenizer.chat_template is a Jinja program; rather than run arbitrary
 * Jinja, recognise the common shapes by their marker tokens and render those exactly as
 * their reference templates do. Anything else is refused, naming the template. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mk_size.h"
#include "mk_error.h"
#include "text/tokenizer.h"

static const struct {
    const char *marker; /* text that only this shape's template contains */
    mk_chat_template_kind kind;
    const char *name;
} mk_chat_shapes[] = {
    {"<|im_start|>", MK_CHAT_TEMPLATE_CHATML, "chatml"},
    {"<|start_header_id|>", MK_CHAT_TEMPLATE_LLAMA3, "llama3"},
    {"[INST]", MK_CHAT_TEMPLATE_LLAMA2, "llama2"},
};

const char *mk_chat_template_name(mk_chat_template_kind kind) {
    for (size_t i = 0; i < sizeof mk_chat_shapes / sizeof mk_chat_shapes[0]; i++)
        if (mk_chat_shapes[i].kind == kind) return mk_chat_shapes[i].name;
    return "unknown";
}

mk_status mk_chat_template_detect(const mk_tokenizer *t, mk_chat_template_kind *out) {
    mk_clear_error();
    if (!t || !out) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_chat_template_detect: NULL argument");
    if (!t->chat_template)
        return mk_fail(MK_ERR_CHAT_TEMPLATE, "chat template: the model has no tokenizer.chat_template (send the prompt "
                                             "untemplated with --raw)");
    for (size_t i = 0; i < sizeof mk_chat_shapes / sizeof mk_chat_shapes[0]; i++)
        if (strstr(t->chat_template, mk_chat_shapes[i].marker)) {
            *out = mk_chat_shapes[i].kind;
            return MK_OK;
        }
    return mk_fail(MK_ERR_CHAT_TEMPLATE,
                   "chat template not recognised (known: ChatML <|im_start|>, Llama-3 <|start_header_id|>, Llama-2 "
                   "[INST]); it begins \"%.80s\" (send the prompt untemplated with --raw)",
                   t->chat_template);
}

/* ============================================================= text buffer == */

typedef struct mk_text {
    char *s;
    size_t n, cap;
    mk_text_span *content; /* where the messages' contents sit in s, in order */
    size_t n_content, cap_content;
    bool oom;
} mk_text;

static void mk_text_add(mk_text *b, const char *s, size_t n) {
    if (b->oom) return;
    if (mk_grow_array(&b->s, &b->cap, b->n + n + 1, 1, 256, "chat template text") != MK_OK) {
        b->oom = true;
        return;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void mk_text_cat(mk_text *b, const char *s) { mk_text_add(b, s, strlen(s)); }

/* Jinja's trim / Python's str.strip(): whitespace off both ends. */
static void mk_text_strip(mk_text *b, const char *s) {
    static const char ws[] = " \t\n\r\f\v";
    size_t n = strlen(s);
    while (n && strchr(ws, s[n - 1])) n--;
    while (n && strchr(ws, *s)) s++, n--;
    mk_text_add(b, s, n);
}

/* A message's content (stripped or not), its place recorded: mk_chat_encode keeps the text
 * of control tokens inside it as text. */
static void mk_text_content(mk_text *b, const char *s, bool strip) {
    const size_t start = b->n;
    if (strip) mk_text_strip(b, s);
    else mk_text_cat(b, s);
    if (b->oom || b->n == start) return;
    if (mk_grow_array(&b->content, &b->cap_content, b->n_content + 1, sizeof *b->content, 8, "chat template spans") !=
        MK_OK) {
        b->oom = true;
        return;
    }
    b->content[b->n_content++] = (mk_text_span){start, b->n};
}

/* ============================================================ the shapes == */

/* SmolLM2's template adds its own system turn when the conversation has none: take the
 * literal "<|im_start|>system\n...<|im_end|>" out of the template text. */
static const char *mk_chatml_default_system(const char *tmpl, size_t *len) {
    if (!strstr(tmpl, "!= 'system'") && !strstr(tmpl, "!= \"system\"")) return NULL;
    /* the newline after "system" is a real one or a Jinja "\n" escape */
    static const char *const opens[] = {"<|im_start|>system\n", "<|im_start|>system\\n"};
    for (size_t k = 0; k < 2; k++) {
        const char *p = strstr(tmpl, opens[k]);
        if (!p) continue;
        p += strlen(opens[k]);
        const char *e = strstr(p, "<|im_end|>");
        if (!e) return NULL;
        *len = (size_t)(e - p);
        return p;
    }
    return NULL;
}

/* Template source text as Jinja would print it: "\n" escapes become newlines. */
static void mk_text_unescape(mk_text *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n && s[i + 1] == 'n') mk_text_add(b, "\n", 1), i++;
        else mk_text_add(b, s + i, 1);
    }
}

static mk_status mk_render_chatml(const mk_tokenizer *t, const mk_chat_message *m, size_t n, bool gen, mk_text *b) {
    size_t sys_len = 0;
    const char *sys = mk_chatml_default_system(t->chat_template, &sys_len);
    if (sys && n > 0 && strcmp(m[0].role, "system") != 0) {
        mk_text_cat(b, "<|im_start|>system\n");
        mk_text_unescape(b, sys, sys_len);
        mk_text_cat(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        mk_text_cat(b, "<|im_start|>");
        mk_text_cat(b, m[i].role);
        mk_text_cat(b, "\n");
        mk_text_content(b, m[i].content, false);
        mk_text_cat(b, "<|im_end|>\n");
    }
    if (gen) mk_text_cat(b, "<|im_start|>assistant\n");
    return MK_OK;
}

static mk_status mk_render_llama3(const mk_tokenizer *t, const mk_chat_message *m, size_t n, bool gen, mk_text *b) {
    for (size_t i = 0; i < n; i++) {
        if (i == 0 && t->bos >= 0) mk_text_cat(b, t->text[t->bos]);
        mk_text_cat(b, "<|start_header_id|>");
        mk_text_cat(b, m[i].role);
        mk_text_cat(b, "<|end_header_id|>\n\n");
        mk_text_content(b, m[i].content, true);
        mk_text_cat(b, "<|eot_id|>");
    }
    if (gen) mk_text_cat(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return MK_OK;
}

/* Llama-2: the system prompt goes inside the first [INST]; turns must alternate user,
 * assistant, user, ... (the reference template raises otherwise). */
static mk_status mk_render_llama2(const mk_tokenizer *t, const mk_chat_message *m, size_t n, mk_text *b) {
    const char *bos = t->bos >= 0 ? t->text[t->bos] : "";
    const char *eos = t->eos >= 0 ? t->text[t->eos] : "";
    const char *system = NULL;
    if (n && strcmp(m[0].role, "system") == 0) system = m[0].content, m++, n--;
    for (size_t i = 0; i < n; i++) {
        const bool user = strcmp(m[i].role, "user") == 0;
        if (user != (i % 2 == 0) || (!user && strcmp(m[i].role, "assistant") != 0))
            return mk_fail(MK_ERR_CHAT_TEMPLATE,
                           "chat template llama2: message %zu has role '%s'; roles must alternate "
                           "user/assistant/user/... after an optional system message",
                           i, m[i].role);
        if (user) {
            mk_text_cat(b, bos);
            mk_text_cat(b, "[INST] ");
            if (i == 0 && system) {
                mk_text t2 = {0};
                mk_text_cat(&t2, "<<SYS>>\n");
                mk_text_cat(&t2, system);
                mk_text_cat(&t2, "\n<</SYS>>\n\n");
                mk_text_cat(&t2, m[i].content);
                if (t2.oom) b->oom = true;
                else mk_text_content(b, t2.s, true);
                free(t2.s);
            } else {
                mk_text_content(b, m[i].content, true);
            }
            mk_text_cat(b, " [/INST]");
        } else {
            mk_text_cat(b, " ");
            mk_text_content(b, m[i].content, true);
            mk_text_cat(b, " ");
            mk_text_cat(b, eos);
        }
    }
    return MK_OK;
}

/* The conversation rendered into b (its contents' spans recorded). */
static mk_status mk_chat_render(const mk_tokenizer *t, const mk_chat_message *messages, size_t n, bool gen,
                                mk_text *b) {
    if (!t || (!messages && n))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "chat template: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (!messages[i].role || !messages[i].content || !messages[i].role[0])
            return mk_fail(MK_ERR_INVALID_ARGUMENT, "chat template: message %zu lacks a role or content", i);
    for (size_t i = 0; i < n; i++) { /* name the message and its offset, not the rendered text's */
        const unsigned char *c = (const unsigned char *)messages[i].content;
        const size_t len = strlen(messages[i].content);
        for (size_t k = 0; k < len;) {
            const size_t cl = mk_utf8_valid_len(c + k, len - k);
            if (!cl)
                return mk_fail(MK_ERR_INVALID_UTF8,
                               "chat message %zu (%s) is not valid UTF-8 (byte 0x%02x at offset %zu)", i,
                               messages[i].role, c[k], k);
            k += cl;
        }
    }
    mk_chat_template_kind kind;
    MK_TRY(mk_chat_template_detect(t, &kind));
    mk_text_add(b, "", 0);
    mk_status s = MK_OK;
    switch (kind) {
    case MK_CHAT_TEMPLATE_CHATML: s = mk_render_chatml(t, messages, n, gen, b); break;
    case MK_CHAT_TEMPLATE_LLAMA3: s = mk_render_llama3(t, messages, n, gen, b); break;
    case MK_CHAT_TEMPLATE_LLAMA2: s = mk_render_llama2(t, messages, n, b); break;
    }
    if (s == MK_OK && b->oom) s = mk_fail(MK_ERR_OUT_OF_MEMORY, "chat template: out of memory");
    return s;
}

mk_status mk_chat_render_spans(const mk_tokenizer *t, const mk_chat_message *messages, size_t n, bool gen,
                               char **out, size_t *out_len, mk_text_span **spans, size_t *n_spans) {
    mk_clear_error();
    if (!out || !out_len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "chat template: NULL output");
    *out = NULL;
    *out_len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    mk_text b = {0};
    const mk_status s = mk_chat_render(t, messages, n, gen, &b);
    if (s != MK_OK) {
        free(b.content);
        free(b.s);
        return s;
    }
    *out = b.s;
    *out_len = b.n;
    if (spans && n_spans) {
        *spans = b.content;
        *n_spans = b.n_content;
    } else {
        free(b.content);
    }
    return MK_OK;
}

mk_status mk_chat_apply(const mk_tokenizer *t, const mk_chat_message *messages, size_t n, bool gen, char **out,
                        size_t *out_len) {
    mk_clear_error();
    return mk_chat_render_spans(t, messages, n, gen, out, out_len, NULL, NULL);
}

mk_status mk_chat_encode_from(const mk_tokenizer *t, const char *text, size_t len, size_t from,
                              const mk_text_span *spans, size_t n_spans, int32_t **ids, size_t *n_ids) {
    mk_clear_error();
    if (!ids || !n_ids || !text || (n_spans && !spans))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_chat_encode_from: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (from > len) return mk_fail(MK_ERR_INVALID_ARGUMENT, "chat encode: offset %zu past the text's %zu bytes", from, len);
    mk_text_span *tail = n_spans ? malloc(n_spans * sizeof *tail) : NULL;
    if (n_spans && !tail) return mk_fail(MK_ERR_OUT_OF_MEMORY, "chat encode: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n_spans; i++)
        if (spans[i].end > from)
            tail[k++] = (mk_text_span){(spans[i].start > from ? spans[i].start : from) - from, spans[i].end - from};
    const mk_status s =
        mk_tokenizer_encode_literal(t, text + from, len - from, MK_TOKENIZE_PARSE_SPECIAL, tail, k, ids, n_ids);
    free(tail);
    return s;
}

mk_status mk_chat_encode(const mk_tokenizer *t, const mk_chat_message *messages, size_t n, bool gen, int32_t **ids,
                         size_t *n_ids) {
    mk_clear_error();
    if (!ids || !n_ids) return mk_fail(MK_ERR_INVALID_ARGUMENT, "mk_chat_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    char *text = NULL;
    size_t len = 0, n_spans = 0;
    mk_text_span *spans = NULL;
    mk_status s = mk_chat_render_spans(t, messages, n, gen, &text, &len, &spans, &n_spans);
    if (s == MK_OK) s = mk_chat_encode_from(t, text, len, 0, spans, n_spans, ids, n_ids);
    free(spans);
    free(text);
    return s;
}
