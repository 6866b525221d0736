/* meshkern serve: a request body (untrusted bytes) -> a request the server can honour, or
 * the API's refusal naming the field. JSON by cJSON; the prompt through the model's chat
 * template and tokenizer. Nothing here touches the model: a refused request never does. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

/* ================================================================ errors == */

bool mk_serve_refuse(mk_serve_err *err, int http, const char *code, const char *param, const char *fmt, ...) {
    err->http = http;
    err->code = code;
    err->param = param;
    err->type = http == 401   ? "authentication_error"
                : http == 404 ? "not_found_error"
                : http == 429 ? "rate_limit_error"
                : http >= 500 ? "server_error"
                              : "invalid_request_error";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return false;
}

char *mk_serve_error_json(const mk_serve_err *err) {
    /* A message cut inside a character (a client's text as %.64s, or the buffer's end) would
     * make the body invalid UTF-8, which a JSON client cannot decode: each stray byte -> '?'. */
    char msg[sizeof err->message];
    snprintf(msg, sizeof msg, "%s", err->message);
    const size_t n = strlen(msg);
    for (size_t at = 0; (at += mk_serve_utf8_check(msg + at, n - at)) < n; at++) msg[at] = '?';
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "invalid_request_error");
    if (err->param) cJSON_AddStringToObject(e, "param", err->param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddStringToObject(e, "code", err->code ? err->code : "invalid_value");
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

/* ================================================================= UTF-8 == */

size_t mk_serve_utf8_check(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        const unsigned c = p[i];
        size_t n;
        unsigned min;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) n = 1, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) n = 2, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) n = 3, min = 0x10000;
        else return i;
        if (len - i <= n) return i;
        unsigned cp = c & (0x3F >> n);
        for (size_t k = 1; k <= n; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n + 1;
    }
    return len;
}

/* ========================================================= field checks == */

/* A field present and not null. */
static const cJSON *mk_field(const cJSON *root, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static bool mk_is_integer(const cJSON *f) {
    return cJSON_IsNumber(f) && isfinite(f->valuedouble) && floor(f->valuedouble) == f->valuedouble;
}

/* Fields that ask for what a greedy, one-answer server cannot give: 400 naming the field. */
static bool mk_check_unsupported(const cJSON *root, mk_serve_kind kind, mk_serve_err *err) {
    const cJSON *f;
    if ((f = mk_field(root, "temperature"))) {
        if (!cJSON_IsNumber(f) || f->valuedouble < 0 || f->valuedouble > 2)
            return mk_serve_refuse(err, 400, "invalid_type", "temperature", "temperature must be a number in [0, 2]");
        if (f->valuedouble > 0)
            return mk_serve_refuse(err, 400, "unsupported_value", "temperature",
                                   "temperature %g is not supported: this server decodes greedily (temperature 0)",
                                   f->valuedouble);
    }
    /* any nucleus keeps the most likely token, which is what greedy decoding takes: 0 included */
    if ((f = mk_field(root, "top_p")) && (!cJSON_IsNumber(f) || !(f->valuedouble >= 0) || f->valuedouble > 1))
        return mk_serve_refuse(err, 400, "invalid_type", "top_p", "top_p must be a number in [0, 1]");
    if ((f = mk_field(root, "n"))) {
        if (!mk_is_integer(f) || f->valuedouble < 1)
            return mk_serve_refuse(err, 400, "invalid_type", "n", "n must be a positive integer");
        if (f->valuedouble != 1)
            return mk_serve_refuse(err, 400, "unsupported_value", "n", "n = %g is not supported: one choice per request (n = 1)",
                                   f->valuedouble);
    }
    if ((f = mk_field(root, "seed")) && !mk_is_integer(f))
        return mk_serve_refuse(err, 400, "invalid_type", "seed", "seed must be an integer");
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < 2; i++)
        if ((f = mk_field(root, penalties[i]))) {
            if (!cJSON_IsNumber(f))
                return mk_serve_refuse(err, 400, "invalid_type", penalties[i], "%s must be a number", penalties[i]);
            if (f->valuedouble != 0)
                return mk_serve_refuse(err, 400, "unsupported_value", penalties[i],
                                       "%s is not supported: this server decodes greedily", penalties[i]);
        }
    if ((f = mk_field(root, "logprobs")) && !(cJSON_IsFalse(f)))
        return mk_serve_refuse(err, 400, "unsupported_parameter", "logprobs", "logprobs are not supported");
    if ((f = mk_field(root, "top_logprobs")))
        return mk_serve_refuse(err, 400, "unsupported_parameter", "top_logprobs", "top_logprobs are not supported");
    if ((f = mk_field(root, "logit_bias")) && !(cJSON_IsObject(f) && !f->child))
        return mk_serve_refuse(err, 400, "unsupported_parameter", "logit_bias", "logit_bias is not supported");
    static const char *const tools[] = {"tools", "functions"};
    for (size_t i = 0; i < 2; i++)
        if ((f = mk_field(root, tools[i])) && !(cJSON_IsArray(f) && !f->child))
            return mk_serve_refuse(err, 400, "unsupported_parameter", tools[i], "%s (function calling) are not supported",
                                   tools[i]);
    static const char *const choices[] = {"tool_choice", "function_call"};
    for (size_t i = 0; i < 2; i++)
        if ((f = mk_field(root, choices[i])) && !(cJSON_IsString(f) && strcmp(f->valuestring, "none") == 0))
            return mk_serve_refuse(err, 400, "unsupported_parameter", choices[i], "%s is not supported", choices[i]);
    if ((f = mk_field(root, "response_format"))) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(f, "type");
        if (!cJSON_IsObject(f) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0)
            return mk_serve_refuse(err, 400, "unsupported_parameter", "response_format",
                                   "response_format other than {\"type\": \"text\"} is not supported");
    }
    if (kind == MK_SERVE_COMPLETION) {
        if ((f = mk_field(root, "best_of")) && !(mk_is_integer(f) && f->valuedouble == 1))
            return mk_serve_refuse(err, 400, "unsupported_value", "best_of", "best_of other than 1 is not supported");
        if ((f = mk_field(root, "echo")) && !cJSON_IsFalse(f))
            return mk_serve_refuse(err, 400, "unsupported_parameter", "echo", "echo is not supported");
        if ((f = mk_field(root, "suffix")))
            return mk_serve_refuse(err, 400, "unsupported_parameter", "suffix", "suffix is not supported");
    }
    return true;
}

static bool mk_parse_stop(const cJSON *root, mk_serve_req *req, mk_serve_err *err) {
    const cJSON *f = mk_field(root, "stop");
    if (!f) return true;
    const cJSON *one[1] = {f};
    size_t n = 0;
    if (cJSON_IsString(f)) n = 1;
    else if (cJSON_IsArray(f)) n = (size_t)cJSON_GetArraySize(f);
    else return mk_serve_refuse(err, 400, "invalid_type", "stop", "stop must be a string or an array of strings");
    if (n > MK_SERVE_MAX_STOP)
        return mk_serve_refuse(err, 400, "invalid_value", "stop", "stop holds %zu strings; at most %d", n, MK_SERVE_MAX_STOP);
    const cJSON *s = cJSON_IsString(f) ? one[0] : f->child;
    for (size_t i = 0; i < n; i++, s = s->next) {
        if (!cJSON_IsString(s))
            return mk_serve_refuse(err, 400, "invalid_type", "stop", "stop must be a string or an array of strings");
        const size_t len = strlen(s->valuestring);
        if (len == 0) return mk_serve_refuse(err, 400, "invalid_value", "stop", "stop strings must not be empty");
        if (len > MK_SERVE_MAX_STOP_LEN)
            return mk_serve_refuse(err, 400, "invalid_value", "stop", "a stop string of %zu bytes; at most %d", len,
                                   MK_SERVE_MAX_STOP_LEN);
        memcpy(req->stop[i], s->valuestring, len + 1);
        req->stop_len[i] = len;
    }
    req->n_stop = n;
    return true;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts
 * (joined). *out is malloc'd. */
static bool mk_message_content(const cJSON *content, size_t index, char **out, mk_serve_err *err) {
    if (cJSON_IsString(content)) {
        *out = strdup(content->valuestring);
    } else if (cJSON_IsArray(content)) {
        size_t total = 0;
        for (const cJSON *p = content->child; p; p = p->next) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text))
                return mk_serve_refuse(err, 400, "unsupported_value", "messages",
                                       "messages[%zu].content: only text parts ({\"type\": \"text\", \"text\": ...}) are supported",
                                       index);
            total += strlen(text->valuestring);
        }
        *out = malloc(total + 1);
        if (*out) {
            size_t at = 0;
            for (const cJSON *p = content->child; p; p = p->next) {
                const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
                memcpy(*out + at, t, strlen(t));
                at += strlen(t);
            }
            (*out)[at] = '\0';
        }
    } else {
        return mk_serve_refuse(err, 400, "invalid_type", "messages",
                               "messages[%zu].content must be a string or an array of text parts", index);
    }
    if (!*out) return mk_serve_refuse(err, 500, "out_of_memory", NULL, "out of memory");
    if (!**out) {
        free(*out);
        *out = NULL;
        return mk_serve_refuse(err, 400, "invalid_value", "messages", "messages[%zu].content is empty", index);
    }
    return true;
}

/* The tokenizer's refusal of a text (invalid UTF-8 after JSON escapes, a template that
 * refuses the roles) as a 400. */
static bool mk_text_refusal(mk_status s, const char *param, mk_serve_err *err) {
    return mk_serve_refuse(err, s == MK_ERR_OUT_OF_MEMORY ? 500 : 400,
                           s == MK_ERR_INVALID_UTF8 ? "invalid_encoding" : "invalid_value", param, "%s: %s", param,
                           mk_last_error());
}

static bool mk_parse_messages(const mk_serve_limits *lim, const cJSON *root, mk_serve_req *req, mk_serve_err *err) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) return mk_serve_refuse(err, 400, "missing_required_parameter", "messages", "messages is required");
    if (!cJSON_IsArray(msgs)) return mk_serve_refuse(err, 400, "invalid_type", "messages", "messages must be an array");
    const size_t n = (size_t)cJSON_GetArraySize(msgs);
    if (n == 0) return mk_serve_refuse(err, 400, "invalid_value", "messages", "messages must not be empty");
    if (n > 4096) return mk_serve_refuse(err, 400, "invalid_value", "messages", "messages holds %zu entries; at most 4096", n);
    mk_chat_message *m = calloc(n, sizeof *m);
    char **texts = calloc(n, sizeof *texts);
    bool ok = m && texts;
    if (!ok) mk_serve_refuse(err, 500, "out_of_memory", NULL, "out of memory");
    size_t i = 0;
    for (const cJSON *e = msgs->child; ok && e; e = e->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        if (!cJSON_IsObject(e)) {
            ok = mk_serve_refuse(err, 400, "invalid_type", "messages", "messages[%zu] must be an object", i);
        } else if (!cJSON_IsString(role)) {
            ok = mk_serve_refuse(err, 400, "invalid_type", "messages", "messages[%zu].role must be a string", i);
        } else if (strcmp(role->valuestring, "system") != 0 && strcmp(role->valuestring, "user") != 0 &&
                   strcmp(role->valuestring, "assistant") != 0 && strcmp(role->valuestring, "developer") != 0) {
            ok = mk_serve_refuse(err, 400, "invalid_value", "messages",
                                 "messages[%zu].role '%.64s' is not supported (system, developer, user, assistant)", i,
                                 role->valuestring);
        } else if (mk_field(e, "tool_calls") || mk_field(e, "function_call")) {
            ok = mk_serve_refuse(err, 400, "unsupported_parameter", "messages", "messages[%zu]: tool calls are not supported", i);
        } else {
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
            if (!content || cJSON_IsNull(content))
                ok = mk_serve_refuse(err, 400, "missing_required_parameter", "messages", "messages[%zu].content is required", i);
            else ok = mk_message_content(content, i, &texts[i], err);
            m[i].role = strcmp(role->valuestring, "developer") == 0 ? "system" : role->valuestring;
            m[i].content = texts[i];
        }
    }
    if (ok) { /* contents stay text: a client's "<|im_end|>" cannot close its turn */
        const mk_status s = mk_chat_encode(lim->tok, m, n, true, &req->ids, &req->n_ids);
        if (s != MK_OK) ok = mk_text_refusal(s, "messages", err);
    }
    for (size_t k = 0; texts && k < n; k++) free(texts[k]);
    free(texts);
    free(m);
    return ok;
}

/* /v1/completions: a string, or an array of exactly one string; the model's BOS added. */
static bool mk_parse_prompt(const mk_serve_limits *lim, const cJSON *root, mk_serve_req *req, mk_serve_err *err) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) return mk_serve_refuse(err, 400, "missing_required_parameter", "prompt", "prompt is required");
    if (cJSON_IsArray(p)) {
        if (cJSON_GetArraySize(p) != 1 || !cJSON_IsString(p->child))
            return mk_serve_refuse(err, 400, "unsupported_value", "prompt",
                                   "prompt must be a string (or an array of one string): one prompt per request");
        p = p->child;
    }
    if (!cJSON_IsString(p)) return mk_serve_refuse(err, 400, "invalid_type", "prompt", "prompt must be a string");
    const size_t len = strlen(p->valuestring);
    if (len == 0) return mk_serve_refuse(err, 400, "invalid_value", "prompt", "prompt is empty");
    const mk_status s = mk_tokenizer_encode(lim->tok, p->valuestring, len, MK_TOKENIZE_ADD_SPECIAL | MK_TOKENIZE_PARSE_SPECIAL,
                                            &req->ids, &req->n_ids);
    return s == MK_OK ? true : mk_text_refusal(s, "prompt", err);
}

/* ================================================================ parse == */

static bool mk_parse_root(const mk_serve_limits *lim, mk_serve_kind kind, const cJSON *root, mk_serve_req *req,
                          mk_serve_err *err) {
    if (!cJSON_IsObject(root)) return mk_serve_refuse(err, 400, "invalid_type", NULL, "the request body must be a JSON object");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (f && !cJSON_IsString(f)) return mk_serve_refuse(err, 400, "invalid_type", "model", "model must be a string");
    if (f && strcmp(f->valuestring, lim->model_id) != 0)
        return mk_serve_refuse(err, 404, "model_not_found", "model", "the model '%.128s' does not exist (this server has '%s')",
                               f->valuestring, lim->model_id);
    if ((f = mk_field(root, "stream")) && !cJSON_IsBool(f))
        return mk_serve_refuse(err, 400, "invalid_type", "stream", "stream must be a boolean");
    req->stream = f && cJSON_IsTrue(f);
    if ((f = mk_field(root, "stream_options"))) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(f, "include_usage");
        if (!cJSON_IsObject(f) || (u && !cJSON_IsBool(u)))
            return mk_serve_refuse(err, 400, "invalid_type", "stream_options", "stream_options must be {\"include_usage\": bool}");
        if (!req->stream)
            return mk_serve_refuse(err, 400, "invalid_value", "stream_options", "stream_options is only allowed with stream: true");
        req->include_usage = u && cJSON_IsTrue(u);
    }
    if (!mk_check_unsupported(root, kind, err)) return false;
    const char *max_name = NULL;
    double max_tokens = 0;
    static const char *const names[] = {"max_completion_tokens", "max_tokens"};
    for (size_t i = 0; i < 2 && !max_name; i++)
        if ((f = mk_field(root, names[i]))) {
            if (!mk_is_integer(f) || f->valuedouble < 1)
                return mk_serve_refuse(err, 400, "invalid_type", names[i], "%s must be a positive integer", names[i]);
            max_name = names[i];
            max_tokens = f->valuedouble;
        }
    if (!mk_parse_stop(root, req, err)) return false;
    if (!(kind == MK_SERVE_CHAT ? mk_parse_messages(lim, root, req, err) : mk_parse_prompt(lim, root, req, err)))
        return false;
    /* prompt and answer share the sequence's KV cache (the last token is never fed back) */
    if (req->n_ids >= lim->context)
        return mk_serve_refuse(err, 400, "context_length_exceeded", kind == MK_SERVE_CHAT ? "messages" : "prompt",
                               "the prompt has %zu tokens; this server's context holds %zu (prompt and answer)",
                               req->n_ids, lim->context);
    const size_t room = lim->context - req->n_ids;
    if (max_name && max_tokens > (double)room)
        return mk_serve_refuse(err, 400, "context_length_exceeded", max_name,
                               "the prompt has %zu tokens and %s is %.0f: %.0f in all, over this server's context of %zu",
                               req->n_ids, max_name, max_tokens, (double)req->n_ids + max_tokens, lim->context);
    req->max_tokens = max_name ? (size_t)max_tokens : room;
    return true;
}

/* The offset of the first \u0000 escape inside a JSON string of body, or of a raw NUL byte
 * anywhere, or len: the parser takes either into a NUL that ends the C string, so the text
 * after it would silently go. */
static size_t mk_serve_nul_escape(const char *body, size_t len) {
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        if (body[i] == '\0') return i; /* never valid JSON, and cJSON copies it into the string */
        if (!in_string) {
            in_string = body[i] == '"';
        } else if (body[i] == '"') {
            in_string = false;
        } else if (body[i] == '\\' && i + 1 < len) {
            if (body[i + 1] == 'u' && i + 6 <= len && memcmp(body + i + 2, "0000", 4) == 0) return i;
            i++; /* the escaped character (a quote or a backslash does not end or start anything) */
        }
    }
    return len;
}

bool mk_serve_parse(const mk_serve_limits *lim, mk_serve_kind kind, const char *body, size_t len, mk_serve_req *req,
                    mk_serve_err *err) {
    memset(req, 0, sizeof *req);
    req->kind = kind;
    const size_t bad = mk_serve_utf8_check(body, len);
    if (bad < len)
        return mk_serve_refuse(err, 400, "invalid_encoding", NULL, "the request body is not valid UTF-8 (byte %zu)", bad);
    const size_t nul = mk_serve_nul_escape(body, len);
    if (nul < len)
        return mk_serve_refuse(err, 400, "invalid_encoding", NULL,
                               "a string of the request holds a NUL character (\\u0000 or a NUL byte at byte %zu): text cannot",
                               nul);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        const size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return mk_serve_refuse(err, 400, "invalid_json", NULL, "the request body is not valid JSON (near byte %zu)", at);
    }
    /* nothing but white space after the value */
    const char *rest = end ? end : body + len;
    while (rest < body + len && (*rest == ' ' || *rest == '\t' || *rest == '\n' || *rest == '\r')) rest++;
    bool ok = rest == body + len ? mk_parse_root(lim, kind, root, req, err)
                                 : mk_serve_refuse(err, 400, "invalid_json", NULL,
                                                   "the request body is not valid JSON (trailing bytes at %zu)",
                                                   (size_t)(rest - body));
    cJSON_Delete(root);
    if (!ok) mk_serve_req_free(req);
    return ok;
}

void mk_serve_req_free(mk_serve_req *req) {
    if (!req) return;
    mk_buffer_free(req->ids);
    req->ids = NULL;
    req->n_ids = 0;
}

/* ========================================================== stop strings == */

bool mk_serve_stop_scan(const mk_serve_req *req, const char *text, size_t len, size_t from, size_t *cut,
                        size_t *safe) {
    bool hit = false;
    size_t first = len, hold = 0;
    for (size_t k = 0; k < req->n_stop; k++) {
        const char *s = req->stop[k];
        const size_t n = req->stop_len[k];
        for (size_t at = from; at + n <= len && at < first; at++)
            if (memcmp(text + at, s, n) == 0) {
                hit = true;
                first = at;
                break;
            }
        /* the longest tail of the text that begins this stop string */
        for (size_t t = n - 1 < len ? n - 1 : len; t > hold; t--)
            if (memcmp(text + len - t, s, t) == 0) {
                hold = t;
                break;
            }
    }
    *cut = first;
    *safe = len - hold;
    return hit;
}
