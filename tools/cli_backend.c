/* The backend options of the run forms that build ranges from the command line (run
 * --prompts, run -p, chat): one table of flags, one default rule for the weight mode. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "net/io.h"
#include "seam/seam.h"

static const struct {
    const char *name;
    mk_dtype dtype;
} mk_cli_weight_modes[] = {
    {"native", MK_DTYPE_NATIVE}, {"f32", MK_DTYPE_F32}, {"f16", MK_DTYPE_F16}, {"bf16", MK_DTYPE_BF16}};

bool mk_cli_parse_count(const char *flag, const char *v, size_t lo, size_t hi, size_t *out) {
    char *end = NULL;
    errno = 0;
    /* digits only: strtoull would turn "-1" into SIZE_MAX and skip leading blanks */
    const unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
    if (end && !*end && !errno && x >= lo && x <= hi) {
        *out = (size_t)x;
        return true;
    }
    fprintf(stderr, "meshkern: %s %s: expected a count from %zu to %zu (the limit)\n", flag, v, lo, hi);
    return false;
}

void mk_cli_backend_init(mk_cli_backend *b) {
    memset(b, 0, sizeof *b);
    b->config = mk_backend_config_default(MK_BACKEND_CPU);
}

bool mk_cli_backend_flag(const char *a, mk_cli_backend *b) {
    if (strcmp(a, "--eager-decode") == 0) {
        b->eager_decode = true; /* decode op by op instead of replaying one graph per range */
        return true;
    }
    if (strcmp(a, "--speed") != 0) return false;
    b->config.speed_mode = true;
    return true;
}

int mk_cli_backend_option(const char *a, const char *v, mk_cli_backend *b) {
    if (strcmp(a, "--backend") == 0) {
        const mk_status s = mk_backend_kind_from_name(v, &b->config.kind);
        return s == MK_OK ? 1 : (mk_cli_fail(s), -1);
    }
    if (strcmp(a, "--device") == 0) {
        size_t d = 0;
        if (!mk_cli_parse_count("--device", v, 0, 1023, &d)) return -1;
        b->config.device = (int)d;
        return 1;
    }
    if (strcmp(a, "--dtype") == 0) {
        for (size_t i = 0; i < sizeof mk_cli_weight_modes / sizeof *mk_cli_weight_modes; i++)
            if (strcmp(v, mk_cli_weight_modes[i].name) == 0) {
                b->config.weight_dtype = mk_cli_weight_modes[i].dtype;
                b->dtype_given = true;
                return 1;
            }
        return -1;
    }
    if (strcmp(a, "--kv") == 0) {
        if (strcmp(v, "f16") == 0) b->config.kv_dtype = MK_DTYPE_F16;
        else if (strcmp(v, "bf16") == 0) b->config.kv_dtype = MK_DTYPE_BF16; /* cuda */
        else if (strcmp(v, "f32") == 0) b->config.kv_dtype = MK_DTYPE_F32;
        else return -1;
        return 1;
    }
    if (strcmp(a, "--threads") == 0)
        return mk_cli_parse_count("--threads", v, 1, MK_CLI_MAX_THREADS, &b->config.threads) ? 1 : -1;
    return 0;
}

void mk_cli_backend_finish(mk_cli_backend *b, const char *model_path) {
    /* A GGUF model on the cpu backend runs on its stored weights unless asked otherwise;
     * the random models have no stored format (F32 is what they are). */
    if (!b->dtype_given && b->config.kind == MK_BACKEND_CPU && strncmp(model_path, "--random", 8) != 0)
        b->config.weight_dtype = MK_DTYPE_NATIVE;
}

bool mk_cli_tls_option(const char *a, const char *v, mk_seam_tls *tls) {
    if (strcmp(a, "--tls-psk") == 0) tls->psk_hex = v;
    else if (strcmp(a, "--tls-identity") == 0) tls->psk_identity = v;
    else if (strcmp(a, "--tls-cert") == 0) tls->cert_file = v;
    else if (strcmp(a, "--tls-key") == 0) tls->key_file = v;
    else if (strcmp(a, "--tls-ca") == 0) tls->ca_file = v;
    else return false;
    tls->enabled = true;
    return true;
}

bool mk_cli_tls_usable(const mk_seam_options *seam) {
    SSL_CTX *ctx = NULL;
    mk_status s = mk_seam_check_tls(seam);
    if (s == MK_OK) s = mk_tls_context(&seam->tls, true, &ctx); /* the key's length, the files */
    mk_tls_context_free(ctx);
    if (s == MK_OK) return true;
    fprintf(stderr, "meshkern: %s: %s\n", mk_status_name(s), mk_last_error());
    return false;
}
