/*
 * test_stream.c - acceptance of streamed exec output: POST .../exec with
 * "Accept: application/x-ndjson" against the real daemon and a real bubblewrap sandbox, read
 * line by line with libcurl as the bytes arrive (each line stamped with its arrival time).
 *
 * Proves: the first chunk arrives while the command still runs; chunks concatenate to the
 * stdout of a plain exec (also across a UTF-8 sequence split between two writes, and
 * byte-exact with "encoding": "base64"); stderr has chunks of its own; the output cap and the
 * timeout apply; errors found before the command runs keep their plain JSON status; a client
 * that hangs up mid-stream costs nothing else (other execs run, the command's processes end,
 * the daemon exits 0, which under make asan includes LeakSanitizer's verdict).
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define OUTPUT_CAP 4096 /* limits.max_output_bytes of this suite's daemon */

static struct lbt_daemon D;
static char SBX[128];

static const char *const ARGS[] = {"--set", "limits.max_output_bytes=4096", NULL};

static void seed(void)
{
    json_t *lease = lbt_seed(&D, "stream-1", "task-stream", NULL);

    snprintf(SBX, sizeof(SBX), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
}

/* A streamed exec: the lines as they came, each with its arrival time. */
#define MAX_LINES 512
struct ndjson {
    double t0;
    double at[MAX_LINES];
    json_t *line[MAX_LINES];
    int n;
    char partial[1 << 20];
    size_t plen;
    int stop_after; /* > 0: hang up after this many lines */
    long status;
    char content_type[128];
    CURLcode rc;
};

static size_t ndjson_write(char *p, size_t sz, size_t nmemb, void *ud)
{
    struct ndjson *x = ud;
    size_t k = sz * nmemb;
    char *nl;

    ck_assert_msg(x->plen + k < sizeof(x->partial), "a line longer than 1 MiB");
    memcpy(x->partial + x->plen, p, k);
    x->plen += k;
    x->partial[x->plen] = '\0';
    while ((nl = memchr(x->partial, '\n', x->plen))) {
        size_t len = (size_t)(nl - x->partial);
        json_error_t e;

        ck_assert_int_lt(x->n, MAX_LINES);
        x->line[x->n] = json_loadb(x->partial, len, 0, &e);
        ck_assert_msg(x->line[x->n], "line %d is not JSON: %.*s", x->n, (int)len, x->partial);
        x->at[x->n++] = lbt_now();
        memmove(x->partial, nl + 1, x->plen - len - 1);
        x->plen -= len + 1;
        if (x->stop_after && x->n >= x->stop_after)
            return 0; /* hang up */
    }
    return k;
}

static void exec_ndjson_on(struct lbt_daemon *d, const char *sbx, const char *body_json,
                           int stop_after, struct ndjson *x)
{
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    char url[512], auth[300];
    char *ct = NULL;

    memset(x, 0, sizeof(*x));
    x->stop_after = stop_after;
    snprintf(url, sizeof(url), "%s/v1/sandboxes/%s/exec", d->base_url, sbx);
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", d->admin_token);
    h = curl_slist_append(h, auth);
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: application/x-ndjson");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body_json);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, ndjson_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    x->t0 = lbt_now();
    x->rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &x->status);
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(x->content_type, sizeof(x->content_type), "%s", ct ? ct : "");
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
}

static void exec_ndjson(const char *body_json, int stop_after, struct ndjson *x)
{
    exec_ndjson_on(&D, SBX, body_json, stop_after, x);
}

static void ndjson_free(struct ndjson *x)
{
    for (int i = 0; i < x->n; i++)
        json_decref(x->line[i]);
    x->n = 0;
}

/* Assert the shape of a whole stream: 200 NDJSON, chunk lines, then one result line; return
 * the concatenated data of stream name (malloc'd; base64 chunks decoded), length in *len. */
static char *ndjson_concat(struct ndjson *x, const char *name, bool base64, size_t *len)
{
    char *all = calloc(1, 1);
    size_t n = 0;

    ck_assert_int_eq(x->rc, CURLE_OK);
    ck_assert_int_eq(x->status, 200);
    ck_assert_str_eq(x->content_type, "application/x-ndjson");
    ck_assert_int_ge(x->n, 1);
    for (int i = 0; i < x->n - 1; i++) {
        json_t *l = x->line[i];
        const char *s = json_string_value(json_object_get(l, "stream"));
        const char *d = json_string_value(json_object_get(l, "data"));
        size_t dl = json_string_length(json_object_get(l, "data"));

        ck_assert_msg(s && d && json_object_size(l) == 2, "line %d is not a chunk", i);
        ck_assert_msg(!strcmp(s, "stdout") || !strcmp(s, "stderr"), "stream '%s'", s);
        ck_assert_uint_gt(dl, 0);
        if (strcmp(s, name))
            continue;
        if (base64) {
            size_t bl = 0;
            unsigned char *b = lbt_b64_decode(d, &bl);

            ck_assert_ptr_nonnull(b);
            all = realloc(all, n + bl + 1);
            memcpy(all + n, b, bl);
            n += bl;
            free(b);
        } else {
            all = realloc(all, n + dl + 1);
            memcpy(all + n, d, dl);
            n += dl;
        }
        all[n] = '\0';
    }
    /* the last line is the result object, its output already sent in the chunks */
    ck_assert_msg(json_is_integer(json_object_get(x->line[x->n - 1], "return_code")),
                  "the last line is not a result");
    ck_assert(json_is_null(json_object_get(x->line[x->n - 1], "stdout")));
    ck_assert(json_is_null(json_object_get(x->line[x->n - 1], "stderr")));
    if (len)
        *len = n;
    return all;
}

static json_t *last(struct ndjson *x)
{
    return x->line[x->n - 1];
}

START_TEST(test_first_chunk_before_the_end)
{
    static const char cmd[] =
        "{\"command\": \"for i in 1 2 3; do echo $i; sleep 1; done\", \"timeout_s\": 30}";
    struct ndjson x;
    json_t *plain;
    char *out;
    double first = -1, end;
    int64_t duration_ms;

    exec_ndjson(cmd, 0, &x);
    out = ndjson_concat(&x, "stdout", false, NULL);
    ck_assert_str_eq(out, "1\n2\n3\n");
    ck_assert_int_eq(json_integer_value(json_object_get(last(&x), "return_code")), 0);
    ck_assert(json_is_null(json_object_get(last(&x), "error_type")));
    ck_assert(json_is_false(json_object_get(last(&x), "stdout_truncated")));
    duration_ms = json_integer_value(json_object_get(last(&x), "duration_ms"));
    ck_assert_int_ge(duration_ms, 2500); /* the command sleeps 3 s */
    for (int i = 0; i < x.n - 1 && first < 0; i++)
        first = x.at[i];
    end = x.at[x.n - 1];
    /* "1" is written at once and the command runs 2 s more: the first chunk must come well
     * before the result (half the command's own remaining time as the margin) */
    ck_assert_msg(end - first >= 1.0, "first chunk %.3f s, result %.3f s after the request",
                  first - x.t0, end - x.t0);
    /* the same command, plain JSON: the same stdout */
    plain = lbt_exec_ok(&D, SBX, "", cmd);
    ck_assert_str_eq(json_string_value(json_object_get(plain, "stdout")), out);
    json_decref(plain);
    free(out);
    ndjson_free(&x);
}
END_TEST

START_TEST(test_stderr_and_utf8_split)
{
    /* é (c3 a9) split across two writes with a pause between, then an invalid byte; stderr
     * on its own stream */
    static const char cmd[] = "{\"command\": \"printf 'a\\\\303'; sleep 0.5; printf "
                              "'\\\\251b\\\\377c'; echo oops >&2; exit 3\"}";
    struct ndjson x;
    json_t *plain;
    char *out, *err;

    exec_ndjson(cmd, 0, &x);
    out = ndjson_concat(&x, "stdout", false, NULL);
    err = ndjson_concat(&x, "stderr", false, NULL);
    ck_assert_str_eq(out, "a\xc3\xa9"
                          "b\xef\xbf\xbd"
                          "c");
    ck_assert_str_eq(err, "oops\n");
    ck_assert_int_eq(json_integer_value(json_object_get(last(&x), "return_code")), 3);
    plain = lbt_exec_ok(&D, SBX, "", cmd);
    ck_assert_str_eq(json_string_value(json_object_get(plain, "stdout")), out);
    ck_assert_str_eq(json_string_value(json_object_get(plain, "stderr")), err);
    json_decref(plain);
    free(out);
    free(err);
    ndjson_free(&x);
}
END_TEST

START_TEST(test_base64_chunks_are_byte_exact)
{
    static const char cmd[] = "{\"command\": \"printf '\\\\000\\\\377\\\\303'; sleep 0.3; printf "
                              "'\\\\251\\\\n'\", \"encoding\": \"base64\"}";
    struct ndjson x;
    size_t n = 0;
    char *out;

    exec_ndjson(cmd, 0, &x);
    out = ndjson_concat(&x, "stdout", true, &n);
    ck_assert_uint_eq(n, 5);
    ck_assert(memcmp(out, "\x00\xff\xc3\xa9\n", 5) == 0);
    free(out);
    ndjson_free(&x);
}
END_TEST

START_TEST(test_cap_applies)
{
    struct ndjson x;
    size_t n = 0;
    char *out;

    exec_ndjson("{\"command\": \"head -c 100000 /dev/zero | tr '\\\\0' a; echo done >&2\"}", 0, &x);
    out = ndjson_concat(&x, "stdout", false, &n);
    ck_assert_uint_eq(n, OUTPUT_CAP);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(out[i], 'a');
    ck_assert(json_is_true(json_object_get(last(&x), "stdout_truncated")));
    ck_assert(json_is_false(json_object_get(last(&x), "stderr_truncated")));
    ck_assert_int_eq(json_integer_value(json_object_get(last(&x), "return_code")), 0);
    free(out);
    ndjson_free(&x);
}
END_TEST

START_TEST(test_timeout_applies)
{
    struct ndjson x;
    char *out;

    exec_ndjson("{\"command\": \"echo start; sleep 30.417; echo never\", \"timeout_s\": 1}", 0, &x);
    out = ndjson_concat(&x, "stdout", false, NULL);
    ck_assert_str_eq(out, "start\n");
    ck_assert_int_eq(json_integer_value(json_object_get(last(&x), "return_code")), 125);
    ck_assert_str_eq(json_string_value(json_object_get(last(&x), "error_type")), "timeout");
    ck_assert_uint_eq(lbt_count_procs_cmdline("sleep 30.417"), 0);
    free(out);
    ndjson_free(&x);
}
END_TEST

START_TEST(test_errors_before_start_are_plain)
{
    struct lbt_resp r;
    const char *hdr[] = {"Accept: application/x-ndjson", NULL};
    static const char body[] = "{\"command\": \"echo hi\"}";

    lbt_request_ex(&D, "POST", "/v1/sandboxes/sbx-nosuchsandbox0000000000000/exec", "", body,
                   strlen(body), NULL, hdr, false, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_request_ex(&D, "POST", "/v1/sandboxes/x/exec", "", "{\"command\": 3}", 14, NULL, hdr, false,
                   &r);
    ck_assert_int_eq(r.status, 400);
    lbt_resp_free(&r);
}
END_TEST

/* On a daemon of its own, stopped at the end: exit 0 (under make asan: no leak either). */
START_TEST(test_client_hangs_up_mid_stream)
{
    static const char marker[] = "echo first; sleep 3.0417";
    struct lbt_daemon d;
    struct ndjson x;
    struct lbt_async *other;
    struct lbt_resp r;
    char sbx[128], path[256];
    json_t *lease, *res;
    double until;

    lbt_daemon_start(&d, NULL);
    lease = lbt_seed(&d, "stream-hangup", "task-stream", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    /* another exec of the same sandbox runs meanwhile and must not notice */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", sbx);
    other = lbt_async_json(&d, "POST", path, "", "{\"command\": \"sleep 2; echo other\"}");
    exec_ndjson_on(&d, sbx,
                   "{\"command\": \"echo first; sleep 3.0417; echo second; sleep 3\", "
                   "\"timeout_s\": 20}",
                   1, &x);
    ck_assert_int_eq(x.rc, CURLE_WRITE_ERROR); /* we hung up after the first line */
    ck_assert_int_eq(x.n, 1);
    ck_assert_str_eq(json_string_value(json_object_get(x.line[0], "data")), "first\n");
    ndjson_free(&x);
    lbt_async_join(other, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "stdout")), "other\n");
    lbt_resp_free(&r);
    lbt_assert_healthy(&d);
    /* the abandoned command ends on its own (not left behind) */
    until = lbt_now() + 20;
    while (lbt_count_procs_cmdline(marker) > 0 && lbt_now() < until)
        lbt_sleep_ms(100);
    ck_assert_int_eq(lbt_count_procs_cmdline(marker), 0);
    /* the sandbox still execs, also streamed */
    res = lbt_exec_ok(&d, sbx, "", "{\"command\": \"echo after\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "after\n");
    json_decref(res);
    {
        char *out;

        exec_ndjson_on(&d, sbx, "{\"command\": \"echo streamed\"}", 0, &x);
        out = ndjson_concat(&x, "stdout", false, NULL);
        ck_assert_str_eq(out, "streamed\n");
        free(out);
        ndjson_free(&x);
    }
    ck_assert_int_eq(lbt_daemon_stop(&d), 0);
    lbt_daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stream");
    TCase *tc = tcase_create("stream");

    /* stop_clean: a clean exit (0) also means no leak report under make asan */
    lbt_fixture_add(
        tc, &(struct lbt_fixture){.d = &D, .args = ARGS, .seed = seed, .stop_clean = true}, true);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_first_chunk_before_the_end);
    tcase_add_test(tc, test_stderr_and_utf8_split);
    tcase_add_test(tc, test_base64_chunks_are_byte_exact);
    tcase_add_test(tc, test_cap_applies);
    tcase_add_test(tc, test_timeout_applies);
    tcase_add_test(tc, test_errors_before_start_are_plain);
    suite_add_tcase(s, tc);
    tc = tcase_create("hangup");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_client_hangs_up_mid_stream);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
