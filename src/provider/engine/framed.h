/*
 * framed.h - the reader of lendbox-supervise's framed mode (supervise.c, "Framed mode"): the
 * exec protocol of the engine providers (docker, lxd). The supervisor's stdout carries frames
 * (one byte type, a 4-byte big-endian length, the payload): 'o' stdout bytes, 'e' stderr bytes,
 * 'T' "o"/"e" (that stream was cut), and last 's', the status line. How the bytes reach the
 * daemon is the engine's business (docker: a multiplexed HTTP stream; lxd: a recorded output
 * file); this reader only turns them into a struct lb_exec_result.
 *
 * Thread-safety: a reader is used by one thread at a time; readers are independent.
 */
#ifndef LB_PROVIDER_FRAMED_H
#define LB_PROVIDER_FRAMED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider/provider.h"

#define FRAMED_STATUS_MAX 1100

struct lb_framed_reader {
    struct lb_exec_result *res; /* borrowed: 'o'/'e' payload goes into res->out / res->err */
    unsigned char hdr[5];
    size_t have;
    uint32_t left;
    char type;
    char status[FRAMED_STATUS_MAX];
    size_t status_len;
    bool have_status; /* an 's' frame began */
    bool bad;         /* a frame that is not the protocol's */
};

/* Start reading frames into res (whose out/err buffers the caller initialised with their
 * caps). */
void framed_reader_init(struct lb_framed_reader *x, struct lb_exec_result *res);

/* Consume n bytes of the supervisor's stdout (any split). Output past the result's caps is
 * dropped (the supervisor caps it already). */
void framed_reader_feed(struct lb_framed_reader *x, const void *data, size_t n);

/* Did a whole, well-formed result arrive (a status frame, no foreign frame)? */
bool framed_reader_complete(const struct lb_framed_reader *x);

/* The status line as the result (exec_result_apply_status, with the text as it came). Call when
 * complete. */
void framed_reader_apply_status(struct lb_framed_reader *x);

#endif
