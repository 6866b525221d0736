/* Shared by the command-line program's files (meshkern.c, run_batch.c, cli_text.c,
 * cli_backend.c). */
#ifndef MK_TOOLS_CLI_H
#define MK_TOOLS_CLI_H

#include "meshkern.h"

/* MODEL.gguf, or "--random[:key=value,...]" for the seeded random model. */
mk_status mk_cli_open_model(const char *path, mk_model **out);
int mk_cli_usage(void);
int mk_cli_fail(mk_status s);

/* The limits of the counts the command line takes (each refused above its limit with a
 * usage error naming it, before anything is allocated): tokens to generate (--n,
 * --max-tokens), sequences in flight (--batch), cpu threads (--threads). */
#define MK_CLI_MAX_NEW_TOKENS ((size_t)1 << 20)
#define MK_CLI_MAX_BATCH ((size_t)4096)
#define MK_CLI_MAX_THREADS ((size_t)1024)
/* A count flag's value: decimal digits only, from lo to hi; otherwise a message naming the
 * flag, the value and the limits on stderr, and false (the caller prints the usage). */
bool mk_cli_parse_count(const char *flag, const char *v, size_t lo, size_t hi, size_t *out);

/* meshkern run MODEL --prompts FILE ...: many sequences through a placed pipeline. */
int mk_cli_run_batch(int argc, char **argv);
/* True when argv names the batch form of run (it has --prompts). */
bool mk_cli_is_batch_run(int argc, char **argv);

/* The backend options of the range-building run forms (cli_backend.c):
 *   --backend cpu|cuda  --device I  --dtype native|f32|f16|bf16  --kv f32|f16|bf16
 *   --threads N (cpu threads per range)  --speed, --eager-decode (flags)
 * Weights default to native for a GGUF model on the cpu backend (F32 with --dtype f32). */
typedef struct mk_cli_backend {
    mk_backend_config config;
    bool dtype_given;
    bool eager_decode; /* --eager-decode: mk_range_options.eager_decode (cuda: no decode graphs) */
} mk_cli_backend;
void mk_cli_backend_init(mk_cli_backend *b);
/* A flag without a value (--speed, --eager-decode): true when `a` was one. */
bool mk_cli_backend_flag(const char *a, mk_cli_backend *b);
/* `a` with its value `v`: 1 taken, 0 not a backend option, -1 a bad value (a status
 * message is printed where there is one; the caller prints the usage). */
int mk_cli_backend_option(const char *a, const char *v, mk_cli_backend *b);
/* After every option: the weight-mode default for the model at `model_path`. */
void mk_cli_backend_finish(mk_cli_backend *b, const char *model_path);
/* Prompts as token ids: one prompt per line, comma-separated ids; blank lines and lines
 * starting with '#' skipped. path "-" reads standard input. */
typedef struct batch_prompt {
    int32_t *ids;
    size_t n;
} batch_prompt;
mk_status mk_cli_read_prompts(const char *path, batch_prompt **out, size_t *n_out);
void mk_cli_free_prompts(batch_prompt *p, size_t n);

/* --tls-psk HEX, --tls-identity ID, --tls-cert/--tls-key/--tls-ca PEM (run, stage): true
 * when `a` is one of them (any of them turns TLS on; the combination is checked after). */
bool mk_cli_tls_option(const char *a, const char *v, mk_seam_tls *tls);
/* The TLS options of `seam`, checked by the library's rules before anything runs (the
 * transport, the combination, the key's length, the files): false with a message. */
bool mk_cli_tls_usable(const mk_seam_options *seam);

/* meshkern stage MODEL ...: one range of a multi-process pipeline (stage_cmd.c). */
int mk_cli_stage(int argc, char **argv);

#endif
