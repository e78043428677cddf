/*
 * tar_out.h - a bounded tar writer, for every provider's archive GET: a pax (restricted)
 * archive written onto an fd, at most max_bytes of archive and TAR_OUT_MAX_ENTRIES entries.
 * The local provider walks the sandbox's tree itself; the engine providers hand it entries
 * from their backend (engine.h, archive_get hook). Both go through here so the bounds and
 * their error messages cannot drift apart.
 *
 * Use: tar_out_init, tar_out_open, then tar_out_write_header (and for a regular file exactly
 * its size in bytes through tar_out_write_data) per entry, tar_out_close; tar_out_free always.
 *
 * Thread-safety: none needed; each call touches only the writer it is given.
 */
#ifndef LB_PROVIDER_TAR_OUT_H
#define LB_PROVIDER_TAR_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/error.h"

#define TAR_OUT_MAX_ENTRIES 200000 /* entries of one archive */

struct archive;
struct archive_entry;

/* A writer: fd (not owned: never closed here), the bound max_bytes (bytes of archive), dir
 * (borrowed: named in error messages, must outlive the writer). written and entries count
 * what has gone out. */
struct lb_tar_out {
    struct archive *a;
    struct archive_entry *e;
    int fd;
    uint64_t max_bytes, written, entries;
    bool too_big;
    const char *dir;
};

/* One entry: name relative to the directory (directories end in '/'), mode with its type,
 * size of a regular file's data (then exactly that many bytes through tar_out_write_data),
 * mtime in seconds and nanoseconds, symlink's target or hard link's earlier name, or NULL.
 * Ids past 65535 are written as 0. All borrowed for the call. */
struct lb_tar_item {
    const char *name;
    mode_t mode;
    int64_t size, mtime;
    long mtime_nsec;
    uint32_t uid, gid;
    const char *symlink, *hardlink;
};

/* Make w a writer onto fd; nothing is written yet. 0, or -ENOMEM with err set (w is then
 * still safe to tar_out_free). */
int tar_out_init(struct lb_tar_out *w, int fd, uint64_t max_bytes, const char *dir,
                 struct lb_error *err);
/* Open the archive. 0, or -EREMOTEIO with err set. */
int tar_out_open(struct lb_tar_out *w, struct lb_error *err);
/* One entry's header. 0, or -EFBIG (past the bounds) / -EREMOTEIO with err set. */
int tar_out_write_header(struct lb_tar_out *w, const struct lb_tar_item *it, struct lb_error *err);
/* len bytes of the current entry's data (name: for the error message). 0, or -EFBIG /
 * -EREMOTEIO with err set. */
int tar_out_write_data(struct lb_tar_out *w, const void *buf, size_t len, const char *name,
                       struct lb_error *err);
/* Write the archive's end. 0, or -EFBIG / -EREMOTEIO with err set. */
int tar_out_close(struct lb_tar_out *w, struct lb_error *err);
/* Free what tar_out_init allocated (an archive not closed is ended by libarchive). */
void tar_out_free(struct lb_tar_out *w);

#endif
