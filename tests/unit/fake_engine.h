/*
 * fake_engine.h - a fake container engine for unit tests: a small HTTP server (libmicrohttpd)
 * on a unix socket that speaks the subset of the Docker Engine API or of the LXD API that the
 * docker and lxd providers use, keeps its containers (instances) and their files in memory, and
 * can be told to fail: time out, answer an error status, cut a response short, fail an LXD
 * operation or lose an instance. Shared by tests/unit/check_engine_fake.c only.
 *
 * Docker subset (paths after an optional "/vX.Y" prefix): GET /_ping; POST /containers/create;
 * GET /containers/json; GET /containers/N/json; POST /containers/N/{start,pause,unpause,exec};
 * GET /containers/N/stats (one sample: the FAKE_USAGE_* figures below);
 * DELETE /containers/N; POST /exec/E/start (the multiplexed stream: the scripted supervisor
 * output as stdout); PUT, HEAD and GET /containers/N/archive (tar streams, libarchive).
 * LXD subset: GET /1.0, /1.0/profiles/default, /1.0/storage-pools/P; GET and POST
 * /1.0/instances; GET and DELETE /1.0/instances/I; GET (with the FAKE_USAGE_* figures) and PUT
 * /1.0/instances/I/state; POST
 * /1.0/instances/I/exec (record-output); GET and DELETE /1.0/instances/I/logs/L; GET and POST
 * /1.0/instances/I/files; GET /1.0/operations/O/wait.
 *
 * Nothing runs inside a fake instance: an exec answers the supervisor output the test scripted
 * (fake_engine_set_exec_output), by default one stdout frame "ok\n" and the status "exit 0".
 *
 * Connections: HTTP/1.1 keep-alive as libmicrohttpd does it (one thread per connection); the
 * fake counts those it accepts and can close them (fake_engine_connections,
 * fake_engine_close_connections, the FAKE_CLOSE rule).
 *
 * Thread-safety: every function may be called while the server answers requests (one lock);
 * fake_engine_stop must be the last call.
 */
#ifndef LB_TESTS_FAKE_ENGINE_H
#define LB_TESTS_FAKE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>

enum fake_engine_api {
    FAKE_DOCKER,
    FAKE_LXD,
};

/* What a rule does to a request it matches (bits; FAKE_HANG and FAKE_ERROR answer nothing
 * else). */
enum {
    FAKE_HANG = 1 << 0,       /* no answer until the fake stops (the client's timeout runs out) */
    FAKE_ERROR = 1 << 1,      /* answer the rule's status with the rule's message as the engine's
                                 error ({"message"} on docker, {"error"} on LXD); nothing changes */
    FAKE_CUT = 1 << 2,        /* answer normally, but close the connection after half the body */
    FAKE_LOSE = 1 << 3,       /* answer normally, then the instance the request is about is gone */
    FAKE_OP_FAIL = 1 << 4,    /* LXD: the operation the request starts ends in Failure with the
                                 rule's message (the request itself changes nothing) */
    FAKE_OP_RUNNING = 1 << 5, /* LXD: the operation the request starts never ends: every wait
                                 answers "Running", as LXD does when the wait's timeout passes */
    FAKE_CLOSE = 1 << 6,      /* answer normally with "Connection: close", then close the
                                 connection (no keep-alive) */
};

/* What every running instance uses, as the fake's stats (docker) and state (LXD) answer it:
 * CPU ns, memory and peak bytes, processes; docker's memory_stats.stats.oom_kill; LXD's
 * disk.root.usage bytes. */
#define FAKE_USAGE_CPU_NS 1500000000LL
#define FAKE_USAGE_MEMORY 67108864LL
#define FAKE_USAGE_PEAK 100663296LL
#define FAKE_USAGE_PIDS 3
#define FAKE_USAGE_OOM_KILLS 1
#define FAKE_USAGE_DISK 12288

struct fake_engine;

/* Listen on socket_path (made; an old file there is replaced) and answer as api. *out is the
 * caller's (fake_engine_stop). 0 or a negative errno. */
int fake_engine_start(enum fake_engine_api api, const char *socket_path, struct fake_engine **out);

/* End every request still hanging, stop the server, remove the socket and free f. NULL-safe. */
void fake_engine_stop(struct fake_engine *f);

/* Add a rule: the next `times` requests (< 0: every one) whose method is method (NULL: any)
 * and whose path (without query and version prefix) contains path_part (or, when path_part
 * starts with '=', is the rest of it) get `action` (FAKE_*
 * bits). status and message are FAKE_ERROR's answer and FAKE_OP_FAIL's error. Rules are tried
 * in the order they were added; the first live match applies. */
void fake_engine_rule(struct fake_engine *f, const char *method, const char *path_part, int action,
                      int status, const char *message, int times);

/* Add an instance (docker: the container name; LXD: the instance name) carrying the two lendbox
 * labels with these values, running. 0, or -EEXIST, -ENOSPC. */
int fake_engine_add(struct fake_engine *f, const char *name, const char *label_instance,
                    const char *label_sandbox);

/* Does the instance exist? */
bool fake_engine_has(struct fake_engine *f, const char *name);

/* The instance is gone, as if removed behind the daemon's back. */
void fake_engine_lose(struct fake_engine *f, const char *name);

/* The instance's state: "running", "paused", "stopped" (LXD's Running/Frozen/Stopped, docker's
 * running/paused/created) or "gone" (static string). */
const char *fake_engine_state(struct fake_engine *f, const char *name);

/* Put a file (or read one back) in an instance. put: 0, -ENOENT (no instance), -ENOSPC. get:
 * a new copy of its bytes (free()) and *len, or NULL when the instance or file is missing. */
int fake_engine_put(struct fake_engine *f, const char *name, const char *path, const void *data,
                    size_t len);
void *fake_engine_get(struct fake_engine *f, const char *name, const char *path, size_t *len);

/* LXD: the driver every storage pool is said to have from now on (default "btrfs"; at most 15
 * bytes). */
void fake_engine_set_pool_driver(struct fake_engine *f, const char *driver);

/* What every later exec writes on the supervisor's stdout (its frames, see framed.h). */
void fake_engine_set_exec_output(struct fake_engine *f, const void *data, size_t len);

/* How many connections the fake accepted so far (a client that keeps its connection alive
 * makes one for many requests). */
int fake_engine_connections(struct fake_engine *f);

/* Close every open connection now, without a word (as an engine closes idle keep-alive
 * connections): the socket of each is shut down both ways. For connections that are idle; one
 * in the middle of a request fails. */
void fake_engine_close_connections(struct fake_engine *f);

/* How many requests so far had this method (NULL: any) and a path containing path_part (an LXD
 * files request's path is followed by "?path=P;", the file it names). */
int fake_engine_hits(struct fake_engine *f, const char *method, const char *path_part);

#endif
