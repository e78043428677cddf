/*
 * utf8.h - make arbitrary bytes valid UTF-8 for JSON output.
 */
#ifndef LB_UTF8_H
#define LB_UTF8_H

#include <stdbool.h>
#include <stddef.h>

#include "util/buf.h"

/* Append data to out, replacing every invalid UTF-8 sequence (bad lead or continuation bytes,
 * overlong forms, surrogates, code points past U+10FFFF, a sequence cut at the end) with
 * U+FFFD, one replacement per maximal invalid subpart (as the Unicode standard recommends).
 * Returns 0 or -ENOMEM. out must have no max (or a large enough one). */
int utf8_sanitize(const char *data, size_t len, struct lb_buf *out);

/* How many bytes at the end of data (0..3) are the valid beginning of a UTF-8 sequence that
 * is cut short: what a stream of chunks keeps back for the next chunk, so that sanitizing
 * chunk by chunk gives the same text as sanitizing the whole. */
size_t utf8_incomplete_tail(const char *data, size_t len);

/* Whether data (len bytes; NULs count as valid) is well-formed UTF-8. Thread-safe. */
bool utf8_valid(const char *data, size_t len);

/* Make the NUL-terminated string s, held in a buffer of cap bytes (cap >= 1), valid UTF-8 in
 * place: invalid subparts become U+FFFD as in utf8_sanitize; what no longer fits in cap is cut
 * at a character boundary, so the result is always valid and NUL-terminated. Needs no memory
 * (for messages built in fixed buffers, e.g. struct lb_error). Thread-safe. */
void utf8_sanitize_inplace(char *s, size_t cap);

#endif
