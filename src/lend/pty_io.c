/*
 * pty_io.c - a PTY session's traffic: output replay from a byte offset (the segments the holder
 * writes, swept of anything it never writes), the exit code, input to the terminal, and the
 * control requests (resize, signal). Every file is reached through pty.c's directory helpers.
 * Shares pty_internal.h.
 */
#include "lend/pty_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

#define SEG_BYTES (256 * 1024) /* as lendbox-supervise's PTY_SEG_BYTES */
#define INPUT_WAIT_MS 5000

/* ---------- output ---------- */

/* Read up to len-1 bytes of the holder's file name (exit) into buf, NUL-terminated. */
static int read_small(const struct lb_ptys *p, const char *sid, const char *name, char *buf,
                      size_t len)
{
    struct stat st;
    int sdir = pty_session_dir_open(p, sid), fd;

    if (sdir < 0)
        return sdir;
    fd = pty_session_open_file(sdir, name, &st);
    close(sdir);
    if (fd < 0)
        return fd;
    return pty_read_text(fd, buf, len);
}

/* The holder is gone without an exit status: the session ended with its sandbox (released,
 * deleted: 404, as for a deleted session), or its holder was killed (502). */
static int holder_lost(struct lb_ptys *p, struct lb_error *err, const char *sid)
{
    char sandbox[LB_ID_MAX];

    if (pty_sandbox_of(p, sid, sandbox, sizeof(sandbox)) < 0 ||
        !store_sandbox_is_lent(p->store, sandbox))
        return pty_not_found(err, sid);
    return lb_error_set(err, -EREMOTEIO,
                        "PTY session %s ended without an exit status: its holder process in the "
                        "sandbox was killed",
                        sid);
}

struct seg_range {
    bool any;
    uint64_t lo, hi; /* lowest and highest segment index present */
};

/* Index of a segment name PREFIX.K (K decimal, no sign, no leading zero but "0"), or -1. */
static int64_t segment_index(const char *name, const char *prefix)
{
    size_t pl = strlen(prefix);
    const char *d = name + pl;
    char *end;
    unsigned long long k;

    if (strncmp(name, prefix, pl) != 0 || *d < '0' || *d > '9' || (d[0] == '0' && d[1]))
        return -1;
    errno = 0;
    k = strtoull(d, &end, 10);
    return errno || *end || k > (unsigned long long)INT64_MAX / SEG_BYTES ? -1 : (int64_t)k;
}

/* The names the holder writes besides the segments (lendbox-supervise's PTY mode). */
static bool holder_name(const char *n)
{
    static const char *const names[] = {"exit", "in", "ctl", "pid", ".exit.tmp", ".pid.tmp"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(n, names[i]) == 0)
            return true;
    return false;
}

#define SWEEP_SEGS 6 /* segments kept by the sweep: the holder's 5 and the one it opens next */

/* Find the range of PREFIX segments in the session directory, and sweep it: whatever the
 * holder never writes (other names, directories, symlinks, FIFOs or hard links where a file
 * belongs, segments over SEG_BYTES or behind the retained window) is removed, so a sandbox
 * that got hold of the directory cannot grow it past about SWEEP_SEGS segments per stream
 * for longer than until the next read. */
static void scan_segments(int sdir, const char *prefix, struct seg_range *sr)
{
    struct seg_range both[2] = {{0}};
    static const char *const prefixes[2] = {"out.", "err."};
    struct dirent *e;
    DIR *d;
    int fd = openat(sdir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    memset(sr, 0, sizeof(*sr));
    if (fd < 0 || !(d = fdopendir(fd))) {
        if (fd >= 0)
            close(fd);
        return;
    }
    for (int pass = 0; pass < 2; pass++) { /* 1: ranges known, remove the old segments */
        rewinddir(d);
        while ((e = readdir(d))) {
            const char *n = e->d_name;
            uint64_t size;
            int64_t k = -1;
            int i;

            if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0)
                continue;
            for (i = 0; i < 2 && k < 0; i++)
                k = segment_index(n, prefixes[i]);
            i--;
            if (k < 0) {
                if (pass == 0 && !holder_name(n)) {
                    log_warn("pty: removing '%s' from a session directory (not the holder's)", n);
                    pty_remove_entry_at(dirfd(d), n, 0);
                }
                continue;
            }
            if (pass == 0) {
                if (!pty_session_file_ok(dirfd(d), n, &size) || size > SEG_BYTES) {
                    log_warn("pty: removing '%s' from a session directory (not a segment)", n);
                    pty_remove_entry_at(dirfd(d), n, 0);
                    continue;
                }
                if (!both[i].any || (uint64_t)k < both[i].lo)
                    both[i].lo = (uint64_t)k;
                if (!both[i].any || (uint64_t)k > both[i].hi)
                    both[i].hi = (uint64_t)k;
                both[i].any = true;
            } else if ((uint64_t)k + SWEEP_SEGS <= both[i].hi) {
                (void)unlinkat(dirfd(d), n, 0);
            }
        }
    }
    closedir(d);
    for (int i = 0; i < 2; i++) {
        if (both[i].any && both[i].hi >= SWEEP_SEGS && both[i].lo + SWEEP_SEGS <= both[i].hi)
            both[i].lo = both[i].hi - SWEEP_SEGS + 1;
        if (strcmp(prefix, prefixes[i]) == 0)
            *sr = both[i];
    }
}

int pty_read(struct lb_ptys *p, const char *sid, bool err_stream, uint64_t since,
             struct lb_pty_chunk *out, struct lb_error *err)
{
    const char *prefix = err_stream ? "err." : "out.";
    char name[64], exit_text[32];
    struct seg_range sr;
    struct session *s;
    struct stat stt;
    uint64_t size;
    int r = pty_session_lock(p, sid, &s, err), fd, sdir;

    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (r < 0)
        return r;
    pthread_mutex_unlock(&p->lock);
    sdir = pty_session_dir_open(p, sid);
    if (sdir < 0)
        return pty_not_found(err, sid);
    /* the exit file first: it is renamed in after the last byte, so the end read after it
     * is final */
    if (read_small(p, sid, "exit", exit_text, sizeof(exit_text)) == 0) {
        out->exited = true;
        out->exit_code = atoi(exit_text);
    }
    scan_segments(sdir, prefix, &sr);
    if (!sr.any) {
        sr.lo = sr.hi = 0; /* not started yet: an empty stream */
        out->end = 0;
    } else {
        snprintf(name, sizeof(name), "%s%" PRIu64, prefix, sr.hi);
        if (!pty_session_file_ok(sdir, name, &size) || size > SEG_BYTES)
            size = 0;
        out->end = sr.hi * SEG_BYTES + size;
    }
    r = 0;
    if (since > out->end) {
        r = lb_error_set(err, -EINVAL,
                         "since %" PRIu64 " is past the end of the output (%" PRIu64
                         " bytes so far)",
                         since, out->end);
        goto out;
    }
    if (since < sr.lo * SEG_BYTES) {
        r = lb_error_set(err, -ESTALE,
                         "since %" PRIu64 " is older than the retained window (it starts at "
                         "%" PRIu64 ")",
                         since, sr.lo * SEG_BYTES);
        goto out;
    }
    out->next = since;
    if (since == out->end) {
        /* nothing more: is anyone still there to write it? (the exit file comes before the
         * holder lets go of ctl, so a second look settles a race with a normal end) */
        if (!out->exited && !pty_holder_alive(p, sid)) {
            if (read_small(p, sid, "exit", exit_text, sizeof(exit_text)) == 0) {
                out->exited = true;
                out->exit_code = atoi(exit_text);
                goto out;
            }
            r = holder_lost(p, err, sid);
        }
        goto out;
    }
    snprintf(name, sizeof(name), "%s%" PRIu64, prefix, since / SEG_BYTES);
    fd = pty_session_open_file(sdir, name, &stt);
    if (fd == -EPERM) {
        r = lb_error_set(err, -EREMOTEIO,
                         "PTY session %s: %s is not an output segment the holder wrote (a "
                         "symlink, FIFO or link was planted in its place); it is not served",
                         sid, name);
        goto out;
    }
    if (fd < 0) {
        r = lb_error_set(err, -ESTALE, "since %" PRIu64 " left the retained window just now",
                         since);
        goto out;
    }
    out->file_off = since % SEG_BYTES;
    size = (uint64_t)stt.st_size > SEG_BYTES ? SEG_BYTES : (uint64_t)stt.st_size;
    if (size <= out->file_off) { /* the segment is being started */
        close(fd);
        goto out;
    }
    out->fd = fd;
    out->len = size - out->file_off;
    out->next = since + out->len;
out:
    close(sdir);
    return r;
}

int pty_exit_code(struct lb_ptys *p, const char *sid, int *code, struct lb_error *err)
{
    char text[32];
    struct session *s;
    int r = pty_session_lock(p, sid, &s, err);

    if (r < 0)
        return r;
    pthread_mutex_unlock(&p->lock);
    if (read_small(p, sid, "exit", text, sizeof(text)) < 0) {
        if (pty_holder_alive(p, sid))
            return -EAGAIN;
        if (read_small(p, sid, "exit", text, sizeof(text)) < 0)
            return holder_lost(p, err, sid);
    }
    *code = atoi(text);
    return 0;
}

/* ---------- input and control ---------- */

static bool session_exited(struct lb_ptys *p, const char *sid)
{
    int sdir = pty_session_dir_open(p, sid);
    bool exited = sdir >= 0 && pty_session_file_ok(sdir, "exit", NULL);

    if (sdir >= 0)
        close(sdir);
    return exited;
}

/* Open a FIFO of the session for writing, without blocking. */
static int open_fifo(struct lb_ptys *p, const char *sid, const char *name, struct lb_error *err)
{
    int sdir = pty_session_dir_open(p, sid), fd;

    if (sdir < 0)
        return pty_not_found(err, sid);
    fd = pty_session_open_fifo(sdir, name);
    close(sdir);
    if (fd >= 0)
        return fd;
    if (fd == -EPERM)
        return lb_error_set(err, -EREMOTEIO,
                            "PTY session %s: its %s is not the holder's FIFO (something was "
                            "planted in its place); nothing was written",
                            sid, name);
    if (fd == -ENXIO || session_exited(p, sid))
        return lb_error_set(err, -EBUSY, "the session's process has exited");
    if (fd == -ENOENT)
        return pty_not_found(err, sid);
    return lb_error_set(err, -EIO, "cannot reach the session: %s", strerror(-fd));
}

int pty_input(struct lb_ptys *p, const char *sid, const void *data, size_t len,
              struct lb_error *err)
{
    struct session *s;
    int64_t deadline = clock_mono_ms() + INPUT_WAIT_MS;
    size_t done = 0;
    int r = pty_session_lock(p, sid, &s, err), fd;

    if (r < 0)
        return r;
    pthread_mutex_unlock(&p->lock);
    if (session_exited(p, sid))
        return lb_error_set(err, -EBUSY, "the session's process has exited");
    fd = open_fifo(p, sid, "in", err);
    if (fd < 0)
        return fd;
    while (done < len) {
        ssize_t w = write(fd, (const char *)data + done, len - done);

        if (w > 0) {
            done += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int64_t left = deadline - clock_mono_ms();

            if (left > 0 && poll(&pf, 1, (int)(left > 100 ? 100 : left)) >= 0)
                continue;
            r = lb_error_set(err, -EAGAIN,
                             "the terminal took %zu of %zu bytes and nothing more for %d s", done,
                             len, INPUT_WAIT_MS / 1000);
            break;
        }
        r = lb_error_set(err, -EBUSY, "the session's process has exited");
        break;
    }
    close(fd);
    return r;
}

static int send_control(struct lb_ptys *p, const char *sid, const char *line, struct lb_error *err)
{
    struct session *s;
    size_t n = strlen(line);
    int r = pty_session_lock(p, sid, &s, err), fd;

    if (r < 0)
        return r;
    pthread_mutex_unlock(&p->lock);
    fd = open_fifo(p, sid, "ctl", err);
    if (fd < 0)
        return fd;
    /* one short line: a single atomic pipe write */
    if (write(fd, line, n) != (ssize_t)n)
        r = lb_error_set(err, errno == EAGAIN ? -EAGAIN : -EBUSY,
                         "the session did not take the request: %s", strerror(errno));
    close(fd);
    return r;
}

int pty_resize(struct lb_ptys *p, const char *sid, int rows, int cols, struct lb_error *err)
{
    char line[64];

    if (rows < 1 || rows > 65535 || cols < 1 || cols > 65535)
        return lb_error_set(err, -EINVAL, "rows and cols must be 1-65535");
    snprintf(line, sizeof(line), "resize %d %d\n", rows, cols);
    return send_control(p, sid, line, err);
}

int pty_signal(struct lb_ptys *p, const char *sid, int sig, struct lb_error *err)
{
    char line[32];

    if (sig < 1 || sig >= NSIG)
        return lb_error_set(err, -EINVAL, "no such signal");
    snprintf(line, sizeof(line), "signal %d\n", sig);
    return send_control(p, sid, line, err);
}

int pty_signal_number(const char *name)
{
    static const struct {
        const char *name;
        int sig;
    } names[] = {{"HUP", SIGHUP},   {"INT", SIGINT},     {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
                 {"TERM", SIGTERM}, {"USR1", SIGUSR1},   {"USR2", SIGUSR2}, {"STOP", SIGSTOP},
                 {"CONT", SIGCONT}, {"WINCH", SIGWINCH}, {"ALRM", SIGALRM}, {"TSTP", SIGTSTP},
                 {"PIPE", SIGPIPE}, {"ABRT", SIGABRT}};
    char *end;
    long v;

    if (!name || !*name)
        return -1;
    if (strncmp(name, "SIG", 3) == 0)
        name += 3;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i].name) == 0)
            return names[i].sig;
    v = strtol(name, &end, 10);
    return *end || v < 1 || v >= NSIG ? -1 : (int)v;
}
