/* check_util.c - unit tests of the small util modules: buf, utf8, token, config, fault, pool,
 * error mapping. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/http.h"
#include "pool/pool.h"
#include "provider/provider.h"
#include "util/buf.h"
#include "util/config.h"
#include "util/error.h"
#include "util/fault.h"
#include "util/parallel.h"
#include "util/token.h"
#include "util/utf8.h"

START_TEST(test_buf_limits)
{
    struct lb_buf b;

    lb_buf_init(&b, 8);
    ck_assert_int_eq(lb_buf_append(&b, "", 0), 0);
    ck_assert_ptr_nonnull(b.data);
    ck_assert_str_eq(b.data, "");
    ck_assert_int_eq(lb_buf_append(&b, "12345", 5), 0);
    ck_assert_int_eq(lb_buf_append(&b, "6789", 4), -EFBIG);
    ck_assert_uint_eq(b.len, 5);
    ck_assert_int_eq(lb_buf_append_capped(&b, "6789", 4), 0);
    ck_assert_uint_eq(b.len, 8);
    ck_assert(b.truncated);
    ck_assert_str_eq(b.data, "12345678");
    lb_buf_release(&b);
    ck_assert_ptr_null(b.data);
}
END_TEST

static void check_sanitize_n(const char *in, size_t n, const char *want, size_t want_len)
{
    struct lb_buf out;

    lb_buf_init(&out, 0);
    ck_assert_int_eq(utf8_sanitize(in, n, &out), 0);
    ck_assert_uint_eq(out.len, want_len);
    ck_assert_mem_eq(out.data, want, out.len);
    lb_buf_release(&out);
}

static void check_sanitize(const char *in, size_t n, const char *want)
{
    check_sanitize_n(in, n, want, strlen(want));
}

START_TEST(test_utf8)
{
    check_sanitize("plain", 5, "plain");
    check_sanitize("h\xc3\xa9llo", 6, "h\xc3\xa9llo");                         /* é stays */
    check_sanitize("\xff\xfeok", 4, "\xef\xbf\xbd\xef\xbf\xbdok");             /* two bad bytes */
    check_sanitize("\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd");                 /* overlong */
    check_sanitize("\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"); /* surrogate */
    check_sanitize("a\xe2\x82", 3, "a\xef\xbf\xbd");                           /* cut at the end */
    check_sanitize("\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80");                 /* emoji */
    check_sanitize_n("a\0b", 3, "a\0b", 3);                                    /* NUL is valid */
}
END_TEST

/* In place, within a fixed buffer: invalid bytes become U+FFFD, a cut falls between
 * characters; error messages are made valid this way by lb_error_set. */
START_TEST(test_utf8_inplace_and_errors)
{
    char buf[8], want[16];
    struct lb_error err;
    char big[2 * LB_ERROR_MESSAGE_MAX];

    snprintf(buf, sizeof(buf),
             "a\xff"
             "b");
    utf8_sanitize_inplace(buf, sizeof(buf));
    ck_assert_str_eq(buf, "a\xef\xbf\xbd"
                          "b");
    snprintf(buf, sizeof(buf), "\xff\xff\xff");
    utf8_sanitize_inplace(buf, sizeof(buf)); /* 9 bytes do not fit in 7: two replacements */
    ck_assert_str_eq(buf, "\xef\xbf\xbd\xef\xbf\xbd");
    snprintf(buf, sizeof(buf), "abcde\xc3");
    utf8_sanitize_inplace(buf, sizeof(buf)); /* a lone lead byte at the end: no room */
    snprintf(want, sizeof(want), "abcde");
    ck_assert_str_eq(buf, want);
    ck_assert(utf8_valid("h\xc3\xa9", 3));
    ck_assert(!utf8_valid("h\xc3", 2));
    ck_assert(!utf8_valid("\xed\xa0\x80", 3));
    lb_error_set(&err, -ENOENT, "no file '%s'", "/workspace/\xff\xfenope");
    ck_assert_str_eq(err.message, "no file '/workspace/\xef\xbf\xbd\xef\xbf\xbdnope'");
    /* 2 x 512 bytes of "é": vsnprintf cuts at 511 bytes, inside one; the half is dropped */
    for (size_t i = 0; i + 2 < sizeof(big); i += 2)
        memcpy(big + i, "\xc3\xa9", 2);
    big[sizeof(big) - 2] = '\0';
    lb_error_set(&err, -ENOENT, "%s", big);
    ck_assert(utf8_valid(err.message, strlen(err.message)));
    ck_assert_uint_eq(strlen(err.message), 2 * 255); /* 255 x é; no room for a U+FFFD */
}
END_TEST

/* The bytes a streamed chunk holds back: only a valid sequence cut short at the end. */
START_TEST(test_utf8_incomplete_tail)
{
    ck_assert_uint_eq(utf8_incomplete_tail("", 0), 0);
    ck_assert_uint_eq(utf8_incomplete_tail("abc", 3), 0);
    ck_assert_uint_eq(utf8_incomplete_tail("a\xc3", 2), 1);            /* é's first byte */
    ck_assert_uint_eq(utf8_incomplete_tail("a\xc3\xa9", 3), 0);        /* whole é */
    ck_assert_uint_eq(utf8_incomplete_tail("a\xe2\x82", 3), 2);        /* € cut after 2 */
    ck_assert_uint_eq(utf8_incomplete_tail("\xf0\x9f\x98", 3), 3);     /* emoji cut after 3 */
    ck_assert_uint_eq(utf8_incomplete_tail("\xf0\x9f\x98\x80", 4), 0); /* whole emoji */
    ck_assert_uint_eq(utf8_incomplete_tail("a\xff", 2), 0);            /* never valid */
    ck_assert_uint_eq(utf8_incomplete_tail("a\xa9", 2), 0);            /* stray continuation */
    ck_assert_uint_eq(utf8_incomplete_tail("\xe0\x80", 2), 0);         /* overlong: invalid */
    ck_assert_uint_eq(utf8_incomplete_tail("\xed\xa0", 2), 0);         /* surrogate: invalid */
}
END_TEST

START_TEST(test_base64_round_trip)
{
    unsigned char all[256], *back = NULL;
    char *text = NULL;
    size_t n = 0, len = 0;

    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)i;
    for (size_t k = 0; k <= 256; k += (k < 8 ? 1 : 61)) {
        ck_assert_int_eq(token_base64_encode(all, k, &text, &len), 0);
        ck_assert_int_eq(token_base64_decode(text, len, &back, &n), 0);
        ck_assert_uint_eq(n, k);
        if (k)
            ck_assert_mem_eq(back, all, k);
        free(text);
        free(back);
    }
    ck_assert_int_eq(token_base64_decode("abc", 3, &back, &n), -EINVAL);
    ck_assert_int_eq(token_base64_decode("ab=c", 4, &back, &n), -EINVAL);
    ck_assert_int_eq(token_base64_decode("a b=", 4, &back, &n), -EINVAL);
    ck_assert_int_eq(token_base64_decode("aGk=", 4, &back, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_mem_eq(back, "hi", 2);
    free(back);
}
END_TEST

START_TEST(test_ids_and_tokens)
{
    char a[31], b[31], h1[65], h2[65];

    ck_assert_int_eq(token_new_sandbox_id(a), 0);
    ck_assert_int_eq(token_new_sandbox_id(b), 0);
    ck_assert_uint_eq(strlen(a), 30);
    ck_assert(strncmp(a, "sbx-", 4) == 0);
    ck_assert_str_ne(a, b);
    for (int i = 4; i < 30; i++)
        ck_assert_ptr_nonnull(strchr("0123456789abcdefghjkmnpqrstvwxyz", a[i]));
    token_sha256_hex("abc", 3, h1);
    ck_assert_str_eq(h1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    ck_assert_int_eq(token_hmac_hex("key", 3, "sbx-1", h1), 0);
    ck_assert_int_eq(token_hmac_hex("key", 3, "sbx-1", h2), 0);
    ck_assert_str_eq(h1, h2);
    ck_assert_int_eq(token_hmac_hex("key", 3, "sbx-2", h2), 0);
    ck_assert_str_ne(h1, h2);
    ck_assert(token_equal("abc", "abc"));
    ck_assert(!token_equal("abc", "abd"));
    ck_assert(!token_equal("abc", "abcd"));
}
END_TEST

START_TEST(test_config)
{
    struct lb_config cfg;
    struct lb_error err = {0};
    char path[] = "/tmp/lendbox-conf-XXXXXX";
    int fd = mkstemp(path);
    const char *text = "[lending]\nstop_concurrency = 8\nshutdown_sweep = no\n"
                       "[server]\nlisten = 127.0.0.1:0\n";

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);
    ck_assert_int_eq(config_init(&cfg), 0);
    ck_assert_int_eq(cfg.stop_concurrency, 64);
    ck_assert_int_eq(cfg.stop_timeout_s, 120);
    ck_assert(cfg.shutdown_sweep);
    ck_assert_int_eq(config_load_file(&cfg, path, &err), 0);
    ck_assert_int_eq(cfg.stop_concurrency, 8);
    ck_assert(!cfg.shutdown_sweep);
    ck_assert_str_eq(cfg.listen, "127.0.0.1:0");
    ck_assert_int_eq(config_set_assignment(&cfg, "limits.max_output_bytes=4096", &err), 0);
    ck_assert_int_eq(cfg.max_output_bytes, 4096);
    ck_assert_int_eq(config_set_assignment(&cfg, "lending.nope=1", &err), -EINVAL);
    ck_assert(strstr(err.message, "lending.nope") != NULL);
    ck_assert_int_eq(config_set_assignment(&cfg, "lending.stop_concurrency=0", &err), -EINVAL);
    ck_assert_int_eq(config_set_assignment(&cfg, "lending.stop_concurrency=x", &err), -EINVAL);
    ck_assert_int_eq(config_set_assignment(&cfg, "nodot=1", &err), -EINVAL);
    ck_assert_int_eq(config_load_file(&cfg, "/nonexistent/lendbox.conf", &err), -ENOENT);
    /* a bad key in a file names the line */
    fd = open(path, O_WRONLY | O_TRUNC);
    ck_assert_int_eq(write(fd, "[lending]\n\nbogus = 1\n", 21), 21);
    close(fd);
    ck_assert_int_eq(config_load_file(&cfg, path, &err), -EINVAL);
    ck_assert(strstr(err.message, "line 3") != NULL);
    unlink(path);
    config_release(&cfg);
}
END_TEST

/* A thread calling fault_hit(op): started, then asked whether it returned within some ms. */
struct fault_hold {
    pthread_t thread;
    const char *op;
    atomic_bool done;
};

static void *fault_hold_main(void *arg)
{
    struct fault_hold *h = arg;
    struct lb_error err = {0};

    ck_assert_int_eq(fault_hit(h->op, 0, &err), 0);
    atomic_store(&h->done, true);
    return NULL;
}

static struct fault_hold *fault_hold_start(const char *op)
{
    static struct fault_hold h;

    h.op = op;
    atomic_store(&h.done, false);
    ck_assert_int_eq(pthread_create(&h.thread, NULL, fault_hold_main, &h), 0);
    return &h;
}

/* Whether the call returned within ms; joined when it did. */
static bool fault_hold_done(struct fault_hold *h, int ms)
{
    for (int t = 0; t < ms && !atomic_load(&h->done); t += 10)
        usleep(10000);
    if (!atomic_load(&h->done))
        return false;
    pthread_join(h->thread, NULL);
    return true;
}

START_TEST(test_fault_spec)
{
    struct lb_error err = {0};

    ck_assert_int_eq(fault_load("provider.stop=fail:2,provider.create=delay:1", &err), 0);
    ck_assert(fault_enabled());
    ck_assert_int_eq(fault_hit("provider.stop", 0, &err), -EIO);
    ck_assert_int_eq(fault_hit("provider.stop", 0, &err), -EIO);
    ck_assert_int_eq(fault_hit("provider.stop", 0, &err), 0);
    ck_assert_int_eq(fault_hit("provider.create", 0, &err), 0);
    ck_assert_int_eq(fault_hit("provider.exec", 0, &err), 0);
    ck_assert_int_eq(fault_load("store.write=hang", &err), 0);
    ck_assert_int_eq(fault_hit("store.write", 10, &err), -ETIMEDOUT);
    {
        char dir[] = "/tmp/lbt-fault-XXXXXX", spec[96], file[64];
        struct fault_hold *h;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(file, sizeof(file), "%s/go", dir);
        snprintf(spec, sizeof(spec), "snapshot.frozen=hold:%s", file);
        ck_assert_int_eq(fault_load(spec, &err), 0);
        h = fault_hold_start("snapshot.frozen");
        ck_assert(!fault_hold_done(h, 300)); /* held while the file is absent */
        ck_assert_int_eq(close(open(file, O_CREAT | O_WRONLY, 0600)), 0);
        ck_assert(fault_hold_done(h, 5000)); /* and goes on once it exists */
        unlink(file);
        rmdir(dir);
    }
    ck_assert_int_eq(fault_load("provider.stop=hold:relative", &err), -EINVAL);
    ck_assert_int_eq(fault_load("provider.stop=explode", &err), -EINVAL);
    ck_assert_int_eq(fault_load("provider.stop=fail:0", &err), -EINVAL);
    ck_assert_int_eq(fault_load("=fail", &err), -EINVAL);
    ck_assert_int_eq(fault_load("", &err), 0);
    ck_assert(!fault_enabled());
}
END_TEST

START_TEST(test_error_mapping)
{
    const char *code;

    ck_assert_int_eq(lb_error_http_status(-EINVAL, &code), 400);
    ck_assert_str_eq(code, "bad_request");
    ck_assert_int_eq(lb_error_http_status(-ENOKEY, &code), 401);
    ck_assert_int_eq(lb_error_http_status(-EACCES, &code), 403);
    ck_assert_int_eq(lb_error_http_status(-ENOENT, &code), 404);
    ck_assert_int_eq(lb_error_http_status(-EEXIST, &code), 409);
    ck_assert_str_eq(code, "conflict");
    ck_assert_int_eq(lb_error_http_status(-EFBIG, &code), 413);
    ck_assert_int_eq(lb_error_http_status(-EOPNOTSUPP, &code), 422);
    ck_assert_int_eq(lb_error_http_status(-EAGAIN, &code), 429);
    ck_assert_int_eq(lb_error_http_status(-EREMOTEIO, &code), 502);
    ck_assert_int_eq(lb_error_http_status(-ESHUTDOWN, &code), 503);
    ck_assert_int_eq(lb_error_http_status(-ENOSYS, &code), 501);
    ck_assert_int_eq(lb_error_http_status(-EIO, &code), 500);
    ck_assert_str_eq(code, "internal");
}
END_TEST

/* Every errno the API answers with something other than 500, with its status and code. */
START_TEST(test_error_mapping_all)
{
    static const struct {
        int errnum, status;
        const char *code;
    } want[] = {
        {EINVAL, 400, "bad_request"},       {EISDIR, 400, "bad_request"},
        {ENOTDIR, 400, "bad_request"},      {EROFS, 400, "bad_request"},
        {ENAMETOOLONG, 400, "bad_request"}, {ELOOP, 400, "bad_request"},
        {ENOKEY, 401, "unauthorized"},      {EACCES, 403, "forbidden"},
        {EPERM, 403, "forbidden"},          {ENOENT, 404, "not_found"},
        {ESRCH, 404, "not_found"},          {LB_E_IMAGE_NOT_FOUND, 404, "image_not_found"},
        {EEXIST, 409, "conflict"},          {EBUSY, 409, "conflict"},
        {EALREADY, 409, "conflict"},        {ESTALE, 410, "gone"},
        {EFBIG, 413, "payload_too_large"},  {EMSGSIZE, 413, "payload_too_large"},
        {EOPNOTSUPP, 422, "unenforceable"}, {EAGAIN, 429, "overloaded"},
        {EUSERS, 429, "overloaded"},        {EREMOTEIO, 502, "provider_error"},
        {ETIMEDOUT, 502, "provider_error"}, {ECONNREFUSED, 502, "provider_error"},
        {ECHILD, 502, "provider_error"},    {ESHUTDOWN, 503, "draining"},
        {ENOSPC, 503, "draining"},          {ENOSYS, 501, "not_implemented"},
    };
    const char *code;

    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        code = NULL;
        ck_assert_int_eq(lb_error_http_status(-want[i].errnum, &code), want[i].status);
        ck_assert_str_eq(code, want[i].code);
        ck_assert_int_eq(lb_error_http_status(-want[i].errnum, NULL), want[i].status);
    }
    /* no error, a positive code and errnos outside the table are 500 "internal" */
    ck_assert_int_eq(lb_error_http_status(0, &code), 500);
    ck_assert_str_eq(code, "internal");
    ck_assert_int_eq(lb_error_http_status(EINVAL, &code), 500);
    ck_assert_int_eq(lb_error_http_status(-ENOMEM, &code), 500);
    ck_assert_str_eq(code, "internal");
}
END_TEST

START_TEST(test_paths)
{
    ck_assert(provider_path_is_valid("/"));
    ck_assert(provider_path_is_valid("/workspace/a.txt"));
    ck_assert(!provider_path_is_valid("workspace"));
    ck_assert(!provider_path_is_valid("/a/../b"));
    ck_assert(!provider_path_is_valid("/a/./b"));
    ck_assert(!provider_path_is_valid("/a//b"));
    ck_assert(!provider_path_is_valid("/a/"));
    ck_assert(!provider_path_is_valid("/.."));
    ck_assert(!provider_path_is_valid(""));
}
END_TEST

static atomic_int pool_ran;

static void pool_job(void *arg)
{
    (void)arg;
    usleep(20000);
    atomic_fetch_add(&pool_ran, 1);
}

/* --listen takes HOST:PORT with a port from 0 to 65535; nothing wraps silently. */
START_TEST(test_listen_spec)
{
    static const char *const bad[] = {"127.0.0.1:99999", "127.0.0.1:65536",
                                      "127.0.0.1:-1",    "127.0.0.1:8a",
                                      "127.0.0.1:",      "8787",
                                      ":8787",           NULL};
    char bound[128];
    int fd = -1;

    for (int i = 0; bad[i]; i++) {
        struct lb_error e = {0};

        ck_assert_msg(http_bind(bad[i], &fd, bound, sizeof(bound), &e) == -EINVAL, "%s", bad[i]);
        ck_assert_int_eq(fd, -1);
    }
    ck_assert_int_eq(http_bind("127.0.0.1:0", &fd, bound, sizeof(bound), NULL), 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_ptr_nonnull(strstr(bound, "127.0.0.1:"));
    close(fd);
}
END_TEST

START_TEST(test_pool_bounded)
{
    struct lb_pool *p = NULL;
    int accepted = 0, refused = 0;

    ck_assert_int_eq(pool_new(1, 2, &p), 0);
    for (int i = 0; i < 10; i++) {
        int r = pool_submit(p, pool_job, NULL);

        if (r == 0)
            accepted++;
        else {
            ck_assert_int_eq(r, -EAGAIN);
            refused++;
        }
    }
    ck_assert_int_ge(refused, 1);
    pool_stop(p);
    ck_assert_int_eq(atomic_load(&pool_ran), accepted);
    ck_assert_int_eq(pool_submit(p, pool_job, NULL), -ESHUTDOWN);
    pool_destroy(p);
}
END_TEST

/* Keyed jobs: one key runs one at a time (in order), and jobs waiting behind it hold no
 * worker, so another key's job runs at once on the second worker. */
static atomic_int key_running, key_max_running, key_order_bad, key_last;
static atomic_int other_ran;
static pthread_mutex_t gate_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static bool gate_open;

static void keyed_job(void *arg)
{
    int seq = (int)(intptr_t)arg, now = atomic_fetch_add(&key_running, 1) + 1;

    if (now > atomic_load(&key_max_running))
        atomic_store(&key_max_running, now);
    if (seq != atomic_load(&key_last) + 1)
        atomic_fetch_add(&key_order_bad, 1);
    atomic_store(&key_last, seq);
    if (seq == 1) { /* the first holds its key until the other key's job has run */
        pthread_mutex_lock(&gate_mutex);
        while (!gate_open)
            pthread_cond_wait(&gate_cond, &gate_mutex);
        pthread_mutex_unlock(&gate_mutex);
    }
    atomic_fetch_sub(&key_running, 1);
}

static void other_job(void *arg)
{
    (void)arg;
    atomic_fetch_add(&other_ran, 1);
    pthread_mutex_lock(&gate_mutex);
    gate_open = true;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_mutex);
}

START_TEST(test_pool_keyed)
{
    struct lb_pool *p = NULL;

    ck_assert_int_eq(pool_new(2, 100, &p), 0);
    for (int i = 1; i <= 20; i++)
        ck_assert_int_eq(pool_submit_keyed(p, "session:a", 30, keyed_job, (void *)(intptr_t)i), 0);
    ck_assert_int_eq(pool_queued(p) + pool_running(p), 20);
    /* the first "a" job blocks until this one ran: it must not wait behind the 19 others */
    ck_assert_int_eq(pool_submit_keyed(p, "session:b", 30, other_job, NULL), 0);
    pool_stop(p);
    ck_assert_int_eq(atomic_load(&other_ran), 1);
    ck_assert_int_eq(atomic_load(&key_max_running), 1);
    ck_assert_int_eq(atomic_load(&key_order_bad), 0);
    ck_assert_int_eq(atomic_load(&key_last), 20);
    pool_destroy(p);

    /* per-key backlog bound: past key_max waiting jobs of one key, -EBUSY */
    gate_open = false;
    atomic_store(&key_last, 0);
    ck_assert_int_eq(pool_new(2, 8, &p), 0);
    ck_assert_int_eq(pool_submit_keyed(p, "k", 2, keyed_job, (void *)(intptr_t)1), 0);
    while (atomic_load(&key_running) == 0)
        usleep(1000);
    ck_assert_int_eq(pool_submit_keyed(p, "k", 2, keyed_job, (void *)(intptr_t)2), 0);
    ck_assert_int_eq(pool_submit_keyed(p, "k", 2, keyed_job, (void *)(intptr_t)3), 0);
    ck_assert_int_eq(pool_submit_keyed(p, "k", 2, keyed_job, (void *)(intptr_t)4), -EBUSY);
    ck_assert_int_eq(pool_queued(p), 2);
    ck_assert_int_eq(pool_submit(p, other_job, NULL), 0); /* the other worker: opens the gate */
    pool_stop(p);
    ck_assert_int_eq(atomic_load(&key_last), 3);
    pool_destroy(p);
}
END_TEST

static atomic_int shared_running, shared_max, shared_done;
static atomic_bool shared_gate;

static void shared_job(void *arg)
{
    int n = atomic_fetch_add(&shared_running, 1) + 1, m = atomic_load(&shared_max);

    (void)arg;
    while (n > m && !atomic_compare_exchange_weak(&shared_max, &m, n))
        ;
    while (!atomic_load(&shared_gate))
        usleep(1000);
    atomic_fetch_sub(&shared_running, 1);
    atomic_fetch_add(&shared_done, 1);
}

static void shared_gate_job(void *arg)
{
    (void)arg;
    atomic_store(&shared_gate, true);
}

/* pool_submit_shared: at most active_max jobs of a key hold workers, the rest wait off the ring
 * (bounded by waiting_max: -EBUSY past it), and other jobs still get the free workers. */
START_TEST(test_pool_shared)
{
    struct lb_pool *p = NULL;

    atomic_store(&shared_gate, false);
    ck_assert_int_eq(pool_new(4, 100, &p), 0);
    ck_assert_int_eq(pool_submit_shared(p, "x", 2, 0, shared_job, NULL), 0);
    ck_assert_int_eq(pool_submit_shared(p, "x", 2, 0, shared_job, NULL), 0);
    ck_assert_int_eq(pool_submit_shared(p, "x", 2, 0, shared_job, NULL), -EBUSY);
    ck_assert_int_eq(pool_submit_shared(p, "x", 0, 0, shared_job, NULL), -EINVAL);
    /* a free worker runs another key's job while "x" holds two */
    ck_assert_int_eq(pool_submit_shared(p, "y", 2, 0, shared_gate_job, NULL), 0);
    pool_stop(p);
    ck_assert_int_eq(atomic_load(&shared_done), 2);
    ck_assert_int_eq(atomic_load(&shared_max), 2);
    pool_destroy(p);

    atomic_store(&shared_gate, false);
    atomic_store(&shared_done, 0);
    atomic_store(&shared_max, 0);
    ck_assert_int_eq(pool_new(4, 100, &p), 0);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(pool_submit_shared(p, "x", 2, 4, shared_job, NULL), 0);
    ck_assert_int_eq(pool_submit_shared(p, "x", 2, 4, shared_job, NULL), -EBUSY);
    while (atomic_load(&shared_running) < 2)
        usleep(1000);
    usleep(50000);
    /* four workers, but only two run "x"; four wait off the ring */
    ck_assert_int_eq(atomic_load(&shared_running), 2);
    ck_assert_int_eq(pool_queued(p), 4);
    ck_assert_int_eq(pool_submit(p, shared_gate_job, NULL), 0);
    pool_stop(p);
    ck_assert_int_eq(atomic_load(&shared_done), 6);
    ck_assert_int_eq(atomic_load(&shared_max), 2);
    pool_destroy(p);
}
END_TEST

/* parallel_run: every index once, never more than width at once, and in parallel. */
struct par_probe {
    atomic_int calls[64];
    atomic_int running, max_running;
    bool overlap; /* index 0 waits (at most 10 s) for a second call to run beside it */
};

static void par_fn(void *arg, size_t i)
{
    struct par_probe *p = arg;
    int now = atomic_fetch_add(&p->running, 1) + 1, seen = atomic_load(&p->max_running);

    while (now > seen && !atomic_compare_exchange_weak(&p->max_running, &seen, now))
        ;
    atomic_fetch_add(&p->calls[i], 1);
    for (int k = 0; p->overlap && i == 0 && k < 10000 && atomic_load(&p->max_running) < 2; k++)
        usleep(1000);
    usleep(1000);
    atomic_fetch_sub(&p->running, 1);
}

START_TEST(test_parallel_run)
{
    const struct {
        size_t n, width;
        int max_lo, max_hi;
    } cases[] = {{64, 8, 2, 8}, {3, 8, 2, 3}, {10, 1, 1, 1}, {10, 0, 1, 1}, {0, 8, 0, 0}};

    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct par_probe *p = calloc(1, sizeof(*p));

        ck_assert_ptr_nonnull(p);
        p->overlap = cases[c].max_lo > 1;
        parallel_run(cases[c].n, cases[c].width, par_fn, p);
        for (size_t i = 0; i < 64; i++)
            ck_assert_int_eq(atomic_load(&p->calls[i]), i < cases[c].n ? 1 : 0);
        ck_assert_int_eq(atomic_load(&p->running), 0);
        ck_assert_int_ge(atomic_load(&p->max_running), cases[c].max_lo);
        ck_assert_int_le(atomic_load(&p->max_running), cases[c].max_hi);
        free(p);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("util");
    TCase *tc = tcase_create("util");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, test_buf_limits);
    tcase_add_test(tc, test_utf8);
    tcase_add_test(tc, test_utf8_incomplete_tail);
    tcase_add_test(tc, test_utf8_inplace_and_errors);
    tcase_add_test(tc, test_base64_round_trip);
    tcase_add_test(tc, test_ids_and_tokens);
    tcase_add_test(tc, test_config);
    tcase_add_test(tc, test_fault_spec);
    tcase_add_test(tc, test_error_mapping);
    tcase_add_test(tc, test_error_mapping_all);
    tcase_add_test(tc, test_paths);
    tcase_add_test(tc, test_listen_spec);
    tcase_add_test(tc, test_pool_bounded);
    tcase_add_test(tc, test_pool_keyed);
    tcase_add_test(tc, test_pool_shared);
    tcase_add_test(tc, test_parallel_run);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
