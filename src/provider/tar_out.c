/*
 * tar_out.c - a bounded tar writer for every provider's archive GET (see tar_out.h).
 */
#include "provider/tar_out.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static la_ssize_t tar_out_write_cb(struct archive *a, void *arg, const void *buf, size_t len)
{
    struct lb_tar_out *w = arg;
    const char *p = buf;
    size_t left = len;

    if (len > w->max_bytes - w->written) {
        w->too_big = true;
        archive_set_error(a, EFBIG, "archive too large");
        return -1;
    }
    while (left > 0) {
        ssize_t n = write(w->fd, p, left);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            archive_set_error(a, errno, "cannot write the archive: %s", strerror(errno));
            return -1;
        }
        p += n;
        left -= (size_t)n;
    }
    w->written += len;
    return (la_ssize_t)len;
}

static int tar_out_fail(struct lb_tar_out *w, const char *name, struct lb_error *err)
{
    if (w->too_big)
        return lb_error_set(err, -EFBIG,
                            "the archive of '%s' is larger than %llu bytes (limits.max_file_bytes)",
                            w->dir, (unsigned long long)w->max_bytes);
    return lb_error_set(err, -EREMOTEIO, "cannot archive '%s': %s", name,
                        archive_error_string(w->a));
}

int tar_out_init(struct lb_tar_out *w, int fd, uint64_t max_bytes, const char *dir,
                 struct lb_error *err)
{
    *w = (struct lb_tar_out){.fd = fd, .max_bytes = max_bytes, .dir = dir};
    w->a = archive_write_new();
    w->e = archive_entry_new();
    if (!w->a || !w->e)
        return lb_error_set(err, -ENOMEM, "out of memory");
    archive_write_set_format_pax_restricted(w->a);
    archive_write_set_bytes_in_last_block(w->a, 1);
    return 0;
}

int tar_out_open(struct lb_tar_out *w, struct lb_error *err)
{
    if (archive_write_open(w->a, w, NULL, tar_out_write_cb, NULL) != ARCHIVE_OK)
        return tar_out_fail(w, w->dir, err);
    return 0;
}

int tar_out_write_header(struct lb_tar_out *w, const struct lb_tar_item *it, struct lb_error *err)
{
    if (++w->entries > TAR_OUT_MAX_ENTRIES)
        return lb_error_set(err, -EFBIG, "'%s' holds more than %d entries", w->dir,
                            TAR_OUT_MAX_ENTRIES);
    archive_entry_clear(w->e);
    archive_entry_set_pathname(w->e, it->name);
    archive_entry_set_mode(w->e, it->mode);
    archive_entry_set_uid(w->e, it->uid <= 65535 ? it->uid : 0);
    archive_entry_set_gid(w->e, it->gid <= 65535 ? it->gid : 0);
    archive_entry_set_mtime(w->e, it->mtime, it->mtime_nsec);
    archive_entry_set_size(w->e, S_ISREG(it->mode) && !it->hardlink ? it->size : 0);
    if (it->symlink)
        archive_entry_set_symlink(w->e, it->symlink);
    if (it->hardlink)
        archive_entry_set_hardlink(w->e, it->hardlink);
    if (archive_write_header(w->a, w->e) < ARCHIVE_WARN)
        return tar_out_fail(w, it->name, err);
    return 0;
}

int tar_out_write_data(struct lb_tar_out *w, const void *buf, size_t len, const char *name,
                       struct lb_error *err)
{
    if (len > 0 && archive_write_data(w->a, buf, len) < 0)
        return tar_out_fail(w, name, err);
    return 0;
}

int tar_out_close(struct lb_tar_out *w, struct lb_error *err)
{
    if (archive_write_close(w->a) != ARCHIVE_OK)
        return tar_out_fail(w, w->dir, err);
    return 0;
}

void tar_out_free(struct lb_tar_out *w)
{
    if (w->a)
        archive_write_free(w->a);
    if (w->e)
        archive_entry_free(w->e);
    w->a = NULL;
    w->e = NULL;
}
