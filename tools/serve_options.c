/* The HTTP side's flags, shared by `meshkern serve` and `meshkern stage ... --serve` (one
 * name, one limit, one help line in both). Built with or without the server itself, so the
 * stage command parses them the same way in every build. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

void mk_serve_settings_default(mk_serve_settings *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->host, sizeof s->host, "127.0.0.1");
    s->port = 8080;
    s->max_queue = 64;
    s->max_body = 1 << 20;
    s->max_conn = 128;
    s->timeout = 60;
    s->drain = 60;
}

/* An IPv4 or IPv6 literal (no names: the server binds exactly what it is told). */
bool mk_serve_host_ok(const char *host) {
    unsigned char buf[16];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

static bool parse_host(const char *v, void *dest, char *why, size_t why_len) {
    mk_serve_settings *s = dest;
    if (strlen(v) >= sizeof s->host || !mk_serve_host_ok(v)) {
        snprintf(why, why_len, "expected an IPv4 or IPv6 address (127.0.0.1, ::1, 0.0.0.0, ::)");
        return false;
    }
    snprintf(s->host, sizeof s->host, "%s", v);
    return true;
}

/* HOST:PORT, [IPV6]:PORT */
static bool parse_address(const char *v, void *dest, char *why, size_t why_len) {
    mk_serve_settings *s = dest;
    const char *colon = strrchr(v, ':');
    char host[sizeof s->host];
    size_t n = colon ? (size_t)(colon - v) : 0;
    const char *h = v;
    if (n >= 2 && v[0] == '[' && v[n - 1] == ']') h = v + 1, n -= 2;
    char *end = NULL;
    errno = 0;
    const bool digits = colon && colon[1] >= '0' && colon[1] <= '9'; /* strtoul takes blanks and signs */
    const unsigned long port = digits ? strtoul(colon + 1, &end, 10) : 0;
    if (!digits || n == 0 || n >= sizeof host || *end || errno || port > 65535) {
        snprintf(why, why_len, "expected HOST:PORT ([::1]:PORT for IPv6; port 0: any free port)");
        return false;
    }
    memcpy(host, h, n);
    host[n] = '\0';
    if (!mk_serve_host_ok(host)) {
        snprintf(why, why_len, "'%s' is not an IPv4 or IPv6 address", host);
        return false;
    }
    snprintf(s->host, sizeof s->host, "%s", host);
    s->port = port;
    s->enabled = true;
    return true;
}

size_t mk_serve_cli_options(mk_serve_settings *s, bool address_flag, mk_cli_option out[MK_SERVE_CLI_OPTIONS]) {
    size_t n = 0;
    if (address_flag) {
        out[n++] = (mk_cli_option){"--serve", NULL, "HOST:PORT",
                                   "rank 0: answer OpenAI-compatible HTTP there instead of reading --prompts", NULL,
                                   MK_CLI_CALL, s, 0, 0, parse_address};
    } else {
        out[n++] = (mk_cli_option){"--host", NULL, "ADDRESS", "the IPv4 or IPv6 address to listen on", "127.0.0.1",
                                   MK_CLI_CALL, s, 0, 0, parse_host};
        out[n++] = (mk_cli_option){"--port", NULL, "PORT", "the port (0: any free port)", "8080", MK_CLI_COUNT, &s->port,
                                   0, 65535, NULL};
    }
    out[n++] = (mk_cli_option){"--api-key", NULL, "KEY", "requests must carry it (Authorization: Bearer KEY)", NULL,
                               MK_CLI_TEXT, (void *)&s->api_key, 0, 0, NULL};
    out[n++] = (mk_cli_option){"--api-key-file", NULL, "FILE", "the API key from the file's first line", NULL,
                               MK_CLI_TEXT, (void *)&s->api_key_file, 0, 0, NULL};
    out[n++] = (mk_cli_option){"--model-name", NULL, "NAME", "the model's id in the API", "the file's name", MK_CLI_TEXT,
                               (void *)&s->model_name, 0, 0, NULL};
    out[n++] = (mk_cli_option){"--max-queue", NULL, "N", "requests waiting for a slot before 429", "64", MK_CLI_COUNT,
                               &s->max_queue, 0, 65536, NULL};
    out[n++] = (mk_cli_option){"--ctx", NULL, "N", "KV positions per sequence", "min(model, 2048)", MK_CLI_COUNT,
                               &s->ctx, 2, 1 << 20, NULL};
    out[n++] = (mk_cli_option){"--max-body", NULL, "BYTES", "the largest request body", "1048576", MK_CLI_COUNT,
                               &s->max_body, 64, (size_t)1 << 30, NULL};
    out[n++] = (mk_cli_option){"--max-connections", NULL, "N", "connections at once (completion requests past them: 503)",
                               "128", MK_CLI_COUNT, &s->max_conn, 1, 65536, NULL};
    /* the stage command's --timeout is its ranks' deadline: there this one is --http-timeout */
    out[n++] = (mk_cli_option){address_flag ? "--http-timeout" : "--timeout", NULL, "S",
                               "the deadline of an idle HTTP connection, in seconds", "60", MK_CLI_COUNT, &s->timeout, 1,
                               86400, NULL};
    out[n++] = (mk_cli_option){"--drain-timeout", NULL, "S", "on SIGTERM/SIGINT, how long requests in flight may finish",
                               "60", MK_CLI_COUNT, &s->drain, 0, 86400, NULL};
    return n;
}
