/*
 * docker_internal.h - what docker.c, docker_exec.c, docker_files.c, docker_pass.c and
 * docker_api.c share. Not a public interface. Calls go one way: docker.c (hooks, ops table,
 * construction) -> docker_exec.c, docker_files.c; docker_exec.c -> docker_pass.c; each of them
 * -> docker_api.c (the transport and a sandbox's names), which calls none of them.
 */
#ifndef LB_DOCKER_INTERNAL_H
#define LB_DOCKER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "provider/docker/docker.h"
#include "provider/engine/engine.h"
#include "provider/engine/httpc.h"

#define DOCKER_LABEL_INSTANCE "io.lendbox.instance"
#define DOCKER_LABEL_SANDBOX "io.lendbox.sandbox"
/* The supervisor every daemon command of a container runs: a read-only bind mount of the
 * directory <state_dir>/docker-supervise at /.lendbox. A mount point directly under / cannot be
 * renamed (EBUSY) or unmounted (the container has no CAP_SYS_ADMIN), and a read-only mount's
 * file cannot be replaced, so no path component of it is the container's to change (unlike
 * /run/lendbox, which its root can rename and refill). */
#define DOCKER_SUPERVISE_DIR "/.lendbox"
#define DOCKER_SUPERVISE_PATH DOCKER_SUPERVISE_DIR "/supervise"
#define DOCKER_PASS_PATH "/run/lendbox/pass" /* the per-sandbox pass dir inside a container */

struct lb_docker {
    struct lb_engine eng;    /* first: the provider, the engine base and its settings */
    uint64_t max_file_bytes; /* docker.max_file_bytes: file_open refuses larger files */
    char *pass_dir;          /* <state_dir>/docker-pass: one directory per sandbox, bind-mounted */
    char *supervise_dir;     /* <state_dir>/docker-supervise: the supervisor's copy, bind-mounted
                                read-only at DOCKER_SUPERVISE_DIR */
};

/* One daemon fd passed to one exec (the engine passes none). A listening unix socket under a
 * fresh random name in the sandbox's pass directory (<pass_dir>/<id>, bind-mounted at
 * DOCKER_PASS_PATH); the exec's supervisor (--pass-socket) connects. A thread accepts every
 * connection until the deadline, takes the peer's pid (SO_PEERCRED, in the daemon's pid
 * namespace) and hands the fd (SCM_RIGHTS) only to the peer whose pid is the exec's own, as the
 * engine's GET /exec/{id}/json "Pid" gives it; any other peer is closed with nothing sent. After
 * the one hand-over, the deadline or docker_pass_close the socket is unlinked and closed. */
struct docker_pass {
    struct lb_docker *d;
    int fd;        /* the daemon's fd to pass (borrowed: the caller keeps and closes it) */
    int dir_fd;    /* O_PATH of the sandbox's pass directory */
    int listen_fd; /* the listening socket (the thread closes it when it ends) */
    int stop_fd;   /* eventfd: docker_pass_close ends the thread */
    char name[32]; /* the socket's name in the directory */
    char exec_id[96];
    int64_t deadline_ms; /* monotonic */
    pthread_t thread;
    bool started, bound;
    atomic_bool sent;   /* the fd went to the exec's process */
    atomic_int refused; /* connections closed unanswered (other processes) */
};

/* ---- docker_pass.c ---- */

/* Bind and listen in sandbox id's pass directory; the in-container path for --pass-socket goes
 * into path. fd must be a regular file (-ENOSYS otherwise: no host directory or device goes
 * into a container). Returns 0, -ENOENT (no pass directory: no such sandbox), or another
 * negative errno (err says why); on error nothing is left behind. Not thread-safe on one ps. */
int docker_pass_open(struct lb_docker *d, const char *id, int fd, struct docker_pass *ps,
                     char *path, size_t size, struct lb_error *err);
/* Start serving the exec exec_id (created, not yet started) for at most wait_ms from now.
 * Returns 0 or a negative errno; call docker_pass_close either way. */
int docker_pass_start(struct docker_pass *ps, const char *exec_id, int64_t wait_ms,
                      struct lb_error *err);
/* Stop the thread (if started), unlink the socket and close what ps holds. Idempotent. */
void docker_pass_close(struct docker_pass *ps);

/* ---- docker_api.c: the transport and a sandbox's names ---- */

/* <pass_dir>/<id> into buf. */
void docker_pass_dir(const struct lb_docker *d, const char *id, char *buf, size_t size);
/* "lendbox-<instance>-<id>" into buf. */
void docker_name(const struct lb_docker *d, const char *id, char *buf, size_t size);
/* One engine request with a small JSON body (or none) and a buffered answer of at most 4 MiB.
 * 0 when an answer came (any status), else -EREMOTEIO (engine unreachable), -ETIMEDOUT. */
int docker_call(struct lb_docker *d, const char *method, const char *path, const json_t *body,
                int64_t timeout_ms, struct lb_httpc_response *resp, struct lb_error *err);
/* GET path_prefix (a path ending in '?' or '&') with a filter on this daemon's instance label,
 * as a JSON array into *items_out (the caller's). what names the list in messages. 0 or a
 * negative errno with err set (an answer that is not an array: -EREMOTEIO). */
int docker_list_ours(struct lb_docker *d, const char *path_prefix, const char *what,
                     json_t **items_out, struct lb_error *err);
/* An httpc failure as this provider's error (unreachable engine: -EREMOTEIO). */
int docker_transport_error(int r, struct lb_error *err);

/* ---- docker.c ---- */

/* The container's state (404: LB_STATUS_STOPPED). */
int docker_state(struct lb_docker *d, const char *id, enum lb_sandbox_status *out,
                 struct lb_error *err);

/* The engine hooks of exec (docker_exec.c; see engine.h). */
int docker_exec_check(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                      const struct lb_exec_request *req, struct lb_error *err);
int docker_exec_run(struct lb_engine *e, const struct lb_sandbox_ref *ref, struct engine_exec *x,
                    struct lb_error *err);
/* The engine's file_open hook (docker_files.c). */
int docker_file_open(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                     int *fd_out, uint64_t *size_out, struct lb_error *err);
/* Put one regular file (len bytes from fd at its offset 0, or from data when fd < 0) at the
 * absolute path inside the sandbox, parents created. */
int docker_put_file(struct lb_docker *d, const char *id, const char *path, int fd, const void *data,
                    uint64_t len, int mode, struct lb_error *err);

/* PUT a tar archive (len bytes from tar_fd at its current offset) at dir inside sandbox id's
 * container; the engine's answer, any status, into *resp (the caller releases it). 0, or the
 * transport's error (-EREMOTEIO, -ETIMEDOUT) with err set. */
int docker_put_archive(struct lb_docker *d, const char *id, const char *dir, int tar_fd,
                       uint64_t len, struct lb_httpc_response *resp, struct lb_error *err);

/* GET the archive of path inside sandbox id's container into fd (at most max bytes:
 * -EFBIG past it); the answer's status into *resp (the caller releases it). httpc_do's
 * return (a transport failure is not yet this provider's error: docker_transport_error). */
int docker_get_archive(struct lb_docker *d, const char *id, const char *path, int fd, uint64_t max,
                       struct lb_httpc_response *resp, struct lb_error *err);
/* HEAD the archive endpoint of path in sandbox id's container: the answer's status into
 * *status and, when it is 200 with a readable X-Docker-Container-Path-Stat, that stat (a new
 * reference) into *stat (else NULL: the caller words the failure, a 404 included). 0, or the
 * URL's or the transport's error (docker_transport_error) with err set. */
int docker_path_stat(struct lb_docker *d, const char *id, const char *path, json_t **stat,
                     long *status, struct lb_error *err);
/* The tar a docker_get_archive answered (resp) into fd, opened for reading from fd's start
 * once the answer is 200: *a (set to a reader as soon as one is made; the caller's to
 * archive_read_free also on error). 0, or -EREMOTEIO with err set (dir: the tree named in the
 * message; NULL: a single file's tar stream). */
struct archive;
int docker_archive_read(const struct lb_httpc_response *resp, int fd, const char *dir,
                        struct archive **a, struct lb_error *err);

/* The archive hooks of the engine base (docker_archive.c; see engine.h). */
int docker_archive_put(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir,
                       int fd, uint64_t len, const struct engine_archive_tops *tops,
                       struct lb_error *err);
int docker_archive_get(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir,
                       struct lb_tar_out *w, struct lb_error *err);

/* The snapshot hooks of the engine base (docker_snapshot.c; see engine.h). */
int docker_workdir_archive(struct lb_engine *e, const struct lb_sandbox_ref *ref, int fd,
                           char *workdir, size_t size, struct lb_error *err);
int docker_commit(struct lb_engine *e, const struct lb_sandbox_ref *ref, char *image, size_t size,
                  struct lb_error *err);
int docker_put_tar(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir, int fd,
                   struct lb_error *err);
int docker_snapshot_images(struct lb_engine *e, json_t **out, struct lb_error *err);
int docker_image_remove(struct lb_engine *e, const char *image, struct lb_error *err);

#endif
