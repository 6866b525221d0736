/* TLS 1.3 for the stream transport (OpenSSL): an external pre-shared key, or certificates
 * signed by a CA both ends trust (mutual: the receiving end requires the sender's
 * certificate too). The receiving end is the TLS server. A handshake that fails for any
 * reason but the deadline is MK_ERR_AUTH: a wrong key, an untrusted certificate, or a
 * peer that speaks plaintext; nothing is read from such a peer. */
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/io.h"
#include "mk_error.h"

#define MK_PSK_MIN 32 /* bytes: a 256-bit key at least */
#define MK_PSK_MAX 64

typedef struct mk_psk {
    unsigned char key[MK_PSK_MAX];
    size_t key_len;
    char identity[128];
} mk_psk;

/* One ex_data slot for the key in every SSL_CTX: an OpenSSL registration made once per
 * process (the only process-wide state here, OpenSSL's own design). */
static int mk_psk_slot = -1;
static pthread_once_t mk_psk_once = PTHREAD_ONCE_INIT;
static void mk_psk_register(void) { mk_psk_slot = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, NULL); }

static int mk_psk_index(void) {
    pthread_once(&mk_psk_once, mk_psk_register);
    return mk_psk_slot;
}

static SSL_SESSION *mk_psk_session(SSL *ssl, const mk_psk *psk) {
    static const unsigned char aes128gcm[] = {0x13, 0x01}; /* TLS_AES_128_GCM_SHA256 */
    const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, aes128gcm);
    SSL_SESSION *s = cipher ? SSL_SESSION_new() : NULL;
    if (!s) return NULL;
    if (!SSL_SESSION_set1_master_key(s, psk->key, psk->key_len) || !SSL_SESSION_set_cipher(s, cipher) ||
        !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
        SSL_SESSION_free(s);
        return NULL;
    }
    return s;
}

static int mk_psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *id_len, SSL_SESSION **sess) {
    const mk_psk *psk = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), mk_psk_index());
    SSL_SESSION *s = psk ? mk_psk_session(ssl, psk) : NULL;
    if (!s) return 0;
    if (md && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s))) {
        SSL_SESSION_free(s); /* a HelloRetryRequest chose another hash: no PSK for it */
        *sess = NULL;
        return 1;
    }
    *sess = s;
    *id = (const unsigned char *)psk->identity;
    *id_len = strlen(psk->identity);
    return 1;
}

static int mk_psk_find(SSL *ssl, const unsigned char *identity, size_t identity_len, SSL_SESSION **sess) {
    const mk_psk *psk = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), mk_psk_index());
    *sess = NULL;
    if (!psk || identity_len != strlen(psk->identity) || memcmp(identity, psk->identity, identity_len) != 0)
        return 1; /* unknown identity: no session; with no certificate the handshake fails */
    *sess = mk_psk_session(ssl, psk);
    return *sess ? 1 : 0;
}

static mk_status mk_tls_error(mk_status status, const char *what) {
    char text[200] = "no detail";
    const unsigned long e = ERR_peek_last_error();
    if (e) ERR_error_string_n(e, text, sizeof text);
    ERR_clear_error();
    return mk_fail(status, "seam TLS: %s: %s", what, text);
}

static mk_status mk_psk_parse(const char *hex, const char *identity, mk_psk *out) {
    const size_t n = hex ? strlen(hex) : 0;
    if (n % 2 || n / 2 < MK_PSK_MIN || n / 2 > MK_PSK_MAX)
        return mk_fail(MK_ERR_INVALID_ARGUMENT,
                       "seam TLS: the pre-shared key must be %d to %d bytes (%d to %d hex digits), not %zu hex digits",
                       MK_PSK_MIN, MK_PSK_MAX, 2 * MK_PSK_MIN, 2 * MK_PSK_MAX, n);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1 || !strchr("0123456789abcdefABCDEF", hex[2 * i]) ||
            !strchr("0123456789abcdefABCDEF", hex[2 * i + 1]))
            return mk_fail(MK_ERR_INVALID_ARGUMENT, "seam TLS: the pre-shared key is not hex");
        out->key[i] = (unsigned char)v;
    }
    out->key_len = n / 2;
    snprintf(out->identity, sizeof out->identity, "%s", identity && *identity ? identity : "meshkern");
    return MK_OK;
}

void mk_tls_context_free(SSL_CTX *ctx) {
    if (!ctx) return;
    mk_psk *psk = SSL_CTX_get_ex_data(ctx, mk_psk_index());
    if (psk) {
        OPENSSL_cleanse(psk, sizeof *psk);
        free(psk);
    }
    SSL_CTX_free(ctx);
}

mk_status mk_tls_check(const mk_seam_tls *tls) {
    const bool psk = tls->psk_hex != NULL, certs = tls->cert_file || tls->key_file || tls->ca_file;
    if (psk && certs)
        return mk_fail(MK_ERR_INVALID_ARGUMENT,
                       "seam TLS: a pre-shared key or certificates, not both (one of them would be ignored)");
    if (!psk && tls->psk_identity)
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "seam TLS: a pre-shared key identity without a pre-shared key");
    if (!psk && !(tls->cert_file && tls->key_file && tls->ca_file))
        return mk_fail(MK_ERR_INVALID_ARGUMENT, "seam TLS: give a pre-shared key, or a certificate, its key and a CA");
    return MK_OK;
}

mk_status mk_tls_context(const mk_seam_tls *tls, bool server, SSL_CTX **out) {
    *out = NULL;
    const bool use_psk = tls->psk_hex != NULL;
    MK_TRY(mk_tls_check(tls));
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!ctx) return mk_tls_error(MK_ERR_OUT_OF_MEMORY, "SSL_CTX_new");
    mk_status s = MK_OK;
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) || !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION))
        s = mk_tls_error(MK_ERR_INTERNAL, "TLS 1.3 unavailable");
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET); /* no resumption tickets: every connection proves the key */
    if (s == MK_OK && use_psk) {
        mk_psk *psk = calloc(1, sizeof *psk);
        if (!psk) s = mk_fail(MK_ERR_OUT_OF_MEMORY, "seam TLS: out of memory");
        if (s == MK_OK) s = mk_psk_parse(tls->psk_hex, tls->psk_identity, psk);
        if (s == MK_OK && !SSL_CTX_set_ex_data(ctx, mk_psk_index(), psk)) s = mk_tls_error(MK_ERR_INTERNAL, "ex_data");
        /* The key is bound to SHA-256: a suite of another hash would skip the PSK. */
        if (s == MK_OK && !SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256"))
            s = mk_tls_error(MK_ERR_INTERNAL, "ciphersuites");
        if (s != MK_OK) free(psk);
        if (s == MK_OK) {
            if (server) SSL_CTX_set_psk_find_session_callback(ctx, mk_psk_find);
            else SSL_CTX_set_psk_use_session_callback(ctx, mk_psk_use);
        }
    } else if (s == MK_OK) {
        if (SSL_CTX_use_certificate_chain_file(ctx, tls->cert_file) != 1)
            s = mk_tls_error(MK_ERR_AUTH, "cannot load the certificate");
        else if (SSL_CTX_use_PrivateKey_file(ctx, tls->key_file, SSL_FILETYPE_PEM) != 1)
            s = mk_tls_error(MK_ERR_AUTH, "cannot load the private key");
        else if (SSL_CTX_check_private_key(ctx) != 1)
            s = mk_tls_error(MK_ERR_AUTH, "the private key does not match the certificate");
        else if (SSL_CTX_load_verify_locations(ctx, tls->ca_file, NULL) != 1)
            s = mk_tls_error(MK_ERR_AUTH, "cannot load the CA");
        else SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    if (s != MK_OK) {
        mk_tls_context_free(ctx);
        return s;
    }
    *out = ctx;
    return MK_OK;
}

mk_status mk_tls_attach(mk_io *io, SSL_CTX *ctx, bool server) {
    io->ssl = SSL_new(ctx);
    if (!io->ssl || !SSL_set_fd(io->ssl, io->fd)) return mk_tls_error(MK_ERR_OUT_OF_MEMORY, "SSL_new");
    if (server) SSL_set_accept_state(io->ssl);
    else SSL_set_connect_state(io->ssl);
    return MK_OK;
}

/* One handshake step: 1 done, 0 waiting (events set), or a recorded failure. */
static mk_status mk_tls_step(mk_io *io, bool *done, short *events) {
    ERR_clear_error();
    const int r = SSL_do_handshake(io->ssl);
    if (r == 1) {
        *done = true;
        return MK_OK;
    }
    const int err = SSL_get_error(io->ssl, r);
    if (err == SSL_ERROR_WANT_READ) *events = POLLIN;
    else if (err == SSL_ERROR_WANT_WRITE) *events = POLLOUT;
    else return mk_tls_error(MK_ERR_AUTH, "handshake refused (wrong key or certificate, or a plaintext peer)");
    return MK_OK;
}

mk_status mk_tls_handshake_step(mk_io *io, bool *done, short *events) {
    *done = false;
    *events = 0;
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    const bool was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old); /* a peer that hangs up must not raise SIGPIPE */
    const mk_status s = mk_tls_step(io, done, events);
    sigpending(&pending);
    const struct timespec zero = {0, 0};
    if (!was_pending && sigismember(&pending, SIGPIPE)) (void)sigtimedwait(&pipe_set, NULL, &zero);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return s;
}

mk_status mk_tls_handshake(mk_io *a, mk_io *b, int64_t deadline) {
    mk_io *ends[2] = {a, b};
    bool done[2] = {false, b == NULL};
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old); /* a peer that hangs up must not raise SIGPIPE */
    mk_status s = MK_OK;
    while (s == MK_OK && !(done[0] && done[1])) {
        struct pollfd p[2];
        nfds_t np = 0;
        for (int i = 0; i < 2 && s == MK_OK; i++) {
            if (done[i]) continue;
            short events = 0;
            s = mk_tls_step(ends[i], &done[i], &events);
            if (s == MK_OK && !done[i]) p[np++] = (struct pollfd){.fd = ends[i]->fd, .events = events};
        }
        if (s != MK_OK || np == 0) continue;
        const int64_t left = deadline - mk_now_ms();
        if (left <= 0) s = mk_fail(MK_ERR_PEER_TIMEOUT, "seam TLS: the handshake did not finish before the deadline");
        else (void)poll(p, np, (int)left);
    }
    const struct timespec zero = {0, 0};
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE)) (void)sigtimedwait(&pipe_set, NULL, &zero);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return s;
}
