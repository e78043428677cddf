/*
 * buf.h - a growable byte buffer with a hard maximum size (curl's dynbuf idea).
 *
 * Not thread-safe: a buffer belongs to one thread at a time. data is always NUL-terminated
 * (one spare byte beyond len) so text can be used in place.
 */
#ifndef LB_BUF_H
#define LB_BUF_H

#include <stdbool.h>
#include <stddef.h>

struct lb_buf {
    char *data;     /* owned; NULL until the first append */
    size_t len;     /* bytes held */
    size_t cap;     /* bytes allocated (excluding the NUL spare) */
    size_t max;     /* hard limit on len; 0 means SIZE_MAX */
    bool truncated; /* lb_buf_append_capped dropped bytes */
};

/* Set up an empty buffer that may hold at most max_bytes (0: unlimited). Allocates nothing. */
void lb_buf_init(struct lb_buf *b, size_t max_bytes);
/* Append n bytes. Returns 0, -EFBIG if len would pass max (nothing is appended), -ENOMEM. */
int lb_buf_append(struct lb_buf *b, const void *p, size_t n);
/* Append what fits under max, drop the rest and set truncated. Returns 0 or -ENOMEM. */
int lb_buf_append_capped(struct lb_buf *b, const void *p, size_t n);
/* Free the contents; the buffer is empty and reusable with the same max afterwards. */
void lb_buf_release(struct lb_buf *b);
/* Hand the data to the caller (who frees it with free()); the buffer is left empty. */
char *lb_buf_steal(struct lb_buf *b, size_t *len_out);

#endif
