/*
 * fd.h - small file descriptor helpers. Thread-safe as far as the descriptor itself is owned
 * by one thread.
 */
#ifndef LB_FD_H
#define LB_FD_H

#include <dirent.h>

/* close(*fd) if it is open (>= 0), then *fd = -1; close's result is not reported. */
void fd_close(int *fd);

/* fdopendir(fd), taking fd: the stream (closedir closes fd), or NULL (errno set) when fd < 0
 * or fdopendir fails, fd then closed. */
DIR *fd_open_dir(int fd);

#endif
