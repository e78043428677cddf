/*
 * mode_reserve.c - reserve mode of lendbox-supervise (--reserve UID OFFSET LENGTH), the local
 * provider's upload helper, run by the daemon as host root outside the sandbox: join the
 * sandbox's memory cgroup as its uid and allocate an upload's pages there, so they count
 * against the sandbox's memory limit. The exit codes: supervise.c's head comment, "Reserve
 * mode".
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/falloc.h>

#include "supervisor/supervise_internal.h"

/* Reserve mode (see supervise.c's head comment). */
int mode_reserve_run(int argc, char **argv)
{
    int64_t uid, off, len;
    int fd, r;

    if (argc != 5 || proc_parse_int64(argv[2], 1, 0xfffffffeLL, &uid) < 0 ||
        proc_parse_int64(argv[3], 0, INT64_MAX, &off) < 0 ||
        proc_parse_int64(argv[4], 1, INT64_MAX - off, &len) < 0)
        return 125;
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        return errno;
    /* the first victim if the pages do not fit, so the sandbox's own processes are spared:
     * set before joining, since any allocation after that may already meet the limit */
    fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "1000", 4) != 4)
        return errno ? errno : EIO;
    (void)close(fd);
    if (write(1, "0", 1) != 1)
        return errno ? errno : EIO;
    if (syscall(SYS_setresgid, (gid_t)uid, (gid_t)uid, (gid_t)uid) < 0 ||
        syscall(SYS_setresuid, (uid_t)uid, (uid_t)uid, (uid_t)uid) < 0 ||
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return errno;
    do
        r = fallocate(0, FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
    while (r < 0 && errno == EINTR);
    return r < 0 ? (errno < 125 ? errno : EIO) : 0;
}
