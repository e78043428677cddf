/* utf8.c - see utf8.h. Validation follows the well-formed byte sequences table of the
 * Unicode standard (chapter 3, table 3-7). */
#include "util/utf8.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char replacement[] = "\xef\xbf\xbd";

/* Length of the valid sequence at p (1..4), or 0 when the bytes at p are not one; *bad is the
 * number of bytes to replace with one U+FFFD in that case. */
static size_t utf8_sequence(const unsigned char *p, size_t n, size_t *bad)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xbf;
    size_t need, i;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        need = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        *bad = 1;
        return 0;
    }
    for (i = 1; i < need; i++) {
        unsigned char min = i == 1 ? lo : 0x80, max = i == 1 ? hi : 0xbf;

        if (i >= n || p[i] < min || p[i] > max) {
            *bad = i;
            return 0;
        }
    }
    return need;
}

int utf8_sanitize(const char *data, size_t len, struct lb_buf *out)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t start = 0, i = 0;
    int r = 0;

    while (i < len && r == 0) {
        size_t bad = 0, n = utf8_sequence(p + i, len - i, &bad);

        if (n) {
            i += n;
            continue;
        }
        r = lb_buf_append(out, data + start, i - start);
        if (r == 0)
            r = lb_buf_append(out, replacement, 3);
        i += bad;
        start = i;
    }
    if (r == 0)
        r = lb_buf_append(out, data + start, len - start);
    return r;
}

size_t utf8_incomplete_tail(const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data;

    for (size_t k = 1; k <= 3 && k <= len; k++) {
        unsigned char c = p[len - k];
        size_t bad = 0;

        if ((c & 0xc0) == 0x80)
            continue; /* a continuation byte: the lead may be further back */
        if (c < 0xc2 || c > 0xf4)
            return 0; /* ASCII, or no lead byte at all */
        /* a lead byte: cut short exactly when the sequence runs out at the end */
        return utf8_sequence(p + len - k, k, &bad) == 0 && bad == k ? k : 0;
    }
    return 0;
}

bool utf8_valid(const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t i = 0;

    while (i < len) {
        size_t bad = 0, n = utf8_sequence(p + i, len - i, &bad);

        if (!n)
            return false;
        i += n;
    }
    return true;
}

void utf8_sanitize_inplace(char *s, size_t cap)
{
    size_t len = strnlen(s, cap), i = 0, o = 0;
    char *copy;

    if (cap == 0)
        return;
    if (len == cap) /* not terminated within cap: take what fits */
        len = cap - 1;
    if (utf8_valid(s, len)) {
        s[len] = '\0';
        return;
    }
    /* the result is written over s from the front; the rest is read from a copy */
    copy = strndup(s, len);
    if (!copy) {
        /* no memory: drop every byte that is not ASCII, which needs none */
        for (i = 0; i < len; i++)
            if ((unsigned char)s[i] < 0x80)
                s[o++] = s[i];
        s[o] = '\0';
        return;
    }
    while (i < len) {
        size_t bad = 0, n = utf8_sequence((const unsigned char *)copy + i, len - i, &bad);
        const char *piece = n ? copy + i : replacement;
        size_t plen = n ? n : 3;

        if (o + plen > cap - 1)
            break;
        memcpy(s + o, piece, plen);
        o += plen;
        i += n ? n : bad;
    }
    s[o] = '\0';
    free(copy);
}
