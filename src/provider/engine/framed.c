/*
 * framed.c - the framed-mode reader shared by the engine providers (see framed.h).
 */
#include "provider/engine/framed.h"

#include "provider/exec_result.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void framed_reader_init(struct lb_framed_reader *x, struct lb_exec_result *res)
{
    memset(x, 0, sizeof(*x));
    x->res = res;
}

void framed_reader_feed(struct lb_framed_reader *x, const void *data, size_t n)
{
    const unsigned char *p = data;

    while (n > 0) {
        if (x->left == 0 && x->have < 5) {
            x->hdr[x->have++] = *p++;
            n--;
            if (x->have == 5) {
                x->type = (char)x->hdr[0];
                x->left = (uint32_t)x->hdr[1] << 24 | (uint32_t)x->hdr[2] << 16 |
                          (uint32_t)x->hdr[3] << 8 | x->hdr[4];
                if (x->type == 's')
                    x->have_status = true;
                if (!strchr("oeTs", x->type))
                    x->bad = true;
                if (x->left == 0)
                    x->have = 0;
            }
            continue;
        }
        size_t k = n < x->left ? n : x->left;

        switch (x->type) {
        case 'o':
            (void)lb_buf_append_capped(&x->res->out, p, k);
            break;
        case 'e':
            (void)lb_buf_append_capped(&x->res->err, p, k);
            break;
        case 'T':
            if (*p == 'o')
                x->res->out.truncated = true;
            else if (*p == 'e')
                x->res->err.truncated = true;
            break;
        case 's': {
            size_t room = sizeof(x->status) - 1 - x->status_len, c = k < room ? k : room;

            memcpy(x->status + x->status_len, p, c);
            x->status_len += c;
            x->status[x->status_len] = '\0';
            break;
        }
        default:
            break;
        }
        p += k;
        n -= k;
        x->left -= (uint32_t)k;
        if (x->left == 0)
            x->have = 0;
    }
}

bool framed_reader_complete(const struct lb_framed_reader *x)
{
    return x->have_status && !x->bad;
}

void framed_reader_apply_status(struct lb_framed_reader *x)
{
    exec_result_apply_status(x->res, x->status, NULL);
}
