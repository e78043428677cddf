/* check_engine_fake.c - the engine providers' (docker, lxd) error paths against a fake engine
 * (fake_engine.h): each test runs once per backend (a Check loop test, index = backends[]),
 * opens the provider through the registry (registry.h) with the fake's socket as the engine
 * and drives it through provider.h only, so it holds whatever the drivers' insides become.
 * Asserted: the errno each operation returns (and err.code, which decides the HTTP status),
 * the class of its lb_error message, and what is left in the engine (rollbacks, adoption,
 * foreign instances untouched). Real podman and LXD stay in the e2e variants. */
#include <archive.h>
#include <archive_entry.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fake_engine.h"
#include "provider/engine/httpc.h"
#include "provider/lxd/lxd.h"
#include "provider/provider.h"
#include "provider/registry.h"
#include "util/buf.h"
#include "util/config.h"
#include "util/metrics.h"

#define SBX "sbx-1"

/* What differs between the two backends: the engine's name of sandbox SBX and the request
 * each kind of fault is put on (method, path part, FAKE_* action). */
struct fault_at {
    const char *method, *path;
    int action;
};

struct backend {
    const char *kind; /* registry kind */
    enum fake_engine_api api;
    const char *name;         /* the engine's name of SBX */
    struct fault_at create;   /* the create request itself */
    struct fault_at start;    /* the start of a created instance */
    struct fault_at pause;    /* pause / freeze */
    struct fault_at remove;   /* what stop does first */
    struct fault_at stream;   /* where exec output comes from */
    struct fault_at upload;   /* a file written into the sandbox */
    struct fault_at download; /* a file read from the sandbox */
    struct fault_at status;   /* the status query */
    struct fault_at usage;    /* the usage query */
};

static const struct backend backends[] = {
    {
        .kind = "docker",
        .api = FAKE_DOCKER,
        .name = "lendbox-fake-" SBX,
        .create = {"POST", "/containers/create", FAKE_ERROR},
        .start = {"POST", "/containers/lendbox-fake-" SBX "/start", FAKE_ERROR},
        .pause = {"POST", "pause", FAKE_ERROR}, /* pause and unpause */
        .remove = {"DELETE", "/containers/", FAKE_ERROR},
        .stream = {"POST", "/exec/", 0},
        .upload = {"PUT", "/archive", FAKE_ERROR},
        .download = {"GET", "/archive", FAKE_ERROR},
        .status = {"GET", "/json", 0},
        .usage = {"GET", "/stats", 0},
    },
    {
        .kind = "lxd",
        .api = FAKE_LXD,
        .name = SBX,
        .create = {"POST", "=/1.0/instances", FAKE_ERROR},
        .start = {"PUT", "/state", FAKE_OP_FAIL},
        .pause = {"PUT", "/state", FAKE_OP_FAIL},
        .remove = {"PUT", "/state", FAKE_OP_FAIL},
        .stream = {"GET", "/logs/", 0},
        .upload = {"POST", "/files", FAKE_ERROR},
        .download = {"GET", "/files", FAKE_ERROR},
        .status = {"GET", "/state", 0},
        .usage = {"GET", "/state", 0},
    },
};

static char base_dir[64] = "/tmp/check-engine-fake-XXXXXX"; /* the runner's; all tests under it */
/* lxd: the storage pool driver the fake reports to the next open_backend (NULL: its default) */
static const char *next_pool_driver;
/* the next open_backend's lxd.supervise_host_path ("SUP": its own supervisor file) and
 * lxd.call_timeout_s (NULL: the defaults) */
static const char *next_supervise_host;
static const char *next_call_timeout_s;
static char open_error[512]; /* open_backend_may_fail's error message */
static const struct backend *be;
static struct fake_engine *fe;
static struct lb_provider *prov;
static struct lb_config cfg;
static bool cfg_live;

/* Put fault at (with status and message) on the next `times` matching requests. */
static void fault(const struct fault_at *at, int extra, int status, const char *message, int times)
{
    fake_engine_rule(fe, at->method, at->path, at->action | extra, status, message, times);
}

static void set(const char *section, const char *key, const char *value)
{
    struct lb_error err = {0};

    ck_assert_msg(config_set(&cfg, section, key, value, &err) == 0, "%s.%s: %s", section, key,
                  err.message);
}

/* The fake engine and a provider of backends[i] on it, whose create is bounded by
 * create_timeout_s (docker: each engine call of a create; lxd: the whole create). Every other
 * call keeps its default bound. */
static int open_backend_may_fail(int i, const char *create_timeout_s);

static void open_backend(int i, const char *create_timeout_s)
{
    int r = open_backend_may_fail(i, create_timeout_s);

    ck_assert_msg(r == 0, "open %s: %d %s", be->kind, r, open_error);
}

/* open_backend, but the open's failure is returned (its message in open_error); the fake
 * engine runs either way (close_backend stops it). */
static int open_backend_may_fail(int i, const char *create_timeout_s)
{
    const struct lb_provider_kind *kind;
    struct lb_provider_env env = {0};
    struct lb_error err = {0};
    char dir[128], sock[160], sup[160];
    int fd, r;

    be = &backends[i];
    snprintf(dir, sizeof(dir), "%s/%s-XXXXXX", base_dir, be->kind);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(sock, sizeof(sock), "%s/engine.sock", dir);
    snprintf(sup, sizeof(sup), "%s/supervise", dir);
    fd = open(sup, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "#!not-a-supervisor\n", 19), 19);
    close(fd);
    r = fake_engine_start(be->api, sock, &fe);
    ck_assert_int_eq(r, 0);
    if (next_pool_driver)
        fake_engine_set_pool_driver(fe, next_pool_driver);
    ck_assert_int_eq(config_init(&cfg), 0);
    cfg_live = true;
    set("server", "state_dir", dir);
    set("network", "inherit", "none");
    set("lending", "create_timeout_s", create_timeout_s);
    if (be->api == FAKE_DOCKER) {
        set("docker", "socket", sock);
        set("docker", "instance", "fake");
    } else {
        set("lxd", "socket", sock);
        set("lxd", "instance", "fake");
        if (next_supervise_host)
            set("lxd", "supervise_host_path",
                strcmp(next_supervise_host, "SUP") == 0 ? sup : next_supervise_host);
        if (next_call_timeout_s)
            set("lxd", "call_timeout_s", next_call_timeout_s);
    }
    env.cfg = &cfg;
    env.supervise_path = sup;
    env.images_dir = dir;
    kind = registry_find_kind(be->kind);
    ck_assert_ptr_nonnull(kind);
    prov = NULL;
    r = kind->open(&env, &prov, &err);
    snprintf(open_error, sizeof(open_error), "%s", err.message);
    return r;
}

static void close_backend(void)
{
    if (prov)
        provider_destroy(prov);
    prov = NULL;
    fake_engine_stop(fe);
    fe = NULL;
    if (cfg_live)
        config_release(&cfg);
    cfg_live = false;
}

static int create(const char *image, json_t **desc, struct lb_error *err)
{
    struct lb_sandbox_spec spec = {.image = image, .workdir = "/workspace"};
    struct lb_sandbox_ref ref = {.id = SBX};

    *desc = NULL;
    return provider_create(prov, &ref, &spec, desc, err);
}

/* Create SBX, which must work. */
static json_t *create_ok(void)
{
    struct lb_error err = {0};
    json_t *desc = NULL;
    int r = create("img", &desc, &err);

    ck_assert_msg(r == 0, "create: %d %s", r, err.message);
    ck_assert_ptr_nonnull(desc);
    return desc;
}

static int run(const json_t *desc, struct lb_exec_result *res, struct lb_error *err)
{
    static const char *const argv[] = {"true", NULL};
    struct lb_exec_request req = {.argv = argv, .timeout_ms = 5000, .max_output_bytes = 4096};
    struct lb_sandbox_ref ref = {.id = SBX, .descriptor = desc};
    int r = provider_exec(prov, &ref, &req, res, err);

    /* lxd deletes the exec's logs after answering: settled here, so that every count of the
     * engine's requests and connections after an exec is exact */
    if (be->api == FAKE_LXD)
        ck_assert_int_eq(provider_lxd_settle(prov, 10000), 0);
    return r;
}

/* ret and e.code are want, and the message holds part. */
#define ck_assert_fails(ret, e, want, part)                                                        \
    do {                                                                                           \
        ck_assert_msg((ret) == (want), "%s: returned %d, wanted %d (%s)", be->kind, (ret), (want), \
                      (e).message);                                                                \
        ck_assert_msg((e).code == (want), "%s: err.code %d, wanted %d (%s)", be->kind, (e).code,   \
                      (want), (e).message);                                                        \
        ck_assert_msg(strstr((e).message, (part)), "%s: message '%s' lacks '%s'", be->kind,        \
                      (e).message, (part));                                                        \
    } while (0)

/* Append one supervisor frame (framed.h) to buf at *len. */
static void frame(unsigned char *buf, size_t *len, char type, const char *payload)
{
    size_t n = strlen(payload);

    buf[(*len)++] = (unsigned char)type;
    buf[(*len)++] = (unsigned char)(n >> 24);
    buf[(*len)++] = (unsigned char)(n >> 16);
    buf[(*len)++] = (unsigned char)(n >> 8);
    buf[(*len)++] = (unsigned char)n;
    memcpy(buf + *len, payload, n);
    *len += n;
}

/* An unlinked file holding a tar of one entry: a regular file name with len bytes of data,
 * or (data NULL) a symlink name -> len-less target "../../x"; its fd at offset 0. */
static int tar_fd(const char *name, const char *data, size_t len)
{
    struct archive *a = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    FILE *f = tmpfile();
    int fd;

    ck_assert_ptr_nonnull(f);
    fd = dup(fileno(f));
    fclose(f);
    ck_assert_int_ge(fd, 0);
    archive_write_set_format_pax_restricted(a);
    ck_assert_int_eq(archive_write_open_fd(a, fd), ARCHIVE_OK);
    archive_entry_set_pathname(e, name);
    archive_entry_set_perm(e, 0644);
    if (data) {
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_size(e, (la_int64_t)len);
    } else {
        archive_entry_set_filetype(e, AE_IFLNK);
        archive_entry_set_symlink(e, "../../x");
    }
    ck_assert_int_eq(archive_write_header(a, e), ARCHIVE_OK);
    if (data && len)
        ck_assert_int_eq(archive_write_data(a, data, len), (la_ssize_t)len);
    ck_assert_int_eq(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    archive_entry_free(e);
    ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
    return fd;
}

/* Read the sandbox file path back through file_open into a new string (NULL on error). */
static char *read_back(const json_t *desc, const char *path, struct lb_error *err, int *ret)
{
    struct lb_sandbox_ref ref = {.id = SBX, .descriptor = desc};
    uint64_t size = 0;
    char *buf;
    int fd = -1;

    *ret = provider_file_open(prov, &ref, path, &fd, &size, err);
    if (*ret < 0)
        return NULL;
    buf = calloc(1, (size_t)size + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(read(fd, buf, (size_t)size + 1), (ssize_t)size);
    close(fd);
    return buf;
}

/* The fake speaks enough of the API for every operation to work when nothing fails. */
START_TEST(test_round_trip)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    enum lb_sandbox_status st;
    struct lb_exec_result res;
    struct lb_error err = {0};
    struct lb_upload *up = NULL;
    json_t *list = NULL;
    char *text;
    int r;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    ck_assert_str_eq(fake_engine_state(fe, be->name), "running");
    ck_assert_int_eq(provider_status(prov, &ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_RUNNING);
    ck_assert_int_eq(run(ref.descriptor, &res, &err), 0);
    ck_assert_int_eq(res.error_type, LB_EXEC_OK);
    ck_assert_int_eq(res.return_code, 0);
    ck_assert_uint_eq(res.out.len, 3);
    ck_assert_mem_eq(res.out.data, "ok\n", 3);
    provider_exec_result_release(&res);
    ck_assert_int_eq(provider_file_write(prov, &ref, "/workspace/a.txt", "hello", 5, -1, &err), 0);
    text = read_back(ref.descriptor, "/workspace/a.txt", &err, &r);
    ck_assert_int_eq(r, 0);
    ck_assert_str_eq(text, "hello");
    free(text);
    ck_assert_int_eq(provider_upload_begin(prov, &ref, "/workspace/b.txt", 0600, NULL, &up, &err),
                     0);
    ck_assert_int_eq(write(up->fd, "streamed", 8), 8);
    ck_assert_int_eq(provider_upload_commit(up, &err), 0);
    text = read_back(ref.descriptor, "/workspace/b.txt", &err, &r);
    ck_assert_int_eq(r, 0);
    ck_assert_str_eq(text, "streamed");
    free(text);
    {
        /* a directory in by archive: checked by the daemon, then put into the engine */
        struct lb_archive_result ar = {0};
        int tfd = tar_fd("f.txt", "hi", 2);
        size_t len = 0;

        ck_assert_int_eq(provider_archive_put(prov, &ref, "/workspace/d", tfd, 1024, &ar, &err), 0);
        close(tfd);
        ck_assert_uint_eq(ar.entries, 1);
        ck_assert_uint_eq(ar.bytes, 2);
        text = fake_engine_get(fe, be->name, "/workspace/d/f.txt", &len);
        ck_assert_ptr_nonnull(text);
        ck_assert_uint_eq(len, 2);
        ck_assert_mem_eq(text, "hi", 2);
        free(text);
    }
    ck_assert_int_eq(provider_pause(prov, &ref, &err), 0);
    ck_assert_str_eq(fake_engine_state(fe, be->name), "paused");
    ck_assert_int_eq(provider_status(prov, &ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_PAUSED);
    ck_assert_int_eq(provider_resume(prov, &ref, &err), 0);
    ck_assert_str_eq(fake_engine_state(fe, be->name), "running");
    ck_assert_int_eq(provider_list(prov, &list, &err), 0);
    ck_assert_uint_eq(json_array_size(list), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(list, 0), "sandbox_id")),
                     SBX);
    json_decref(list);
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    ck_assert(!fake_engine_has(fe, be->name));
    ck_assert_int_eq(provider_status(prov, &ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_STOPPED);
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* The engine refuses the create: 502 with its message, nothing made, nothing to roll back. */
START_TEST(test_create_fails)
{
    struct lb_error err = {0};
    json_t *desc = NULL;
    int r;

    open_backend(_i, "30");
    fault(&be->create, FAKE_ERROR, 500, "engine broke", 1);
    r = create("img", &desc, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "failed (HTTP 500): engine broke");
    ck_assert_ptr_null(desc);
    ck_assert(!fake_engine_has(fe, be->name));
    ck_assert_int_eq(fake_engine_hits(fe, "DELETE", "/"), 0);
    if (be->api == FAKE_LXD) {
        /* the create's operation fails instead of the request */
        lb_error_clear(&err);
        fake_engine_rule(fe, "POST", "=/1.0/instances", FAKE_OP_FAIL, 0, "pool is full", 1);
        r = create("img", &desc, &err);
        ck_assert_fails(r, err, -EREMOTEIO, "failed: pool is full");
        ck_assert(!fake_engine_has(fe, be->name));
    }
    /* an unknown image is the seed's fault, not the engine's */
    lb_error_clear(&err);
    r = create("nosuch", &desc, &err);
    ck_assert_fails(r, err, -LB_E_IMAGE_NOT_FOUND, "no image");
    ck_assert(!fake_engine_has(fe, be->name));
    close_backend();
}
END_TEST

/* The engine does not answer the create within create_timeout_s: -ETIMEDOUT (502). */
START_TEST(test_create_times_out)
{
    struct lb_error err = {0};
    json_t *desc = NULL;
    int r;

    open_backend(_i, "1");
    fake_engine_rule(fe, be->create.method, be->create.path, FAKE_HANG, 0, NULL, 1);
    r = create("img", &desc, &err);
    ck_assert_fails(r, err, -ETIMEDOUT, "did not answer");
    ck_assert_ptr_null(desc);
    ck_assert(!fake_engine_has(fe, be->name));
    if (be->api == FAKE_LXD) {
        /* the request is answered, its operation never ends */
        lb_error_clear(&err);
        fake_engine_rule(fe, "POST", "=/1.0/instances", FAKE_OP_RUNNING, 0, NULL, 1);
        r = create("img", &desc, &err);
        ck_assert_fails(r, err, -ETIMEDOUT, "did not end within");
        ck_assert_ptr_null(desc);
    }
    close_backend();
}
END_TEST

/* The instance is made but does not start: it is removed again (nothing left running). */
START_TEST(test_create_start_fails_rolls_back)
{
    struct lb_error err = {0};
    json_t *desc = NULL;
    int r;

    open_backend(_i, "30");
    fault(&be->start, 0, 500, "start broke", 1);
    r = create("img", &desc, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "start broke");
    ck_assert_ptr_null(desc);
    ck_assert(!fake_engine_has(fe, be->name));
    ck_assert_int_eq(fake_engine_hits(fe, "DELETE", be->name), 1);
    close_backend();
}
END_TEST

/* A create retried after a crash finds the daemon's own instance ("exists") and adopts it;
 * an instance of that name without this daemon's labels is refused and left alone. */
START_TEST(test_create_exists)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_error err = {0};
    json_t *desc = NULL;
    int r;

    open_backend(_i, "30");
    ck_assert_int_eq(fake_engine_add(fe, be->name, "fake", SBX), 0);
    r = create("img", &desc, &err);
    ck_assert_msg(r == 0, "%s: adopt: %d %s", be->kind, r, err.message);
    ck_assert_ptr_nonnull(desc);
    ck_assert_str_eq(fake_engine_state(fe, be->name), "running");
    ck_assert_int_eq(fake_engine_hits(fe, "DELETE", "/"), 0);
    ref.descriptor = desc;
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    json_decref(desc);
    desc = NULL;
    if (be->api == FAKE_DOCKER) {
        /* podman answers a name conflict with 500 "already in use" (Docker: 409) */
        ck_assert_int_eq(fake_engine_add(fe, be->name, "fake", SBX), 0);
        fault(&be->create, 0, 500, "container name is already in use by abc", 1);
        r = create("img", &desc, &err);
        ck_assert_msg(r == 0, "%s: adopt after 500: %d %s", be->kind, r, err.message);
        ck_assert_str_eq(fake_engine_state(fe, be->name), "running");
        ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
        json_decref(desc);
        desc = NULL;
    }

    ck_assert_int_eq(fake_engine_add(fe, be->name, "another-daemon", SBX), 0);
    r = create("img", &desc, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "does not carry this daemon's labels");
    ck_assert_ptr_null(desc);
    ck_assert_str_eq(fake_engine_state(fe, be->name), "running");
    /* only the stops of the adopted ones */
    ck_assert_int_eq(fake_engine_hits(fe, "DELETE", "/"), be->api == FAKE_DOCKER ? 2 : 1);
    close_backend();
}
END_TEST

/* Exec output that ends without the supervisor's status is a sandbox result; a stream cut by
 * the engine is a transport failure (502), or -ENOENT when the instance went with it. */
START_TEST(test_exec_cut_short)
{
    unsigned char out[64];
    size_t len = 0;
    struct lb_exec_result res;
    struct lb_error err = {0};
    json_t *desc;
    int r;

    open_backend(_i, "30");
    desc = create_ok();
    frame(out, &len, 'o', "partial");
    fake_engine_set_exec_output(fe, out, len);
    r = run(desc, &res, &err);
    ck_assert_int_eq(r, 0);
    ck_assert_int_eq(res.error_type, LB_EXEC_SANDBOX);
    ck_assert_int_eq(res.return_code, LB_RETURN_CODE_RUNTIME);
    ck_assert_msg(strncmp(res.message, "the supervisor ended without a result", 37) == 0, "%s",
                  res.message);
    ck_assert_mem_eq(res.out.data, "partial", 7);
    provider_exec_result_release(&res);

    frame(out, &len, 's', "exit 3");
    fake_engine_set_exec_output(fe, out, len);
    fake_engine_rule(fe, be->stream.method, be->stream.path, FAKE_CUT, 0, NULL, 1);
    r = run(desc, &res, &err);
    ck_assert_msg(r == -EREMOTEIO, "%s: %d %s", be->kind, r, err.message);
    ck_assert_msg(strstr(err.message, "failed"), "%s", err.message);
    provider_exec_result_release(&res);
    lb_error_clear(&err);

    /* the same exec whole: its status counts */
    r = run(desc, &res, &err);
    ck_assert_int_eq(r, 0);
    ck_assert_int_eq(res.error_type, LB_EXEC_OK);
    ck_assert_int_eq(res.return_code, 3);
    provider_exec_result_release(&res);

    fake_engine_rule(fe, be->stream.method, be->stream.path, FAKE_CUT | FAKE_LOSE, 0, NULL, 1);
    r = run(desc, &res, &err);
    ck_assert_fails(r, err, -ENOENT, "no such sandbox");
    provider_exec_result_release(&res);
    json_decref(desc);
    close_backend();
}
END_TEST

/* The engine fails a pause or resume: 502 with its message, unless the sandbox already is in
 * the wanted state (idempotent). */
START_TEST(test_pause_fails)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_error err = {0};
    int r;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    fault(&be->pause, 0, 500, "cgroup broke", 1);
    r = provider_pause(prov, &ref, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "cgroup broke");
    ck_assert_str_eq(fake_engine_state(fe, be->name), "running");
    lb_error_clear(&err);
    ck_assert_int_eq(provider_pause(prov, &ref, &err), 0);
    ck_assert_int_eq(provider_pause(prov, &ref, &err), 0); /* the engine refuses; already so */
    ck_assert_str_eq(fake_engine_state(fe, be->name), "paused");
    fault(&be->pause, 0, 500, "cgroup broke", 1);
    r = provider_resume(prov, &ref, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "cgroup broke");
    ck_assert_str_eq(fake_engine_state(fe, be->name), "paused");
    lb_error_clear(&err);
    ck_assert_int_eq(provider_resume(prov, &ref, &err), 0);
    ck_assert_int_eq(provider_resume(prov, &ref, &err), 0);
    ck_assert_str_eq(fake_engine_state(fe, be->name), "running");
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* The engine fails the removal: 502 and the instance stays (stop is retried later); then a
 * stop works, and a stop of what is gone is success. */
START_TEST(test_remove_fails)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_error err = {0};
    int r;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    fault(&be->remove, 0, 500, "device busy", 1);
    r = provider_stop(prov, &ref, 10000, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "device busy");
    ck_assert(fake_engine_has(fe, be->name));
    lb_error_clear(&err);
    if (be->api == FAKE_LXD) {
        /* stopped, but the delete fails */
        fake_engine_rule(fe, "DELETE", "/1.0/instances/", FAKE_OP_FAIL, 0, "device busy", 1);
        r = provider_stop(prov, &ref, 10000, &err);
        ck_assert_fails(r, err, -EREMOTEIO, "device busy");
        ck_assert(fake_engine_has(fe, be->name));
        lb_error_clear(&err);
    }
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    ck_assert(!fake_engine_has(fe, be->name));
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* The instance vanishes between two calls: status says stopped, every call on it -ENOENT
 * (404), stop succeeds, list no longer has it. */
START_TEST(test_instance_lost)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    enum lb_sandbox_status st;
    struct lb_exec_result res;
    struct lb_error err = {0};
    struct lb_upload *up = NULL;
    json_t *list = NULL;
    int r;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    fake_engine_lose(fe, be->name);
    ck_assert_int_eq(provider_status(prov, &ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_STOPPED);
    r = run(ref.descriptor, &res, &err);
    ck_assert_fails(r, err, -ENOENT, "no such sandbox");
    provider_exec_result_release(&res);
    lb_error_clear(&err);
    r = provider_pause(prov, &ref, &err);
    ck_assert_fails(r, err, -ENOENT, "no such sandbox");
    lb_error_clear(&err);
    r = provider_resume(prov, &ref, &err);
    ck_assert_fails(r, err, -ENOENT, "no such sandbox");
    lb_error_clear(&err);
    r = provider_file_write(prov, &ref, "/workspace/a.txt", "x", 1, -1, &err);
    ck_assert_fails(r, err, -ENOENT, "no such sandbox");
    lb_error_clear(&err);
    r = provider_upload_begin(prov, &ref, "/workspace/a.txt", -1, NULL, &up, &err);
    ck_assert_fails(r, err, -ENOENT, "no such sandbox");
    lb_error_clear(&err);
    ck_assert_ptr_null(read_back(ref.descriptor, "/workspace/a.txt", &err, &r));
    ck_assert_fails(r, err, -ENOENT, "no ");
    lb_error_clear(&err);
    ck_assert_int_eq(provider_list(prov, &list, &err), 0);
    ck_assert_uint_eq(json_array_size(list), 0);
    json_decref(list);
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* Uploads: a full disk is 413, another engine failure 502, an instance lost between
 * upload_begin and commit 404. */
START_TEST(test_upload_fails)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_error err = {0};
    struct lb_upload *up = NULL;
    size_t len = 0;
    char *back;
    int r;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    fault(&be->upload, 0, 500, "write /workspace/a.txt: no space left on device", 1);
    ck_assert_int_eq(provider_upload_begin(prov, &ref, "/workspace/a.txt", -1, NULL, &up, &err), 0);
    ck_assert_int_eq(write(up->fd, "data", 4), 4);
    r = provider_upload_commit(up, &err);
    ck_assert_fails(r, err, -EFBIG, "no space left for '/workspace/a.txt'");
    ck_assert_ptr_null(fake_engine_get(fe, be->name, "/workspace/a.txt", &len));
    lb_error_clear(&err);

    fault(&be->upload, 0, 500, "disk on fire", 1);
    r = provider_file_write(prov, &ref, "/workspace/a.txt", "data", 4, -1, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "(HTTP 500): disk on fire");
    ck_assert_ptr_null(fake_engine_get(fe, be->name, "/workspace/a.txt", &len));
    lb_error_clear(&err);

    ck_assert_int_eq(provider_upload_begin(prov, &ref, "/workspace/a.txt", -1, NULL, &up, &err), 0);
    ck_assert_int_eq(write(up->fd, "data", 4), 4);
    fake_engine_lose(fe, be->name);
    r = provider_upload_commit(up, &err);
    ck_assert_fails(r, err, -ENOENT, "no such sandbox");
    lb_error_clear(&err);

    /* and a write that works after all that lands whole */
    ck_assert_int_eq(fake_engine_add(fe, be->name, "fake", SBX), 0);
    ck_assert_int_eq(provider_file_write(prov, &ref, "/tmp.txt", "data", 4, -1, &err), 0);
    back = fake_engine_get(fe, be->name, "/tmp.txt", &len);
    ck_assert_ptr_nonnull(back);
    ck_assert_uint_eq(len, 4);
    ck_assert_mem_eq(back, "data", 4);
    free(back);
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* Archives: what the daemon refuses never reaches the engine; a full disk part way is 413 and
 * what was made is removed again (an exec of rm in the instance); an engine failure or an
 * answer cut short on the way out is 502. */
START_TEST(test_archive_fails)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_archive_result ar = {0};
    struct lb_error err = {0};
    int fd, r, puts, execs;
    FILE *f;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    puts = fake_engine_hits(fe, be->upload.method, be->upload.path);
    /* a body that is not a tar, an entry leaving the directory, past max_bytes: the engine
     * is never asked to write */
    f = tmpfile();
    ck_assert_ptr_nonnull(f);
    fputs("not a tar at all, only some text that is long enough to be read\n", f);
    fflush(f);
    fd = dup(fileno(f));
    fclose(f);
    ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
    r = provider_archive_put(prov, &ref, "/workspace/d", fd, 1024, &ar, &err);
    close(fd);
    ck_assert_fails(r, err, -EINVAL, "not a tar archive");
    lb_error_clear(&err);
    fd = tar_fd("evil", NULL, 0);
    r = provider_archive_put(prov, &ref, "/workspace/d", fd, 1024, &ar, &err);
    close(fd);
    ck_assert_fails(r, err, -EINVAL, "must be relative and stay inside");
    lb_error_clear(&err);
    fd = tar_fd("big", "0123456789", 10);
    r = provider_archive_put(prov, &ref, "/workspace/d", fd, 9, &ar, &err);
    close(fd);
    ck_assert_fails(r, err, -EFBIG, "max_file_bytes");
    lb_error_clear(&err);
    ck_assert_int_eq(fake_engine_hits(fe, be->upload.method, be->upload.path), puts);

    /* the engine's disk fills part way (into the existing /workspace): 413, and rm -rf of
     * what the archive made there */
    execs = fake_engine_hits(fe, "POST", "/exec");
    fault(&be->upload, 0, 500, "write /workspace/f.txt: no space left on device", 1);
    fd = tar_fd("f.txt", "hi", 2);
    r = provider_archive_put(prov, &ref, "/workspace", fd, 1024, &ar, &err);
    close(fd);
    ck_assert_int_eq(r, -EFBIG);
    ck_assert_int_eq(err.code, -EFBIG);
    ck_assert_msg(strstr(err.message, "/workspace"), "%s", err.message);
    ck_assert_uint_eq(ar.entries, 0);
    ck_assert_int_gt(fake_engine_hits(fe, "POST", "/exec"), execs);
    lb_error_clear(&err);
    /* any other engine failure: 502 */
    fault(&be->upload, 0, 500, "disk on fire", 1);
    fd = tar_fd("f.txt", "hi", 2);
    r = provider_archive_put(prov, &ref, "/workspace/e", fd, 1024, &ar, &err);
    close(fd);
    ck_assert_int_eq(r, -EREMOTEIO);
    ck_assert_int_eq(err.code, -EREMOTEIO);
    lb_error_clear(&err);

    /* out: a 500 and an answer cut short are 502, nothing written to fd counts */
    ck_assert_int_eq(fake_engine_put(fe, be->name, "/workspace/a.txt", "hello", 5), 0);
    f = tmpfile();
    ck_assert_ptr_nonnull(f);
    fd = dup(fileno(f));
    fclose(f);
    fault(&be->download, 0, 500, "io error", 1);
    r = provider_archive_get(prov, &ref, "/workspace", fd, 1 << 20, &ar, &err);
    ck_assert_int_eq(r, -EREMOTEIO);
    ck_assert_int_eq(err.code, -EREMOTEIO);
    ck_assert_uint_eq(ar.bytes, 0);
    lb_error_clear(&err);
    fault(&be->download, FAKE_CUT, 0, NULL, 1);
    r = provider_archive_get(prov, &ref, "/workspace", fd, 1 << 20, &ar, &err);
    ck_assert_int_eq(r, -EREMOTEIO);
    ck_assert_int_eq(err.code, -EREMOTEIO);
    ck_assert_uint_eq(ar.bytes, 0);
    lb_error_clear(&err);
    close(fd);
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* Downloads: a missing file is 404, an engine failure 502. */
START_TEST(test_download_fails)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_error err = {0};
    char *text;
    int r;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    ck_assert_ptr_null(read_back(ref.descriptor, "/workspace/none.txt", &err, &r));
    ck_assert_fails(r, err, -ENOENT, "no ");
    ck_assert_ptr_nonnull(strstr(err.message, "'/workspace/none.txt'"));
    lb_error_clear(&err);
    ck_assert_int_eq(fake_engine_put(fe, be->name, "/workspace/a.txt", "hello", 5), 0);
    fault(&be->download, 0, 500, "io error", 1);
    ck_assert_ptr_null(read_back(ref.descriptor, "/workspace/a.txt", &err, &r));
    ck_assert_fails(r, err, -EREMOTEIO, "failed (HTTP 500)");
    lb_error_clear(&err);
    text = read_back(ref.descriptor, "/workspace/a.txt", &err, &r);
    ck_assert_int_eq(r, 0);
    ck_assert_str_eq(text, "hello");
    free(text);
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* An answer the engine cuts short, or an engine that is gone, is a failure of the provider
 * (502) on every operation: the returned errno and err.code both -EREMOTEIO, never the
 * transport's own errno (500). */
START_TEST(test_transport_fails)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    enum lb_sandbox_status st;
    struct lb_exec_result res;
    struct lb_error err = {0};
    int r;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    ck_assert_int_eq(fake_engine_put(fe, be->name, "/workspace/a.txt", "hello", 5), 0);
    fake_engine_rule(fe, be->status.method, be->status.path, FAKE_CUT, 0, NULL, 1);
    r = provider_status(prov, &ref, &st, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "failed");
    lb_error_clear(&err);
    fake_engine_rule(fe, be->stream.method, be->stream.path, FAKE_CUT, 0, NULL, 1);
    r = run(ref.descriptor, &res, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "failed");
    provider_exec_result_release(&res);
    lb_error_clear(&err);
    fake_engine_rule(fe, be->download.method, be->download.path, FAKE_CUT, 0, NULL, 1);
    ck_assert_ptr_null(read_back(ref.descriptor, "/workspace/a.txt", &err, &r));
    ck_assert_fails(r, err, -EREMOTEIO, "failed");
    lb_error_clear(&err);

    /* the engine is gone (its socket with it) */
    fake_engine_stop(fe);
    fe = NULL;
    r = provider_status(prov, &ref, &st, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "cannot reach");
    lb_error_clear(&err);
    r = provider_pause(prov, &ref, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "cannot reach");
    lb_error_clear(&err);
    r = provider_stop(prov, &ref, 10000, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "cannot reach");
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* Connections are kept alive: sequential calls of a provider go over one connection; one the
 * engine closes (saying so, or silently while it is idle) is replaced without the caller
 * seeing it, an upload included; a stream the engine cuts fails its own call only, and the
 * calls after it work on a new connection. Every count is exact: each new connection the
 * provider makes is one the test caused. */
START_TEST(test_keepalive)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    enum lb_sandbox_status st;
    struct lb_exec_result res;
    struct lb_error err = {0};
    char *text;
    int r;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    /* the open (version, pool) and the whole create went over one connection */
    ck_assert_int_eq(fake_engine_connections(fe), 1);
    for (int k = 0; k < 20; k++) {
        ck_assert_int_eq(provider_status(prov, &ref, &st, &err), 0);
        ck_assert_int_eq(st, LB_STATUS_RUNNING);
    }
    ck_assert_int_eq(run(ref.descriptor, &res, &err), 0);
    ck_assert_int_eq(res.return_code, 0);
    provider_exec_result_release(&res);
    ck_assert_int_eq(provider_file_write(prov, &ref, "/workspace/a.txt", "one", 3, -1, &err), 0);
    ck_assert_int_eq(fake_engine_connections(fe), 1);

    /* the engine answers and closes ("Connection: close"): the next call opens a new one */
    fake_engine_rule(fe, be->status.method, be->status.path, FAKE_CLOSE, 0, NULL, 1);
    ck_assert_int_eq(provider_status(prov, &ref, &st, &err), 0);
    ck_assert_int_eq(provider_status(prov, &ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_RUNNING);
    ck_assert_int_eq(fake_engine_connections(fe), 2);

    /* the engine drops the idle connection without a word: a call, and an upload from a file,
     * work on a new one */
    fake_engine_close_connections(fe);
    ck_assert_int_eq(provider_status(prov, &ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_RUNNING);
    ck_assert_int_eq(fake_engine_connections(fe), 3);
    fake_engine_close_connections(fe);
    {
        struct lb_upload *up = NULL;

        ck_assert_int_eq(
            provider_upload_begin(prov, &ref, "/workspace/b.txt", 0600, NULL, &up, &err), 0);
        ck_assert_int_eq(write(up->fd, "streamed", 8), 8);
        r = provider_upload_commit(up, &err);
        ck_assert_msg(r == 0, "%s: upload after a dropped connection: %d %s", be->kind, r,
                      err.message);
    }
    text = read_back(ref.descriptor, "/workspace/b.txt", &err, &r);
    ck_assert_int_eq(r, 0);
    ck_assert_str_eq(text, "streamed");
    free(text);
    ck_assert_int_eq(fake_engine_connections(fe), 4);

    /* a stream cut short fails its call; the next exec gets its whole answer */
    fake_engine_rule(fe, be->stream.method, be->stream.path, FAKE_CUT, 0, NULL, 1);
    r = run(ref.descriptor, &res, &err);
    ck_assert_msg(r == -EREMOTEIO, "%s: %d %s", be->kind, r, err.message);
    provider_exec_result_release(&res);
    lb_error_clear(&err);
    for (int k = 0; k < 3; k++) {
        r = run(ref.descriptor, &res, &err);
        ck_assert_msg(r == 0, "%s: exec after a cut stream: %d %s", be->kind, r, err.message);
        ck_assert_int_eq(res.error_type, LB_EXEC_OK);
        ck_assert_int_eq(res.return_code, 0);
        ck_assert_uint_eq(res.out.len, 3);
        ck_assert_mem_eq(res.out.data, "ok\n", 3);
        provider_exec_result_release(&res);
    }
    ck_assert_int_eq(fake_engine_connections(fe), 5);
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    ck_assert_int_eq(fake_engine_connections(fe), 5);
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

struct ping_arg {
    struct lb_httpc *c;
    const char *path;
    int ok; /* answers 200 */
};

static void *ping_loop(void *arg)
{
    struct ping_arg *pa = arg;

    for (int k = 0; k < 25; k++) {
        struct lb_httpc_request req = {
            .method = "GET", .path = pa->path, .timeout_ms = 10000, .max_body_bytes = 65536};
        struct lb_httpc_response resp;
        struct lb_error err = {0};

        if (httpc_do(pa->c, &req, &resp, &err) == 0 && resp.status == 200)
            pa->ok++;
        httpc_response_release(&resp);
    }
    return NULL;
}

/* One client used by 4 threads at once (100 calls): every call answered, never more
 * connections than calls ran at once, and the client counts what the engine accepted. */
START_TEST(test_keepalive_threads)
{
    struct ping_arg pa[4];
    pthread_t th[4];
    struct lb_httpc *c = NULL;
    struct lb_error err = {0};
    char dir[128], sock[160];

    snprintf(dir, sizeof(dir), "%s/threads-XXXXXX", base_dir);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(sock, sizeof(sock), "%s/engine.sock", dir);
    ck_assert_int_eq(fake_engine_start(FAKE_DOCKER, sock, &fe), 0);
    ck_assert_int_eq(httpc_new(sock, "/v1.41", &c, &err), 0);
    for (int i = 0; i < 4; i++) {
        pa[i] = (struct ping_arg){.c = c, .path = "/_ping"};
        ck_assert_int_eq(pthread_create(&th[i], NULL, ping_loop, &pa[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(pa[i].ok, 25);
    }
    ck_assert_int_ge(fake_engine_connections(fe), 1);
    ck_assert_int_le(fake_engine_connections(fe), 4);
    ck_assert_int_eq(httpc_connections(c), fake_engine_connections(fe));
    ck_assert_int_eq(fake_engine_hits(fe, "GET", "/_ping"), 100);
    /* the connections kept open (this process's sockets whose peer is the fake's socket) are
     * close-on-exec */
    {
        DIR *d = opendir("/proc/self/fd");
        struct dirent *de;
        int conns = 0;

        ck_assert_ptr_nonnull(d);
        while ((de = readdir(d))) {
            struct sockaddr_un peer;
            socklen_t len = sizeof(peer);
            int fd = atoi(de->d_name);

            memset(&peer, 0, sizeof(peer));
            if (de->d_name[0] == '.' || fd == dirfd(d) ||
                getpeername(fd, (struct sockaddr *)&peer, &len) < 0 || peer.sun_family != AF_UNIX ||
                strcmp(peer.sun_path, sock) != 0)
                continue;
            conns++;
            ck_assert_msg(fcntl(fd, F_GETFD) & FD_CLOEXEC, "connection fd %d is not close-on-exec",
                          fd);
        }
        closedir(d);
        ck_assert_int_ge(conns, 1);
        ck_assert_int_le(conns, 4);
    }
    httpc_free(c);
    fake_engine_stop(fe);
    fe = NULL;
}
END_TEST

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    (void)remove(path);
    return 0;
}

/* Runner process: one directory for every test's state dirs and sockets, removed at the end
 * whatever the tests did (a failed test in fork mode skips its own teardown). */
static void runner_setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(base_dir));
}

static void runner_teardown(void)
{
    (void)nftw(base_dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Every figure of u is unknown (-1). */
static void assert_usage_unknown(const struct lb_usage *u)
{
    ck_assert_msg(u->cpu_s == -1 && u->memory_bytes == -1 && u->memory_peak_bytes == -1 &&
                      u->pids == -1 && u->oom_kills == -1 && u->disk_bytes == -1,
                  "%s: usage not all unknown: cpu_s %g memory %lld peak %lld pids %lld oom %lld "
                  "disk %lld",
                  be->kind, u->cpu_s, (long long)u->memory_bytes, (long long)u->memory_peak_bytes,
                  (long long)u->pids, (long long)u->oom_kills, (long long)u->disk_bytes);
}

/* Usage: the engine's figures as they are (docker's stats: no disk; LXD's state: no OOM
 * kills), a paused instance's too; an engine error (500), an answer cut short, an answer that
 * is no JSON object and a lost instance leave every figure unknown and fail the op (502, or
 * 404 for the lost one), never half an answer. */
START_TEST(test_usage)
{
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_error err = {0};
    struct lb_usage u;
    int r;

    open_backend(_i, "30");
    ref.descriptor = create_ok();
    for (int paused = 0; paused < 2; paused++) {
        memset(&u, 0x55, sizeof(u));
        r = provider_usage(prov, &ref, &u, &err);
        ck_assert_msg(r == 0, "%s: usage: %d %s", be->kind, r, err.message);
        ck_assert_double_eq(u.cpu_s, (double)FAKE_USAGE_CPU_NS / 1e9);
        ck_assert_int_eq(u.memory_bytes, FAKE_USAGE_MEMORY);
        ck_assert_int_eq(u.memory_peak_bytes, FAKE_USAGE_PEAK);
        ck_assert_int_eq(u.pids, FAKE_USAGE_PIDS);
        ck_assert_int_eq(u.oom_kills, be->api == FAKE_DOCKER ? FAKE_USAGE_OOM_KILLS : -1);
        ck_assert_int_eq(u.disk_bytes, be->api == FAKE_DOCKER ? -1 : FAKE_USAGE_DISK);
        ck_assert_int_eq(provider_pause(prov, &ref, &err), 0);
    }
    ck_assert_int_eq(provider_resume(prov, &ref, &err), 0);

    fault(&be->usage, FAKE_ERROR, 500, "stats broke", 1);
    memset(&u, 0x55, sizeof(u));
    r = provider_usage(prov, &ref, &u, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "stats broke");
    assert_usage_unknown(&u);
    lb_error_clear(&err);

    fault(&be->usage, FAKE_CUT, 0, NULL, 1);
    memset(&u, 0x55, sizeof(u));
    r = provider_usage(prov, &ref, &u, &err);
    ck_assert_fails(r, err, -EREMOTEIO, "");
    assert_usage_unknown(&u);
    lb_error_clear(&err);

    /* 200 with an object without the figures (docker: each figure unknown, as one an engine
     * does not give; LXD: no metadata, unreadable) */
    fault(&be->usage, FAKE_ERROR, 200, "not stats", 1);
    memset(&u, 0x55, sizeof(u));
    r = provider_usage(prov, &ref, &u, &err);
    if (be->api == FAKE_DOCKER)
        ck_assert_int_eq(r, 0);
    else
        ck_assert_fails(r, err, -EREMOTEIO, "unreadable");
    assert_usage_unknown(&u);
    lb_error_clear(&err);

    /* one bad answer changes nothing after it */
    ck_assert_int_eq(provider_usage(prov, &ref, &u, &err), 0);
    ck_assert_int_eq(u.pids, FAKE_USAGE_PIDS);

    fake_engine_lose(fe, be->name);
    memset(&u, 0x55, sizeof(u));
    r = provider_usage(prov, &ref, &u, &err);
    ck_assert_fails(r, err, -ENOENT, "");
    assert_usage_unknown(&u);
    lb_error_clear(&err);
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* lxd: the pool's driver found at start is in the metrics (lendbox_provider_storage_info); a
 * copy-on-write one (btrfs) takes disk_mib, dir has no quotas: disk_limit off and a create asking
 * for a disk size refused (-EOPNOTSUPP, 422) before anything is made. */
START_TEST(test_lxd_pool_driver)
{
    static const char *const drivers[] = {"btrfs", "dir"};
    struct lb_sandbox_spec spec = {.image = "img", .workdir = "/workspace"};
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_provider_caps caps;
    struct lb_error err = {0};
    struct lb_buf out = {0};
    char want[160];
    json_t *desc = NULL;
    int r;

    if (backends[_i].api != FAKE_LXD)
        return;
    for (size_t k = 0; k < sizeof(drivers) / sizeof(drivers[0]); k++) {
        bool cow = strcmp(drivers[k], "dir") != 0;

        next_pool_driver = drivers[k];
        open_backend(_i, "30");
        next_pool_driver = NULL;
        lb_buf_init(&out, 0);
        ck_assert_int_eq(metrics_render(&out), 0);
        snprintf(want, sizeof(want),
                 "\nlendbox_provider_storage_info{provider=\"lxd\",pool=\"default\","
                 "driver=\"%s\"} 1\n",
                 drivers[k]);
        ck_assert_msg(out.data && strstr(out.data, want), "no '%s' in the metrics", want + 1);
        lb_buf_release(&out);
        memset(&caps, 0, sizeof(caps));
        provider_caps(prov, &caps);
        ck_assert(caps.disk_limit == cow);
        spec.resources.disk_mib = 64;
        r = provider_create(prov, &ref, &spec, &desc, &err);
        if (cow) {
            ck_assert_msg(r == 0, "create with disk_mib on %s: %d %s", drivers[k], r, err.message);
            ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
            json_decref(desc);
            desc = NULL;
        } else {
            ck_assert_fails(r, err, -EOPNOTSUPP, "no quotas (driver dir)");
            ck_assert_ptr_null(desc);
            ck_assert(!fake_engine_has(fe, be->name));
            lb_error_clear(&err);
        }
        close_backend();
    }
}
END_TEST

/* lxd: what a create asks of LXD beyond the create and the start. The instance's member comes
 * from the create's operation (no lookup of the instance), and each directory finish makes is
 * one files request while its parent exists (/run is the instance's own mount): the
 * supervisor's directory, the supervisor, the workdir; a workdir whose parents are missing
 * still gets them, one request each. */
START_TEST(test_lxd_create_requests)
{
    struct lb_sandbox_spec spec = {.image = "img", .workdir = "/srv/deep/work"};
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_error err = {0};
    json_t *desc;
    int r;

    if (backends[_i].api != FAKE_LXD)
        return;
    open_backend(_i, "30");
    desc = create_ok();
    ck_assert_str_eq(json_string_value(json_object_get(desc, "location")), "none");
    ck_assert_int_eq(fake_engine_hits(fe, "GET", "/1.0/instances/"), 0);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path="), 3);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/run;"), 0);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/run/lendbox;"), 1);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/run/lendbox/supervise;"), 1);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/workspace;"), 1);
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    json_decref(desc);
    desc = NULL;

    r = provider_create(prov, &ref, &spec, &desc, &err);
    ck_assert_msg(r == 0, "create: %d %s", r, err.message);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/srv/deep/work;"), 2);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/srv;"), 1);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/srv/deep;"), 1);
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    json_decref(desc);
    close_backend();
}
END_TEST

/* lxd.supervise_host_path: the supervisor is bound from the member's host and the workdir
 * made by LXC at the start, so a create asks no files request but for a workdir raw.lxc cannot
 * carry; a path that is not plain, not the daemon's build, or not executable by others is
 * refused at the open, one this host lacks only warned about. */
START_TEST(test_lxd_supervise_host_path)
{
    struct lb_sandbox_spec spec = {.image = "img", .workdir = "/srv/my work"};
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_exec_result res;
    struct lb_error err = {0};
    char other[PATH_MAX];
    json_t *desc;
    int fd, r;

    if (backends[_i].api != FAKE_LXD)
        return;
    next_supervise_host = "SUP";
    open_backend(_i, "30");
    next_supervise_host = NULL;
    desc = create_ok();
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path="), 0);
    ck_assert_int_eq(run(desc, &res, &err), 0);
    ck_assert_int_eq(res.error_type, LB_EXEC_OK);
    provider_exec_result_release(&res);
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    json_decref(desc);
    desc = NULL;
    /* a workdir with a space cannot go into raw.lxc: made through the files API, the
     * supervisor still bound */
    r = provider_create(prov, &ref, &spec, &desc, &err);
    ck_assert_msg(r == 0, "create: %d %s", r, err.message);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/srv/my work;"), 2);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/srv;"), 1);
    ck_assert_int_eq(fake_engine_hits(fe, "POST", "/files?path=/run/lendbox/supervise;"), 0);
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    json_decref(desc);
    close_backend();

    next_supervise_host = "/usr/lib/lendbox/lendbox supervise";
    ck_assert_int_eq(open_backend_may_fail(_i, "30"), -EINVAL);
    ck_assert_msg(strstr(open_error, "must be an absolute path"), "%s", open_error);
    close_backend();
    next_supervise_host = "/run/lendbox-test-none/lendbox-supervise";
    ck_assert_int_eq(open_backend_may_fail(_i, "30"), 0);
    close_backend();
    snprintf(other, sizeof(other), "%s/other-supervise", base_dir);
    fd = open(other, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "#!another-build\n", 16), 16);
    close(fd);
    ck_assert_int_eq(chmod(other, 0755), 0);
    next_supervise_host = other;
    ck_assert_int_eq(open_backend_may_fail(_i, "30"), -EINVAL);
    ck_assert_msg(strstr(open_error, "not the same build"), "%s", open_error);
    close_backend();
    fd = open(other, O_WRONLY | O_TRUNC | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "#!not-a-supervisor\n", 19), 19);
    close(fd);
    ck_assert_int_eq(chmod(other, 0700), 0);
    ck_assert_int_eq(open_backend_may_fail(_i, "30"), -EINVAL);
    ck_assert_msg(strstr(open_error, "others may execute"), "%s", open_error);
    close_backend();
    ck_assert_int_eq(chmod(other, 0711), 0);
    ck_assert_int_eq(open_backend_may_fail(_i, "30"), 0);
    close_backend();
    next_supervise_host = NULL;
    unlink(other);
}
END_TEST

/* lxd: an exec answers once its stdout is read; the logs' DELETEs come after (a DELETE the
 * engine never answers leaves the exec's answer as it was, and is still outstanding after). */
START_TEST(test_lxd_exec_logs_after_answer)
{
    static const char *const argv[] = {"true", NULL};
    struct lb_exec_request req = {.argv = argv, .timeout_ms = 5000, .max_output_bytes = 4096};
    struct lb_sandbox_ref ref = {.id = SBX};
    struct lb_exec_result res;
    struct lb_error err = {0};

    if (backends[_i].api != FAKE_LXD)
        return;
    next_call_timeout_s = "2";
    open_backend(_i, "30");
    next_call_timeout_s = NULL;
    ref.descriptor = create_ok();
    fake_engine_rule(fe, "DELETE", ".stdout", FAKE_HANG, 0, NULL, 1);
    ck_assert_int_eq(provider_exec(prov, &ref, &req, &res, &err), 0);
    ck_assert_int_eq(res.error_type, LB_EXEC_OK);
    ck_assert_int_eq(res.return_code, 0);
    provider_exec_result_release(&res);
    ck_assert_int_eq(provider_lxd_settle(prov, 200), -ETIMEDOUT);
    /* the hung DELETE times out (its call's 2 s); the stderr log's comes after it */
    ck_assert_int_eq(provider_lxd_settle(prov, 10000), 0);
    ck_assert_int_eq(fake_engine_hits(fe, "DELETE", ".stderr"), 1);
    ck_assert_int_eq(provider_stop(prov, &ref, 10000, &err), 0);
    json_decref((json_t *)ref.descriptor);
    close_backend();
}
END_TEST

/* lxd: an exec reads its recorded stdout (the frames) and deletes both logs; its stderr is read
 * only when the frames hold no complete result (the supervisor's diagnostics), else only
 * deleted. */
START_TEST(test_lxd_exec_logs)
{
    unsigned char out[64];
    size_t len = 0;
    struct lb_exec_result res;
    struct lb_error err = {0};
    json_t *desc;

    if (backends[_i].api != FAKE_LXD)
        return;
    open_backend(_i, "30");
    desc = create_ok();
    ck_assert_int_eq(run(desc, &res, &err), 0);
    ck_assert_int_eq(res.error_type, LB_EXEC_OK);
    provider_exec_result_release(&res);
    ck_assert_int_eq(fake_engine_hits(fe, "GET", ".stdout"), 1);
    ck_assert_int_eq(fake_engine_hits(fe, "DELETE", ".stdout"), 1);
    ck_assert_int_eq(fake_engine_hits(fe, "GET", ".stderr"), 0);
    ck_assert_int_eq(fake_engine_hits(fe, "DELETE", ".stderr"), 1);

    frame(out, &len, 'o', "partial");
    fake_engine_set_exec_output(fe, out, len);
    ck_assert_int_eq(run(desc, &res, &err), 0);
    ck_assert_int_eq(res.error_type, LB_EXEC_SANDBOX);
    provider_exec_result_release(&res);
    ck_assert_int_eq(fake_engine_hits(fe, "GET", ".stderr"), 1);
    ck_assert_int_eq(fake_engine_hits(fe, "DELETE", ".stderr"), 2);
    ck_assert_int_eq(fake_engine_hits(fe, "DELETE", ".stdout"), 2);
    json_decref(desc);
    close_backend();
}
END_TEST

static Suite *engine_fake_suite(void)
{
    Suite *s = suite_create("engine_fake");
    TCase *tc = tcase_create("errors");
    size_t n = sizeof(backends) / sizeof(backends[0]);

    tcase_add_unchecked_fixture(tc, runner_setup, runner_teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_round_trip, 0, (int)n);
    tcase_add_loop_test(tc, test_create_fails, 0, (int)n);
    tcase_add_loop_test(tc, test_create_times_out, 0, (int)n);
    tcase_add_loop_test(tc, test_create_start_fails_rolls_back, 0, (int)n);
    tcase_add_loop_test(tc, test_create_exists, 0, (int)n);
    tcase_add_loop_test(tc, test_exec_cut_short, 0, (int)n);
    tcase_add_loop_test(tc, test_pause_fails, 0, (int)n);
    tcase_add_loop_test(tc, test_remove_fails, 0, (int)n);
    tcase_add_loop_test(tc, test_instance_lost, 0, (int)n);
    tcase_add_loop_test(tc, test_upload_fails, 0, (int)n);
    tcase_add_loop_test(tc, test_archive_fails, 0, (int)n);
    tcase_add_loop_test(tc, test_download_fails, 0, (int)n);
    tcase_add_loop_test(tc, test_transport_fails, 0, (int)n);
    tcase_add_loop_test(tc, test_usage, 0, (int)n);
    tcase_add_loop_test(tc, test_lxd_pool_driver, 0, (int)n);
    tcase_add_loop_test(tc, test_lxd_create_requests, 0, (int)n);
    tcase_add_loop_test(tc, test_lxd_exec_logs, 0, (int)n);
    tcase_add_loop_test(tc, test_lxd_exec_logs_after_answer, 0, (int)n);
    tcase_add_loop_test(tc, test_lxd_supervise_host_path, 0, (int)n);
    tcase_add_loop_test(tc, test_keepalive, 0, (int)n);
    tcase_add_test(tc, test_keepalive_threads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(engine_fake_suite());
    int failed;

    httpc_global_init();
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
