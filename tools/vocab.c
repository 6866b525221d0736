#include "vocab.h"

#include <stdbool.h>
#include <string.h>

#include "gguf.h"
#include "model.h"

/* GPT-2 maps every byte to a printable code point: printable Latin-1 bytes map to
 * themselves, the rest to 256 + n in byte order. Invert that for one code point. */
static int mk_byte_of_codepoint(unsigned cp) {
    const bool printable_self = (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255);
    if (printable_self) return (int)cp;
    if (cp < 256) return -1;
    unsigned n = 0;
    for (unsigned b = 0; b < 256; b++) {
        const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (self) continue;
        if (256 + n == cp) return (int)b;
        n++;
    }
    return -1;
}

void mk_vocab_print(FILE *f, const mk_model *model, int32_t token) {
    const char *text = NULL;
    size_t len = 0;
    if (!model->gguf || mk_gguf_get_array_string(model->gguf, "tokenizer.ggml.tokens", (size_t)token, &text, &len) != MK_OK) {
        fprintf(f, "<%d>", token);
        return;
    }
    if (len > 2 && text[0] == '<' && text[len - 1] == '>') { /* control tokens as they are */
        fwrite(text, 1, len, f);
        return;
    }
    for (size_t i = 0; i < len;) {
        const unsigned char c = (unsigned char)text[i];
        unsigned cp;
        size_t n;
        if (c < 0x80) cp = c, n = 1;
        else if ((c & 0xe0) == 0xc0 && i + 1 < len) cp = ((c & 0x1fu) << 6) | (text[i + 1] & 0x3fu), n = 2;
        else if ((c & 0xf0) == 0xe0 && i + 2 < len)
            cp = ((c & 0x0fu) << 12) | ((text[i + 1] & 0x3fu) << 6) | (text[i + 2] & 0x3fu), n = 3;
        else cp = '?', n = 1;
        const int byte = mk_byte_of_codepoint(cp);
        fputc(byte >= 0 ? byte : '?', f);
        i += n;
    }
}
