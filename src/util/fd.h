/*
 * fd.h - small file descriptor helpers. Thread-safe as far as the descriptor itself is owned
 * by one thread.
 */
#ifndef LB_FD_H
#define LB_FD_H

/* close(*fd) if it is open (>= 0), then *fd = -1; close's result is not reported. */
void fd_close(int *fd);

#endif
