/*
 * fake_engine_internal.h - what the fake engine's files share: its state (instances, files,
 * operations, rules), the answer being built, and the two API dialects' entry points. Shared by
 * fake_engine.c (state, server, public functions), fake_docker.c and fake_lxd.c; not for tests.
 */
#ifndef LB_TESTS_FAKE_ENGINE_INTERNAL_H
#define LB_TESTS_FAKE_ENGINE_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "fake_engine.h"

#define FAKE_MAX_INSTANCES 16
#define FAKE_MAX_FILES 32
#define FAKE_MAX_RULES 32
#define FAKE_MAX_OPS 64
#define FAKE_MAX_EXECS 64
#define FAKE_MAX_HITS 1024
#define FAKE_MAX_CONNS 64 /* open connections tracked for fake_engine_close_connections */
#define FAKE_BODY_MAX (16 * 1024 * 1024)
#define FAKE_HANG_MAX_S 30 /* a hanging answer gives up after this even if nobody stops it */

enum fake_state { ST_GONE, ST_CREATED, ST_RUNNING, ST_PAUSED };

struct fake_file {
    char path[256];
    unsigned char *data;
    size_t len;
    bool dir;
};

struct fake_inst {
    bool used;
    char name[160];
    char id[72];
    char label_instance[64], label_sandbox[128];
    enum fake_state state;
    struct fake_file files[FAKE_MAX_FILES];
};

struct fake_rule {
    char method[16]; /* "" any */
    char path[160];
    int action, status, times;
    char message[256];
};

struct fake_op {
    bool used;
    char id[40];
    char inst[160];
    bool failed;
    bool running; /* never ends */
    char err[256];
    bool exec; /* an exec: its metadata names the two logs */
};

struct fake_exec {
    bool used;
    char id[72];
    char inst[160];
};

struct fake_engine {
    enum fake_engine_api api;
    char socket_path[108];
    struct MHD_Daemon *mhd;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* stopping */
    bool stopping;
    struct fake_inst insts[FAKE_MAX_INSTANCES];
    struct fake_rule rules[FAKE_MAX_RULES];
    size_t n_rules;
    struct fake_op ops[FAKE_MAX_OPS];
    struct fake_exec execs[FAKE_MAX_EXECS];
    bool op_running; /* the next operation made never ends (FAKE_OP_RUNNING) */
    unsigned char *exec_out;
    size_t exec_out_len;
    char hits[FAKE_MAX_HITS][200];
    size_t n_hits;
    unsigned seq;
    char pool_driver[16]; /* LXD: the driver GET /1.0/storage-pools/NAME answers ("" btrfs) */
    int accepted;         /* connections accepted so far */
    int conn_fds[FAKE_MAX_CONNS]; /* sockets of the open connections (-1: free slot) */
};

/* One request: its body as it arrives. */
struct fake_req {
    unsigned char *body;
    size_t len;
    bool too_big;
};

/* One answer. */
struct fake_reply {
    unsigned status;
    unsigned char *body;
    size_t len;
    const char *ctype;
    char hdr_name[64];
    char *hdr_value; /* malloc'd */
    bool cut;
    bool close; /* "Connection: close": the connection ends after this answer */
};

/* Everything below runs with f->lock held. */

/* The instance named name, or NULL. */
struct fake_inst *fake_inst_find(struct fake_engine *f, const char *name);
/* Free what the instance holds and mark its slot free. */
void fake_inst_free(struct fake_inst *in);
/* A new instance (state created, "/" its only directory) with these label values, or NULL when
 * every slot is taken. */
struct fake_inst *fake_inst_new(struct fake_engine *f, const char *name, const char *li,
                                const char *ls);
/* The file or directory at path in the instance, or NULL. */
struct fake_file *fake_file_find(struct fake_inst *in, const char *path);
/* Make or replace path in the instance (dir: a directory; data ignored): 0, -ENOSPC, -ENOMEM,
 * -EISDIR (a directory is there and a file is wanted), -ENOTDIR (the parent is a file), -ENOENT
 * (no parent), -EINVAL (not absolute or too long). */
int fake_file_put(struct fake_inst *in, const char *path, const void *data, size_t len, bool dir);
/* Make path and its parents as directories; errors as fake_file_put. */
int fake_dirs_put(struct fake_inst *in, const char *path);
/* A new LXD operation about instance inst (exec: its metadata names the output logs), or NULL
 * when every slot is taken. */
struct fake_op *fake_op_new(struct fake_engine *f, const char *inst, bool exec);

/* Fill rp: a JSON body (j consumed), raw bytes (copied), the engine's error answer in f's
 * dialect, one extra response header (copied). */
void fake_reply_json(struct fake_reply *rp, unsigned status, json_t *j);
void fake_reply_bytes(struct fake_reply *rp, unsigned status, const void *data, size_t len,
                      const char *ctype);
void fake_reply_error(struct fake_engine *f, struct fake_reply *rp, unsigned status,
                      const char *message);
void fake_reply_header(struct fake_reply *rp, const char *name, const char *value);

/* Answer the request (path without the version prefix and the query; rq its whole body) into
 * rp, and name the instance it is about in inst (left "" when none). fail: a FAKE_OP_FAIL
 * rule's message for the operation the request starts (LXD), or NULL. */
void fake_docker_dispatch(struct fake_engine *f, struct MHD_Connection *c, const char *method,
                          const char *path, const struct fake_req *rq, struct fake_reply *rp,
                          char *inst, size_t inst_size);
void fake_lxd_dispatch(struct fake_engine *f, struct MHD_Connection *c, const char *method,
                       const char *path, const struct fake_req *rq, struct fake_reply *rp,
                       char *inst, size_t inst_size, const char *fail);

#endif
