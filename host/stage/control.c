/* Control messages between stage processes: a small framed message on each rank's
 * rendezvous connection (hello, welcome, ready, result, bye, abort). The receiver checks
 * the magic and bounds the length by its own limit before reading the body. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mk_error.h"
#include "stage/stage.h"

mk_status mk_stage_wrap(mk_status status, const char *fmt, ...) {
    char cause[512], prefix[512];
    snprintf(cause, sizeof cause, "%s", mk_last_error());
    va_list args;
    va_start(args, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, args);
    va_end(args);
    return mk_fail(status, "%s: %s", prefix, cause);
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

mk_status mk_ctl_send(mk_io *io, mk_ctl_type type, const void *body, size_t len, int64_t deadline) {
    if (len > MK_CTL_MAX_BODY) return mk_fail(MK_ERR_INTERNAL, "control message of %zu bytes is over the limit", len);
    uint8_t buf[MK_CTL_HEADER_BYTES + MK_CTL_MAX_BODY];
    put_u32(buf, MK_CTL_MAGIC);
    put_u32(buf + 4, (uint32_t)type);
    put_u32(buf + 8, (uint32_t)len);
    if (len) memcpy(buf + MK_CTL_HEADER_BYTES, body, len);
    return mk_io_write(io, buf, MK_CTL_HEADER_BYTES + len, deadline, "control message");
}

mk_status mk_ctl_recv(mk_io *io, mk_ctl_type *type, char *body, size_t *len, int64_t deadline, const char *peer) {
    uint8_t head[MK_CTL_HEADER_BYTES];
    mk_status s = mk_io_read(io, head, sizeof head, deadline, "control message");
    if (s == MK_ERR_PEER_CLOSED) return mk_stage_wrap(MK_ERR_PEER_LOST, "%s closed its connection", peer);
    if (s == MK_ERR_PEER_TIMEOUT) return mk_fail(s, "%s sent nothing before the deadline", peer);
    if (s != MK_OK) return s;
    const uint32_t magic = get_u32(head), t = get_u32(head + 4), n = get_u32(head + 8);
    if (magic != MK_CTL_MAGIC || t < MK_CTL_HELLO || t > MK_CTL_LAST)
        return mk_fail(MK_ERR_FRAME, "%s sent a control message with bad magic 0x%08x or type %u", peer, magic, t);
    if (n > MK_CTL_MAX_BODY)
        return mk_fail(MK_ERR_FRAME, "%s sent a control message of %u bytes (limit %u)", peer, n, MK_CTL_MAX_BODY);
    s = mk_io_read(io, body, n, deadline, "control message body");
    if (s == MK_ERR_PEER_CLOSED) return mk_stage_wrap(MK_ERR_PEER_LOST, "%s closed its connection", peer);
    if (s != MK_OK) return s;
    body[n] = '\0';
    *type = (mk_ctl_type)t;
    *len = n;
    return MK_OK;
}

void mk_ctl_abort(mk_io *io, mk_status status, const char *message) {
    if (io->fd < 0) return;
    char body[MK_CTL_MAX_BODY];
    const int n = snprintf(body, sizeof body, "%d %s", (int)status, message);
    const size_t len = n < 0 ? 0 : (size_t)n >= sizeof body ? sizeof body - 1 : (size_t)n;
    (void)mk_ctl_send(io, MK_CTL_ABORT, body, len, mk_deadline_ms(500, 500));
}

mk_status mk_ctl_abort_status(const char *body) {
    char *end = NULL;
    const long v = strtol(body, &end, 10);
    if (end == body || v <= 0 || v > 1000)
        return mk_fail(MK_ERR_FRAME, "an abort message without a status: '%.80s'", body);
    const char *why = *end == ' ' ? end + 1 : end;
    /* A status this build does not know (a peer's number, out of the enum's range for C++
     * callers too) is not passed on as a status: the abort itself is the refusal. */
    if (strcmp(mk_status_name((mk_status)v), "MK_ERR_UNKNOWN") == 0)
        return mk_fail(MK_ERR_FRAME, "an abort with status %ld, which this build does not know: %.200s", v,
                       *why ? why : "no reason given");
    if (!*why) /* found by tests/fuzz/fuzz_control.c: a failure must never come without a message */
        return mk_fail((mk_status)v, "the run was aborted with %s and no reason given", mk_status_name((mk_status)v));
    return mk_fail((mk_status)v, "%s", why);
}
