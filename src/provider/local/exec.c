/*
 * local_exec.c - the local provider's exec: enter the sandbox's namespaces the way nsenter
 * does (setns, fork) and run the command under lendbox-supervise, which owns the timeout and
 * the process tree (see src/supervisor/supervise.c for the status protocol).
 *
 * Process shape: the daemon spawns (spawn_vfork: no copy of the daemon) lendbox-supervise
 * --enter as host root with the namespace, cgroup and filter fds. That helper, a process with
 * a memory of its own, joins the sandbox's cgroup, enters its user namespace first (which
 * grants the capabilities needed for the rest), then mnt, pid, net, uts and ipc, and becomes
 * the namespace's root (= the sandbox's host uid). It forks the supervisor, which is thereby
 * inside the pid namespace, closes every fd and waits for it. Nothing that shares the
 * daemon's memory ever enters the sandbox: a sandbox process can SIGSTOP the supervisor (same
 * uid, same pid namespace) and a pause freezes the helper, but neither holds a daemon thread
 * beyond the bounded waits below. The helper must not exit early: an orphan is adopted by a
 * reaper of the *parent's* pid namespace (the host's init), and a zombie left to a slow host
 * init holds up the pid namespace's teardown at stop (measured: ~2 s). Background processes
 * the supervisor leaves behind (--keep-background) are adopted by the sandbox's pid 1, which
 * reaps them. The daemon waits for the helper once the supervisor is done, and talks to the
 * supervisor through four pipes: stdin, stdout, stderr, and the status pipe (fd 3 in the
 * supervisor).
 *
 * The daemon side never blocks on the sandbox: stdin is written non-blocking, stdout and
 * stderr are read (and past the cap, dropped) as they come, and a backstop deadline of
 * timeout + 10 s ends the wait even if the supervisor never answers.
 *
 * Channels: nothing in the sandbox can read or forge an exec's output or result. The pipes are made
 * by the daemon (host root, mode 0600), so no sandbox uid can reopen them through /proc/<pid>/fd;
 * the supervisor is non-dumpable, so none can take them from it either; the status fd is the
 * supervisor's alone. The result is its one status line: once the line is in, nothing more is
 * awaited on the status pipe, and stdout/stderr are drained for at most DRAIN_MS, so whatever holds
 * a copy of a pipe cannot stall the exec. The helper joins a fresh session keyring before it enters
 * the sandbox and installs the seccomp filter (passed as a memfd) last, after dropping its
 * capabilities; the supervisor and the command inherit both. An exclusive exec first takes the
 * sandbox's exec gate and sweeps every sandbox process but the init (local_exclusive.c).
 */
#include "provider/exec_result.h"
#include "provider/local/local_internal.h"
#include "provider/local/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "supervisor/user.h"
#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"

#define BACKSTOP_MS 10000
#define PAUSED_KILL_MS 2000 /* past the timeout, a paused (frozen) exec is killed by the daemon */
#define FROZEN_CHECK_MS 500
#define REAP_MS 5000 /* wait for the exec's helper to exit after its kill */
#define DEFAULT_OUTPUT_MAX (1024 * 1024)
#define STATUS_MAX 2048
#define READ_CHUNK 65536
#define DRAIN_MS 200
#define QUIESCE_MS 10000    /* bound on an exclusive exec's sweep */
#define HELPER_EXIT_MS 2000 /* bound on the helper's exit once the status is in */

enum { NS_USER, NS_MNT, NS_PID, NS_NET, NS_UTS, NS_IPC, NS_COUNT };
static const char *const ns_names[NS_COUNT] = {"user", "mnt", "pid", "net", "uts", "ipc"};

/* The supervisor's fds, in order: 0 stdin, 1 stdout, 2 stderr, 3 status, and with a pass fd
 * 4 that (the supervisor hands it to the command alone). */
enum { CH_STDIN, CH_STDOUT, CH_STDERR, CH_STATUS, CH_COUNT, CH_PASS = CH_COUNT, CH_MAX };

struct exec_fds {
    int ns[NS_COUNT];
    int cg[LB_CGROUP_MAX_DIRS];
    int ncg;
    struct rlimit nofile; /* the sandbox's RLIMIT_NOFILE, not the daemon's */
    int child[CH_MAX];    /* the supervisor's ends */
    int nchild;           /* CH_COUNT, or CH_MAX with a pass fd */
    int in_w, out_r, err_r, status_r;
};

static void exec_fds_init(struct exec_fds *f)
{
    int i;

    memset(f, 0, sizeof(*f));
    for (i = 0; i < NS_COUNT; i++)
        f->ns[i] = -1;
    for (i = 0; i < CH_MAX; i++)
        f->child[i] = -1;
    f->nchild = CH_COUNT;
    f->in_w = f->out_r = f->err_r = f->status_r = -1;
}

static void exec_fds_close_child(struct exec_fds *f)
{
    int i;

    for (i = 0; i < NS_COUNT; i++)
        local_close_fd(&f->ns[i]);
    for (i = 0; i < f->ncg; i++)
        local_close_fd(&f->cg[i]);
    f->ncg = 0;
    for (i = 0; i < CH_MAX; i++)
        local_close_fd(&f->child[i]);
}

static void exec_fds_close(struct exec_fds *f)
{
    exec_fds_close_child(f);
    local_close_fd(&f->in_w);
    local_close_fd(&f->out_r);
    local_close_fd(&f->err_r);
    local_close_fd(&f->status_r);
}

/* What the spawned child (spawn.h: it shares the daemon's memory until execve) needs. */
struct helper_child {
    const struct exec_fds *f;
    int seccomp_fd;          /* -1: no filter */
    const char *helper_path; /* lendbox-supervise on the host */
    char *const *argv;       /* lendbox-supervise --enter ... */
};

/* The spawned child: place the helper's fds (the supervisor's, then the namespaces, the
 * cgroup.procs files and the filter), close the rest and exec lendbox-supervise --enter as
 * host root, outside the sandbox: it enters the sandbox in a memory of its own, so nothing
 * that shares the daemon's memory is ever visible to, or freezable with, sandbox processes.
 * Returns an errno value (after reporting on the status pipe) only on failure. */
static int child_exec_helper(void *arg)
{
    static char *const no_env[] = {NULL};
    const struct helper_child *c = arg;
    const struct exec_fds *f = c->f;
    int fds[CH_MAX + NS_COUNT + LB_CGROUP_MAX_DIRS + 1], n = 0, i, r;

    sup_signals_reset();
    for (i = 0; i < f->nchild; i++)
        fds[n++] = f->child[i];
    for (i = 0; i < NS_COUNT; i++)
        fds[n++] = f->ns[i];
    for (i = 0; i < f->ncg; i++)
        fds[n++] = f->cg[i];
    if (c->seccomp_fd >= 0)
        fds[n++] = c->seccomp_fd;
    r = local_child_place_fds(fds, n);
    if (r < 0) {
        local_child_report(f->child[CH_STATUS], "error cannot set up the exec helper's fds", -r);
        return -r;
    }
    (void)syscall(SYS_close_range, n, ~0U, 0);
    execve(c->helper_path, c->argv, no_env);
    r = errno;
    local_child_report(CH_STATUS, "error cannot execute the exec helper", r);
    return r;
}

/* The trusted view of an exclusive exec (lendbox-supervise --enter-view): what its base is
 * (kind "root": the sandbox's own root, read-only, as for image host; "mounted": base, the
 * idmapped tree its overlay is over; "image": base, the image tree itself, which the helper
 * idmaps as the overlay's is), the hosts file to bind at /etc/hosts ("-": none), the workdir,
 * and the size of its fresh /tmp. */
struct exec_view {
    bool on;
    const char *kind;
    char base[4400], hosts[4400], tmp_mib[24];
    const char *workdir;
};

/* Fill v for the sandbox id: an image sandbox's base is its read-only image tree, the
 * idmapped lower layer of its root's overlay (local_image.c) while this daemon's mount
 * namespace has it, else the image tree its descriptor names (a daemon restarted in a mount
 * namespace of its own), and its /etc/hosts the daemon's file; /tmp as large as the
 * sandbox's own. A sandbox whose root is an overlay (an image's) but whose base is not found
 * is refused, never run on its writable root: -EOPNOTSUPP (422). */
static int exec_view_find(const struct local_provider *lp, const char *id,
                          const struct local_desc *d, struct exec_view *v, struct lb_error *err)
{
    static const char *const lowers[] = {"img/lower", "img-lower"}; /* now, and before */
    char dir[4352], path[64];
    struct statfs sf;
    struct stat st;
    int64_t mib = lp->tmp_size_mib;

    v->on = true;
    v->kind = "mounted";
    v->workdir = d->workdir;
    snprintf(v->base, sizeof(v->base), "-");
    snprintf(v->hosts, sizeof(v->hosts), "-");
    local_sandbox_dir(lp, id, dir, sizeof(dir));
    for (size_t i = 0; i < sizeof(lowers) / sizeof(lowers[0]); i++) {
        snprintf(v->base, sizeof(v->base), "%s/%s", dir, lowers[i]);
        if (stat(v->base, &st) == 0 && S_ISDIR(st.st_mode))
            break;
        snprintf(v->base, sizeof(v->base), "-");
    }
    if (strcmp(v->base, "-") == 0 && d->image[0] && stat(d->image, &st) == 0 &&
        S_ISDIR(st.st_mode)) {
        v->kind = "image";
        snprintf(v->base, sizeof(v->base), "%s", d->image);
    }
    if (strcmp(v->base, "-") == 0)
        v->kind = "root";
    snprintf(path, sizeof(path), "/proc/%d/root/", (int)d->pid);
    if (strcmp(v->base, "-") == 0 && statfs(path, &sf) == 0 && sf.f_type == OVERLAYFS_SUPER_MAGIC)
        return lb_error_set(err, -EOPNOTSUPP,
                            "cannot find the image tree of sandbox '%s' to grade on: run the "
                            "exclusive exec with \"agent_root\": true to grade on its own root",
                            id);
    snprintf(v->hosts, sizeof(v->hosts), "%s/hosts", dir);
    if (strcmp(v->base, "-") == 0 || stat(v->hosts, &st) < 0 || !S_ISREG(st.st_mode))
        snprintf(v->hosts, sizeof(v->hosts), "-");
    snprintf(path, sizeof(path), "/proc/%d/root/tmp", (int)d->pid);
    if (statfs(path, &sf) == 0 && sf.f_blocks > 0)
        mib = (int64_t)(((uint64_t)sf.f_blocks * (uint64_t)sf.f_bsize) >> 20);
    snprintf(v->tmp_mib, sizeof(v->tmp_mib), "%lld", (long long)(mib > 0 ? mib : 1));
    return 0;
}

/* argv of lendbox-supervise --enter, or --enter-view with view->on (see
 * src/supervisor/supervise.c): numbers in nums (5 strings of 24 bytes), env, the view and the
 * supervisor's argv borrowed. NULL when out of memory. */
static char **helper_argv(const char *path, const char *id, const struct exec_fds *f,
                          int seccomp_fd, const char *const *env, const struct exec_view *view,
                          const char **sup, char nums[5][24], char host[64])
{
    size_t nenv = 0, nsup = 0, i = 0;
    char **v;

    while (env[nenv])
        nenv++;
    while (sup[nsup])
        nsup++;
    v = calloc(15 + nenv + 1 + nsup + 1, sizeof(*v));
    if (!v)
        return NULL;
    snprintf(nums[0], 24, "%d", f->nchild);
    snprintf(nums[1], 24, "%d", f->ncg);
    snprintf(nums[2], 24, "%d", seccomp_fd >= 0 ? f->nchild + NS_COUNT + f->ncg : -1);
    snprintf(nums[3], 24, "%llu", (unsigned long long)f->nofile.rlim_cur);
    snprintf(nums[4], 24, "%zu", nenv);
    v[i++] = (char *)path;
    if (view->on) {
        v[i++] = "--enter-view";
        v[i++] = (char *)view->kind;
        v[i++] = (char *)view->base;
        v[i++] = (char *)view->hosts;
        v[i++] = (char *)view->workdir;
        v[i++] = (char *)view->tmp_mib;
    } else {
        v[i++] = "--enter";
    }
    /* after the mode's own arguments: run_enter looks for it right before NCHILD */
    if (local_keyrings_refused())
        v[i++] = "--keyrings-refused";
    /* the hostname create.c gave it: the sandbox must still be this id's (a recycle renames) */
    snprintf(host, 64, "%.63s", id);
    v[i++] = "--host";
    v[i++] = host;
    for (int k = 0; k < 5; k++)
        v[i++] = nums[k];
    for (size_t k = 0; k < nenv; k++)
        v[i++] = (char *)env[k];
    v[i++] = "--";
    for (size_t k = 0; k < nsup; k++)
        v[i++] = (char *)sup[k];
    v[i] = NULL;
    return v;
}

/* Open the namespaces of the sandbox's init, and make sure they are its. */
static int open_namespaces(const struct local_desc *d, const char *id, struct exec_fds *f,
                           struct lb_error *err)
{
    char path[64];
    int i;

    for (i = 0; i < NS_COUNT; i++) {
        snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)d->pid, ns_names[i]);
        f->ns[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (f->ns[i] < 0) {
            if (errno == ENOENT || errno == ESRCH)
                return lb_error_set(err, -ENOENT, "sandbox '%s' is not running", id);
            return lb_error_set(err, -EREMOTEIO, "cannot open %s: %s", path, strerror(errno));
        }
    }
    /* the pid may have been reused between the first check and the opens */
    if (!local_desc_alive(d))
        return lb_error_set(err, -ENOENT, "sandbox '%s' is not running", id);
    return 0;
}

/* argv for the supervisor; strings are borrowed from req, num and untrusted (NULL: none, else
 * the workdir of a trusted view, where no HOME may lie). */
static const char **supervise_argv(const struct lb_exec_request *req, const char *cwd,
                                   const char *num, const char *untrusted)
{
    size_t n = 0, i = 0, k;
    const char **v;

    while (req->argv[n])
        n++;
    v = calloc(n + 16, sizeof(*v));
    if (!v)
        return NULL;
    v[i++] = LOCAL_SUPERVISE_PATH;
    v[i++] = "--status-fd";
    v[i++] = "3";
    v[i++] = "--timeout-ms";
    v[i++] = num;
    v[i++] = "--cwd";
    v[i++] = cwd;
    if (untrusted) {
        v[i++] = "--untrusted-dir";
        v[i++] = untrusted;
    }
    if (req->preserve_background)
        v[i++] = "--keep-background";
    if (req->pass_fd > 0) {
        v[i++] = "--pass-fd";
        v[i++] = "4"; /* CH_PASS */
    }
    if (req->user && *req->user) {
        v[i++] = "--user";
        v[i++] = req->user;
    }
    v[i++] = "--";
    for (k = 0; k < n; k++)
        v[i++] = req->argv[k];
    v[i] = NULL;
    return v;
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Whom to tell about output as it comes (streamed exec): the request's on_output. */
struct exec_tell {
    const struct lb_exec_request *req;
    int stream; /* LB_EXEC_STDOUT / LB_EXEC_STDERR; 0: nobody (the status pipe) */
};

/* Read once from *fd into b (dropping past its cap), reporting the kept bytes to tell;
 * closes *fd at EOF or error. */
static void pump_read(int *fd, struct lb_buf *b, char *chunk, struct exec_tell tell)
{
    ssize_t n = read(*fd, chunk, READ_CHUNK);

    if (n > 0) {
        size_t before = b->len;

        if (lb_buf_append_capped(b, chunk, (size_t)n) < 0)
            b->truncated = true; /* out of memory: keep draining, drop the bytes */
        if (tell.stream && tell.req->on_output && b->len > before)
            tell.req->on_output(tell.req->output_ctx, tell.stream, b->data + before,
                                b->len - before);
        return;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    local_close_fd(fd);
}

/* Take the helper's "supervisor PID" line out of the status text; the pid, or 0. */
static pid_t take_supervisor_pid(struct lb_buf *status)
{
    char *p = status->data, *nl;
    long v = 0;

    while (p && *p) {
        nl = strchr(p, '\n');
        if (strncmp(p, "supervisor ", 11) == 0) {
            size_t line = nl ? (size_t)(nl - p) + 1 : strlen(p);

            v = strtol(p + 11, NULL, 10);
            memmove(p, p + line, strlen(p + line) + 1);
            status->len -= line;
            break;
        }
        p = nl ? nl + 1 : NULL;
    }
    return v > 0 && v <= INT_MAX ? (pid_t)v : 0;
}

struct exec_io {
    const char *in;
    size_t in_len, in_off;
    struct lb_buf status;
    int64_t paused_kill_at; /* the timeout plus grace: a frozen exec is ended then */
    int64_t backstop_at;    /* give up waiting, whatever the sandbox's state */
    const struct lb_cgroup *cg;
    bool backstop;    /* gave up waiting */
    bool paused;      /* the sandbox was frozen past the timeout */
    pid_t supervisor; /* its pid (the helper's "supervisor PID" line), 0 until known */
    const struct lb_exec_request *req; /* on_output: told about output as it is read */
};

/* Move data until the status pipe closes, the sandbox is found frozen past the timeout (the
 * supervisor cannot enforce it then), or the backstop deadline passes. */
static void exec_pump(struct exec_fds *f, struct exec_io *io, struct lb_exec_result *res,
                      char *chunk)
{
    int64_t next_check = io->paused_kill_at;

    while (f->status_r >= 0) {
        struct pollfd p[4];
        int idx_in = -1, idx_out = -1, idx_err = -1, idx_st, np = 0, n;
        int64_t now = clock_mono_ms(), left = io->backstop_at - now;

        if (left <= 0) {
            io->backstop = true;
            return;
        }
        if (now >= next_check) {
            bool frozen = false;

            cgroup_is_frozen(io->cg, &frozen);
            if (frozen) {
                io->paused = true;
                return;
            }
            next_check = now + FROZEN_CHECK_MS;
        }
        if (next_check - now < left)
            left = next_check - now;
        if (f->in_w >= 0) {
            idx_in = np;
            p[np++] = (struct pollfd){.fd = f->in_w, .events = POLLOUT};
        }
        if (f->out_r >= 0) {
            idx_out = np;
            p[np++] = (struct pollfd){.fd = f->out_r, .events = POLLIN};
        }
        if (f->err_r >= 0) {
            idx_err = np;
            p[np++] = (struct pollfd){.fd = f->err_r, .events = POLLIN};
        }
        idx_st = np;
        p[np++] = (struct pollfd){.fd = f->status_r, .events = POLLIN};
        n = poll(p, (nfds_t)np, left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno != EINTR) {
            io->backstop = true;
            return;
        }
        if (n <= 0)
            continue;
        if (idx_in >= 0 && p[idx_in].revents) {
            ssize_t w = write(f->in_w, io->in + io->in_off, io->in_len - io->in_off);

            if (w > 0)
                io->in_off += (size_t)w;
            if ((w < 0 && errno != EAGAIN && errno != EINTR) || io->in_off == io->in_len)
                local_close_fd(&f->in_w); /* EPIPE: the command does not read; EOF otherwise */
        }
        if (idx_out >= 0 && p[idx_out].revents)
            pump_read(&f->out_r, &res->out, chunk, (struct exec_tell){io->req, LB_EXEC_STDOUT});
        if (idx_err >= 0 && p[idx_err].revents)
            pump_read(&f->err_r, &res->err, chunk, (struct exec_tell){io->req, LB_EXEC_STDERR});
        if (p[idx_st].revents) {
            pump_read(&f->status_r, &io->status, chunk, (struct exec_tell){0});
            if (!io->supervisor) {
                io->supervisor = take_supervisor_pid(&io->status);
                /* the supervisor is in the sandbox's pid namespace: a reset or stop from now
                 * on ends it and all it starts */
                if (io->supervisor && io->req && io->req->on_started)
                    io->req->on_started(io->req->started_ctx);
            }
            /* one line is the whole status: do not wait for EOF (nor for whoever might
             * hold the pipe) once it is in */
            if (io->status.data && memchr(io->status.data, '\n', io->status.len))
                local_close_fd(&f->status_r);
        }
    }
}

/* The supervisor is gone (or killed). What the command wrote is in the pipes already;
 * anything still holding them is a background process left running on purpose: take what is
 * there (for at most DRAIN_MS, in case it keeps writing), do not wait for more. */
static void exec_drain(struct exec_fds *f, const struct lb_exec_request *req,
                       struct lb_exec_result *res, char *chunk)
{
    int64_t drain_end;

    local_close_fd(&f->in_w);
    if (f->out_r >= 0)
        set_nonblock(f->out_r);
    if (f->err_r >= 0)
        set_nonblock(f->err_r);
    drain_end = clock_mono_ms() + DRAIN_MS;
    while ((f->out_r >= 0 || f->err_r >= 0) && clock_mono_ms() < drain_end) {
        size_t before = res->out.len + res->err.len;
        bool trunc = res->out.truncated || res->err.truncated;

        if (f->out_r >= 0)
            pump_read(&f->out_r, &res->out, chunk, (struct exec_tell){req, LB_EXEC_STDOUT});
        if (f->err_r >= 0)
            pump_read(&f->err_r, &res->err, chunk, (struct exec_tell){req, LB_EXEC_STDERR});
        if (res->out.len + res->err.len == before &&
            trunc == (res->out.truncated || res->err.truncated))
            break; /* nothing new (EAGAIN on both) */
    }
}

/* Turn the status line into the result. 1 when there was no status at all. */
static int parse_status(struct exec_io *io, struct lb_exec_result *res)
{
    char *line = io->status.data;

    if (!line || !*line)
        return 1;
    line[strcspn(line, "\n")] = '\0';
    exec_result_apply_status(res, line, local_errno_text);
    return 0;
}

/* A memory-limit kill ended the command: the sandbox's OOM-kill count grew during the exec
 * and the command died of SIGKILL (128 + 9, also as a shell's exit status). */
static void check_oom(const struct lb_cgroup *cg, bool have_before, uint64_t before,
                      struct lb_exec_result *res)
{
    uint64_t after = 0;
    int64_t limit = 0;

    if (!have_before || res->error_type != LB_EXEC_OK || res->return_code != 128 + SIGKILL ||
        cgroup_read_oom_kills(cg, &after, &limit) < 0 || after <= before)
        return;
    res->error_type = LB_EXEC_OOM;
    if (limit > 0)
        snprintf(res->message, sizeof(res->message),
                 "the command was killed by the out-of-memory killer: it reached the sandbox's "
                 "memory limit of %lld MiB",
                 (long long)(limit / (1024 * 1024)));
    else
        snprintf(res->message, sizeof(res->message),
                 "the command was killed by the out-of-memory killer");
    {
        char line[sizeof(res->message) + 16];

        snprintf(line, sizeof(line), "lendbox: %s", res->message);
        exec_result_append_line(&res->err, line);
    }
}

/* The supervisor ended without a status: why, from the helper's exit status (128 + N: signal
 * N killed it) and the sandbox's OOM-kill count. */
static void supervisor_lost(const struct lb_cgroup *cg, bool have_oom, uint64_t oom_before,
                            bool have_status, int st, int n_killed, struct lb_exec_result *res)
{
    char why[sizeof(res->message)];
    uint64_t after = 0;
    int64_t limit = 0;

    if (have_status && WIFEXITED(st) && WEXITSTATUS(st) > 128) {
        int sig = WEXITSTATUS(st) - 128;
        const char *name = sigabbrev_np(sig), *descr = sigdescr_np(sig);

        if (sig == SIGKILL && have_oom && cgroup_read_oom_kills(cg, &after, &limit) == 0 &&
            after > oom_before)
            snprintf(why, sizeof(why),
                     "the exec's supervisor was killed by the out-of-memory killer (the "
                     "sandbox's memory limit is %lld MiB); the command's outcome is unknown",
                     (long long)(limit / (1024 * 1024)));
        else
            snprintf(why, sizeof(why),
                     "the exec's supervisor was killed by signal %d (SIG%s, %s); the command's "
                     "outcome is unknown",
                     sig, name ? name : "?", descr ? descr : "unknown signal");
    } else {
        snprintf(why, sizeof(why), "the supervisor exited without a status");
    }
    if (n_killed > 0) {
        size_t len = strlen(why);

        snprintf(why + len, sizeof(why) - len,
                 "; lendbox killed the %d processes the exec left running", n_killed);
    }
    exec_result_note(res, LB_EXEC_SANDBOX, why);
}

#define ENDED_MESSAGE                                                                              \
    "the daemon is shutting down and stopped waiting for the command "                             \
    "(lending.drain_timeout_s): lendbox killed its process tree"

/* Link e (helper running) into the provider's list; false when the daemon already ended its
 * execs (the caller kills the tree: it started too late). */
static bool running_add(struct local_provider *lp, struct local_running_exec *e)
{
    bool ok;

    pthread_mutex_lock(&lp->lock);
    ok = !lp->execs_ended;
    e->ended = !ok;
    e->next = lp->running;
    lp->running = e;
    pthread_mutex_unlock(&lp->lock);
    return ok;
}

/* Unlink e; whether local_end_execs ended it. */
static bool running_remove(struct local_provider *lp, struct local_running_exec *e)
{
    bool ended;

    pthread_mutex_lock(&lp->lock);
    ended = e->ended;
    for (struct local_running_exec **pp = &lp->running; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    pthread_mutex_unlock(&lp->lock);
    return ended;
}

int local_end_execs(struct lb_provider *p)
{
    struct local_provider *lp = (struct local_provider *)p;
    int n = 0;

    pthread_mutex_lock(&lp->lock);
    lp->execs_ended = true;
    for (struct local_running_exec *e = lp->running; e; e = e->next) {
        /* linked means not reaped yet (unlinked before the wait): the pid is still the helper */
        e->ended = true;
        (void)local_kill_tree(e->helper, e->cg);
        n++;
    }
    pthread_mutex_unlock(&lp->lock);
    return n;
}

/* Is user (a name of the sandbox's /etc/passwd, a number, NAME:GROUP or UID:GID) one the
 * sandbox can run as? Looked up the way the supervisor will (user.c), in the sandbox's own
 * root through /proc/<init>/root, so an unknown one is a 400 before anything starts.
 * 0 or -EINVAL (400, naming it). */
static int user_check(const struct local_desc *d, const char *user, struct lb_error *err)
{
    struct sup_user u;
    char path[64], why[300];
    int rootfd, r;

    if (!user || !*user)
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/root", (int)d->pid);
    rootfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
        return lb_error_set(err, -ENOENT, "sandbox is not running");
    r = sup_user_resolve(rootfd, user, &u, why, sizeof(why));
    close(rootfd);
    if (r == -ENOENT || r == -ERANGE || r == -EINVAL)
        return lb_error_set(err, -EINVAL, "%s", why);
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "%s", why);
    return 0;
}

int local_exec(struct lb_provider *p, const struct lb_sandbox_ref *ref,
               const struct lb_exec_request *req, struct lb_exec_result *res, struct lb_error *err)
{
    static const char *const default_env[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
        NULL}; /* HOME: the user's, from the sandbox's passwd (supervisor) */
    struct local_provider *lp = (struct local_provider *)p;
    size_t out_max = req && req->max_output_bytes ? req->max_output_bytes : DEFAULT_OUTPUT_MAX;
    struct exec_io io = {0};
    struct local_running_exec running = {0};
    bool linked = false, ended = false;
    struct exec_fds f;
    struct local_desc d;
    sigset_t pipe_set, old_mask, pending;
    bool pipe_was_pending = false, masked = false;
    const char **argv = NULL;
    char num[32], *chunk = NULL;
    int64_t start;
    bool frozen, gated = false, have_oom, have_st = false;
    uint64_t oom_before = 0;
    char why[sizeof(res->message)];
    struct helper_child hc;
    struct exec_view view = {.on = false};
    char **hargv = NULL, nums[5][24], host[64];
    pid_t mid = 0;
    int r, st = 0, w, n_killed, seccomp_fd = -1;

    exec_fds_init(&f);
    f.nofile.rlim_cur = f.nofile.rlim_max = (rlim_t)lp->sandbox_nofile;
    memset(res, 0, sizeof(*res));
    lb_buf_init(&res->out, out_max);
    lb_buf_init(&res->err, out_max);
    lb_buf_init(&io.status, STATUS_MAX);
    memset(&d, 0, sizeof(d));

    if (!req || !req->argv || !req->argv[0])
        return lb_error_set(err, -EINVAL, "argv must hold at least the program");
    if (req->timeout_ms <= 0)
        return lb_error_set(err, -EINVAL, "timeout must be positive");
    if (req->cwd && !provider_path_is_valid(req->cwd))
        return lb_error_set(err, -EINVAL, "cwd '%s' is not an absolute normalised path", req->cwd);
    r = local_desc_load_running(lp, ref, &d, err);
    if (r < 0)
        return r;
    cgroup_is_frozen(&d.cg, &frozen);
    if (frozen) {
        r = lb_error_set(err, -EBUSY, "sandbox '%s' is paused", ref->id);
        goto out;
    }
    r = user_check(&d, req->user, err);
    if (r < 0)
        goto out;
    /* an exclusive exec (a grader) runs on a trusted view unless it asked for the agent's root,
     * and starts in / (a cwd in the workdir would put the agent's files first on the paths
     * interpreters search) */
    if (req->exclusive && !req->agent_root && (r = exec_view_find(lp, ref->id, &d, &view, err)) < 0)
        goto out;
    r = gates_enter(&lp->gates, ref->id, req->exclusive, err);
    if (r < 0)
        goto out;
    gated = true;
    if (req->exclusive) {
        r = local_sandbox_quiesce(lp, ref->id, &d, clock_mono_ms() + QUIESCE_MS, err);
        if (r < 0)
            goto out;
    }
    r = open_namespaces(&d, ref->id, &f, err);
    if (r < 0)
        goto out;
    r = cgroup_open_procs(&d.cg, f.cg, &f.ncg);
    if (r < 0) {
        if (!local_desc_alive(&d)) /* a stop got there first */
            r = lb_error_set(err, -ENOENT, "sandbox '%s' is not running", ref->id);
        else
            r = lb_error_set(err, -EREMOTEIO, "cannot open the sandbox's cgroup: %s", strerror(-r));
        goto out;
    }
    if (req->stdin_data) {
        r = local_pipe(&f.child[CH_STDIN], &f.in_w);
        if (r == 0)
            set_nonblock(f.in_w);
    } else {
        f.child[CH_STDIN] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        r = f.child[CH_STDIN] < 0 ? -errno : 0;
    }
    if (r < 0 || (r = local_pipe(&f.out_r, &f.child[CH_STDOUT])) < 0 ||
        (r = local_pipe(&f.err_r, &f.child[CH_STDERR])) < 0 ||
        (r = local_pipe(&f.status_r, &f.child[CH_STATUS])) < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot make pipes: %s", strerror(-r));
        goto out;
    }
    if (req->pass_fd > 0) {
        f.child[CH_PASS] = fcntl(req->pass_fd, F_DUPFD_CLOEXEC, 3);
        if (f.child[CH_PASS] < 0) {
            r = lb_error_set(err, -EREMOTEIO, "cannot pass an fd: %s", strerror(errno));
            goto out;
        }
        f.nchild = CH_MAX;
    }
    snprintf(num, sizeof(num), "%lld", (long long)req->timeout_ms);
    argv = supervise_argv(req,
                          req->cwd         ? req->cwd
                          : req->exclusive ? "/"
                                           : d.workdir,
                          num, view.on ? d.workdir : NULL);
    chunk = malloc(READ_CHUNK);
    if (!argv || !chunk) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    io.in = req->stdin_data;
    io.in_len = req->stdin_len;
    io.req = req;
    if (f.in_w >= 0 && io.in_len == 0)
        local_close_fd(&f.in_w);
    /* execve would refuse it inside the sandbox: say which limit, without starting anything */
    if (local_check_exec_args(argv, req->env ? req->env : (const char *const *)default_env, why,
                              sizeof(why)) < 0) {
        exec_result_note(res, LB_EXEC_SANDBOX, why);
        r = 0;
        goto out;
    }
    have_oom = cgroup_read_oom_kills(&d.cg, &oom_before, NULL) == 0;

    /* a command that does not read its stdin must not kill us with SIGPIPE */
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    pipe_was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
    masked = true;

    if (lp->seccomp.prog.len > 0) {
        seccomp_fd = seccomp_filter_memfd(&lp->seccomp);
        if (seccomp_fd < 0) {
            r = lb_error_set(err, -EREMOTEIO, "cannot pass the seccomp filter: %s",
                             strerror(-seccomp_fd));
            goto out;
        }
    }
    hargv = helper_argv(lp->supervise_path, ref->id, &f, seccomp_fd,
                        req->env ? req->env : (const char *const *)default_env, &view, argv, nums,
                        host);
    if (!hargv) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    hc = (struct helper_child){&f, seccomp_fd, lp->supervise_path, hargv};
    /* tests: an exec found not paused, held right before its helper starts (a pause then
     * freezes the helper as it joins the sandbox's cgroup) */
    r = fault_hit("exec.spawn", 0, err);
    if (r < 0)
        goto out;
    start = clock_mono_ms();
    r = spawn_vfork(child_exec_helper, &hc, &mid);
    local_close_fd(&seccomp_fd);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot start the exec helper: %s", strerror(-r));
        goto out;
    }
    exec_fds_close_child(&f);
    running.helper = mid;
    running.cg = &d.cg;
    linked = true;
    if (!running_add(lp, &running))
        (void)local_kill_tree(mid, &d.cg);
    io.paused_kill_at = start + req->timeout_ms + PAUSED_KILL_MS;
    io.backstop_at = start + req->timeout_ms + BACKSTOP_MS;
    io.cg = &d.cg;
    exec_pump(&f, &io, res, chunk);
    /* Past the timeout in a frozen sandbox (the supervisor cannot act: paused), or past the
     * backstop: the daemon ends the exec itself. Its processes are let out of the freezer
     * first, so they die even on cgroup v1; the rest of the sandbox stays as it is. */
    if (io.paused || io.backstop)
        (void)local_kill_tree_wait(mid, &d.cg, PAUSED_KILL_MS);
    exec_drain(&f, req, res, chunk);
    /* unlinked before the helper is reaped, so its pid is never reused under local_end_execs */
    ended = running_remove(lp, &running);
    linked = false;
    res->duration_ms = clock_mono_ms() - start;
    /* The helper exits as soon as the supervisor does. Every wait on it is bounded: a
     * supervisor stopped by a sandbox process (SIGSTOP from the same uid) or a helper frozen
     * by a pause that came just then must not hold the worker. After HELPER_EXIT_MS the
     * helper is let out of the freezer and killed (the supervisor then belongs to lendboxd, a
     * subreaper, and dies with the sandbox); one that does not die even then is reaped later,
     * on a thread of its own. */
    w = local_wait_child(mid, clock_mono_ms() + HELPER_EXIT_MS, &st);
    if (w == -ETIMEDOUT) {
        (void)cgroup_unfreeze_procs(&d.cg, &mid, 1);
        (void)kill(mid, SIGKILL);
        w = local_wait_child(mid, clock_mono_ms() + REAP_MS, &st);
    }
    if (w == -ETIMEDOUT) {
        log_warn("sbx=%s the exec's helper (pid %d) did not exit after SIGKILL; reaping it later",
                 ref->id, (int)mid);
        local_reap_later(mid);
    }
    have_st = w == 0;
    if (ended) {
        exec_result_note(res, LB_EXEC_SANDBOX, ENDED_MESSAGE);
    } else if (io.paused) {
        exec_result_note(res, LB_EXEC_TIMEOUT,
                         "the sandbox was paused when the timeout passed: lendbox killed the "
                         "command's processes (the rest of the sandbox stays paused)");
    } else if (io.backstop) {
        exec_result_note(res, LB_EXEC_SANDBOX, "no result from the sandbox in time");
    } else if (parse_status(&io, res) != 0) {
        /* an init still exiting counts as gone: the stop killed the supervisor */
        if (!local_desc_alive(&d) || local_desc_exiting(&d)) {
            r = lb_error_set(err, -ENOENT, "sandbox '%s' stopped during the exec", ref->id);
            goto out;
        }
        /* Nobody enforces the exec's timeout now: end what is left of it (its session), as a
         * timeout would, background processes included (preserve_background_services keeps
         * them only after the command's own exit, and its outcome is unknown here). */
        n_killed = io.supervisor ? local_kill_session(&d, io.supervisor) : 0;
        if (n_killed > 0)
            log_info("sbx=%s the exec's supervisor died: killed the %d processes it left", ref->id,
                     n_killed);
        supervisor_lost(&d.cg, have_oom, oom_before, have_st, st, n_killed, res);
    } else {
        check_oom(&d.cg, have_oom, oom_before, res);
    }
    if (w == -ETIMEDOUT && res->error_type == LB_EXEC_OK)
        exec_result_note(res, LB_EXEC_SANDBOX,
                         "the exec's helper process did not exit, even after SIGKILL");
    r = 0;
out:
    if (linked)
        running_remove(lp, &running);
    if (gated)
        gates_leave(&lp->gates, ref->id, req->exclusive);
    exec_fds_close(&f);
    if (masked) {
        struct timespec zero = {0, 0};

        sigpending(&pending);
        if (!pipe_was_pending && sigismember(&pending, SIGPIPE))
            (void)sigtimedwait(&pipe_set, NULL, &zero);
        pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    }
    local_close_fd(&seccomp_fd);
    free(chunk);
    free(hargv);
    free(argv);
    lb_buf_release(&io.status);
    local_desc_release(&d);
    if (r < 0)
        provider_exec_result_release(res);
    return r;
}
