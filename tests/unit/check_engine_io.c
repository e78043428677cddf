/* check_engine_io.c - unit tests for what the engine providers (docker, lxd) share: the framed
 * reader (src/provider/engine/framed.c: frames split at every byte boundary, caps, cut markers,
 * status lines, foreign frames), the status-line parser every provider uses
 * (src/provider/exec_result.c) and httpc_new_https's refusals (src/provider/engine/httpc.c: no
 * usable certificate, key or pin means no client). The transport itself is covered end to end
 * by tests/e2e/test_docker.c and test_lxd.c. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "provider/engine/framed.h"
#include "provider/engine/httpc.h"
#include "provider/exec_result.h"

/* Append one frame (type, big-endian length, payload) to buf at *len. */
static void frame(unsigned char *buf, size_t *len, char type, const char *payload, size_t n)
{
    buf[(*len)++] = (unsigned char)type;
    buf[(*len)++] = (unsigned char)(n >> 24);
    buf[(*len)++] = (unsigned char)(n >> 16);
    buf[(*len)++] = (unsigned char)(n >> 8);
    buf[(*len)++] = (unsigned char)n;
    memcpy(buf + *len, payload, n);
    *len += n;
}

static void result_init(struct lb_exec_result *res, size_t cap)
{
    memset(res, 0, sizeof(*res));
    lb_buf_init(&res->out, cap);
    lb_buf_init(&res->err, cap);
}

START_TEST(test_framed_any_split)
{
    unsigned char stream[256];
    size_t len = 0;

    frame(stream, &len, 'o', "hello ", 6);
    frame(stream, &len, 'e', "warn\n", 5);
    frame(stream, &len, 'o', "", 0);
    frame(stream, &len, 'o', "world", 5);
    frame(stream, &len, 's', "exit 3", 6);
    /* every split point of the stream into two feeds gives the same result */
    for (size_t cut = 0; cut <= len; cut++) {
        struct lb_exec_result res;
        struct lb_framed_reader x;

        result_init(&res, 1024);
        framed_reader_init(&x, &res);
        framed_reader_feed(&x, stream, cut);
        framed_reader_feed(&x, stream + cut, len - cut);
        ck_assert(framed_reader_complete(&x));
        framed_reader_apply_status(&x);
        ck_assert_int_eq(res.return_code, 3);
        ck_assert_int_eq(res.error_type, LB_EXEC_OK);
        ck_assert_uint_eq(res.out.len, 11);
        ck_assert_mem_eq(res.out.data, "hello world", 11);
        ck_assert_uint_eq(res.err.len, 5);
        ck_assert_mem_eq(res.err.data, "warn\n", 5);
        provider_exec_result_release(&res);
    }
}
END_TEST

START_TEST(test_framed_statuses)
{
    static const struct {
        const char *line;
        int code;
        enum lb_exec_error type;
    } cases[] = {
        {"exit 0", 0, LB_EXEC_OK},
        {"signal 9", 137, LB_EXEC_OK},
        {"timeout", LB_RETURN_CODE_RUNTIME, LB_EXEC_TIMEOUT},
        {"error cwd '/nope' does not exist", LB_RETURN_CODE_RUNTIME, LB_EXEC_SANDBOX},
        {"gibberish", LB_RETURN_CODE_RUNTIME, LB_EXEC_SANDBOX},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned char stream[128];
        size_t len = 0;
        struct lb_exec_result res;
        struct lb_framed_reader x;

        frame(stream, &len, 's', cases[i].line, strlen(cases[i].line));
        result_init(&res, 1024);
        framed_reader_init(&x, &res);
        framed_reader_feed(&x, stream, len);
        ck_assert(framed_reader_complete(&x));
        framed_reader_apply_status(&x);
        ck_assert_int_eq(res.return_code, cases[i].code);
        ck_assert_int_eq(res.error_type, cases[i].type);
        if (cases[i].type == LB_EXEC_SANDBOX && strncmp(cases[i].line, "error ", 6) == 0) {
            ck_assert_str_eq(res.message, "cwd '/nope' does not exist");
            ck_assert_mem_eq(res.err.data, "cwd '/nope' does not exist\n", res.err.len);
        }
        provider_exec_result_release(&res);
    }
}
END_TEST

/* The one status-line parser: its forms, and the same result whichever provider reads it. */
START_TEST(test_exec_status_parse)
{
    struct lb_exec_status st;

    ck_assert_int_eq(exec_status_parse("exit 3", &st), 0);
    ck_assert_int_eq(st.kind, LB_EXEC_STATUS_EXIT);
    ck_assert_int_eq(st.value, 3);
    ck_assert_int_eq(exec_status_parse("signal 9", &st), 0);
    ck_assert_int_eq(st.kind, LB_EXEC_STATUS_SIGNAL);
    ck_assert_int_eq(st.value, 9);
    ck_assert_int_eq(exec_status_parse("timeout", &st), 0);
    ck_assert_int_eq(st.kind, LB_EXEC_STATUS_TIMEOUT);
    ck_assert_int_eq(exec_status_parse("error cannot fork", &st), 0);
    ck_assert_int_eq(st.kind, LB_EXEC_STATUS_ERROR);
    ck_assert_str_eq(st.text, "cannot fork");
    ck_assert_int_eq(exec_status_parse("timeouts", &st), -EINVAL);
    ck_assert_int_eq(st.kind, LB_EXEC_STATUS_UNREADABLE);
    ck_assert_int_eq(exec_status_parse("exit", &st), -EINVAL);
    ck_assert_int_eq(exec_status_parse("", &st), -EINVAL);
}
END_TEST

static void upper_text(const char *in, char *out, size_t size)
{
    size_t i;

    for (i = 0; in[i] && i + 1 < size; i++)
        out[i] = (char)(in[i] >= 'a' && in[i] <= 'z' ? in[i] - 32 : in[i]);
    out[i] = '\0';
}

START_TEST(test_exec_result_status_lines)
{
    unsigned char stream[128];
    size_t len = 0;
    struct lb_exec_result res;
    struct lb_framed_reader x;

    /* an error after stderr that ends mid-line: the error is a line of its own (as the local
     * provider always gave it), on the framed path too */
    frame(stream, &len, 'e', "partial", 7);
    frame(stream, &len, 's', "error cannot fork", 17);
    result_init(&res, 1024);
    framed_reader_init(&x, &res);
    framed_reader_feed(&x, stream, len);
    ck_assert(framed_reader_complete(&x));
    framed_reader_apply_status(&x);
    ck_assert_int_eq(res.return_code, LB_RETURN_CODE_RUNTIME);
    ck_assert_int_eq(res.error_type, LB_EXEC_SANDBOX);
    ck_assert_str_eq(res.message, "cannot fork");
    ck_assert_uint_eq(res.err.len, strlen("partial\ncannot fork\n"));
    ck_assert_mem_eq(res.err.data, "partial\ncannot fork\n", res.err.len);
    provider_exec_result_release(&res);

    /* the text goes through the provider's rewrite, into the message and stderr alike */
    result_init(&res, 1024);
    exec_result_apply_status(&res, "error cannot fork", upper_text);
    ck_assert_str_eq(res.message, "CANNOT FORK");
    ck_assert_mem_eq(res.err.data, "CANNOT FORK\n", res.err.len);
    provider_exec_result_release(&res);

    /* unreadable: a runtime result that quotes the line and says so on stderr */
    result_init(&res, 1024);
    exec_result_apply_status(&res, "gibberish", NULL);
    ck_assert_int_eq(res.return_code, LB_RETURN_CODE_RUNTIME);
    ck_assert_int_eq(res.error_type, LB_EXEC_SANDBOX);
    ck_assert_str_eq(res.message, "unreadable status from the supervisor: gibberish");
    ck_assert_uint_eq(res.err.len,
                      strlen("lendbox: unreadable status from the supervisor: gibberish\n"));
    ck_assert_mem_eq(res.err.data, "lendbox: unreadable status from the supervisor: gibberish\n",
                     res.err.len);
    provider_exec_result_release(&res);

    /* timeout */
    result_init(&res, 1024);
    exec_result_apply_status(&res, "timeout", NULL);
    ck_assert_int_eq(res.return_code, LB_RETURN_CODE_RUNTIME);
    ck_assert_int_eq(res.error_type, LB_EXEC_TIMEOUT);
    ck_assert_str_eq(res.message,
                     "the command did not end within its timeout; its process tree was killed");
    ck_assert_uint_eq(res.err.len, 0);
    provider_exec_result_release(&res);
}
END_TEST

START_TEST(test_framed_caps_cuts_and_foreign)
{
    unsigned char stream[256];
    size_t len = 0;
    struct lb_exec_result res;
    struct lb_framed_reader x;

    frame(stream, &len, 'o', "0123456789", 10);
    frame(stream, &len, 'T', "o", 1);
    frame(stream, &len, 's', "exit 0", 6);
    result_init(&res, 4);
    framed_reader_init(&x, &res);
    framed_reader_feed(&x, stream, len);
    ck_assert(framed_reader_complete(&x));
    ck_assert_uint_eq(res.out.len, 4);
    ck_assert(res.out.truncated);
    ck_assert(!res.err.truncated);
    provider_exec_result_release(&res);

    /* no status frame: incomplete (the supervisor died); a foreign frame type: not the protocol */
    len = 0;
    frame(stream, &len, 'o', "x", 1);
    result_init(&res, 64);
    framed_reader_init(&x, &res);
    framed_reader_feed(&x, stream, len);
    ck_assert(!framed_reader_complete(&x));
    frame(stream, &len, 'Z', "?", 1);
    frame(stream, &len, 's', "exit 0", 6);
    framed_reader_init(&x, &res);
    framed_reader_feed(&x, stream, len);
    ck_assert(!framed_reader_complete(&x));
    provider_exec_result_release(&res);
}
END_TEST

START_TEST(test_https_refusals)
{
    struct lb_httpc_tls tls = {.cert = "/nonexistent.crt",
                               .key = "/nonexistent.key",
                               .server_cert = "/nonexistent-server.crt"};
    struct lb_error err = {0};
    struct lb_httpc *c = NULL;
    char dir[] = "/tmp/check-engine-io-XXXXXX", path[128];
    FILE *f;

    ck_assert_int_eq(httpc_new_https("http://10.0.0.1:8443", &tls, "", &c, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.message, "https://host:port"));
    lb_error_clear(&err);
    ck_assert_int_eq(httpc_new_https("https://10.0.0.1:8443/x", &tls, "", &c, &err), -EINVAL);
    lb_error_clear(&err);
    ck_assert_int_eq(httpc_new_https("https://10.0.0.1:8443", NULL, "", &c, &err), -EINVAL);
    lb_error_clear(&err);
    ck_assert_int_eq(httpc_new_https("https://10.0.0.1:8443", &tls, "", &c, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.message, "/nonexistent.crt"));
    lb_error_clear(&err);
    /* readable files, but the server's "certificate" is no PEM certificate: no pin, no client */
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/not-a-cert.pem", dir);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", f);
    fclose(f);
    tls.cert = path;
    tls.key = path;
    tls.server_cert = path;
    ck_assert_int_eq(httpc_new_https("https://10.0.0.1:8443", &tls, "", &c, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.message, "not a PEM certificate"));
    ck_assert_ptr_null(c);
    unlink(path);
    rmdir(dir);
}
END_TEST

static Suite *engine_io_suite(void)
{
    Suite *s = suite_create("engine_io");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_framed_any_split);
    tcase_add_test(tc, test_framed_statuses);
    tcase_add_test(tc, test_framed_caps_cuts_and_foreign);
    tcase_add_test(tc, test_exec_status_parse);
    tcase_add_test(tc, test_exec_result_status_lines);
    tcase_add_test(tc, test_https_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(engine_io_suite());
    int failed;

    httpc_global_init();
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
