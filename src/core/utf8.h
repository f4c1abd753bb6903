/* utf8.h - the one UTF-8 encoder (RFC 3629, section 3): the tokenizer, the Jinja lexer's
 * string escapes and `ftune tokenize` use it. */
#ifndef FT_UTF8_H
#define FT_UTF8_H

#include <stdint.h>

/* Writes code point cp (0..0x10FFFF; surrogates are the caller's to refuse) as 1-4 bytes
 * into out and returns the byte count. */
static inline int ft_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

#endif
