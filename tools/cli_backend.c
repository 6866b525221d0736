/* The backend options of the commands that build ranges (run, chat, stage, serve): one
 * table of options, one default rule for the weight mode; and the TLS options (run, stage). */
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mk_error.h"
#include "net/io.h"
#include "seam/seam.h"

static const struct {
    const char *name;
    mk_dtype dtype;
} mk_cli_weight_modes[] = {
    {"native", MK_DTYPE_NATIVE}, {"f32", MK_DTYPE_F32}, {"f16", MK_DTYPE_F16}, {"bf16", MK_DTYPE_BF16}};

static const struct {
    const char *name;
    mk_dtype dtype;
} mk_cli_kv_modes[] = {{"f32", MK_DTYPE_F32}, {"f16", MK_DTYPE_F16}, {"bf16", MK_DTYPE_BF16 /* cuda */}};

void mk_cli_backend_init(mk_cli_backend *b) {
    memset(b, 0, sizeof *b);
    b->config = mk_backend_config_default(MK_BACKEND_CPU);
}

static bool mk_cli_parse_backend(const char *v, void *dest, char *why, size_t why_len) {
    const mk_status s = mk_backend_kind_from_name(v, dest);
    if (s != MK_OK) snprintf(why, why_len, "%s", mk_last_error());
    return s == MK_OK;
}

static bool mk_cli_parse_dtype(const char *v, void *dest, char *why, size_t why_len) {
    mk_cli_backend *b = dest;
    for (size_t i = 0; i < sizeof mk_cli_weight_modes / sizeof *mk_cli_weight_modes; i++)
        if (strcmp(v, mk_cli_weight_modes[i].name) == 0) {
            b->config.weight_dtype = mk_cli_weight_modes[i].dtype;
            b->dtype_given = true;
            return true;
        }
    snprintf(why, why_len, "expected native, f32, f16 or bf16");
    return false;
}

static bool mk_cli_parse_kv(const char *v, void *dest, char *why, size_t why_len) {
    for (size_t i = 0; i < sizeof mk_cli_kv_modes / sizeof *mk_cli_kv_modes; i++)
        if (strcmp(v, mk_cli_kv_modes[i].name) == 0) {
            *(mk_dtype *)dest = mk_cli_kv_modes[i].dtype;
            return true;
        }
    snprintf(why, why_len, "expected f32, f16 or bf16");
    return false;
}

/* --device I: kept with the fact that it was given (only the cuda backend has devices). */
static bool mk_cli_parse_device(const char *v, void *dest, char *why, size_t why_len) {
    mk_cli_backend *b = dest;
    char *end = NULL;
    errno = 0;
    const unsigned long long n = (v[0] >= '0' && v[0] <= '9') ? strtoull(v, &end, 10) : 0;
    if (!end || *end || errno || n > MK_CLI_MAX_DEVICE) {
        snprintf(why, why_len, "expected a device number from 0 to %d", MK_CLI_MAX_DEVICE);
        return false;
    }
    b->device = (size_t)n;
    b->device_given = true;
    return true;
}

/* --kv-pool: N blocks, or N KiB / MiB / GiB of blocks. */
static bool mk_cli_parse_pool(const char *v, void *dest, char *why, size_t why_len) {
    mk_cli_backend *b = dest;
    static const struct {
        const char *unit;
        unsigned shift;
    } units[] = {{"", 0}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}};
    char *end = NULL;
    errno = 0;
    const unsigned long long n = (v[0] >= '0' && v[0] <= '9') ? strtoull(v, &end, 10) : 0;
    if (errno == ERANGE) end = NULL; /* saturated: not the number given */
    for (size_t i = 0; end && end != v && n > 0 && i < sizeof units / sizeof *units; i++) {
        if (strcmp(end, units[i].unit) != 0) continue;
        if (n > (SIZE_MAX >> units[i].shift)) break;
        /* the last --kv-pool given wins, in either form (the library prefers blocks) */
        b->kv_pool_bytes = units[i].shift ? (size_t)n << units[i].shift : 0;
        b->kv_pool_blocks = units[i].shift ? 0 : (size_t)n;
        return true;
    }
    snprintf(why, why_len, "expected a count of blocks or a size like 512MiB (KiB, MiB, GiB), above 0");
    return false;
}

void mk_cli_backend_range(const mk_cli_backend *b, mk_range_options *range) {
    range->backend = b->config;
    range->eager_decode = b->eager_decode;
    range->kv_block_size = b->kv_block;
    range->kv_pool_blocks = b->kv_pool_blocks;
    range->kv_pool_bytes = b->kv_pool_bytes;
}

size_t mk_cli_backend_options(mk_cli_backend *b, mk_cli_option out[MK_CLI_BACKEND_OPTIONS], const char *threads_help) {
    const mk_cli_option opts[MK_CLI_BACKEND_OPTIONS] = {
        {"--backend", NULL, "cpu|cuda", "where the ranges run", "cpu", MK_CLI_CALL, &b->config.kind, 0, 0,
         mk_cli_parse_backend},
        {"--device", NULL, "I", "the cuda device (every range's, without --devices)", "0",
         MK_CLI_CALL, b, 0, 0, mk_cli_parse_device},
        {"--dtype", NULL, "native|f32|f16|bf16",
         "weights: native keeps the GGUF's blocks (Q4_0-Q8_0, Q2_K-Q6_K, IQ4_NL/XS); f32: the parity mode",
         "native for a GGUF on cpu, else f32", MK_CLI_CALL, b, 0, 0, mk_cli_parse_dtype},
        {"--kv", NULL, "f32|f16|bf16", "KV cache elements (f16: cpu and cuda; bf16: cuda)", "f32", MK_CLI_CALL,
         &b->config.kv_dtype, 0, 0, mk_cli_parse_kv},
        {"--threads", NULL, "N", threads_help, NULL, MK_CLI_COUNT, &b->config.threads, 1, MK_CLI_MAX_THREADS, NULL},
        {"--speed", NULL, NULL, "cuda: tensor-core GEMMs (not the parity mode)", NULL, MK_CLI_FLAG, &b->config.speed_mode,
         0, 0, NULL},
        {"--eager-decode", NULL, NULL, "cuda: decode op by op (no decode graphs)", NULL, MK_CLI_FLAG, &b->eager_decode, 0,
         0, NULL},
        {"--kv-block", NULL, "N", "positions per KV block (a power of two, 4 to 1024)", "16", MK_CLI_COUNT, &b->kv_block, 4,
         1024, NULL},
        {"--kv-pool", NULL, "N|SIZE", "each range's KV pool: N blocks, or a size (512MiB); sequences wait for room",
         "4 sequences of the full context, or one per sequence a step carries", MK_CLI_CALL, b, 0, 0, mk_cli_parse_pool},
    };
    memcpy(out, opts, sizeof opts);
    return MK_CLI_BACKEND_OPTIONS;
}

int mk_cli_backend_finish(mk_cli_backend *b, const char *cmd, const char *model_path) {
    if (b->device_given && b->config.kind != MK_BACKEND_CUDA)
        return mk_cli_usage_error(cmd, "--device needs --backend cuda (the cpu backend has no devices)");
    if ((b->config.speed_mode || b->eager_decode) && b->config.kind != MK_BACKEND_CUDA)
        return mk_cli_usage_error(cmd, "%s has no effect without --backend cuda (%s)",
                                  b->config.speed_mode ? "--speed" : "--eager-decode",
                                  b->config.speed_mode ? "tensor-core GEMMs" : "decode graphs are cuda's");
    b->config.device = (int)b->device;
    /* A GGUF model on the cpu backend runs on its stored weights unless asked otherwise;
     * the random models have no stored format (F32 is what they are). */
    if (!b->dtype_given && b->config.kind == MK_BACKEND_CPU && strncmp(model_path, "--random", 8) != 0)
        b->config.weight_dtype = MK_DTYPE_NATIVE;
    return -1;
}

size_t mk_cli_tls_options(mk_seam_tls *tls, mk_cli_option out[MK_CLI_TLS_OPTIONS]) {
    const mk_cli_option opts[MK_CLI_TLS_OPTIONS] = {
        {"--tls-psk", NULL, "HEX", "TLS 1.3 with this pre-shared key (32 to 64 bytes)", NULL, MK_CLI_TEXT,
         (void *)&tls->psk_hex, 0, 0, NULL},
        {"--tls-identity", NULL, "ID", "the pre-shared key's identity", NULL, MK_CLI_TEXT, (void *)&tls->psk_identity, 0,
         0, NULL},
        {"--tls-cert", NULL, "PEM", "TLS 1.3 with this certificate (with --tls-key and --tls-ca)", NULL, MK_CLI_TEXT,
         (void *)&tls->cert_file, 0, 0, NULL},
        {"--tls-key", NULL, "PEM", "the certificate's private key", NULL, MK_CLI_TEXT, (void *)&tls->key_file, 0, 0,
         NULL},
        {"--tls-ca", NULL, "PEM", "the CA the peers' certificates are checked against", NULL, MK_CLI_TEXT,
         (void *)&tls->ca_file, 0, 0, NULL},
    };
    memcpy(out, opts, sizeof opts);
    return MK_CLI_TLS_OPTIONS;
}

void mk_cli_tls_finish(mk_seam_tls *tls) {
    tls->enabled = tls->psk_hex || tls->psk_identity || tls->cert_file || tls->key_file || tls->ca_file;
}

int mk_cli_tls_check(const char *command, const mk_seam_options *seam) {
    SSL_CTX *ctx = NULL;
    mk_status s = mk_seam_check_tls(seam);
    if (s == MK_OK) s = mk_tls_context(&seam->tls, true, &ctx); /* the key's length, the files */
    mk_tls_context_free(ctx);
    return s == MK_OK ? -1 : mk_cli_usage_status(command, s);
}
