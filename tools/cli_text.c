/* meshkern run -p / chat / tokenize: text in, text out, through the library's tokenizer,
 * chat template and generation loop.
 *
 *   meshkern run MODEL -p TEXT [--system S] [--raw] [--split L1,...] [--max-tokens N]
 *                [--seam wire|local|unix|tcp|nccl] [--devices D0,D1,...] [backend options]
 *   meshkern chat MODEL [--system S] [--split L1,...] [--max-tokens N] [--seam ...] [--devices ...] ...
 *   meshkern tokenize MODEL TEXT [--ids] [--no-bos] [--no-parse-special]
 *
 * run streams the answer of the model (split as asked) and prints one summary line; with
 * --split it then runs the whole model on the same prompt and reports whether the split
 * gave the same tokens and bit-identical logits. chat reads one user turn per line from
 * stdin and keeps the KV cache from turn to turn. Weights are native (the GGUF's block
 * formats) on the cpu backend unless --dtype says otherwise; each seam of the split uses
 * --seam (default wire: packed and unpacked as between peers), each range the device
 * --devices names (cuda). */
#include "cli_text.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/mk_size.h"
#include "mk_error.h"
#include "text/tokenizer.h"

#define MK_CLI_MAX_CUTS 64

typedef struct mk_cli_opts {
    const char *model_path;
    const char *prompt; /* -p */
    const char *system; /* --system */
    bool raw;           /* --raw: no chat template */
    int64_t cuts[MK_CLI_MAX_CUTS];
    size_t n_cuts;
    size_t n_new; /* --max-tokens */
    mk_range_options range;
    mk_seam_options seam;              /* --seam (default wire) */
    int devices[MK_CLI_MAX_CUTS + 1];  /* --devices: range i on devices[i] */
    size_t n_devices;
} mk_cli_opts;

/* The options of run -p (chat: false) and chat; -1 when parsed, else the exit status
 * (0 after --help, 2 after a usage error). */
static int mk_text_options(int argc, char **argv, mk_cli_opts *o, bool chat) {
    memset(o, 0, sizeof *o);
    o->range = mk_range_options_default();
    o->seam = mk_seam_options_default(MK_SEAM_WIRE);
    o->n_new = chat ? 512 : 256;
    const char *name = chat ? "chat" : "run";
    mk_cli_backend backend;
    mk_cli_backend_init(&backend);
    int64_t devices[MK_CLI_MAX_CUTS + 1];
    mk_cli_list cuts_l = MK_CLI_LIST(o->cuts, 0, INT32_MAX, "layer", false);
    mk_cli_list devices_l = MK_CLI_LIST(devices, 0, MK_CLI_MAX_DEVICE, "device", false);
    const mk_cli_option prompt_opts[] = {
        {"--prompt", "-p", "TEXT", "the user message (required)", NULL, MK_CLI_TEXT, (void *)&o->prompt, 0, 0, NULL},
        {"--raw", NULL, NULL, "the text itself with the model's BOS, no chat template", NULL, MK_CLI_FLAG, &o->raw, 0, 0,
         NULL},
    };
    const mk_cli_option text_opts[] = {
        {"--system", NULL, "TEXT", "a system message first", NULL, MK_CLI_TEXT, (void *)&o->system, 0, 0, NULL},
        mk_cli_opt_max_tokens(&o->n_new, MK_CLI_MAX_NEW_TOKENS, chat ? "512 per turn" : "256"),
        mk_cli_opt_split(&cuts_l),
        mk_cli_opt_devices(&devices_l),
        mk_cli_opt_seam(&o->seam.kind, false, "wire"),
    };
    mk_cli_option backend_opts[MK_CLI_BACKEND_OPTIONS];
    const mk_cli_group groups[] = {
        {"options", prompt_opts, chat ? 0 : sizeof prompt_opts / sizeof *prompt_opts},
        {chat ? "options" : "more options", text_opts, sizeof text_opts / sizeof *text_opts},
        {"backend options", backend_opts, mk_cli_backend_options(&backend, backend_opts, "cpu threads (default: every core)")},
    };
    const mk_cli_command cmd = {
        name, chat ? "MODEL.gguf [options]" : "MODEL.gguf -p TEXT [options]",
        chat ? "  A conversation: one user turn per line on standard input (an empty line ends it); the KV\n"
               "  cache is kept from turn to turn.\n"
             : "  Streams the model's answer (split as asked) and one summary line; with --split, then the\n"
               "  whole model on the same prompt, and whether the split gave the same tokens and logits.\n",
        {"MODEL"}, groups, sizeof groups / sizeof *groups};
    const int bad = mk_cli_parse(&cmd, argc, argv, &o->model_path);
    if (bad >= 0) return bad;
    if (!chat && !o->prompt) return mk_cli_usage_error(name, "-p TEXT is required");
    if (o->raw && o->prompt && !*o->prompt)
        return mk_cli_usage_error(name, "-p TEXT is empty: with --raw no chat template adds a token, nothing would run");
    /* --seam (text_opts from index 4) acts only where there is a seam */
    const int unused = mk_cli_needs(&cmd, argc, argv, &groups[1], 4, cuts_l.n > 0, "--split");
    if (unused >= 0) return unused;
    o->n_cuts = cuts_l.n;
    o->n_devices = devices_l.n;
    for (size_t i = 0; i < o->n_devices; i++) o->devices[i] = (int)devices[i];
    const int bad_device = mk_cli_backend_finish(&backend, name, o->model_path);
    if (bad_device >= 0) return bad_device;
    mk_cli_backend_range(&backend, &o->range);
    /* GPU to GPU needs the cuda backend: said here, before the model is read. */
    if (o->range.backend.kind != MK_BACKEND_CUDA && (o->seam.kind == MK_SEAM_NCCL || o->n_devices > 0))
        return mk_cli_usage_error(name, "%s needs --backend cuda (the cpu backend has no devices)",
                                  o->seam.kind == MK_SEAM_NCCL ? "--seam nccl" : "--devices");
    if (o->n_devices > 0 && o->n_devices != o->n_cuts + 1)
        return mk_cli_usage_error(name, "--devices names %zu devices for %zu ranges (one per range: --split has %zu cuts)",
                                  o->n_devices, o->n_cuts + 1, o->n_cuts);
    if (o->n_devices > 0) o->range.backend.device = o->devices[0]; /* the whole model runs on the first */
    return -1;
}

/* The pipeline of the asked split, each seam over the asked transport, each range on its
 * device; no cuts is the whole model (on the first device). */
static mk_status mk_text_pipeline(const mk_model *model, const mk_cli_opts *o, const int64_t *cuts, size_t n_cuts,
                                  mk_pipeline **p) {
    const bool placed = n_cuts > 0 && o->n_devices > 0;
    mk_pipeline_options po = mk_pipeline_options_default();
    po.range = &o->range;
    po.cuts = cuts;
    po.n_cuts = n_cuts;
    po.seam = &o->seam;
    po.devices = placed ? o->devices : NULL;
    po.n_devices = placed ? o->n_devices : 0;
    return mk_pipeline_create(model, &po, p);
}

/* ================================================================ printing == */

void mk_cli_print_text(FILE *f, const mk_tokenizer *tok, const int32_t *ids, size_t n) {
    char *text = NULL;
    size_t len = 0;
    if (tok && mk_tokenizer_decode(tok, ids, n, MK_DECODE_SPECIAL, &text, &len) == MK_OK) {
        fwrite(text, 1, len, f);
    } else {
        mk_clear_error();
        for (size_t i = 0; i < n; i++) fprintf(f, "<%d>", ids[i]);
    }
    mk_buffer_free(text);
}

/* What one generation produced, for the split-vs-whole comparison. */
typedef struct mk_cli_gen {
    mk_detokenizer *stream; /* NULL: do not print */
    int32_t *tokens;        /* [n] */
    float *logits;          /* [n, vocab] */
    size_t n, cap, vocab;
    mk_status status;
} mk_cli_gen;

static mk_status mk_cli_on_token(void *user, int32_t token, const float *logits, size_t vocab) {
    mk_cli_gen *g = user;
    if (g->n == g->cap) { /* both arrays grow to one capacity */
        size_t cap_tokens = g->cap, cap_logits = g->cap;
        MK_TRY(mk_grow_array(&g->tokens, &cap_tokens, g->n + 1, sizeof *g->tokens, 64, "generated tokens"));
        MK_TRY(mk_grow_array(&g->logits, &cap_logits, g->n + 1, vocab * sizeof *g->logits, 64, "generated logits"));
        g->cap = cap_tokens;
    }
    g->tokens[g->n] = token;
    memcpy(g->logits + g->n * vocab, logits, vocab * sizeof *logits);
    g->vocab = vocab;
    g->n++;
    if (g->stream) {
        const char *text;
        size_t len;
        const mk_status s = mk_detokenizer_push(g->stream, token, &text, &len);
        if (s != MK_OK) return s;
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return MK_OK;
}

static void mk_cli_stream_end(mk_detokenizer *d) {
    const char *text;
    size_t len;
    if (d && mk_detokenizer_flush(d, &text, &len) == MK_OK) fwrite(text, 1, len, stdout);
}

static void mk_cli_gen_free(mk_cli_gen *g) {
    mk_detokenizer_free(g->stream);
    free(g->tokens);
    free(g->logits);
}

/* The prompt's ids: the conversation through the chat template, or the raw text. */
static mk_status mk_cli_prompt_ids(const mk_tokenizer *tok, const mk_cli_opts *o, int32_t **ids, size_t *n,
                                   const char **template_name) {
    return mk_cli_text_ids(tok, o->system, o->prompt, o->raw, ids, n, template_name);
}

mk_status mk_cli_text_ids(const mk_tokenizer *tok, const char *system, const char *prompt, bool raw, int32_t **ids,
                          size_t *n, const char **template_name) {
    if (raw) {
        *template_name = "none (--raw)";
        return mk_tokenizer_encode(tok, prompt, strlen(prompt), MK_TOKENIZE_ADD_SPECIAL | MK_TOKENIZE_PARSE_SPECIAL, ids,
                                   n);
    }
    mk_chat_template_kind kind;
    mk_status s = mk_chat_template_detect(tok, &kind);
    if (s != MK_OK) return s;
    *template_name = mk_chat_template_name(kind);
    mk_chat_message msgs[2];
    size_t n_msgs = 0;
    if (system) msgs[n_msgs++] = (mk_chat_message){"system", system};
    msgs[n_msgs++] = (mk_chat_message){"user", prompt};
    return mk_chat_encode(tok, msgs, n_msgs, true, ids, n);
}

static void mk_cli_print_ranges(mk_pipeline *p) {
    printf("ranges:");
    for (size_t i = 0; i < mk_pipeline_range_count(p); i++) {
        const mk_range *r = mk_pipeline_range(p, i);
        printf(" [%lld-%lld] %s %.1f MiB%s", (long long)mk_range_start(r), (long long)mk_range_end(r),
               mk_role_name(mk_range_role(r)), (double)mk_range_weight_bytes(r) / 1048576.0,
               i + 1 < mk_pipeline_range_count(p) ? " |" : "\n");
    }
}

static void mk_cli_print_summary(mk_pipeline *p, const mk_tokenizer *tok, const mk_generate_stats *st) {
    double total = 0.0;
    for (size_t i = 0; i < mk_pipeline_range_count(p); i++) total += mk_pipeline_range_seconds(p, i);
    printf("[%s] prompt %zu tokens, prefill %.1f tok/s; generated %zu tokens, decode %.1f tok/s; time per range",
           st->stopped_at_eog ? "end of turn" : "token limit", st->n_prompt,
           st->prefill_s > 0 ? (double)st->n_prompt / st->prefill_s : 0.0, st->n_generated,
           st->decode_s > 0 ? (double)(st->n_generated > 0 ? st->n_generated - (st->stopped_at_eog ? 0 : 1) : 0) / st->decode_s
                            : 0.0);
    for (size_t i = 0; i < mk_pipeline_range_count(p); i++) {
        const mk_range *r = mk_pipeline_range(p, i);
        printf(" [%lld-%lld] %.0f%%", (long long)mk_range_start(r), (long long)mk_range_end(r),
               total > 0 ? 100.0 * mk_pipeline_range_seconds(p, i) / total : 0.0);
    }
    if (st->stopped_at_eog) printf("; stopped at %s", mk_tokenizer_token_text(tok, st->eog_token));
    printf("\n");
}

/* One generation on a fresh pipeline of the given split. */
static mk_status mk_cli_generate(const mk_model *model, const mk_tokenizer *tok, const mk_cli_opts *o,
                                 const int64_t *cuts, size_t n_cuts, const int32_t *ids, size_t n_ids, bool print,
                                 mk_cli_gen *g, mk_generate_stats *st) {
    mk_pipeline *p = NULL;
    mk_status s = mk_text_pipeline(model, o, cuts, n_cuts, &p);
    if (s == MK_OK && print) {
        mk_cli_print_ranges(p);
        s = mk_detokenizer_create(tok, 0, &g->stream);
    }
    if (s == MK_OK) s = mk_pipeline_generate(p, tok, ids, n_ids, o->n_new, mk_cli_on_token, g, st);
    if (print && s == MK_OK) { /* on failure the message stays for the caller to print */
        mk_cli_stream_end(g->stream);
        printf("\n");
        mk_cli_print_summary(p, tok, st);
    }
    mk_pipeline_free(p);
    return s;
}

int mk_cli_run_text(int argc, char **argv) {
    mk_cli_opts o;
    const int bad = mk_text_options(argc, argv, &o, false);
    if (bad >= 0) return bad;
    mk_model *model = NULL;
    mk_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const char *template_name = "";
    mk_status s = mk_model_open_gguf(o.model_path, &model);
    if (s == MK_OK) s = mk_tokenizer_open(model, &tok);
    if (s == MK_OK) s = mk_cli_prompt_ids(tok, &o, &ids, &n_ids, &template_name);
    if (s != MK_OK) {
        const int rc = mk_cli_fail(s);
        mk_tokenizer_free(tok);
        mk_model_free(model);
        return rc;
    }
    const mk_hparams *hp = mk_model_hparams(model);
    /* the KV cache holds the prompt and the answer; more than the model's context fails */
    o.range.max_context = n_ids + o.n_new < hp->max_context ? n_ids + o.n_new : hp->max_context;
    printf("model %s: %s, %zu layers, hidden %zu, vocab %zu; backend %s, weights %s", o.model_path,
           mk_model_architecture(model), hp->n_layers, hp->hidden, hp->vocab,
           o.range.backend.kind == MK_BACKEND_CUDA ? "cuda" : "cpu", mk_dtype_name(o.range.backend.weight_dtype));
    if (o.n_cuts) printf(", seams %s", mk_seam_kind_name(o.seam.kind));
    printf("\n");
    printf("chat template %s; prompt %zu tokens\n", template_name, n_ids);
    mk_cli_gen split = {0}, whole = {0};
    mk_generate_stats st_split, st_whole;
    int rc = 0;
    s = mk_cli_generate(model, tok, &o, o.cuts, o.n_cuts, ids, n_ids, true, &split, &st_split);
    if (s == MK_OK && o.n_cuts > 0) {
        s = mk_cli_generate(model, tok, &o, NULL, 0, ids, n_ids, false, &whole, &st_whole);
        if (s == MK_OK) {
            const bool same_tokens = split.n == whole.n && st_split.eog_token == st_whole.eog_token &&
                                     memcmp(split.tokens, whole.tokens, split.n * sizeof(int32_t)) == 0;
            const bool same_logits = same_tokens && memcmp(split.logits, whole.logits, split.n * split.vocab * sizeof(float)) == 0;
            if (same_tokens && same_logits) {
                printf("parity: exact (whole model: the same %zu tokens%s, logits bit-identical at every step)\n",
                       whole.n, st_whole.stopped_at_eog ? " and end of turn" : "");
            } else {
                printf("parity: MISMATCH (whole model: %zu tokens, tokens %s, logits %s)\n", whole.n,
                       same_tokens ? "equal" : "differ", same_logits ? "equal" : "differ");
                rc = 3;
            }
        }
    }
    if (s != MK_OK) rc = mk_cli_fail(s);
    mk_cli_gen_free(&split);
    mk_cli_gen_free(&whole);
    mk_buffer_free(ids);
    mk_tokenizer_free(tok);
    mk_model_free(model);
    return rc;
}

/* ==================================================================== chat == */

typedef struct mk_chat_state {
    mk_chat_message *msgs;
    size_t n, cap;
    char *cached_text; /* the rendered text whose tokens the KV cache holds */
} mk_chat_state;

static mk_status mk_chat_add(mk_chat_state *c, const char *role, const char *content) {
    MK_TRY(mk_grow_array(&c->msgs, &c->cap, c->n + 1, sizeof *c->msgs, 8, "chat messages"));
    char *copy = strdup(content);
    if (!copy) return MK_ERR_OUT_OF_MEMORY;
    c->msgs[c->n++] = (mk_chat_message){role, copy};
    return MK_OK;
}

/* One turn: render the whole conversation, feed only what the cache does not hold yet
 * (or everything again after a reset when the text no longer extends it), generate. */
static mk_status mk_chat_turn(mk_pipeline *p, const mk_tokenizer *tok, const mk_cli_opts *o, mk_chat_state *c) {
    char *text = NULL;
    size_t len = 0, n_spans = 0;
    mk_text_span *spans = NULL;
    mk_status s = mk_chat_render_spans(tok, c->msgs, c->n, true, &text, &len, &spans, &n_spans);
    if (s != MK_OK) return s;
    const size_t cached = c->cached_text ? strlen(c->cached_text) : 0;
    size_t from = 0;
    if (cached && len > cached && memcmp(text, c->cached_text, cached) == 0) from = cached;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    s = mk_chat_encode_from(tok, text, len, from, spans, n_spans, &ids, &n_ids);
    if (s == MK_ERR_INVALID_UTF8 && from) { /* the cut fell inside a character: start over */
        from = 0;
        s = mk_chat_encode_from(tok, text, len, 0, spans, n_spans, &ids, &n_ids);
    }
    free(spans);
    if (s == MK_OK && from == 0) s = mk_pipeline_reset(p);
    mk_cli_gen g = {0};
    mk_generate_stats st;
    if (s == MK_OK) s = mk_detokenizer_create(tok, 0, &g.stream);
    if (s == MK_OK) s = mk_pipeline_generate(p, tok, ids, n_ids, o->n_new, mk_cli_on_token, &g, &st);
    if (s == MK_OK) {
        mk_cli_stream_end(g.stream);
        printf("\n");
        fflush(stdout);
    }
    char *answer = NULL;
    size_t answer_len = 0;
    /* the cache holds every generated token but the last: the next turn's text must
     * continue from exactly there */
    if (s == MK_OK) s = mk_tokenizer_decode(tok, g.tokens, g.n, 0, &answer, &answer_len);
    if (s == MK_OK) s = mk_chat_add(c, "assistant", answer);
    if (s == MK_OK) {
        char *held = NULL;
        size_t held_len = 0;
        const size_t n_cached = st.stopped_at_eog ? g.n : (g.n ? g.n - 1 : 0);
        s = mk_tokenizer_decode(tok, g.tokens, n_cached, 0, &held, &held_len);
        free(c->cached_text);
        c->cached_text = malloc(len + held_len + 1);
        if (s == MK_OK && c->cached_text) {
            memcpy(c->cached_text, text, len);
            memcpy(c->cached_text + len, held, held_len);
            c->cached_text[len + held_len] = '\0';
        } else if (s == MK_OK) {
            s = MK_ERR_OUT_OF_MEMORY;
        }
        mk_buffer_free(held);
        fprintf(stderr, "[%zu prompt tokens fed%s, %zu generated, %s]\n", n_ids, from ? " (cache kept)" : "", g.n,
                st.stopped_at_eog ? "end of turn" : "token limit");
    }
    mk_buffer_free(answer);
    mk_cli_gen_free(&g);
    mk_buffer_free(ids);
    mk_buffer_free(text);
    return s;
}

int mk_cli_chat(int argc, char **argv) {
    mk_cli_opts o;
    const int bad = mk_text_options(argc, argv, &o, true);
    if (bad >= 0) return bad;
    mk_model *model = NULL;
    mk_tokenizer *tok = NULL;
    mk_pipeline *p = NULL;
    mk_chat_state c = {0};
    mk_chat_template_kind kind;
    mk_status s = mk_model_open_gguf(o.model_path, &model);
    if (s == MK_OK) s = mk_tokenizer_open(model, &tok);
    if (s == MK_OK) s = mk_chat_template_detect(tok, &kind);
    if (s == MK_OK) s = mk_text_pipeline(model, &o, o.cuts, o.n_cuts, &p);
    if (s == MK_OK && o.system) s = mk_chat_add(&c, "system", o.system);
    if (s == MK_OK) {
        fprintf(stderr, "chat with %s (template %s); one message per line, end with an empty line or EOF\n",
                o.model_path, mk_chat_template_name(kind));
        char *line = NULL;
        size_t cap = 0;
        for (;;) {
            if (isatty(STDIN_FILENO)) fputs("> ", stdout), fflush(stdout);
            const ssize_t n = getline(&line, &cap, stdin);
            if (n <= 0) break;
            if (memchr(line, '\0', (size_t)n)) { /* C strings would end the message there, silently */
                s = mk_fail(MK_ERR_INVALID_ARGUMENT, "standard input: a NUL byte in message %zu", c.n + 1);
                break;
            }
            size_t len = (size_t)n; /* the line end, \n or \r\n: a blank line ends the chat */
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
            if (!line[0]) break;
            s = mk_chat_add(&c, "user", line);
            if (s == MK_OK) s = mk_chat_turn(p, tok, &o, &c);
            if (s != MK_OK) break;
        }
        free(line);
    }
    const int rc = s == MK_OK ? 0 : mk_cli_fail(s);
    for (size_t i = 0; i < c.n; i++) free((char *)c.msgs[i].content);
    free(c.msgs);
    free(c.cached_text);
    mk_pipeline_free(p);
    mk_tokenizer_free(tok);
    mk_model_free(model);
    return rc;
}

/* ================================================================ tokenize == */

int mk_cli_tokenize(int argc, char **argv) {
    bool ids_only = false, no_bos = false, no_parse_special = false;
    const mk_cli_option opts[] = {
        {"--ids", NULL, NULL, "only the ids, as a list", NULL, MK_CLI_FLAG, &ids_only, 0, 0, NULL},
        {"--no-bos", NULL, NULL, "without the BOS / EOS the model adds", NULL, MK_CLI_FLAG, &no_bos, 0, 0, NULL},
        {"--no-parse-special", NULL, NULL, "control-token text stays text", NULL, MK_CLI_FLAG, &no_parse_special, 0, 0,
         NULL},
    };
    const mk_cli_group groups[] = {{"options", opts, sizeof opts / sizeof *opts}};
    const mk_cli_command cmd = {"tokenize", "MODEL.gguf TEXT [options]",
                                "  Each token of TEXT with its bytes (only the tokenizer of the file is read).\n",
                                {"MODEL", "TEXT"}, groups, 1};
    const char *pos[2] = {NULL, NULL};
    const int bad = mk_cli_parse(&cmd, argc, argv, pos);
    if (bad >= 0) return bad;
    unsigned flags = MK_TOKENIZE_ADD_SPECIAL | MK_TOKENIZE_PARSE_SPECIAL;
    if (no_bos) flags &= ~MK_TOKENIZE_ADD_SPECIAL;
    if (no_parse_special) flags &= ~MK_TOKENIZE_PARSE_SPECIAL;
    mk_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    mk_status s = mk_tokenizer_open_file(pos[0], &tok);
    if (s == MK_OK) s = mk_tokenizer_encode(tok, pos[1], strlen(pos[1]), flags, &ids, &n);
    if (s != MK_OK) {
        const int rc = mk_cli_fail(s);
        mk_tokenizer_free(tok);
        return rc;
    }
    if (ids_only) {
        printf("[");
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
    } else {
        /* each token's bytes in context: what it adds to the decoded prefix (so SentencePiece's
         * prefix space is removed once, as in the whole text) */
        size_t before = 0;
        for (size_t i = 0; i < n; i++) {
            char *text = NULL;
            size_t len = 0;
            printf("%6d -> '", ids[i]);
            if (mk_tokenizer_decode(tok, ids, i + 1, MK_DECODE_SPECIAL, &text, &len) == MK_OK && len >= before)
                fwrite(text + before, 1, len - before, stdout);
            printf("'\n");
            before = len;
            mk_buffer_free(text);
        }
    }
    mk_buffer_free(ids);
    mk_tokenizer_free(tok);
    return 0;
}
