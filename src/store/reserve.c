/*
 * reserve.c - the space reserve that keeps stops recordable on a full file system (making it;
 * a stop's write spends it in store.c's store_step_writing), and the check of whether the
 * store can write (store_reserve_init, store_check_writable).
 */
#include "store/store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <sqlite3.h>

#include "util/clock.h"
#include "util/log.h"

/* ---- the space reserve ----
 *
 * A full file system must not keep the daemon from recording stops: a stop frees space, and its
 * record update must not be starved by whoever filled the disk. store_reserve_init makes
 * <database>.reserve, a file of reserve_bytes allocated up front (posix_fallocate). A stop's
 * record update (stopping, stopped, stop failed) that fails with SQLITE_FULL deletes it, which
 * frees its blocks at once (nothing holds it open), and is retried. Other writes never spend
 * it: while it is gone and cannot be made again, new sandbox records are refused (-ENOSPC)
 * rather than eat the space stops need. It is made again once the file system has twice its
 * size free (store_check_writable: /readyz and the sweeper call it; and before an insert).
 */

#define RESERVE_RETRY_MS 1000
#define PROBE_INTERVAL_MS 1000
#define LOW_WATER_BYTES (1024 * 1024) /* less free than this: the store counts as unwritable */

/* Free bytes on the database's file system (lendboxd is root: blocks reserved for root count);
 * -errno when it cannot be read, -EROFS when it is read-only. */
static int64_t fs_free_bytes(const char *path)
{
    struct statvfs v;

    if (statvfs(path, &v) < 0)
        return -errno;
    if (v.f_flag & ST_RDONLY)
        return -EROFS;
    return (int64_t)v.f_bfree * (int64_t)v.f_frsize;
}

/* Make the reserve if it is missing and there is room: twice its size free, so that what is
 * left beside it is at least as much. Rate-limited. 0 when it is in place (or none is
 * configured), -ENOSPC otherwise. Call with the lock held. */
int store_reserve_make(struct lb_store *st)
{
    int64_t now = clock_mono_ms(), free_bytes;
    int fd, r;

    if (st->reserve_bytes == 0 || st->reserve_present)
        return 0;
    if (st->reserve_tried_ms && now - st->reserve_tried_ms < RESERVE_RETRY_MS)
        return -ENOSPC;
    st->reserve_tried_ms = now;
    free_bytes = fs_free_bytes(st->path);
    if (free_bytes < 2 * st->reserve_bytes)
        return -ENOSPC;
    fd = open(st->reserve_path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        log_warn("store: cannot make the space reserve %s: %s", st->reserve_path, strerror(errno));
        return -ENOSPC;
    }
    r = posix_fallocate(fd, 0, st->reserve_bytes);
    close(fd);
    if (r != 0) {
        (void)unlink(st->reserve_path);
        log_warn("store: cannot allocate the space reserve %s: %s", st->reserve_path, strerror(r));
        return -ENOSPC;
    }
    st->reserve_present = true;
    log_info("store: space reserve %s in place (%lld bytes)", st->reserve_path,
             (long long)st->reserve_bytes);
    return 0;
}

/* A real write (user_version set to what it is), after a write failed. Lock held. */
static int probe_write(struct lb_store *st, struct lb_error *err)
{
    char sql[64];
    int version = 0, r;

    r = store_read_user_version(st, &version, err);
    if (r < 0)
        return r;
    snprintf(sql, sizeof(sql), "PRAGMA user_version = %d", version);
    r = store_exec_sql(st, sql, "write check", err);
    if (r == 0)
        atomic_store(&st->write_failed, false);
    return r;
}

int store_reserve_init(struct lb_store *st, int64_t reserve_bytes, struct lb_error *err)
{
    struct stat sb;
    int r = 0;

    if (reserve_bytes < 0)
        return lb_error_set(err, -EINVAL, "store: the space reserve must not be negative");
    pthread_mutex_lock(&st->lock);
    st->reserve_bytes = reserve_bytes;
    if (reserve_bytes == 0) {
        (void)unlink(st->reserve_path); /* one of an earlier configuration */
        goto out;
    }
    /* one kept from an earlier run counts if it is whole */
    st->reserve_present = stat(st->reserve_path, &sb) == 0 && S_ISREG(sb.st_mode) &&
                          sb.st_size >= reserve_bytes &&
                          (int64_t)sb.st_blocks * 512 >= reserve_bytes;
    if (!st->reserve_present && store_reserve_make(st) < 0)
        log_warn("store: no space for the space reserve (%lld bytes) next to %s: stops on a full "
                 "disk may fail to be recorded until space returns",
                 (long long)reserve_bytes, st->path);
out:
    pthread_mutex_unlock(&st->lock);
    return r;
}

int store_check_writable(struct lb_store *st, struct lb_error *err)
{
    int64_t now = clock_mono_ms(), free_bytes;
    int r = 0;

    pthread_mutex_lock(&st->lock);
    free_bytes = fs_free_bytes(st->path);
    if (free_bytes < 0) {
        r = lb_error_set(err, free_bytes == -EROFS ? -EROFS : -EIO,
                         "store cannot write: the file system of %s is %s", st->path,
                         free_bytes == -EROFS ? "read-only" : "unreadable");
    } else if (store_reserve_make(st) < 0) {
        r = lb_error_set(err, -ENOSPC,
                         "store cannot write: the file system of %s is full (its space reserve "
                         "for stops is spent and needs %lld bytes free to be made again)",
                         st->path, (long long)(2 * st->reserve_bytes));
    } else if (free_bytes < LOW_WATER_BYTES) {
        r = lb_error_set(err, -ENOSPC,
                         "store cannot write: the file system of %s is full (%lld bytes free)",
                         st->path, (long long)free_bytes);
    } else if (atomic_load(&st->write_failed)) {
        /* the last write failed: only a write that succeeds tells it works again */
        if (now - st->probed_ms >= PROBE_INTERVAL_MS) {
            st->probed_ms = now;
            (void)probe_write(st, NULL);
        }
        if (atomic_load(&st->write_failed))
            r = lb_error_set(err, -EIO, "store cannot write: the last write failed");
    }
    pthread_mutex_unlock(&st->lock);
    return r;
}
