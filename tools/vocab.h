/* Token text for display: GGUF tokenizer.ggml.tokens decoded from GPT-2 byte-level form. */
#ifndef MK_TOOLS_VOCAB_H
#define MK_TOOLS_VOCAB_H

#include <stdio.h>

#include "meshkern.h"

/* Write the text of `token` to f; falls back to "<id>" when the model has no vocabulary. */
void mk_vocab_print(FILE *f, const mk_model *model, int32_t token);

#endif
