/* libFuzzer target: what a stranger can send a stage process. The first byte picks the
 * run rank 0 has (world 2..9) and the second which ranks have joined; the rest is what one
 * connection sends rank 0's rendezvous, judged as its hello (mk_hello_judge), and also the
 * byte stream of a control connection, read message by message (mk_ctl_recv) with every
 * ABORT body parsed (mk_ctl_abort_status: a known status, with a message). Invariants: a hello is joined only when it names
 * a rank of this run, not joined yet, with this world and digest, and only once all its
 * announced bytes are in (one byte less is still "more"); a drop always says why; "more"
 * never asks past the 4096-byte limit; a control message is within the limit, of a known
 * type, NUL-terminated; every refusal has a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mk_error.h"
#include "net/io.h"
#include "stage/stage.h"

static const char kDigest[] = "2ac2c9cfd401cb11e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7";

static void judge_hello(const uint8_t *data, size_t size) {
    static mk_stage st; /* zeroed once; the fields the judge reads are set here */
    const uint8_t pick = size > 0 ? data[0] : 0, joined = size > 1 ? data[1] : 0;
    const uint8_t *bytes = size > 2 ? data + 2 : data;
    const size_t n = size > 2 ? size - 2 : 0;
    st.world = 2 + pick % 8;
    snprintf(st.digest, sizeof st.digest, "%s", kDigest);
    for (int k = 0; k < MK_STAGE_MAX_WORLD; k++) st.ctl[k].fd = k < 8 && (joined >> k & 1) ? 100 + k : -1;
    mk_hello_judgement j;
    mk_hello_judge(&st, bytes, n, &j);
    switch (j.verdict) {
        case MK_HELLO_MORE:
            if (j.need <= n || j.need > MK_CTL_HEADER_BYTES + MK_CTL_MAX_BODY) abort();
            break;
        case MK_HELLO_JOIN: {
            if (j.hello.rank < 1 || j.hello.rank >= st.world || j.hello.world != st.world) abort();
            if (strcmp(j.hello.digest, kDigest) != 0 || st.ctl[j.hello.rank].fd >= 0) abort();
            if (j.need > n || j.told != MK_OK || j.claim != MK_OK) abort();
            mk_hello_judgement less;
            mk_hello_judge(&st, bytes, j.need - 1, &less); /* one byte short: not yet */
            if (less.verdict != MK_HELLO_MORE) abort();
            break;
        }
        case MK_HELLO_DROP:
            if (!j.why[0] || (j.claim != MK_OK && j.told != j.claim)) abort();
            if (j.duplicate && (j.hello.rank < 1 || st.ctl[j.hello.rank].fd < 0)) abort();
            break;
        default: abort();
    }
}

static void read_control(const uint8_t *data, size_t size) {
    int fds[2];
    if (mk_socket_pair(fds) != MK_OK) abort();
    size_t put = 0; /* the pair's buffers hold 4 MiB: a fuzz input goes in whole */
    while (put < size) {
        const ssize_t w = write(fds[1], data + put, size - put);
        if (w <= 0) break;
        put += (size_t)w;
    }
    close(fds[1]);
    mk_io io = {.fd = fds[0], .ssl = NULL};
    char body[MK_CTL_MAX_BODY + 1];
    for (int i = 0; i < 1000; i++) {
        mk_ctl_type type;
        size_t len = 0;
        const mk_status s = mk_ctl_recv(&io, &type, body, &len, mk_deadline_ms(50, 50), "a fuzzing peer");
        if (s != MK_OK) {
            if (!mk_last_error()[0]) abort();
            break;
        }
        if (len > MK_CTL_MAX_BODY || body[len] != '\0' || type < MK_CTL_HELLO || type > MK_CTL_LAST) abort();
        if (type == MK_CTL_ABORT) {
            const mk_status a = mk_ctl_abort_status(body);
            if (a == MK_OK || !mk_last_error()[0] || strcmp(mk_status_name(a), "MK_ERR_UNKNOWN") == 0) abort();
        }
    }
    mk_io_close(&io);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    judge_hello(data, size);
    read_control(data, size);
    return 0;
}
