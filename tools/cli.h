/* Shared by the command-line program's files (meshkern.c, run_batch.c, cli_text.c,
 * cli_backend.c, stage_cmd.c, serve.c). Options go through one parser (cli_options.h). */
#ifndef MK_TOOLS_CLI_H
#define MK_TOOLS_CLI_H

#include "cli_options.h"
#include "meshkern.h"

/* MODEL.gguf, or "--random[:key=value,...]" for the seeded random model. */
mk_status mk_cli_open_model(const char *path, mk_model **out);
/* A runtime failure: "meshkern: STATUS: message" on stderr; returns 1. */
int mk_cli_fail(mk_status s);
/* The model's tokenizer, or NULL when it has none (a random model, a GGUF without one or
 * with one this build cannot read): the ids are then printed as "<id>". */
mk_tokenizer *mk_cli_tokenizer_or_null(const mk_model *model);

/* The help line of MODEL, shared by every command that takes one. */
#define MK_CLI_MODEL_ABOUT \
    "  MODEL: a GGUF file, or --random[:key=value,...] (the seeded random model: vocab 48, hidden 32,\n" \
    "  6 layers, 4 heads; keys vocab, hidden, layers, heads, kv_heads, head_dim, ffn, ctx, seed)\n"

/* meshkern run MODEL --prompts FILE ...: many sequences through a placed pipeline. */
int mk_cli_run_batch(int argc, char **argv);
/* True when argv names the batch form of run (it has --prompts). */
bool mk_cli_is_batch_run(int argc, char **argv);

/* The backend options of the range-building commands (cli_backend.c):
 *   --backend cpu|cuda  --device I  --dtype native|f32|f16|bf16  --kv f32|f16|bf16
 *   --threads N  --speed  --eager-decode
 * Weights default to native for a GGUF model on the cpu backend (F32 with --dtype f32). */
typedef struct mk_cli_backend {
    mk_backend_config config;
    size_t device; /* --device, into config.device by mk_cli_backend_finish */
    bool device_given, dtype_given;
    bool eager_decode; /* --eager-decode: mk_range_options.eager_decode (cuda: no decode graphs) */
    size_t kv_block;   /* --kv-block: mk_range_options.kv_block_size */
    size_t kv_pool_blocks, kv_pool_bytes; /* --kv-pool: blocks, or bytes with a unit */
} mk_cli_backend;
void mk_cli_backend_init(mk_cli_backend *b);
/* What the backend options set in a range's options: the backend, eager decode, the KV pool. */
void mk_cli_backend_range(const mk_cli_backend *b, mk_range_options *range);
#define MK_CLI_BACKEND_OPTIONS 9
/* The table of the backend options into out (their values into b); the count. */
size_t mk_cli_backend_options(mk_cli_backend *b, mk_cli_option out[MK_CLI_BACKEND_OPTIONS], const char *threads_help);
/* After parsing: the device (refused off the cuda backend: -1, else the usage error's exit
 * status, named for command `cmd`), and the weight-mode default for the model at `model_path`. */
int mk_cli_backend_finish(mk_cli_backend *b, const char *cmd, const char *model_path);

/* --tls-psk HEX, --tls-identity ID, --tls-cert/--tls-key/--tls-ca PEM (run, stage): any of
 * them turns TLS on (mk_cli_tls_finish); the combination is checked after. */
#define MK_CLI_TLS_OPTIONS 5
size_t mk_cli_tls_options(mk_seam_tls *tls, mk_cli_option out[MK_CLI_TLS_OPTIONS]);
void mk_cli_tls_finish(mk_seam_tls *tls);
/* The TLS options of `seam`, checked by the library's rules before anything runs (the
 * transport, the combination, the key's length, the files): -1 when usable, else a usage
 * error (2). */
int mk_cli_tls_check(const char *command, const mk_seam_options *seam);

/* Prompts as token ids: one prompt per line, comma-separated ids; blank lines and lines
 * starting with '#' skipped. path "-" reads standard input. */
typedef struct batch_prompt {
    int32_t *ids;
    size_t n;
} batch_prompt;
mk_status mk_cli_read_prompts(const char *path, batch_prompt **out, size_t *n_out);
/* --text: one user message per non-empty line, through the model's chat template (as run -p). */
mk_status mk_cli_read_text_prompts(const char *path, const mk_tokenizer *tok, batch_prompt **out, size_t *n_out);
void mk_cli_free_prompts(batch_prompt *p, size_t n);

/* meshkern stage MODEL ...: one range of a multi-process pipeline (stage_cmd.c). */
int mk_cli_stage(int argc, char **argv);

#endif
