/* meshkern serve: an OpenAI-compatible HTTP endpoint (serve.c: HTTP by libmicrohttpd, the
 * scheduler, streaming; serve_req.c: a JSON body -> a checked request, by cJSON).
 * Built only where libmicrohttpd and libcjson are found (serve_absent.c otherwise). */
#ifndef MK_TOOLS_SERVE_H
#define MK_TOOLS_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli_options.h"
#include "meshkern.h"

/* meshkern serve MODEL ...: argv[0] is MODEL. */
int mk_cli_serve(int argc, char **argv);

/* ====================================================== the HTTP flags == */

/* What the HTTP side takes from either command's flags (serve_options.c, built always). */
typedef struct mk_serve_settings {
    bool enabled;                 /* stage: --serve was given */
    char host[64];                /* an IPv4 or IPv6 literal */
    size_t port;
    const char *api_key, *api_key_file, *model_name;
    size_t max_queue, ctx, max_body, max_conn, timeout, drain;
} mk_serve_settings;
void mk_serve_settings_default(mk_serve_settings *s);
/* Prompt rows per step when serving (`serve`, `stage --serve`): a long prompt does not stall
 * the streams beside it for its whole prefill (bench/prefill_stall.py). */
#define MK_SERVE_PREFILL_CHUNK 128
bool mk_serve_host_ok(const char *host);
#define MK_SERVE_CLI_OPTIONS 11
/* The HTTP flags into out (values into s): --host and --port for serve, or (address_flag)
 * --serve HOST:PORT for stage; the count. */
size_t mk_serve_cli_options(mk_serve_settings *s, bool address_flag, mk_cli_option out[MK_SERVE_CLI_OPTIONS]);

/* meshkern stage ... --serve HOST:PORT on rank 0: the same endpoint over a process-per-range
 * run (o: the parsed stage options; the model stays the caller's). The exit status. */
int mk_cli_stage_serve(const char *model_path, const mk_model *model, mk_stage_options *o, const mk_serve_settings *set);

/* ======================================================= request parsing == */

#define MK_SERVE_MAX_STOP 4       /* stop strings per request (the API's limit) */
#define MK_SERVE_MAX_STOP_LEN 256 /* bytes per stop string */

typedef enum mk_serve_kind { MK_SERVE_CHAT = 1, MK_SERVE_COMPLETION = 2 } mk_serve_kind;

/* A request the server can honour: greedy, n = 1, its prompt as token ids. */
typedef struct mk_serve_req {
    mk_serve_kind kind;
    bool stream;
    bool include_usage;               /* stream_options.include_usage */
    size_t max_tokens;                /* max_tokens / max_completion_tokens, or what the context leaves */
    char stop[MK_SERVE_MAX_STOP][MK_SERVE_MAX_STOP_LEN + 1];
    size_t stop_len[MK_SERVE_MAX_STOP];
    size_t n_stop;
    int32_t *ids;                     /* [n_ids], mk_buffer_free */
    size_t n_ids;
} mk_serve_req;

/* A refusal: the HTTP status and the API's error object. */
typedef struct mk_serve_err {
    int http;            /* 400, 404, ... */
    const char *type;    /* "invalid_request_error", ... */
    const char *code;    /* "invalid_value", "model_not_found", ... */
    const char *param;   /* the field, or NULL */
    char message[512];
} mk_serve_err;

/* What the parser checks a request against. */
typedef struct mk_serve_limits {
    const mk_tokenizer *tok;
    const char *model_id; /* the one model served */
    size_t context;       /* KV positions per sequence: prompt + max_tokens must fit */
} mk_serve_limits;

/* Parse and check a request body (any bytes: untrusted). true: *req is filled (release
 * with mk_serve_req_free); false: *err says why, and nothing reaches the model. */
bool mk_serve_parse(const mk_serve_limits *lim, mk_serve_kind kind, const char *body, size_t len, mk_serve_req *req,
                    mk_serve_err *err);
void mk_serve_req_free(mk_serve_req *req);

/* The error body {"error": {"message", "type", "param", "code"}}, malloc'd. */
char *mk_serve_error_json(const mk_serve_err *err);
/* Fill an error (printf-style message); returns false for `return mk_serve_refuse(...)`. */
bool mk_serve_refuse(mk_serve_err *err, int http, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Stop strings over the text generated so far, text[len]: true when one occurs (*cut: where
 * the earliest starts, the answer ends there); false: *safe is how much of the text can
 * be sent, the rest might yet become a stop string. No stop string can start before the
 * *safe of an earlier scan of the same (grown) text: pass it as `from` to search only after
 * it (0: the whole text). */
bool mk_serve_stop_scan(const mk_serve_req *req, const char *text, size_t len, size_t from, size_t *cut,
                        size_t *safe);

/* Offset of the first byte that breaks UTF-8 in s[len], or len when valid. */
size_t mk_serve_utf8_check(const char *s, size_t len);

#endif
