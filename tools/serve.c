/* meshkern serve MODEL: an OpenAI-compatible HTTP endpoint over the library's scheduler.
 *
 *   POST /v1/chat/completions   messages through the model's chat template; stream or not
 *   POST /v1/completions        a raw prompt (the model's BOS added)
 *   GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text); HEAD on each
 *
 * HTTP is libmicrohttpd's, one thread per connection (capped; idle connections time out);
 * JSON is cJSON's (serve_req.c turns a body into a checked request). Each accepted request
 * becomes one sequence of an mk_sched: the tail stage's token callback appends the token
 * to the request's job and wakes its connection thread, which detokenizes, holds back text
 * that may yet become a stop string, and writes the answer (one SSE chunk per piece of text
 * when streamed). A streamed client that goes away cancels its sequence (mk_sched_cancel:
 * its slot is free within one step); every sequence's record is released when its request
 * ends (mk_sched_release), so memory does not grow with the requests served. SIGTERM/SIGINT:
 * new requests get 503, those in flight finish (cut short after --drain-timeout), then the
 * process exits 0. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "cli.h"
#include "core/mk_size.h"
#include "mk_error.h"
#include "serve.h"

/* ================================================================ server == */

/* Counted responses, by status. */
static const int mk_codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
#define MK_N_CODES (sizeof mk_codes / sizeof mk_codes[0])

/* One accepted request's sequence: tokens appended by the tail's callback. Guarded by
 * srv->mu; `cv` wakes the connection thread. */
typedef struct mk_job {
    uint64_t seq;
    int32_t *tokens; /* [cap] */
    size_t n_tokens, cap;
    pthread_cond_t cv;
    /* the stage engine: the job is its request until it leaves the table */
    const int32_t *prompt; /* [n_prompt]: the connection's, read under srv->mu only */
    size_t n_prompt;
    bool admitted;         /* rank 0 took it (running) */
    bool ended, failed;    /* its report came: done, or failed with `error` */
    char error[300];
} mk_job;

/* What runs the sequences: the library's scheduler in this process (meshkern serve), or
 * rank 0 of a process-per-range run (meshkern stage --serve). */
typedef enum mk_engine { MK_ENGINE_SCHED, MK_ENGINE_STAGE } mk_engine;
typedef enum mk_health { MK_HEALTH_LOADING, MK_HEALTH_READY, MK_HEALTH_DEGRADED } mk_health;

typedef struct mk_server {
    const mk_model *model;
    mk_tokenizer *tok;
    mk_engine engine;
    mk_sched *sched;          /* MK_ENGINE_SCHED */
    /* MK_ENGINE_STAGE: rank 0's serving thread and its source */
    mk_stage *stage;
    pthread_t stage_thread;
    bool stage_thread_started;
    int wake_fd;              /* eventfd: a job to take, or the drain's end */
    bool closing;             /* drained: the source closes, every request is cut */
    int32_t *take_buf;        /* the prompt rank 0 is taking (the job may go meanwhile) */
    size_t take_cap;
    mk_health health;
    char degraded[512];       /* why the stage run ended */
    size_t kv_sequences;      /* sequences that can hold a KV cache at once */
    size_t kv_bytes_each;     /* KV bytes one sequence reserves, over every range */
    mk_serve_limits lim;
    char model_id[256];
    const char *api_key;
    size_t max_body;
    size_t max_conn;          /* --max-connections: generation requests beyond it get 503 */
    size_t open_conns;        /* connections open now (atomic; MHD's connection notices) */
    int32_t *eog;        /* [n_eog] end-of-generation ids: every sequence stops on them */
    size_t n_eog;
    time_t started;

    pthread_mutex_t mu;
    mk_job **jobs;       /* [max_jobs]: accepted, not yet finished */
    size_t max_jobs, n_jobs;
    size_t n_active;     /* completion requests between acceptance and their connection's end */
    bool draining;
    pthread_cond_t idle_cv; /* n_active reached 0 */
    uint64_t next_id;
    /* metrics */
    uint64_t by_code[MK_N_CODES];
    uint64_t cancelled, failed, prompt_tokens, generated_tokens;
} mk_server;

/* ============================================================== engines == */

static mk_job *mk_job_of(mk_server *srv, uint64_t seq) { /* under srv->mu */
    for (size_t i = 0; i < srv->n_jobs; i++)
        if (srv->jobs[i]->seq == seq) return srv->jobs[i];
    return NULL;
}

static void mk_wake(mk_server *srv) {
    const uint64_t one = 1;
    if (srv->wake_fd >= 0) (void)!write(srv->wake_fd, &one, sizeof one);
}

/* Start a job's sequence (under srv->mu: the first token cannot arrive before the job is listed). */
static mk_status mk_engine_submit(mk_server *srv, mk_job *job, const int32_t *ids, size_t n, size_t max_tokens) {
    if (srv->engine == MK_ENGINE_SCHED)
        return mk_sched_submit(srv->sched, ids, n, max_tokens, srv->eog, srv->n_eog, &job->seq);
    if (srv->health != MK_HEALTH_READY)
        return mk_fail(MK_ERR_PEER_LOST, "%s", srv->health == MK_HEALTH_LOADING ? "the stages are still joining"
                                                                                : srv->degraded);
    job->seq = ++srv->next_id;
    job->prompt = ids;
    job->n_prompt = n;
    mk_wake(srv);
    return MK_OK;
}

/* The job left the table (srv->mu not held): its sequence is cut unless it ended. The
 * stage's rank 0 cuts it before its next step (mk_source_cancelled), when it finds the job
 * gone. */
static void mk_engine_end(mk_server *srv, mk_job *job, bool cancel) {
    if (srv->engine != MK_ENGINE_SCHED) return;
    if (cancel) (void)mk_sched_cancel(srv->sched, job->seq);
    (void)mk_sched_release(srv->sched, job->seq); /* its record goes when it retires */
}

/* Has the job's sequence ended? (srv->mu not held) */
static bool mk_engine_ended(mk_server *srv, mk_job *job, bool *failed, char *why, size_t why_len) {
    if (srv->engine == MK_ENGINE_SCHED) {
        mk_seq_info info;
        if (mk_sched_poll(srv->sched, job->seq, &info, NULL, 0) != MK_OK || info.state < MK_SEQ_DONE) return false;
        *failed = info.state == MK_SEQ_FAILED;
        if (*failed) snprintf(why, why_len, "%s: %s", mk_status_name(info.status), info.error);
        return true;
    }
    pthread_mutex_lock(&srv->mu);
    const bool ended = job->ended;
    *failed = job->failed;
    if (job->failed) snprintf(why, why_len, "%.270s", job->error);
    pthread_mutex_unlock(&srv->mu);
    return ended;
}

/* Waiting for a slot (under srv->mu). */
static bool mk_engine_queued(mk_server *srv, const mk_job *job) {
    if (srv->engine == MK_ENGINE_STAGE) return !job->admitted && !job->ended;
    mk_seq_info info;
    return mk_sched_poll(srv->sched, job->seq, &info, NULL, 0) == MK_OK && info.state == MK_SEQ_QUEUED;
}

/* ------------------------------------------- rank 0's source (stage thread) */

/* The oldest job not yet taken: its prompt, copied (its connection may end meanwhile). */
static bool mk_source_take(void *user, mk_stage_arrival *next) {
    mk_server *srv = user;
    uint64_t drained;
    (void)!read(srv->wake_fd, &drained, sizeof drained); /* nonblocking: the news is read here */
    pthread_mutex_lock(&srv->mu);
    mk_job *oldest = NULL;
    for (size_t i = 0; !srv->closing && i < srv->n_jobs; i++) {
        mk_job *j = srv->jobs[i];
        if (!j->admitted && !j->ended && (!oldest || j->seq < oldest->seq)) oldest = j;
    }
    bool took = false;
    if (oldest && oldest->n_prompt <= srv->take_cap) {
        memcpy(srv->take_buf, oldest->prompt, oldest->n_prompt * sizeof *srv->take_buf);
        *next = (mk_stage_arrival){srv->take_buf, oldest->n_prompt, oldest->cap, oldest->seq};
        oldest->admitted = took = true;
    }
    pthread_mutex_unlock(&srv->mu);
    return took;
}

static bool mk_source_closed(void *user) {
    mk_server *srv = user;
    pthread_mutex_lock(&srv->mu);
    const bool closed = srv->closing;
    pthread_mutex_unlock(&srv->mu);
    return closed;
}

/* A token for a job still listed goes to it. A job gone (client left, drained) is cut by
 * mk_source_cancelled, which rank 0 asks before the request's next step. */
static bool mk_source_token(void *user, uint64_t tag, int32_t token) {
    mk_server *srv = user;
    pthread_mutex_lock(&srv->mu);
    mk_job *j = srv->closing ? NULL : mk_job_of(srv, tag);
    if (j) {
        if (j->n_tokens < j->cap) j->tokens[j->n_tokens++] = token;
        pthread_cond_signal(&j->cv);
    }
    pthread_mutex_unlock(&srv->mu);
    return true;
}

/* Asked between steps: a job gone (client left, drained) is cut, in its prompt's chunks or
 * between its tokens. */
static bool mk_source_cancelled(void *user, uint64_t tag) {
    mk_server *srv = user;
    pthread_mutex_lock(&srv->mu);
    const bool gone = srv->closing || !mk_job_of(srv, tag);
    pthread_mutex_unlock(&srv->mu);
    return gone;
}

static void mk_source_report(void *user, const mk_stage_report *r) {
    mk_server *srv = user;
    pthread_mutex_lock(&srv->mu);
    /* A request refused alone says so (no prompt, over the context); any other failure is
     * the run's, reported for each request in flight: the server is degraded before the
     * first of them reaches its client. */
    if (r->status != MK_OK && r->status != MK_ERR_EMPTY_INPUT && r->status != MK_ERR_CONTEXT_OVERFLOW &&
        srv->health != MK_HEALTH_DEGRADED) {
        srv->health = MK_HEALTH_DEGRADED;
        snprintf(srv->degraded, sizeof srv->degraded, "the stage run failed: %s: %.400s", mk_status_name(r->status),
                 r->error);
    }
    mk_job *j = mk_job_of(srv, (uint64_t)r->request);
    if (j) {
        j->ended = true;
        j->failed = r->status != MK_OK;
        if (j->failed) snprintf(j->error, sizeof j->error, "%s: %.260s", mk_status_name(r->status), r->error);
        pthread_cond_signal(&j->cv);
    }
    pthread_mutex_unlock(&srv->mu);
}

/* Rank 0's serving thread: until the drain closes the source, or the run fails (a rank
 * lost): then the server is degraded, and every job not ended fails with the reason. */
static void *mk_stage_main(void *arg) {
    mk_server *srv = arg;
    const mk_stage_source src = {sizeof src,       mk_source_take, mk_source_token, mk_source_report,
                                 mk_source_closed, srv->wake_fd,   srv,             mk_source_cancelled};
    const mk_status s = mk_stage_serve_source(srv->stage, &src);
    pthread_mutex_lock(&srv->mu);
    if (s != MK_OK) {
        if (srv->health != MK_HEALTH_DEGRADED) /* no request was in flight to report it */
            snprintf(srv->degraded, sizeof srv->degraded, "the stage run failed: %s: %.400s", mk_status_name(s),
                     mk_last_error());
        srv->health = MK_HEALTH_DEGRADED;
        fprintf(stderr, "meshkern stage --serve: %s\n", srv->degraded);
    }
    for (size_t i = 0; i < srv->n_jobs; i++) {
        mk_job *j = srv->jobs[i];
        if (j->ended) continue;
        j->ended = j->failed = true;
        snprintf(j->error, sizeof j->error, "%.290s", s != MK_OK ? srv->degraded : "the server stopped");
        pthread_cond_signal(&j->cv);
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* The tail's token callback: the token goes to its job, if the job is still there. */
static void mk_serve_on_token(void *user, uint64_t seq_id, size_t index, int32_t token, const float *logits,
                              size_t vocab) {
    (void)logits, (void)vocab, (void)index;
    mk_server *srv = user;
    pthread_mutex_lock(&srv->mu);
    for (size_t i = 0; i < srv->n_jobs; i++) {
        mk_job *j = srv->jobs[i];
        if (j->seq != seq_id) continue;
        if (j->n_tokens < j->cap) j->tokens[j->n_tokens++] = token;
        pthread_cond_signal(&j->cv);
        break;
    }
    pthread_mutex_unlock(&srv->mu);
}

static bool mk_serve_is_eog(const mk_server *srv, int32_t token) {
    for (size_t i = 0; i < srv->n_eog; i++)
        if (srv->eog[i] == token) return true;
    return false;
}

/* ============================================================ a request == */

typedef enum mk_route { MK_ROUTE_NONE = 0, MK_ROUTE_CHAT, MK_ROUTE_COMPLETION } mk_route;

/* Per connection request (MHD's con_cls). */
typedef struct mk_conn {
    mk_server *srv;
    mk_route route;
    char *body;
    size_t body_len, body_cap;
    bool active;             /* counted in srv->n_active */
    /* the generation */
    mk_serve_req req;
    mk_job *job;             /* NULL once finished (or never submitted) */
    mk_detokenizer *detok;
    char *text;              /* the answer so far (detokenized) */
    size_t text_len, text_cap;
    size_t consumed;         /* tokens of the job taken */
    size_t completion_tokens;
    size_t sent;             /* bytes of text handed to the client */
    size_t ruled_out;        /* no stop string starts before this byte of text */
    bool finished;
    const char *finish_reason; /* "stop", "length", or NULL on failure */
    char error[300];         /* the sequence failed */
    char id[64];
    time_t created;
    /* streaming: SSE bytes waiting for the socket */
    char *out;
    size_t out_len, out_pos, out_cap;
    bool stream_started, stream_done;
    int fd;                  /* the client's socket: watched for a hang-up while waiting */
    bool gone;               /* the client went away: the sequence was cancelled */
} mk_conn;

/* The client closed its end (a waiting client never does). */
static bool mk_client_gone(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static bool mk_append(char **buf, size_t *len, size_t *cap, const char *data, size_t n) {
    if (mk_grow_array(buf, cap, *len + n + 1, 1, 256, "server text") != MK_OK) return false;
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

/* Leave the job table; the sequence is cancelled unless it already ended. */
static void mk_conn_end_job(mk_conn *c, bool cancel) {
    mk_server *srv = c->srv;
    if (!c->job) return;
    pthread_mutex_lock(&srv->mu);
    for (size_t i = 0; i < srv->n_jobs; i++)
        if (srv->jobs[i] == c->job) {
            srv->jobs[i] = srv->jobs[--srv->n_jobs];
            break;
        }
    pthread_mutex_unlock(&srv->mu);
    mk_engine_end(srv, c->job, cancel);
    pthread_cond_destroy(&c->job->cv);
    free(c->job->tokens);
    free(c->job);
    c->job = NULL;
}

static void mk_conn_finish(mk_conn *c, const char *reason, bool cancel) {
    if (c->detok && reason) { /* bytes of an unfinished character come out as U+FFFD */
        const char *t;
        size_t n;
        if (mk_detokenizer_flush(c->detok, &t, &n) == MK_OK && n) mk_append(&c->text, &c->text_len, &c->text_cap, t, n);
    }
    c->finish_reason = reason;
    c->finished = true;
    mk_conn_end_job(c, cancel);
    pthread_mutex_lock(&c->srv->mu);
    c->srv->generated_tokens += c->completion_tokens;
    if (!reason) c->srv->failed++;
    pthread_mutex_unlock(&c->srv->mu);
}

/* Take the tokens that arrived, waiting up to ~250 ms for one; returns after any progress
 * or when the sequence ended. The answer's end: an end-of-generation token ("stop"), a stop
 * string ("stop", the text cut before it), max_tokens ("length"), or the sequence failed. */
static void mk_conn_advance(mk_conn *c) {
    mk_server *srv = c->srv;
    int32_t batch[64];
    size_t n = 0, base = c->consumed;
    pthread_mutex_lock(&srv->mu);
    if (c->job->n_tokens == c->consumed) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        (void)pthread_cond_timedwait(&c->job->cv, &srv->mu, &until);
    }
    while (c->consumed < c->job->n_tokens && n < 64) batch[n++] = c->job->tokens[c->consumed++];
    pthread_mutex_unlock(&srv->mu);
    if (mk_client_gone(c->fd)) { /* nobody to answer: free the slot now */
        mk_conn_end_job(c, true);
        pthread_mutex_lock(&srv->mu);
        srv->cancelled++;
        srv->generated_tokens += c->completion_tokens;
        pthread_mutex_unlock(&srv->mu);
        c->gone = c->finished = true;
        return;
    }
    if (n == 0) { /* nothing new: has the sequence failed, or been cut short (drain)? */
        bool failed = false;
        char why[280] = "";
        if (!mk_engine_ended(srv, c->job, &failed, why, sizeof why)) return;
        pthread_mutex_lock(&srv->mu); /* its tokens all arrive before it is seen ended */
        const bool all = c->job->n_tokens == c->consumed;
        pthread_mutex_unlock(&srv->mu);
        if (!all) return;
        if (failed) {
            snprintf(c->error, sizeof c->error, "generation failed: %.270s", why);
            mk_conn_finish(c, NULL, false);
        } else {
            mk_conn_finish(c, "length", false);
        }
        return;
    }
    for (size_t i = 0; i < n && !c->finished; i++) {
        const size_t index = base + i;
        if (mk_serve_is_eog(srv, batch[i])) {
            mk_conn_finish(c, "stop", false);
            break;
        }
        c->completion_tokens++;
        const char *t;
        size_t len;
        if (mk_detokenizer_push(c->detok, batch[i], &t, &len) != MK_OK ||
            !mk_append(&c->text, &c->text_len, &c->text_cap, t, len)) {
            snprintf(c->error, sizeof c->error, "detokenizing failed: %s", mk_last_error());
            mk_conn_finish(c, NULL, index + 1 < c->req.max_tokens);
            break;
        }
        size_t cut, safe;
        if (c->req.n_stop && mk_serve_stop_scan(&c->req, c->text, c->text_len, c->ruled_out, &cut, &safe)) {
            mk_conn_finish(c, "stop", index + 1 < c->req.max_tokens);
            c->text_len = cut; /* the stop string and all after it (held bytes included) go */
            c->text[cut] = '\0';
            break;
        }
        if (c->req.n_stop) c->ruled_out = safe;
        if (index + 1 == c->req.max_tokens) mk_conn_finish(c, "length", false);
    }
}

/* How much of the text may go out now: all of it once finished, else what no stop string
 * can still claim. */
static size_t mk_conn_sendable(const mk_conn *c) {
    if (c->finished || c->req.n_stop == 0) return c->text_len;
    return c->ruled_out; /* the scan after the last token said so */
}

/* ========================================================== JSON bodies == */

static void mk_add_usage(cJSON *root, const mk_conn *c) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)c->req.n_ids);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)c->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(c->req.n_ids + c->completion_tokens));
}

static cJSON *mk_body_head(const mk_conn *c, const char *object) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", c->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)c->created);
    cJSON_AddStringToObject(root, "model", c->srv->model_id);
    return root;
}

/* The whole answer (not streamed). */
static char *mk_final_json(const mk_conn *c) {
    const bool chat = c->route == MK_ROUTE_CHAT;
    cJSON *root = mk_body_head(c, chat ? "chat.completion" : "text_completion");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(choice, "index", 0);
    if (chat) {
        cJSON *m = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", c->text ? c->text : "");
    } else {
        cJSON_AddStringToObject(choice, "text", c->text ? c->text : "");
    }
    cJSON_AddNullToObject(choice, "logprobs");
    cJSON_AddStringToObject(choice, "finish_reason", c->finish_reason);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
    mk_add_usage(root, c);
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

/* One SSE chunk: text[n] as the delta (role with the first chat chunk), finish_reason when
 * given; usage_only: the final usage chunk (no choices). */
static bool mk_sse_chunk(mk_conn *c, const char *text, size_t n, const char *finish, bool usage_only) {
    const bool chat = c->route == MK_ROUTE_CHAT;
    cJSON *root = mk_body_head(c, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    if (!usage_only) {
        cJSON *choice = cJSON_CreateObject();
        cJSON_AddNumberToObject(choice, "index", 0);
        char *piece = malloc(n + 1);
        if (piece) memcpy(piece, text, n), piece[n] = '\0';
        if (chat) {
            cJSON *d = cJSON_AddObjectToObject(choice, "delta");
            if (!c->stream_started) cJSON_AddStringToObject(d, "role", "assistant");
            if (n || !finish) cJSON_AddStringToObject(d, "content", piece ? piece : "");
        } else {
            cJSON_AddStringToObject(choice, "text", piece ? piece : "");
        }
        free(piece);
        cJSON_AddNullToObject(choice, "logprobs");
        if (finish) cJSON_AddStringToObject(choice, "finish_reason", finish);
        else cJSON_AddNullToObject(choice, "finish_reason");
        cJSON_AddItemToArray(choices, choice);
        if (c->req.include_usage) cJSON_AddNullToObject(root, "usage");
    } else {
        mk_add_usage(root, c);
    }
    c->stream_started = true;
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    const bool ok = json && mk_append(&c->out, &c->out_len, &c->out_cap, "data: ", 6) &&
                    mk_append(&c->out, &c->out_len, &c->out_cap, json, strlen(json)) &&
                    mk_append(&c->out, &c->out_len, &c->out_cap, "\n\n", 2);
    free(json);
    return ok;
}

/* ============================================================ responses == */

static void mk_count(mk_server *srv, int code) {
    pthread_mutex_lock(&srv->mu);
    for (size_t i = 0; i < MK_N_CODES; i++)
        if (mk_codes[i] == code) srv->by_code[i]++;
    pthread_mutex_unlock(&srv->mu);
}

static enum MHD_Result mk_respond(struct MHD_Connection *conn, mk_server *srv, unsigned code, const char *type,
                                  char *body /* malloc'd, taken */, const char *extra_header, const char *extra_value) {
    struct MHD_Response *r = MHD_create_response_from_buffer(body ? strlen(body) : 0, body ? body : (char *)"",
                                                             body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (extra_header) MHD_add_response_header(r, extra_header, extra_value);
    const enum MHD_Result ok = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    mk_count(srv, (int)code);
    return ok;
}

static enum MHD_Result mk_respond_error(struct MHD_Connection *conn, mk_server *srv, const mk_serve_err *err,
                                        const char *extra_header, const char *extra_value) {
    return mk_respond(conn, srv, (unsigned)err->http, "application/json", mk_serve_error_json(err), extra_header,
                      extra_value);
}

static enum MHD_Result mk_refuse_now(struct MHD_Connection *conn, mk_server *srv, int http, const char *code,
                                     const char *extra_header, const char *extra_value, const char *fmt, ...) {
    mk_serve_err err;
    mk_serve_refuse(&err, http, code, NULL, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof err.message, fmt, ap);
    va_end(ap);
    return mk_respond_error(conn, srv, &err, extra_header, extra_value);
}

/* A body over --max-body while it is still arriving (a chunked body gives no length up front).
 * libmicrohttpd 0.9.75 queues no response in the middle of an upload, and reading on to the end of
 * a body that may never end is no answer: write the 413 on the socket, close our side, drop what
 * the client sends for a moment so a reset does not destroy the answer, and end the connection. */
static long mk_ms_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)(t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

static enum MHD_Result mk_refuse_upload(mk_conn *c) {
    mk_serve_err err;
    mk_serve_refuse(&err, 413, "request_too_large", NULL, "the request body is over this server's limit of %zu bytes",
                    c->srv->max_body);
    char *body = mk_serve_error_json(&err);
    char *msg = NULL;
    size_t len = 0, cap = 0;
    char head[160];
    snprintf(head, sizeof head,
             "HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
             "Connection: close\r\n\r\n",
             body ? strlen(body) : 0);
    const bool built = body && mk_append(&msg, &len, &cap, head, strlen(head)) && mk_append(&msg, &len, &cap, body, strlen(body));
    if (built && c->fd >= 0) {
        mk_count(c->srv, 413);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (size_t off = 0; off < len && mk_ms_since(&t0) < 2000;) { /* a few hundred bytes: sent at once */
            const ssize_t n = send(c->fd, msg + off, len - off, MSG_NOSIGNAL);
            if (n > 0) off += (size_t)n;
            else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                poll(&(struct pollfd){.fd = c->fd, .events = POLLOUT}, 1, 100);
            else
                break; /* the client is gone */
        }
        shutdown(c->fd, SHUT_WR);
        char sink[16384];
        clock_gettime(CLOCK_MONOTONIC, &t0); /* a second of draining from here */
        while (mk_ms_since(&t0) < 1000 && poll(&(struct pollfd){.fd = c->fd, .events = POLLIN}, 1, 100) >= 0) {
            const ssize_t n = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
        }
    }
    free(msg);
    free(body);
    return MHD_NO;
}

static char *mk_metrics_text(mk_server *srv) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    char line[256];
    pthread_mutex_lock(&srv->mu);
#define MK_LINE(...) (snprintf(line, sizeof line, __VA_ARGS__), mk_append(&buf, &len, &cap, line, strlen(line)))
    MK_LINE("# HELP meshkern_requests_total HTTP responses by status code.\n# TYPE meshkern_requests_total counter\n");
    for (size_t i = 0; i < MK_N_CODES; i++)
        MK_LINE("meshkern_requests_total{code=\"%d\"} %llu\n", mk_codes[i], (unsigned long long)srv->by_code[i]);
    MK_LINE("# HELP meshkern_requests_cancelled_total Streamed requests whose client went away (sequence cancelled).\n"
            "# TYPE meshkern_requests_cancelled_total counter\nmeshkern_requests_cancelled_total %llu\n",
            (unsigned long long)srv->cancelled);
    MK_LINE("# HELP meshkern_requests_failed_total Requests whose sequence failed.\n"
            "# TYPE meshkern_requests_failed_total counter\nmeshkern_requests_failed_total %llu\n",
            (unsigned long long)srv->failed);
    MK_LINE("# HELP meshkern_prompt_tokens_total Prompt tokens of accepted requests.\n"
            "# TYPE meshkern_prompt_tokens_total counter\nmeshkern_prompt_tokens_total %llu\n",
            (unsigned long long)srv->prompt_tokens);
    MK_LINE("# HELP meshkern_generated_tokens_total Tokens generated into answers.\n"
            "# TYPE meshkern_generated_tokens_total counter\nmeshkern_generated_tokens_total %llu\n",
            (unsigned long long)srv->generated_tokens);
    MK_LINE("# HELP meshkern_sequences_in_flight Sequences submitted and not finished (running or queued).\n"
            "# TYPE meshkern_sequences_in_flight gauge\nmeshkern_sequences_in_flight %zu\n", srv->n_jobs);
    size_t queued = 0;
    for (size_t i = 0; i < srv->n_jobs; i++) queued += mk_engine_queued(srv, srv->jobs[i]);
    MK_LINE("# HELP meshkern_sequences_queued Sequences waiting for a slot.\n"
            "# TYPE meshkern_sequences_queued gauge\nmeshkern_sequences_queued %zu\n", queued);
    MK_LINE("# HELP meshkern_sequences_capacity Sequences admitted before 429 (slots + queue).\n"
            "# TYPE meshkern_sequences_capacity gauge\nmeshkern_sequences_capacity %zu\n", srv->max_jobs);
    MK_LINE("# HELP meshkern_draining 1 after SIGTERM.\n# TYPE meshkern_draining gauge\nmeshkern_draining %d\n",
            srv->draining ? 1 : 0);
    /* KV as whole sequences: each running one counted at --ctx positions in every range (an
     * upper bound: the pools below hold what the sequences really took) */
    const size_t running = srv->n_jobs - queued;
    MK_LINE("# HELP meshkern_kv_sequences Sequences the server runs, each counted as holding a KV cache (in_use; "
            "a finished one's blocks go back when its stage takes them: meshkern_kv_blocks counts them), and the most "
            "at once (capacity).\n");
    MK_LINE("# TYPE meshkern_kv_sequences gauge\nmeshkern_kv_sequences{kind=\"in_use\"} %zu\n"
            "meshkern_kv_sequences{kind=\"capacity\"} %zu\n", running, srv->kv_sequences);
    MK_LINE("# HELP meshkern_kv_bytes KV cache bytes over every range: held by running sequences (in_use), "
            "reserved for all slots (capacity).\n# TYPE meshkern_kv_bytes gauge\n"
            "meshkern_kv_bytes{kind=\"in_use\"} %zu\nmeshkern_kv_bytes{kind=\"capacity\"} %zu\n",
            running * srv->kv_bytes_each, srv->kv_sequences * srv->kv_bytes_each);
    const mk_health health = srv->health;
    pthread_mutex_unlock(&srv->mu);
    MK_LINE("# HELP meshkern_stage_busy_seconds_total Time each stage spent in its forwards%s.\n"
            "# TYPE meshkern_stage_busy_seconds_total counter\n",
            srv->engine == MK_ENGINE_STAGE ? " (stage --serve: rank 0's; the others report with the run's end)" : "");
    MK_LINE("# HELP meshkern_stage_steps_total Forwards each stage ran.\n# TYPE meshkern_stage_steps_total counter\n");
    MK_LINE("# HELP meshkern_seam_bytes_total Bytes of boundaries that crossed each seam (seam k: stage k to k + 1).\n"
            "# TYPE meshkern_seam_bytes_total counter\n");
    MK_LINE("# HELP meshkern_kv_blocks Each stage's KV pool in blocks: all of them (capacity), held by no sequence "
            "(free), of those promised to admitted sequences (promised)%s.\n# TYPE meshkern_kv_blocks gauge\n",
            srv->engine == MK_ENGINE_STAGE ? " (stage --serve: rank 0's)" : "");
    const size_t pools = srv->engine == MK_ENGINE_SCHED ? mk_sched_worker_count(srv->sched)
                         : health != MK_HEALTH_LOADING && srv->stage ? 1 : 0;
    for (size_t k = 0; k < pools; k++) {
        const mk_range *range = srv->engine == MK_ENGINE_SCHED ? mk_sched_worker_range(srv->sched, k)
                                                                : mk_stage_range(srv->stage);
        mk_kv_pool_info kv;
        if (!range || mk_range_kv_pool(range, &kv) != MK_OK) continue;
        MK_LINE("meshkern_kv_blocks{stage=\"%zu\",kind=\"capacity\"} %zu\nmeshkern_kv_blocks{stage=\"%zu\",kind=\"free\"} "
                "%zu\nmeshkern_kv_blocks{stage=\"%zu\",kind=\"promised\"} %zu\n",
                k, kv.blocks, k, kv.free_blocks, k, kv.promised_blocks);
    }
    if (srv->engine == MK_ENGINE_SCHED) {
        const size_t workers = mk_sched_worker_count(srv->sched);
        for (size_t w = 0; w < workers; w++) {
            mk_worker_stats st;
            if (mk_sched_worker_stats(srv->sched, w, &st) != MK_OK) continue;
            MK_LINE("meshkern_stage_busy_seconds_total{stage=\"%zu\"} %.6f\nmeshkern_stage_steps_total{stage=\"%zu\"} %zu\n",
                    w, (double)st.busy_ns * 1e-9, w, st.steps);
        }
        for (size_t k = 0; k + 1 < workers; k++)
            MK_LINE("meshkern_seam_bytes_total{seam=\"%zu\"} %zu\n", k, mk_sched_seam_bytes(srv->sched, k));
    } else if (health != MK_HEALTH_LOADING && srv->stage) {
        mk_stage_live_stats live;
        if (mk_stage_live(srv->stage, &live) == MK_OK)
            MK_LINE("meshkern_stage_busy_seconds_total{stage=\"0\"} %.6f\nmeshkern_stage_steps_total{stage=\"0\"} %llu\n"
                    "meshkern_seam_bytes_total{seam=\"0\"} %llu\n",
                    live.busy_seconds, (unsigned long long)live.steps, (unsigned long long)live.bytes_sent);
    }
#undef MK_LINE
    return buf;
}

/* SSE: MHD asks for the next bytes; block until there are some (or the end). */
static ssize_t mk_stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    mk_conn *c = cls;
    for (;;) {
        if (c->out_pos < c->out_len) {
            size_t n = c->out_len - c->out_pos;
            if (n > max) n = max;
            memcpy(buf, c->out + c->out_pos, n);
            c->out_pos += n;
            if (c->out_pos == c->out_len) c->out_pos = c->out_len = 0;
            return (ssize_t)n;
        }
        if (c->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!c->finished) mk_conn_advance(c);
        if (c->gone) return MHD_CONTENT_READER_END_WITH_ERROR;
        const size_t sendable = mk_conn_sendable(c);
        bool ok = true;
        if (sendable > c->sent) {
            ok = mk_sse_chunk(c, c->text + c->sent, sendable - c->sent, NULL, false);
            c->sent = sendable;
        } else if (!c->stream_started) {
            ok = mk_sse_chunk(c, "", 0, NULL, false); /* the role, at once */
        }
        if (ok && c->finished) {
            if (c->finish_reason) {
                ok = mk_sse_chunk(c, "", 0, c->finish_reason, false);
                if (ok && c->req.include_usage) ok = mk_sse_chunk(c, NULL, 0, NULL, true);
            } else {
                mk_serve_err err;
                mk_serve_refuse(&err, 500, "generation_failed", NULL, "%s", c->error);
                char *json = mk_serve_error_json(&err);
                ok = json && mk_append(&c->out, &c->out_len, &c->out_cap, "data: ", 6) &&
                     mk_append(&c->out, &c->out_len, &c->out_cap, json, strlen(json)) &&
                     mk_append(&c->out, &c->out_len, &c->out_cap, "\n\n", 2);
                free(json);
            }
            ok = ok && mk_append(&c->out, &c->out_len, &c->out_cap, "data: [DONE]\n\n", 14);
            c->stream_done = true;
        }
        if (!ok) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* An accepted request: a sequence of the scheduler, or 429 when slots and queue are full. */
static enum MHD_Result mk_start_generation(struct MHD_Connection *conn, mk_conn *c) {
    mk_server *srv = c->srv;
    mk_job *job = calloc(1, sizeof *job);
    if (job) job->tokens = malloc(c->req.max_tokens * sizeof *job->tokens);
    if (!job || !job->tokens) {
        if (job) free(job);
        return mk_refuse_now(conn, srv, 500, "out_of_memory", NULL, NULL, "out of memory");
    }
    job->cap = c->req.max_tokens;
    pthread_cond_init(&job->cv, NULL);
    pthread_mutex_lock(&srv->mu);
    const bool full = srv->n_jobs == srv->max_jobs, draining = srv->draining;
    mk_status s = MK_OK;
    if (!full && !draining) {
        /* submitted under the lock: the first token cannot arrive before the job is listed */
        s = mk_engine_submit(srv, job, c->req.ids, c->req.n_ids, c->req.max_tokens);
        if (s == MK_OK) {
            srv->jobs[srv->n_jobs++] = job;
            srv->prompt_tokens += c->req.n_ids;
            c->id[0] = '\0';
            snprintf(c->id, sizeof c->id, "%s-%llx%llx", c->route == MK_ROUTE_CHAT ? "chatcmpl" : "cmpl",
                     (unsigned long long)srv->started, (unsigned long long)++srv->next_id);
        }
    }
    pthread_mutex_unlock(&srv->mu);
    if (full || draining || s != MK_OK) {
        pthread_cond_destroy(&job->cv);
        free(job->tokens);
        free(job);
        if (draining)
            return mk_refuse_now(conn, srv, 503, "shutting_down", "Retry-After", "5", "the server is shutting down");
        if (full)
            return mk_refuse_now(conn, srv, 429, "rate_limit_exceeded", "Retry-After", "1",
                                 "the server is busy: %zu requests in flight (slots and queue); retry later", srv->max_jobs);
        if (s == MK_ERR_PEER_LOST) /* the stages: joining, or a rank lost */
            return mk_refuse_now(conn, srv, 503, "unavailable", "Retry-After", "5", "%s", mk_last_error());
        return mk_refuse_now(conn, srv, 500, "submit_failed", NULL, NULL, "%s: %s", mk_status_name(s), mk_last_error());
    }
    c->job = job;
    c->created = time(NULL);
    if (mk_detokenizer_create(srv->tok, 0, &c->detok) != MK_OK) {
        mk_conn_end_job(c, true);
        return mk_refuse_now(conn, srv, 500, "internal_error", NULL, NULL, "%s", mk_last_error());
    }
    if (c->req.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, mk_stream_reader, c, NULL);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        const enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        mk_count(srv, 200);
        return ok;
    }
    while (!c->finished) mk_conn_advance(c); /* this connection's own thread */
    if (c->gone) return MHD_NO;            /* close: nobody reads an answer */
    if (!c->finish_reason) return mk_refuse_now(conn, srv, 500, "generation_failed", NULL, NULL, "%s", c->error);
    return mk_respond(conn, srv, MHD_HTTP_OK, "application/json", mk_final_json(c), NULL, NULL);
}

/* ============================================================== routing == */

/* The key from "Authorization: Bearer KEY", compared in time independent of where it differs. */
static bool mk_authorized(struct MHD_Connection *conn, const mk_server *srv) {
    if (!srv->api_key) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false; /* the scheme is case-insensitive (RFC 9110 11.1) */
    const char *given = h + 7, *key = srv->api_key;
    const size_t lg = strlen(given), lk = strlen(key);
    volatile unsigned char diff = lg != lk;
    for (size_t i = 0; i < lk; i++) diff |= (unsigned char)(key[i] ^ (i < lg ? given[i] : 0));
    return diff == 0;
}

/* The served model as GET /v1/models lists it and GET /v1/models/{id} returns it. */
static cJSON *mk_model_object(const mk_server *srv) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->started);
    cJSON_AddStringToObject(m, "owned_by", "meshkern");
    cJSON_AddNumberToObject(m, "context_length", (double)srv->lim.context);
    return m;
}

#define MK_MODEL_PREFIX "/v1/models/" /* GET /v1/models/{id} */

/* GET (or HEAD: libmicrohttpd sends the headers of the same response, no body) on /health,
 * /metrics, /v1/models, /v1/models/{id}. */
static enum MHD_Result mk_handle_get(struct MHD_Connection *conn, mk_server *srv, const char *url) {
    if (strcmp(url, "/health") == 0) {
        pthread_mutex_lock(&srv->mu);
        const char *status = srv->draining                          ? "draining"
                             : srv->health == MK_HEALTH_LOADING  ? "loading"
                             : srv->health == MK_HEALTH_DEGRADED ? "degraded"
                                                                 : "ok";
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "status", status);
        if (srv->health == MK_HEALTH_DEGRADED) cJSON_AddStringToObject(root, "reason", srv->degraded);
        pthread_mutex_unlock(&srv->mu);
        char *body = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        return mk_respond(conn, srv, strcmp(status, "ok") == 0 ? 200 : 503, "application/json", body, NULL, NULL);
    }
    if (!mk_authorized(conn, srv))
        return mk_refuse_now(conn, srv, 401, "invalid_api_key", "WWW-Authenticate", "Bearer",
                             "missing or incorrect API key (Authorization: Bearer KEY)");
    if (strcmp(url, "/metrics") == 0)
        return mk_respond(conn, srv, 200, "text/plain; version=0.0.4", mk_metrics_text(srv), NULL, NULL);
    if (strcmp(url, "/v1/models") == 0) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), mk_model_object(srv));
        char *body = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        return mk_respond(conn, srv, 200, "application/json", body, NULL, NULL);
    }
    /* /v1/models/{id}: the id as libmicrohttpd unescaped it (%2F is a '/', and no id served
     * holds a NUL: mk_unescape leaves %00 as it is); anything but the model's id is unknown */
    const char *id = url + strlen(MK_MODEL_PREFIX);
    if (strcmp(id, srv->model_id) != 0) {
        mk_serve_err err;
        mk_serve_refuse(&err, 404, "model_not_found", "model", "the model '%.128s' does not exist (this server has '%s')",
                        id, srv->model_id);
        return mk_respond_error(conn, srv, &err, NULL, NULL);
    }
    cJSON *m = mk_model_object(srv);
    char *body = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    return mk_respond(conn, srv, 200, "application/json", body, NULL, NULL);
}

/* How many headers give the body's length. Two Content-Lengths, or one with a
 * Transfer-Encoding, can be read two ways: a proxy in front may take the other, and the
 * bytes after the body it saw would run here as a second request (request smuggling). */
typedef struct mk_framing {
    unsigned content_length, transfer_encoding;
} mk_framing;

static enum MHD_Result mk_count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind, (void)value;
    mk_framing *f = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) f->content_length++;
    if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) f->transfer_encoding++;
    return MHD_YES;
}

/* Connections past --max-connections: libmicrohttpd stops accepting at its own limit, and a
 * client beyond it waits in the listen backlog until it gives up, where it should hear at once
 * that the server is full. So MHD takes MK_CONN_OVERFLOW(max) connections more than the cap,
 * and one that opens while the cap is reached is marked: its generation requests get 503
 * and the connection closes (its GETs, /health among them, are answered). */
#define MK_CONN_OVERFLOW(max) ((max) / 4 > 16 ? (max) / 4 : 16)
static const char mk_over_cap = 1; /* the socket context of a marked connection */

static void mk_conn_notice(void *cls, struct MHD_Connection *conn, void **socket_context,
                           enum MHD_ConnectionNotificationCode code) {
    (void)conn;
    mk_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const size_t open = __atomic_add_fetch(&srv->open_conns, 1, __ATOMIC_RELAXED);
        *socket_context = open > srv->max_conn ? (void *)&mk_over_cap : NULL;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        __atomic_sub_fetch(&srv->open_conns, 1, __ATOMIC_RELAXED);
    }
}

static bool mk_conn_over_cap(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci && ci->socket_context == &mk_over_cap;
}

static enum MHD_Result mk_handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    mk_server *srv = cls;
    mk_conn *c = *con_cls;
    if (!c) { /* the first call: headers only */
        mk_framing framing = {0, 0};
        MHD_get_connection_values(conn, MHD_HEADER_KIND, mk_count_framing, &framing);
        if (framing.content_length > 1 || (framing.content_length && framing.transfer_encoding))
            return mk_refuse_now(conn, srv, 400, "invalid_request", MHD_HTTP_HEADER_CONNECTION, "close",
                                 "the request's length is ambiguous (%u Content-Length and %u Transfer-Encoding "
                                 "headers): the connection closes",
                                 framing.content_length, framing.transfer_encoding);
        /* prefix: the path and one segment more (/v1/models/{id}); allow: the methods taken
         * (a GET route answers HEAD too) */
        static const struct { const char *path, *allow; mk_route route; bool prefix; } routes[] = {
            {"/v1/chat/completions", "POST", MK_ROUTE_CHAT, false},
            {"/v1/completions", "POST", MK_ROUTE_COMPLETION, false},
            {"/v1/models", "GET, HEAD", MK_ROUTE_NONE, false},
            {MK_MODEL_PREFIX, "GET, HEAD", MK_ROUTE_NONE, true},
            {"/health", "GET, HEAD", MK_ROUTE_NONE, false},
            {"/metrics", "GET, HEAD", MK_ROUTE_NONE, false}};
        char shown[128]; /* the client's bytes, printable ASCII only */
        size_t n = 0;
        for (const char *p = url; *p && n + 1 < sizeof shown; p++) shown[n++] = *p >= 0x20 && *p < 0x7f ? *p : '?';
        shown[n] = '\0';
        size_t r = 0;
        for (; r < sizeof routes / sizeof routes[0]; r++) {
            const size_t len = strlen(routes[r].path);
            if (routes[r].prefix ? strncmp(url, routes[r].path, len) == 0 && url[len] : strcmp(url, routes[r].path) == 0)
                break;
        }
        if (r == sizeof routes / sizeof routes[0])
            return mk_refuse_now(conn, srv, 404, "not_found", NULL, NULL, "no such endpoint: %s", shown);
        const bool get = routes[r].route == MK_ROUTE_NONE;
        if (get ? strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0
                : strcmp(method, MHD_HTTP_METHOD_POST) != 0)
            return mk_refuse_now(conn, srv, 405, "method_not_allowed", MHD_HTTP_HEADER_ALLOW, routes[r].allow,
                                 "this method is not allowed on %s (use %s)", shown, routes[r].allow);
        if (routes[r].route == MK_ROUTE_NONE) return mk_handle_get(conn, srv, url);
        if (mk_conn_over_cap(conn)) /* closed after the answer: a new connection may find room */
            return mk_refuse_now(conn, srv, 503, "too_many_connections", MHD_HTTP_HEADER_CONNECTION, "close",
                                 "this server holds %zu connections at once (--max-connections) and all are open: "
                                 "try again shortly",
                                 srv->max_conn);
        if (!mk_authorized(conn, srv))
            return mk_refuse_now(conn, srv, 401, "invalid_api_key", "WWW-Authenticate", "Bearer",
                                 "missing or incorrect API key (Authorization: Bearer KEY)");
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->max_body)
            return mk_refuse_now(conn, srv, 413, "request_too_large", NULL, NULL,
                                 "the request body of %.24s bytes is over this server's limit of %zu", cl, srv->max_body);
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->srv = srv;
        c->route = routes[r].route;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        *con_cls = c;
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        if (c->body_len + *upload_size <= srv->max_body) {
            if (mk_grow_array(&c->body, &c->body_cap, c->body_len + *upload_size + 1, 1, 256, "request body") != MK_OK)
                return MHD_NO;
            memcpy(c->body + c->body_len, upload, *upload_size);
            c->body_len += *upload_size;
            *upload_size = 0;
            return MHD_YES;
        }
        return mk_refuse_upload(c); /* a chunked body gives no length up front */
    }
    pthread_mutex_lock(&srv->mu);
    const bool draining = srv->draining;
    if (!draining) srv->n_active++, c->active = true;
    pthread_mutex_unlock(&srv->mu);
    if (draining) return mk_refuse_now(conn, srv, 503, "shutting_down", "Retry-After", "5", "the server is shutting down");
    mk_serve_err err;
    if (!mk_serve_parse(&srv->lim, c->route == MK_ROUTE_CHAT ? MK_SERVE_CHAT : MK_SERVE_COMPLETION, c->body ? c->body : "",
                        c->body_len, &c->req, &err))
        return mk_respond_error(conn, srv, &err, NULL, NULL);
    return mk_start_generation(conn, c);
}

/* The connection's request is over (answered, or the client went away). */
static void mk_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)conn, (void)toe;
    mk_server *srv = cls;
    mk_conn *c = *con_cls;
    if (!c) return;
    if (c->job) { /* the client left before the answer ended: free its slot */
        mk_conn_end_job(c, true);
        pthread_mutex_lock(&srv->mu);
        srv->cancelled++;
        srv->generated_tokens += c->completion_tokens;
        pthread_mutex_unlock(&srv->mu);
    }
    mk_detokenizer_free(c->detok);
    mk_serve_req_free(&c->req);
    free(c->body);
    free(c->text);
    free(c->out);
    pthread_mutex_lock(&srv->mu);
    if (c->active && --srv->n_active == 0) pthread_cond_broadcast(&srv->idle_cv);
    pthread_mutex_unlock(&srv->mu);
    free(c);
    *con_cls = NULL;
}

static void mk_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fprintf(stderr, "meshkern serve: http: ");
    vfprintf(stderr, fmt, ap);
}

/* ============================================================== command == */

static sem_t mk_stop_sem;                     /* posted by the signal handler */
static volatile sig_atomic_t mk_stop_signal;  /* which signal */

static void mk_on_stop_signal(int sig) {
    mk_stop_signal = sig;
    sem_post(&mk_stop_sem); /* async-signal-safe */
}

/* The key: the file's first line, whole (without its line end, at most MK_KEY_MAX bytes);
 * NULL with *why otherwise. */
#define MK_KEY_MAX 16384
static char *mk_read_key_file(const char *path, const char **why) {
    FILE *f = fopen(path, "r");
    *why = "it cannot be opened";
    if (!f) return NULL;
    char *key = malloc(MK_KEY_MAX + 2);
    const size_t got = key ? fread(key, 1, MK_KEY_MAX + 1, f) : 0;
    const bool failed = !key || ferror(f);
    fclose(f);
    const char *end = key && !failed ? memchr(key, '\n', got) : NULL;
    size_t n = end ? (size_t)(end - key) : got;
    while (n > 0 && key[n - 1] == '\r') n--;
    *why = failed                ? "it cannot be read (a directory?)"
           : got == 0            ? "it is empty"
           : n > MK_KEY_MAX      ? "its first line is longer than 16384 bytes"
           : n == 0              ? "its first line is empty"
           : memchr(key, '\0', n) ? "its first line holds a NUL byte"
           : memchr(key, '\r', n) ? "its first line holds a carriage return"
                                 : NULL;
    if (*why) {
        free(key);
        return NULL;
    }
    key[n] = '\0';
    return key;
}

/* What both commands share before serving: the key, the tokenizer, the context, the stop
 * ids, the model's id, the job table, the signals. 0, or the exit status. */
static int mk_serve_open(mk_server *srv, const mk_serve_settings *set, const char *cmd, const char *path,
                         const mk_model *model, size_t max_jobs, char **file_key) {
    *file_key = NULL;
    memset(srv, 0, sizeof *srv);
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->idle_cv, NULL);
    sem_init(&mk_stop_sem, 0, 0);
    srv->wake_fd = -1;
    srv->max_jobs = max_jobs;
    const char *key = set->api_key;
    if (set->api_key && set->api_key_file) return mk_cli_usage_error(cmd, "--api-key and --api-key-file: one or the other");
    const char *why = NULL;
    if (set->api_key && !*set->api_key) return mk_cli_usage_error(cmd, "--api-key is empty");
    if (set->api_key_file && !(key = *file_key = mk_read_key_file(set->api_key_file, &why)))
        return mk_cli_usage_error(cmd, "cannot read an API key from %s: %s", set->api_key_file, why);
    srv->model = model;
    srv->api_key = key;
    srv->max_body = set->max_body;
    srv->max_conn = set->max_conn;
    srv->started = time(NULL);
    mk_status s = mk_tokenizer_open(model, &srv->tok);
    if (s != MK_OK) return mk_cli_fail(s);
    const mk_hparams *hp = mk_model_hparams(model);
    size_t ctx = set->ctx ? set->ctx : (hp->max_context < 2048 ? hp->max_context : 2048);
    if (ctx > hp->max_context) ctx = hp->max_context;
    /* the model's end-of-generation ids stop every sequence */
    const size_t vocab = mk_tokenizer_vocab_size(srv->tok);
    srv->eog = malloc(64 * sizeof *srv->eog);
    for (size_t t = 0; srv->eog && t < vocab && srv->n_eog < 64; t++)
        if (mk_tokenizer_is_eog(srv->tok, (int32_t)t)) srv->eog[srv->n_eog++] = (int32_t)t;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(srv->model_id, sizeof srv->model_id, "%s", set->model_name ? set->model_name : base);
    const size_t id_len = strlen(srv->model_id);
    if (!set->model_name && id_len > 5 && strcmp(srv->model_id + id_len - 5, ".gguf") == 0)
        srv->model_id[id_len - 5] = '\0';
    srv->lim = (mk_serve_limits){.tok = srv->tok, .model_id = srv->model_id, .context = ctx};
    srv->jobs = calloc(srv->max_jobs ? srv->max_jobs : 1, sizeof *srv->jobs);
    if (!srv->eog || !srv->jobs) return mk_cli_fail(mk_fail(MK_ERR_OUT_OF_MEMORY, "out of memory"));

    /* SIGTERM/SIGINT: a handler posts a semaphore the main thread waits on. (Not sigwait:
     * threads started before main, such as OpenBLAS's, do not block the signals, and one of
     * them would take a signal that arrives while the main thread is not yet waiting.) */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = mk_on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* KV bytes one sequence reserves over every range: K and V, per layer, per position. */
static size_t mk_kv_bytes_each(const mk_model *model, size_t ctx, mk_dtype kv) {
    const mk_hparams *hp = mk_model_hparams(model);
    const size_t elem = mk_dtype_size(kv ? kv : MK_DTYPE_F32);
    return 2 * hp->n_layers * hp->n_kv_heads * hp->head_dim * ctx * elem;
}

static int mk_hex(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The path's (and query's) escapes, as libmicrohttpd's own unescaping decodes them (%HH ->
 * the byte), except %00: decoded, the NUL would end the path there, so /v1/models/ID%00junk
 * would read as /v1/models/ID; it stays as written (and names nothing served). */
static size_t mk_unescape(void *cls, struct MHD_Connection *conn, char *s) {
    (void)cls, (void)conn;
    char *w = s;
    for (const char *r = s; *r;) {
        int hi, lo;
        if (r[0] == '%' && (hi = mk_hex(r[1])) >= 0 && (lo = mk_hex(r[2])) >= 0 && (hi | lo)) {
            *w++ = (char)(hi << 4 | lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

/* Listen on the settings' address, IPv4 or IPv6. NULL: it said why. */
static struct MHD_Daemon *mk_serve_listen(mk_server *srv, const mk_serve_settings *set, const char *cmd,
                                          unsigned *bound) {
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&addr;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&addr;
    if (inet_pton(AF_INET, set->host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)set->port);
    } else if (inet_pton(AF_INET6, set->host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)set->port);
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "meshkern %s: %s is not an IPv4 or IPv6 address\n", cmd, set->host);
        return NULL;
    }
    struct MHD_Daemon *d =
        MHD_start_daemon(flags, 0, NULL, NULL, mk_handler, srv, MHD_OPTION_EXTERNAL_LOGGER, mk_mhd_log, NULL,
                         MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)(set->max_conn + MK_CONN_OVERFLOW(set->max_conn)), MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)set->timeout, MHD_OPTION_NOTIFY_COMPLETED, mk_completed, srv,
                         MHD_OPTION_NOTIFY_CONNECTION, mk_conn_notice, srv, MHD_OPTION_UNESCAPE_CALLBACK, mk_unescape,
                         NULL, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "meshkern %s: cannot listen on %s port %zu: %s\n", cmd, set->host, set->port, strerror(errno));
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *bound = info ? info->port : (unsigned)set->port;
    return d;
}

static void mk_serve_say_listening(const mk_server *srv, const mk_serve_settings *set, const char *cmd, unsigned bound) {
    const bool v6 = strchr(set->host, ':') != NULL;
    printf("meshkern %s: listening on http://%s%s%s:%u%s\n", cmd, v6 ? "[" : "", set->host, v6 ? "]" : "", bound,
           srv->api_key ? " (API key required)" : "");
    if (strcmp(set->host, "127.0.0.1") != 0 && strcmp(set->host, "::1") != 0 && !srv->api_key)
        printf("meshkern %s: warning: bound to %s without an API key: anyone who can reach it can use it\n", cmd,
               set->host);
    fflush(stdout);
}

enum { MK_CUT_ANSWER_SECONDS = 10 };

/* Until SIGTERM/SIGINT; then the drain: new requests get 503, those open finish (up to
 * --drain-timeout), and the sequences still running are cut. */
static void mk_serve_until_stopped(mk_server *srv, const mk_serve_settings *set, const char *cmd) {
    while (sem_wait(&mk_stop_sem) != 0) {} /* EINTR: the handler itself */
    printf("meshkern %s: %s: draining (new requests get 503)\n", cmd, mk_stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
    fflush(stdout);
    pthread_mutex_lock(&srv->mu);
    srv->draining = true;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)set->drain;
    while (srv->n_active && pthread_cond_timedwait(&srv->idle_cv, &srv->mu, &until) == 0) {}
    const size_t left = srv->n_active;
    if (srv->engine == MK_ENGINE_SCHED)
        for (size_t i = 0; i < srv->n_jobs; i++) (void)mk_sched_cancel(srv->sched, srv->jobs[i]->seq);
    srv->closing = true; /* the stage's source closes; its requests are cut between steps */
    mk_wake(srv);
    /* The cut requests still answer (finish_reason "length", and [DONE] when streamed): their
     * connection threads see the sequences ended within one wait of mk_conn_advance. The
     * daemon stops only after that (or MK_CUT_ANSWER_SECONDS), or it would drop them mid-answer. */
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += MK_CUT_ANSWER_SECONDS;
    while (srv->n_active && pthread_cond_timedwait(&srv->idle_cv, &srv->mu, &until) == 0) {}
    const size_t unanswered = srv->n_active;
    pthread_mutex_unlock(&srv->mu);
    if (left) printf("meshkern %s: %zu requests still open after %zu s: their sequences cancelled\n", cmd, left, set->drain);
    if (unanswered) printf("meshkern %s: %zu requests unanswered after %d s more: closed\n", cmd, unanswered, MK_CUT_ANSWER_SECONDS);
}

static void mk_serve_close(mk_server *srv, char *file_key) {
    sem_destroy(&mk_stop_sem);
    free(srv->jobs);
    free(srv->eog);
    free(srv->take_buf);
    if (srv->wake_fd >= 0) close(srv->wake_fd);
    mk_tokenizer_free(srv->tok);
    free(file_key);
}

static mk_server mk_the_server; /* the one server of this process (its threads point at it) */

int mk_cli_serve(int argc, char **argv) {
    const char *path = NULL;
    size_t max_seq = 8, prefill_chunk = MK_SERVE_PREFILL_CHUNK;
    int64_t cuts[MK_CLI_MAX_LIST];
    mk_cli_list cuts_l = MK_CLI_LIST(cuts, 0, INT32_MAX, "layer", false);
    mk_cli_backend backend;
    mk_cli_backend_init(&backend);
    mk_serve_settings set;
    mk_serve_settings_default(&set);
    mk_cli_option http[MK_SERVE_CLI_OPTIONS];
    const size_t n_http = mk_serve_cli_options(&set, false, http);
    const mk_cli_option opts[] = {mk_cli_opt_split(&cuts_l), mk_cli_opt_max_sequences(&max_seq, "8"),
                                  mk_cli_opt_prefill_chunk(&prefill_chunk, "128")};
    mk_cli_option backend_opts[MK_CLI_BACKEND_OPTIONS];
    const mk_cli_group groups[] = {
        {"options", http, n_http},
        {"pipeline options", opts, sizeof opts / sizeof *opts},
        {"backend options", backend_opts, mk_cli_backend_options(&backend, backend_opts, "cpu threads per stage")},
    };
    const mk_cli_command cmd = {
        "serve", "MODEL.gguf [options]",
        "  OpenAI-compatible HTTP: POST /v1/chat/completions, /v1/completions;\n"
        "  GET (and HEAD) /v1/models, /v1/models/ID, /health, /metrics\n",
        {"MODEL"}, groups, sizeof groups / sizeof *groups};
    const int bad = mk_cli_parse(&cmd, argc, argv, &path);
    if (bad >= 0) return bad;
    const int bad_device = mk_cli_backend_finish(&backend, "serve", path);
    if (bad_device >= 0) return bad_device;
    mk_model *model = NULL;
    mk_status s = mk_cli_open_model(path, &model);
    if (s != MK_OK) return mk_cli_fail(s);
    mk_server *srv = &mk_the_server;
    char *file_key = NULL;
    int rc = mk_serve_open(srv, &set, "serve", path, model, max_seq + set.max_queue, &file_key);
    if (rc) {
        mk_serve_close(srv, file_key);
        mk_model_free(model);
        return rc;
    }
    srv->engine = MK_ENGINE_SCHED;
    srv->health = MK_HEALTH_READY;
    srv->kv_sequences = max_seq;
    srv->kv_bytes_each = mk_kv_bytes_each(model, srv->lim.context, backend.config.kv_dtype);
    mk_sched_options o = mk_sched_options_default();
    mk_cli_backend_range(&backend, &o.range);
    o.range.max_context = srv->lim.context;
    o.range.max_batch_tokens = srv->lim.context;
    o.range.token_only = true;
    o.cuts = cuts;
    o.n_cuts = cuts_l.n;
    o.max_sequences = max_seq;
    o.range.max_batch_sequences = mk_cli_step_sequences(0, max_seq); /* every sequence in flight shares a step */
    o.prefill_chunk = prefill_chunk; /* a long prompt does not stall the streams beside it */
    o.on_token = mk_serve_on_token;
    o.user = srv;
    s = mk_sched_create(model, &o, &srv->sched);
    struct MHD_Daemon *d = NULL;
    unsigned bound = 0;
    if (s != MK_OK) rc = mk_cli_fail(s);
    else if (!(d = mk_serve_listen(srv, &set, "serve", &bound))) rc = 1;
    if (d) {
        const mk_hparams *hp = mk_model_hparams(model);
        printf("meshkern serve: model %s (%zu layers, context %zu), %zu stage%s, %zu sequences + %zu queued, "
               "backend %s, weights %s\n",
               srv->model_id, hp->n_layers, srv->lim.context, mk_sched_worker_count(srv->sched),
               mk_sched_worker_count(srv->sched) > 1 ? "s" : "", max_seq, set.max_queue,
               backend.config.kind == MK_BACKEND_CUDA ? "cuda" : "cpu", mk_dtype_name(backend.config.weight_dtype));
        mk_serve_say_listening(srv, &set, "serve", bound);
        mk_serve_until_stopped(srv, &set, "serve");
        MHD_stop_daemon(d);
        printf("meshkern serve: stopped\n");
        fflush(stdout);
    }
    mk_sched_free(srv->sched);
    mk_serve_close(srv, file_key);
    mk_model_free(model);
    return rc;
}

/* stage --serve: HTTP first (health "loading" while the ranks join), then rank 0's run on a
 * thread of its own, fed by the job table; SIGTERM drains, then the run ends with a bye. */
int mk_cli_stage_serve(const char *model_path, const mk_model *model, mk_stage_options *o, const mk_serve_settings *set) {
    mk_server *srv = &mk_the_server;
    char *file_key = NULL;
    int rc = mk_serve_open(srv, set, "stage", model_path, model, o->max_sequences + set->max_queue, &file_key);
    if (rc) {
        mk_serve_close(srv, file_key);
        return rc;
    }
    srv->engine = MK_ENGINE_STAGE;
    srv->health = MK_HEALTH_LOADING;
    srv->kv_sequences = o->max_sequences;
    srv->kv_bytes_each = mk_kv_bytes_each(model, srv->lim.context, o->range.backend.kv_dtype);
    srv->take_cap = srv->lim.context;
    srv->take_buf = malloc(srv->take_cap * sizeof *srv->take_buf);
    srv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!srv->take_buf || srv->wake_fd < 0) {
        rc = mk_cli_fail(mk_fail(MK_ERR_OUT_OF_MEMORY, "stage --serve: no buffer or eventfd: %s", strerror(errno)));
        mk_serve_close(srv, file_key);
        return rc;
    }
    /* rank 0 holds the limits for all: a prompt and its answer fit the context */
    o->range.max_context = srv->lim.context;
    o->range.max_batch_tokens = srv->lim.context;
    o->max_new_tokens = srv->lim.context;
    o->stop_ids = srv->eog;
    o->n_stop = srv->n_eog;
    unsigned bound = 0;
    struct MHD_Daemon *d = mk_serve_listen(srv, set, "stage", &bound);
    if (!d) {
        mk_serve_close(srv, file_key);
        return 1;
    }
    mk_serve_say_listening(srv, set, "stage", bound);
    mk_stage *stage = NULL;
    mk_status s = mk_stage_join(model, o, &stage);
    if (s != MK_OK) {
        fprintf(stderr, "meshkern stage: rank 0: refused at startup: %s: %s\n", mk_status_name(s), mk_last_error());
        MHD_stop_daemon(d);
        mk_serve_close(srv, file_key);
        return 1;
    }
    const mk_range *r = mk_stage_range(stage);
    printf("meshkern stage: serving model %s over %d processes (rank 0: layers %lld-%lld), seam %s, context %zu, "
           "%zu sequences + %zu queued\n",
           srv->model_id, o->world, (long long)mk_range_start(r), (long long)mk_range_end(r),
           mk_seam_kind_name(o->seam), srv->lim.context, o->max_sequences, set->max_queue);
    fflush(stdout);
    pthread_mutex_lock(&srv->mu);
    srv->stage = stage;
    srv->health = MK_HEALTH_READY;
    pthread_mutex_unlock(&srv->mu);
    if (pthread_create(&srv->stage_thread, NULL, mk_stage_main, srv) != 0) {
        rc = mk_cli_fail(mk_fail(MK_ERR_INTERNAL, "stage --serve: cannot start rank 0's thread"));
    } else {
        srv->stage_thread_started = true;
        mk_serve_until_stopped(srv, set, "stage");
        pthread_join(srv->stage_thread, NULL);
    }
    MHD_stop_daemon(d);
    pthread_mutex_lock(&srv->mu);
    const bool degraded = srv->health == MK_HEALTH_DEGRADED;
    srv->stage = NULL;
    pthread_mutex_unlock(&srv->mu);
    printf("meshkern stage: stopped%s\n", degraded ? " (the stage run had failed)" : "");
    fflush(stdout);
    mk_stage_free(stage);
    mk_serve_close(srv, file_key);
    return rc ? rc : degraded ? 1 : 0;
}
