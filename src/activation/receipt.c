/*
 * receipt.c - where an activation's files are and how they are read: the in-sandbox directory
 * /run/lendbox/<activation id> (read through the provider's files API), the host-side receipt
 * <receipts_dir>/<id>.receipt that the harness supervisor is handed at launch, the daemon's own
 * receipt for a harness never launched, and the receipt's parsing. Shares
 * activation_internal.h.
 */
#include "activation/activation_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"

void act_path(char *buf, size_t size, const struct lb_activation *act, const char *name)
{
    snprintf(buf, size, "%s/%s/%s", ACT_DIR_PARENT, act->id, name);
}

/* Read path inside the sandbox: all of it (-EFBIG past max, with *size set), or with tail
 * the last max bytes. *data is malloc'd and NUL-terminated; *size is the file's size. */
int act_sandbox_read(struct lb_activations *a, const char *sandbox_id, const char *path, size_t max,
                     bool tail, unsigned char **data, size_t *len, uint64_t *size,
                     struct lb_error *err)
{
    unsigned char *buf = NULL;
    uint64_t sz = 0, off = 0;
    size_t want, got = 0;
    int fd = -1, r;

    *data = NULL;
    *len = 0;
    *size = 0;
    r = lend_file_open(a->lend, sandbox_id, path, &fd, &sz, err);
    if (r < 0)
        return r;
    *size = sz;
    if (sz > max && !tail) {
        r = lb_error_set(err, -EFBIG, "'%s' is %llu bytes, over the %zu-byte limit", path,
                         (unsigned long long)sz, max);
        goto out;
    }
    want = sz > max ? max : (size_t)sz;
    off = sz > max ? sz - max : 0;
    buf = malloc(want + 1);
    if (!buf) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    while (got < want) {
        ssize_t n = pread(fd, buf + got, want - got, (off_t)(off + got));

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = lb_error_set(err, -EIO, "cannot read '%s': %s", path, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    *data = buf;
    buf = NULL;
    *len = got;
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    return r;
}

/* The activation's receipt file on the host: <receipts_dir>/<id>.receipt. */
void act_receipt_path(const struct lb_activations *a, const char *act_id, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s.receipt", a->receipts_dir ? a->receipts_dir : ".", act_id);
}

static void launch_mark_path(const struct lb_activations *a, const char *act_id, char *buf,
                             size_t size)
{
    snprintf(buf, size, "%s/%s.launch", a->receipts_dir ? a->receipts_dir : ".", act_id);
}

int act_launch_mark(const struct lb_activations *a, const char *act_id, bool on)
{
    char path[PATH_MAX];
    int fd;

    launch_mark_path(a, act_id, path, sizeof(path));
    if (!on)
        return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    (void)fsync(fd);
    close(fd);
    return 0;
}

bool act_launch_began(const struct lb_activations *a, const char *act_id)
{
    char path[PATH_MAX];
    struct stat st;

    launch_mark_path(a, act_id, path, sizeof(path));
    /* a mark that cannot be looked at counts as made: "fenced" is then not taken */
    return lstat(path, &st) == 0 || errno != ENOENT;
}

void act_receipt_remove(const struct lb_activations *a, const char *act_id)
{
    char path[PATH_MAX];

    (void)act_launch_mark(a, act_id, false);
    act_receipt_path(a, act_id, path, sizeof(path));
    (void)unlink(path);
}

/* Create the (empty) receipt file of a new activation; the fd (O_RDWR) or -errno. */
int act_receipt_create(const struct lb_activations *a, const char *act_id)
{
    char path[PATH_MAX];
    int fd;

    if (!a->receipts_dir)
        return -ENOSYS;
    act_receipt_path(a, act_id, path, sizeof(path));
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    return fd < 0 ? -errno : fd;
}

/* The daemon's own receipt, for an activation whose harness was never launched (a stop won
 * the launch claim): written only while the file is empty or missing (no supervisor ever held
 * it). */
void act_receipt_write_unlaunched(const struct lb_activations *a, const char *act_id,
                                  const char *error)
{
    char path[PATH_MAX];
    json_t *j = json_pack("{s:b,s:n,s:b,s:s?,s:b,s:b}", "cleanup_confirmed", 1, "return_code",
                          "timed_out", 0, "error", error, "launched", 0, "stop_requested", 1);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    struct stat st;
    int fd;

    act_receipt_path(a, act_id, path, sizeof(path));
    /* a close during staging comes before the launch made the file */
    fd = text ? open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600) : -1;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 0) {
        size_t len = strlen(text);

        if (pwrite(fd, text, len, 0) != (ssize_t)len || pwrite(fd, "\n", 1, (off_t)len) != 1)
            log_warn("activation %s: cannot write its receipt: %s", act_id, strerror(errno));
        else
            (void)fsync(fd);
    }
    if (fd >= 0)
        close(fd);
    free(text);
    json_decref(j);
}

/* A receipt's text: 0 and *out (an object), -ENOENT when it is not complete yet (a complete
 * one ends in a newline), -EIO when it cannot be parsed. */
static int parse_receipt(const char *data, size_t len, json_t **out, struct lb_error *err)
{
    json_t *j;

    if (len == 0 || data[len - 1] != '\n')
        return -ENOENT; /* none yet, or still being written */
    j = json_loadb(data, len, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return lb_error_set(err, -EIO,
                            "the harness receipt is unreadable; the launch outcome "
                            "is unknown");
    }
    *out = j;
    return 0;
}

/* Where the activation's harness supervisor writes its receipt inside the sandbox (a provider
 * with receipt_file, no pass_fd: the spec's "receipt_file"), into path; false when it writes
 * to the host-side file. */
static bool receipt_in_sandbox(const struct lb_activation *act, char *path, size_t size)
{
    json_t *spec = act->spec_json ? json_loads(act->spec_json, 0, NULL) : NULL;
    const char *p = json_string_value(json_object_get(spec, "receipt_file"));
    bool in = p && (size_t)snprintf(path, size, "%s", p) < size;

    json_decref(spec);
    return in;
}

/* The receipt in the sandbox (receipt_in_sandbox), read through the provider's files API.
 * Errors as act_read_receipt; a provider that does not answer (a member down, the sandbox
 * stopping) reads as "none yet": the caller's bounded wait decides. */
static int read_receipt_in_sandbox(struct lb_activations *a, const struct lb_activation *act,
                                   const char *path, json_t **out, struct lb_error *err)
{
    unsigned char *data = NULL;
    size_t len = 0;
    uint64_t size = 0;
    struct lb_error rerr = {0};
    int r = act_sandbox_read(a, act->sandbox_id, path, RECEIPT_MAX - 1, false, &data, &len, &size,
                             &rerr);

    if (r == -EFBIG)
        r = lb_error_set(err, -EIO, "the harness receipt is too big");
    else if (r < 0)
        r = -ENOENT;
    else
        r = parse_receipt((const char *)data, len, out, err);
    free(data);
    return r;
}

/* The receipt of the harness supervisor: 0 and *out (an object), -ENOENT while there is none
 * or it is not complete yet (a complete one ends in a newline), -EIO when it cannot be
 * parsed. First the host-side file (the one it was handed at launch, which nothing in the
 * sandbox can reach, or the daemon's own for a harness never launched); then, only for an
 * activation whose supervisor writes inside the sandbox (receipt_file providers), that file.
 * Otherwise nothing under the sandbox's /run/lendbox is read. */
int act_read_receipt(struct lb_activations *a, const struct lb_activation *act, json_t **out,
                     struct lb_error *err)
{
    char path[PATH_MAX], *data = NULL;
    ssize_t n;
    size_t len = 0;
    int fd, r = 0;

    *out = NULL;
    act_receipt_path(a, act->id, path, sizeof(path));
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT)
        return receipt_in_sandbox(act, path, sizeof(path))
                   ? read_receipt_in_sandbox(a, act, path, out, err)
                   : -ENOENT;
    if (fd < 0)
        return lb_error_set(err, -EIO, "cannot open the harness receipt: %s", strerror(errno));
    data = malloc(RECEIPT_MAX + 1);
    if (!data) {
        close(fd);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    while (len < RECEIPT_MAX && (n = pread(fd, data + len, RECEIPT_MAX - len, (off_t)len)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = lb_error_set(err, -EIO, "cannot read the harness receipt: %s", strerror(errno));
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    if (r == 0 && len == RECEIPT_MAX)
        r = lb_error_set(err, -EIO, "the harness receipt is too big");
    if (r == 0)
        r = parse_receipt(data, len, out, err);
    free(data);
    if (r == -ENOENT && receipt_in_sandbox(act, path, sizeof(path)))
        r = read_receipt_in_sandbox(a, act, path, out, err);
    return r;
}

bool act_receipt_confirmed(const json_t *receipt)
{
    return json_is_true(json_object_get(receipt, "cleanup_confirmed"));
}
