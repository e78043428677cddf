/* buf.c - see buf.h. */
#include "util/buf.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void lb_buf_init(struct lb_buf *b, size_t max_bytes)
{
    memset(b, 0, sizeof(*b));
    b->max = max_bytes ? max_bytes : SIZE_MAX - 1;
}

static int buf_reserve(struct lb_buf *b, size_t need)
{
    size_t cap = b->cap ? b->cap : 256;
    char *p;

    if (need <= b->cap && b->data)
        return 0;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    p = realloc(b->data, cap + 1);
    if (!p)
        return -ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

int lb_buf_append(struct lb_buf *b, const void *p, size_t n)
{
    int r;

    if (n > b->max - b->len)
        return -EFBIG;
    r = buf_reserve(b, b->len + n);
    if (r < 0)
        return r;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int lb_buf_append_capped(struct lb_buf *b, const void *p, size_t n)
{
    size_t room = b->max - b->len;

    if (n > room) {
        b->truncated = true;
        n = room;
    }
    if (n == 0)
        return b->data ? 0 : buf_reserve(b, 1);
    return lb_buf_append(b, p, n);
}

void lb_buf_release(struct lb_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->truncated = false;
}

char *lb_buf_steal(struct lb_buf *b, size_t *len_out)
{
    char *p = b->data;

    if (len_out)
        *len_out = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}
