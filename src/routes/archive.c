/*
 * archive.c - PUT and GET /v1/sandboxes/{id}/archive?path=DIR: a directory of a sandbox in and
 * out as a tar archive (the provider's archive_put / archive_get, lend.h).
 *
 * Both spool the archive in an unlinked file of the daemon's host (/tmp): PUT's body streams
 * into it (bounded by limits.max_file_bytes, the raw-body limit) and is extracted from it once
 * it is whole; GET's archive is written into it (bounded likewise, 413 past it) and served from
 * it, so the answer streams from a file and a slow client holds no worker.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lend/lend.h"
#include "provider/provider.h"
#include "routes/routes.h"

#include <uthash.h>

/* Spools of one sandbox alive at once for its operate token (PUT and GET together): each may
 * hold up to
 * limits.max_file_bytes of the host's /tmp, from the request's start until its body is
 * extracted or its answer sent (or its client gone), and a sandbox's agent holds a token. */
#define ARCHIVE_SPOOLS_PER_SANDBOX 2

struct spool_count {
    UT_hash_handle hh;
    unsigned n;
    char id[]; /* the key */
};

static pthread_mutex_t spools_mu = PTHREAD_MUTEX_INITIALIZER;
static struct spool_count *spools; /* by sandbox id, under spools_mu */

/* Take one of the sandbox's spool slots: 0, -EAGAIN (429) when all are taken, -ENOMEM. */
static int spool_slot_take(const char *id, struct lb_error *err)
{
    struct spool_count *c;
    int r = 0;

    pthread_mutex_lock(&spools_mu);
    HASH_FIND_STR(spools, id, c);
    if (!c) {
        size_t len = strlen(id) + 1;

        c = calloc(1, sizeof(*c) + len);
        if (c) {
            memcpy(c->id, id, len);
            HASH_ADD_STR(spools, id, c);
        }
    }
    if (!c)
        r = lb_error_set(err, -ENOMEM, "out of memory");
    else if (c->n >= ARCHIVE_SPOOLS_PER_SANDBOX)
        r = lb_error_set(err, -EAGAIN,
                         "%d archive requests of sandbox '%s' are already in flight (each holds a "
                         "temporary file of the daemon's host until its body is extracted or its "
                         "answer read); retry later",
                         ARCHIVE_SPOOLS_PER_SANDBOX, id);
    else
        c->n++;
    pthread_mutex_unlock(&spools_mu);
    return r;
}

static void spool_slot_give(const char *id)
{
    struct spool_count *c;

    pthread_mutex_lock(&spools_mu);
    HASH_FIND_STR(spools, id, c);
    if (c && --c->n == 0) {
        HASH_DEL(spools, c);
        free(c);
    }
    pthread_mutex_unlock(&spools_mu);
}

/* http_respond_fd_done's callback: arg is the sandbox id (malloc'd). */
static void spool_slot_done(void *arg)
{
    spool_slot_give(arg);
    free(arg);
}

struct archive_job {
    char *id;
    char *dir;
    int fd;          /* the spool */
    char *fenced_id; /* an operate-token put: the sandbox whose fence its extraction passes */
    bool slot;       /* holds one of id's spool slots (spool_slot_take) */
};

static void archive_job_free(void *arg)
{
    struct archive_job *j = arg;

    if (!j)
        return;
    if (j->fd >= 0)
        close(j->fd);
    if (j->slot)
        spool_slot_give(j->id);
    free(j->id);
    free(j->dir);
    free(j->fenced_id);
    free(j);
}

/* An unlinked read-write file of the daemon's host: its fd or -errno. */
static int spool_open(void)
{
    char dir[] = "/tmp/lendbox-archive-XXXXXX";
    int fd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

    if (fd < 0 && mkdtemp(dir)) {
        char p[sizeof(dir) + 16];

        snprintf(p, sizeof(p), "%s/spool", dir);
        fd = open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        (void)unlink(p);
        (void)rmdir(dir);
    }
    return fd < 0 ? -errno : fd;
}

static int archive_job_new(struct lb_request *req, struct archive_job **out, struct lb_error *err)
{
    const char *path = http_query(req, "path");
    struct archive_job *j;
    int r;

    *out = NULL;
    if (!path || !provider_path_is_valid(path) || strcmp(path, "/") == 0)
        return lb_error_set(err, -EINVAL,
                            "query 'path' must be an absolute, normalised path "
                            "(no '..') of a directory other than '/'");
    j = calloc(1, sizeof(*j));
    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    j->fd = -1;
    if (!(j->id = strdup(http_param(req, 0))) || !(j->dir = strdup(path))) {
        archive_job_free(j);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    /* the admin's requests are not counted: an agent holding its slots must not keep the
     * admin (a grader) from its sandbox's files */
    if (http_principal(req) == LB_PRINCIPAL_OPERATE) {
        r = spool_slot_take(j->id, err);
        if (r < 0) {
            archive_job_free(j);
            return r;
        }
        j->slot = true;
    }
    *out = j;
    return 0;
}

/* The body is whole in the spool: extract it. */
static void archive_put_finish(struct lb_request *req, void *arg)
{
    struct archive_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_archive_result res = {0};
    struct lb_error err = {0};
    bool held = false;
    int r = 0;

    if (lseek(j->fd, 0, SEEK_SET) < 0)
        r = lb_error_set(&err, -EIO, "cannot read the archive back: %s", strerror(errno));
    /* admitted before an exclusive exec or a reset began, its entries may land only before the
     * sweep, or in the episode whose token sent them */
    if (r == 0 && j->fenced_id && (r = routes_operate_enter(req, j->fenced_id, &held, &err)) == 0) {
        r = lend_archive_put(app->lend, j->id, j->dir, j->fd, (uint64_t)app->max_file_bytes, &res,
                             &err);
        routes_operate_leave(req, j->fenced_id, &held);
    } else if (r == 0 && !j->fenced_id) {
        r = lend_archive_put(app->lend, j->id, j->dir, j->fd, (uint64_t)app->max_file_bytes, &res,
                             &err);
    }
    if (r < 0)
        http_respond_error(req, &err);
    else
        http_respond_json(req, 200,
                          json_pack("{s:s,s:I,s:I}", "path", j->dir, "entries",
                                    (json_int_t)res.entries, "bytes", (json_int_t)res.bytes));
    archive_job_free(j);
}

static void archive_put_abort(void *arg)
{
    archive_job_free(arg); /* closes the spool: no blocking */
}

static void archive_put_open(struct lb_request *req, void *arg)
{
    struct archive_job *j = arg;
    struct lb_error err = {0};
    struct archive_job *own = calloc(1, sizeof(*own));
    int fd;

    /* the job's arg is freed by http_defer's free hook: the sink gets its own copy */
    if (!own) {
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    fd = spool_open();
    if (fd < 0) {
        free(own);
        lb_error_set(&err, -EIO, "cannot make a temporary file for the archive: %s", strerror(-fd));
        http_respond_error(req, &err);
        return;
    }
    *own = *j;
    own->fd = fd;
    j->id = j->dir = j->fenced_id = NULL;
    j->slot = false; /* the sink's copy gives it back */
    if (http_principal(req) == LB_PRINCIPAL_OPERATE && !(own->fenced_id = strdup(own->id))) {
        archive_job_free(own);
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    http_body_sink(
        req, &(struct lb_body_sink){
                 .fd = fd, .finish = archive_put_finish, .abort = archive_put_abort, .arg = own});
}

/* The request's archive job handed to run on a worker. */
static int archive_defer(struct lb_request *req, lb_http_job_fn run, struct lb_error *err)
{
    struct archive_job *j = NULL;
    int r = archive_job_new(req, &j, err);

    if (r < 0)
        return r;
    return http_defer(req, run, j, archive_job_free, err);
}

int route_archive_put(struct lb_request *req, struct lb_error *err)
{
    return archive_defer(req, archive_put_open, err);
}

static void archive_get_run(struct lb_request *req, void *arg)
{
    struct archive_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_archive_result res = {0};
    struct lb_error err = {0};
    char *slot_id;
    bool held;
    int fd = spool_open(), r;

    if (fd < 0) {
        lb_error_set(&err, -EIO, "cannot make a temporary file for the archive: %s", strerror(-fd));
        http_respond_error(req, &err);
        return;
    }
    /* an operate token's archive admitted before a reset holds its own episode's files or
     * none (401): the fence is held while the archive is made (bounded by max_file_bytes) */
    r = routes_operate_enter_read(req, j->id, &held, &err);
    if (r == 0) {
        r = lend_archive_get(app->lend, j->id, j->dir, fd, (uint64_t)app->max_file_bytes, &res,
                             &err);
        routes_operate_leave_read(req, j->id, &held);
    }
    if (r == 0 && lseek(fd, 0, SEEK_SET) < 0)
        r = lb_error_set(&err, -EIO, "cannot read the archive back: %s", strerror(errno));
    if (r < 0) {
        close(fd);
        http_respond_error(req, &err);
        return;
    }
    /* the slot goes with the spool: given back once the answer has been sent */
    slot_id = strdup(j->id);
    if (slot_id) {
        j->slot = false;
        http_respond_fd_done(req, 200, fd, res.bytes, spool_slot_done, slot_id);
    } else {
        http_respond_fd(req, 200, fd, res.bytes);
    }
    http_response_header(req, "Content-Type", "application/x-tar");
}

int route_archive_get(struct lb_request *req, struct lb_error *err)
{
    return archive_defer(req, archive_get_run, err);
}
