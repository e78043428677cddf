/*
 * engine_archive.c - the engine base's archive_put and archive_get (provider.h): a directory
 * of an instance in and out as a tar archive.
 *
 * Put. The daemon reads the body with libarchive and checks every entry by the local
 * provider's rules before anything reaches the engine: names relative, without "..";
 * symlink targets relative and, read from the link's directory, never above DIR; no entry
 * below a symlink or a file of the archive; hard links only to an earlier regular file; no
 * device node, FIFO or socket; a directory and a non-directory of one name refused. The entries
 * are re-written into a clean pax archive in the spool dir (owners 0, setuid and setgid
 * dropped), bounded by max_bytes of file contents and PROVIDER_ARCHIVE_MAX_ENTRIES headers; only
 * when the whole body passed does the backend's archive_put hook take the clean archive.
 *
 * Get. The backend's archive_get hook hands each entry to a struct lb_tar_out (tar_out.h), which
 * writes a pax archive to the caller's fd, bounded by max_bytes and the entry count.
 */
#include "provider/engine/engine.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uthash.h>

/* ---------- the names an archive holds ---------- */

enum kind { KIND_DIR = 'd', KIND_FILE = 'f', KIND_LINK = 'l' };

struct name_entry {
    UT_hash_handle hh;
    char kind;
    char name[]; /* the key */
};

/* uthash, the names' bytes bounded by PROVIDER_ARCHIVE_MAX_NAME_BYTES */
struct name_set {
    struct name_entry *table;
    size_t bytes;
};

/* Record the first n bytes of name as kind: 0, -ENOMEM, or -EFBIG past the names' bound. */
static int set_put(struct name_set *s, const char *name, size_t n, char kind)
{
    struct name_entry *e = NULL;

    HASH_FIND(hh, s->table, name, n, e);
    if (e) {
        e->kind = kind;
        return 0;
    }
    if (n > PROVIDER_ARCHIVE_MAX_NAME_BYTES - s->bytes)
        return -EFBIG;
    e = malloc(sizeof(*e) + n + 1);
    if (!e)
        return -ENOMEM;
    memcpy(e->name, name, n);
    e->name[n] = '\0';
    e->kind = kind;
    HASH_ADD(hh, s->table, name[0], n, e);
    s->bytes += n;
    return 0;
}

static char set_kind(struct name_set *s, const char *name, size_t n)
{
    struct name_entry *e = NULL;

    HASH_FIND(hh, s->table, name, n, e);
    return e ? e->kind : 0;
}

static void set_free(struct name_set *s)
{
    struct name_entry *e, *tmp;

    HASH_ITER(hh, s->table, e, tmp) {
        HASH_DEL(s->table, e);
        free(e);
    }
    *s = (struct name_set){0};
}

/* A failure of set_put as an answer. */
static int set_failed(int r, struct lb_error *err)
{
    if (r == -EFBIG)
        return lb_error_set(err, -EFBIG,
                            "the archive's names hold more than %u bytes; nothing of it was kept",
                            PROVIDER_ARCHIVE_MAX_NAME_BYTES);
    return lb_error_set(err, -ENOMEM, "out of memory");
}

/* ---------- put ---------- */

struct check_state {
    struct archive *in, *out;
    struct archive_entry *clean;
    const char *dir;
    uint64_t max_bytes, sized;
    struct name_set names;
    uint64_t headers;      /* every header read, bounded by PROVIDER_ARCHIVE_MAX_ENTRIES */
    size_t dir_name_bytes; /* directory entries' names, bounded by ..._MAX_NAME_BYTES */
    struct engine_archive_tops tops;
    struct lb_archive_result res;
};

static int refuse(const struct check_state *s, const char *name, const char *why,
                  struct lb_error *err)
{
    return lb_error_set(err, -EINVAL,
                        "archive entry '%s' is refused: %s (nothing of it was kept in '%s')", name,
                        why, s->dir);
}

static int too_big(const struct check_state *s, struct lb_error *err)
{
    return lb_error_set(err, -EFBIG,
                        "the archive's files hold more than %llu bytes (limits.max_file_bytes); "
                        "nothing of it was kept",
                        (unsigned long long)s->max_bytes);
}

static int add_top(struct check_state *s, const char *name)
{
    size_t n = strcspn(name, "/");
    char **v;

    for (size_t i = 0; i < s->tops.n; i++)
        if (strlen(s->tops.names[i]) == n && memcmp(s->tops.names[i], name, n) == 0)
            return 0;
    if (s->tops.n >= ENGINE_ARCHIVE_MAX_TOPS) {
        s->tops.overflow = true;
        return 0;
    }
    v = realloc(s->tops.names, (s->tops.n + 1) * sizeof(*v));
    if (!v)
        return -ENOMEM;
    s->tops.names = v;
    if (!(v[s->tops.n] = strndup(name, n)))
        return -ENOMEM;
    s->tops.n++;
    return 0;
}

/* The parents of name: none may be a file or a symlink of the archive; each is remembered as a
 * directory (one the archive only implies). */
static int check_parents(struct check_state *s, const char *name, struct lb_error *err)
{
    for (const char *c = strchr(name, '/'); c; c = strchr(c + 1, '/')) {
        size_t n = (size_t)(c - name);
        char k = set_kind(&s->names, name, n);
        int r;

        if (k == KIND_FILE || k == KIND_LINK)
            return refuse(s, name,
                          "a parent of it is not a directory of the archive (no entry is written "
                          "through a symlink)",
                          err);
        if (!k && (r = set_put(&s->names, name, n, KIND_DIR)) < 0)
            return set_failed(r, err);
    }
    return 0;
}

static int copy_data(struct check_state *s, const char *name, int64_t size, struct lb_error *err)
{
    static const char zeros[4096];
    const void *buf;
    size_t len;
    la_int64_t off;
    int64_t pos = 0;
    int ar;

    for (;;) {
        ar = archive_read_data_block(s->in, &buf, &len, &off);
        if (ar == ARCHIVE_EOF)
            break;
        if (ar < ARCHIVE_WARN)
            return lb_error_set(err, -EINVAL, "the archive is damaged at entry '%s': %s", name,
                                archive_error_string(s->in));
        if (off < pos || (int64_t)len > size - off)
            return lb_error_set(err, -EINVAL, "the archive is damaged at entry '%s'", name);
        if (len > s->max_bytes - s->res.bytes)
            return too_big(s, err);
        while (pos < off) { /* a sparse entry's hole: zeros in the clean archive */
            size_t z = (size_t)(off - pos) < sizeof(zeros) ? (size_t)(off - pos) : sizeof(zeros);

            if (archive_write_data(s->out, zeros, z) != (la_ssize_t)z)
                goto spool;
            pos += (int64_t)z;
        }
        if (len > 0 && archive_write_data(s->out, buf, len) != (la_ssize_t)len)
            goto spool;
        pos += (int64_t)len;
        s->res.bytes += len;
    }
    while (pos < size) {
        size_t z = (size_t)(size - pos) < sizeof(zeros) ? (size_t)(size - pos) : sizeof(zeros);

        if (archive_write_data(s->out, zeros, z) != (la_ssize_t)z)
            goto spool;
        pos += (int64_t)z;
    }
    return 0;
spool:
    return lb_error_set(err, -EIO, "cannot spool the checked archive: %s",
                        archive_error_string(s->out));
}

/* One entry of the body (its header read): checked, then written to the clean archive. */
static int check_entry(struct check_state *s, struct archive_entry *e, struct lb_error *err)
{
    char name[4097], target[4097];
    const char *raw = archive_entry_pathname(e), *hard = archive_entry_hardlink(e);
    mode_t type = archive_entry_filetype(e), perm = archive_entry_perm(e);
    int64_t size = 0;
    char kind, had;
    int r;

    /* every header counts, the root's and the repeated ones too: a gzip body of nothing but
     * "./" headers would otherwise keep a worker inflating for as long as its ratio allows */
    if (++s->headers > PROVIDER_ARCHIVE_MAX_ENTRIES)
        return lb_error_set(err, -EFBIG, "the archive has more than %d entries",
                            PROVIDER_ARCHIVE_MAX_ENTRIES);
    r = provider_archive_name_normalise(raw, name, sizeof(name), PROVIDER_ARCHIVE_MAX_DEPTH);
    if (r < 0)
        return refuse(s, raw ? raw : "",
                      "names must be relative, without '..', at most 256 levels deep", err);
    if (r == 1) /* the archive's root: DIR itself */
        return 0;
    if (hard && (provider_archive_name_normalise(hard, target, sizeof(target),
                                                 PROVIDER_ARCHIVE_MAX_DEPTH) != 0 ||
                 set_kind(&s->names, target, strlen(target)) != KIND_FILE))
        return refuse(s, name, "a hard link must name an earlier regular file of the archive", err);
    if (!hard && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK)
        return refuse(s, name,
                      "only directories, regular files, symlinks and hard links are taken (no "
                      "device nodes, FIFOs or sockets)",
                      err);
    if (!hard && type == AE_IFLNK) {
        const char *t = archive_entry_symlink(e);

        if (!t || !provider_archive_link_inside(name, t))
            return refuse(s, name,
                          "a symlink's target must be relative and stay inside the directory", err);
    }
    s->res.entries++;
    r = check_parents(s, name, err);
    if (r < 0)
        return r;
    kind = hard || type == AE_IFREG ? KIND_FILE : type == AE_IFDIR ? KIND_DIR : KIND_LINK;
    had = set_kind(&s->names, name, strlen(name));
    if (had && (had == KIND_DIR) != (kind == KIND_DIR))
        return refuse(s, name,
                      "it clashes with an earlier entry of the archive (a directory and a "
                      "non-directory of the same name)",
                      err);
    /* a directory entry repeated (a small gzip body can repeat a 4 KiB name for every entry)
     * costs a header in the clean archive each time: bounded as the local provider bounds the
     * directory names it keeps */
    if (kind == KIND_DIR && strlen(name) + 1 > PROVIDER_ARCHIVE_MAX_NAME_BYTES - s->dir_name_bytes)
        return lb_error_set(err, -EFBIG,
                            "the archive's directory entries have names longer than %u bytes "
                            "in all; nothing of it was kept",
                            PROVIDER_ARCHIVE_MAX_NAME_BYTES);
    if (kind == KIND_DIR)
        s->dir_name_bytes += strlen(name) + 1;
    if ((r = set_put(&s->names, name, strlen(name), kind)) < 0)
        return set_failed(r, err);
    if (add_top(s, name) < 0)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (kind == KIND_FILE && !hard) {
        size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
        if (size < 0 || (uint64_t)size > s->max_bytes - s->sized)
            return too_big(s, err);
        s->sized += (uint64_t)size;
    }
    archive_entry_clear(s->clean);
    archive_entry_set_pathname(s->clean, name);
    archive_entry_set_uid(s->clean, 0);
    archive_entry_set_gid(s->clean, 0);
    archive_entry_set_mtime(s->clean,
                            archive_entry_mtime_is_set(e) ? archive_entry_mtime(e) : time(NULL), 0);
    if (hard) {
        archive_entry_set_filetype(s->clean, AE_IFREG);
        archive_entry_set_perm(s->clean, perm & 0777);
        archive_entry_set_hardlink(s->clean, target);
        archive_entry_set_size(s->clean, 0);
    } else if (kind == KIND_DIR) {
        archive_entry_set_filetype(s->clean, AE_IFDIR);
        archive_entry_set_perm(s->clean, perm & 01777);
    } else if (kind == KIND_LINK) {
        archive_entry_set_filetype(s->clean, AE_IFLNK);
        archive_entry_set_perm(s->clean, 0777);
        archive_entry_set_symlink(s->clean, archive_entry_symlink(e));
    } else {
        archive_entry_set_filetype(s->clean, AE_IFREG);
        archive_entry_set_perm(s->clean, perm & 0777);
        archive_entry_set_size(s->clean, size);
    }
    if (archive_write_header(s->out, s->clean) < ARCHIVE_WARN)
        return lb_error_set(err, -EIO, "cannot spool the checked archive: %s",
                            archive_error_string(s->out));
    return kind == KIND_FILE && !hard ? copy_data(s, name, size, err) : 0;
}

static int check_all(struct check_state *s, struct lb_error *err)
{
    struct archive_entry *e;
    bool any = false;
    int ar, r;

    for (;;) {
        ar = archive_read_next_header(s->in, &e);
        if (ar == ARCHIVE_EOF)
            return 0;
        if (ar < ARCHIVE_WARN)
            return lb_error_set(err, -EINVAL,
                                any ? "the archive is damaged: %s"
                                    : "the body is not a tar archive (gzip-compressed or not): %s",
                                archive_error_string(s->in));
        any = true;
        r = check_entry(s, e, err);
        if (r < 0)
            return r;
    }
}

void engine_archive_tops_free(struct engine_archive_tops *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->names[i]);
    free(t->names);
    *t = (struct engine_archive_tops){0};
}

int engine_archive_put(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dir,
                       int fd, uint64_t max_bytes, struct lb_archive_result *out,
                       struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    struct check_state s = {.dir = dir, .max_bytes = max_bytes};
    int spool = -1, r;
    off_t len;

    *out = (struct lb_archive_result){0};
    r = engine_check_target(e, ref, dir, err);
    if (r < 0)
        return r;
    spool = engine_spool_file(e);
    if (spool < 0)
        return lb_error_set(err, spool, "cannot make a spool file in '%s': %s", e->spool_dir,
                            strerror(-spool));
    s.in = archive_read_new();
    s.out = archive_write_new();
    s.clean = archive_entry_new();
    if (!s.in || !s.out || !s.clean) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    archive_read_support_filter_gzip(s.in);
    archive_read_support_format_tar(s.in);
    archive_read_support_format_gnutar(s.in);
    if (archive_write_set_format_pax_restricted(s.out) != ARCHIVE_OK ||
        archive_write_open_fd(s.out, spool) != ARCHIVE_OK) {
        r = lb_error_set(err, -EIO, "cannot spool the checked archive: %s",
                         archive_error_string(s.out));
        goto out;
    }
    if (archive_read_open_fd(s.in, fd, 64 * 1024) != ARCHIVE_OK) {
        r = lb_error_set(err, -EINVAL, "the body is not a tar archive (gzip-compressed or not): %s",
                         archive_error_string(s.in));
        goto out;
    }
    r = check_all(&s, err);
    if (r < 0)
        goto out;
    if (archive_write_close(s.out) != ARCHIVE_OK) {
        r = lb_error_set(err, -EIO, "cannot spool the checked archive: %s",
                         archive_error_string(s.out));
        goto out;
    }
    len = lseek(spool, 0, SEEK_END);
    if (len < 0 || lseek(spool, 0, SEEK_SET) < 0) {
        r = lb_error_set(err, -EIO, "cannot rewind the checked archive: %s", strerror(errno));
        goto out;
    }
    r = e->hooks->archive_put(e, ref, dir, spool, (uint64_t)len, &s.tops, err);
    if (r == 0)
        *out = s.res;
out:
    if (s.in)
        archive_read_free(s.in);
    if (s.out)
        archive_write_free(s.out);
    if (s.clean)
        archive_entry_free(s.clean);
    set_free(&s.names);
    engine_archive_tops_free(&s.tops);
    close(spool);
    return r;
}

/* ---------- get ---------- */

int engine_archive_get(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dir,
                       int fd, uint64_t max_bytes, struct lb_archive_result *out,
                       struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    struct lb_tar_out w = {0};
    int r;

    *out = (struct lb_archive_result){0};
    r = engine_check_target(e, ref, dir, err);
    if (r < 0)
        return r;
    r = tar_out_init(&w, fd, max_bytes, dir, err);
    if (r < 0)
        goto out;
    r = tar_out_open(&w, err);
    if (r < 0)
        goto out;
    r = e->hooks->archive_get(e, ref, dir, &w, err);
    if (r == 0)
        r = tar_out_close(&w, err);
    if (r == 0)
        *out = (struct lb_archive_result){.entries = w.entries, .bytes = w.written};
out:
    tar_out_free(&w);
    return r;
}

/* ---------- undo ---------- */

int engine_archive_undo(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir,
                        bool dir_was_new, const struct engine_archive_tops *tops,
                        const bool *existed)
{
    const char **argv = calloc(tops->n + 5, sizeof(*argv));
    char **paths = calloc(tops->n + 1, sizeof(*paths));
    struct lb_exec_result res = {0};
    struct lb_error err = {0};
    size_t n = 0, np = 0;
    int r = -ENOMEM;

    if (!argv || !paths)
        goto out;
    argv[n++] = "rm";
    argv[n++] = "-rf";
    argv[n++] = "--";
    if (dir_was_new) {
        argv[n++] = dir;
    } else {
        for (size_t i = 0; i < tops->n; i++) {
            if (existed[i])
                continue;
            if (asprintf(&paths[np], "%s/%s", dir, tops->names[i]) < 0) {
                paths[np] = NULL;
                goto out;
            }
            argv[n++] = paths[np++];
        }
    }
    r = 0;
    if (n == 3)
        goto out;
    r = e->ops.exec(&e->base, ref,
                    &(struct lb_exec_request){
                        .argv = argv, .cwd = "/", .timeout_ms = 60000, .max_output_bytes = 4096},
                    &res, &err);
    if (r == 0 && res.return_code != 0)
        r = -EREMOTEIO;
out:
    provider_exec_result_release(&res);
    for (size_t i = 0; i < np; i++)
        free(paths[i]);
    free(paths);
    free(argv);
    return r;
}
