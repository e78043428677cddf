/* fd.c - see fd.h. */
#include "util/fd.h"

#include <unistd.h>

void fd_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}
