/* Shared by the command-line program's files (meshkern.c, run_batch.c). */
#ifndef MK_TOOLS_CLI_H
#define MK_TOOLS_CLI_H

#include "meshkern.h"

/* MODEL.gguf, or "--random[:key=value,...]" for the seeded random model. */
mk_status mk_cli_open_model(const char *path, mk_model **out);
int mk_cli_usage(void);
int mk_cli_fail(mk_status s);

/* meshkern run MODEL --prompts FILE ...: many sequences through a placed pipeline. */
int mk_cli_run_batch(int argc, char **argv);
/* True when argv names the batch form of run (it has --prompts). */
bool mk_cli_is_batch_run(int argc, char **argv);

/* Prompts as token ids: one prompt per line, comma-separated ids; blank lines and lines
 * starting with '#' skipped. path "-" reads standard input. */
typedef struct batch_prompt {
    int32_t *ids;
    size_t n;
} batch_prompt;
mk_status mk_cli_read_prompts(const char *path, batch_prompt **out, size_t *n_out);
void mk_cli_free_prompts(batch_prompt *p, size_t n);

/* meshkern stage MODEL ...: one range of a multi-process pipeline (stage_cmd.c). */
int mk_cli_stage(int argc, char **argv);

#endif
