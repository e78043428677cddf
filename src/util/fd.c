/* fd.c - see fd.h. */
#include "util/fd.h"

#include <errno.h>
#include <unistd.h>

void fd_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

DIR *fd_open_dir(int fd)
{
    DIR *d;
    int saved;

    if (fd < 0) {
        errno = EBADF;
        return NULL;
    }
    d = fdopendir(fd);
    if (!d) {
        saved = errno;
        close(fd);
        errno = saved;
    }
    return d;
}
