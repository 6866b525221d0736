/* The text side of the command-line program (cli_text.c): prompts in, answers out. */
#ifndef MK_CLI_TEXT_H
#define MK_CLI_TEXT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "meshkern.h"

/* meshkern run MODEL -p TEXT ...: argv[0] is MODEL. */
int mk_cli_run_text(int argc, char **argv);
/* meshkern chat MODEL ...: argv[0] is MODEL. */
int mk_cli_chat(int argc, char **argv);
/* meshkern tokenize MODEL TEXT ...: argv[0] is MODEL. */
int mk_cli_tokenize(int argc, char **argv);
/* A user message (after an optional system one) rendered with the model's chat template
 * and tokenized, as run -p does; raw: the text itself with the model's BOS. ids are
 * released with mk_buffer_free; template_name is static. */
mk_status mk_cli_text_ids(const mk_tokenizer *tok, const char *system, const char *prompt, bool raw, int32_t **ids,
                          size_t *n, const char **template_name);
/* Print ids as text through `tok` (as "<id>" when tok is NULL: a model without one). */
void mk_cli_print_text(FILE *f, const mk_tokenizer *tok, const int32_t *ids, size_t n);

#endif
