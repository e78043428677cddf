/*
 * image.c - the image subcommand (lendboxd image import [--provider lxd] | list | rm): the image
 * store driven from the command line, without a daemon, and the store question image_gc asks.
 * See daemon.h.
 */
#include "daemon/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image/image.h"
#include "provider/registry.h"

/* image_gc's question: does a live sandbox record hold this digest? (errors: yes) */
bool daemon_image_in_use(void *store, const char *digest)
{
    int64_t n = 0;

    return store_count_using_image_digest(store, digest, &n, NULL) < 0 || n > 0;
}

/* image import --provider lxd: the image (imported into the local store first) as a unified
 * tarball (image_write_lxd_tarball: the supervisor as /sbin/init when it has none) uploaded
 * through [lxd] socket or url and published under the alias name. 0 or a negative errno. */
static int image_publish_lxd(const struct lb_config *cfg, const char *dir, const char *name,
                             struct lb_error *err)
{
    const struct lb_provider_kind *kind = registry_find_kind("lxd");
    char *supervise = cfg->supervise_path ? strdup(cfg->supervise_path) : daemon_supervise_path();
    char tmp_dir[] = "/tmp/lendbox-lxd-image-XXXXXX", fp[128] = "";
    struct lb_provider *prov = NULL;
    struct lb_provider_env env = {.cfg = cfg, .supervise_path = supervise, .images_dir = dir};
    bool init_added = false;
    struct stat st;
    int fd = -1, r;

    if (!supervise) {
        r = lb_error_set(err, -ENOENT, "lendbox-supervise not found; set local.supervise");
        goto out;
    }
    r = kind && kind->image_publish ? kind->open(&env, &prov, err)
                                    : lb_error_set(err, -EINVAL, "no lxd provider");
    if (r < 0)
        goto out;
    /* the tarball: an unlinked file (O_TMPFILE where /tmp has it, else made and unlinked) */
    fd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && mkdtemp(tmp_dir)) {
        char p[sizeof(tmp_dir) + 16];

        snprintf(p, sizeof(p), "%s/image.tar", tmp_dir);
        fd = open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        unlink(p);
        rmdir(tmp_dir);
    }
    if (fd < 0) {
        r = lb_error_set(err, -errno, "cannot make a temporary file: %s", strerror(errno));
        goto out;
    }
    r = image_write_lxd_tarball(dir, name, supervise, fd, &init_added, err);
    if (r == 0 && fstat(fd, &st) < 0)
        r = lb_error_set(err, -errno, "cannot stat the tarball: %s", strerror(errno));
    if (r == 0)
        r = kind->image_publish(prov, fd, (uint64_t)st.st_size, name,
                                cfg->create_timeout_s * 1000 > 600000 ? cfg->create_timeout_s * 1000
                                                                      : 600000,
                                fp, sizeof(fp), err);
    if (r == 0)
        printf("lxd %s %s %lld%s\n", name, fp, (long long)st.st_size,
               init_added ? " (lendbox-supervise as /sbin/init)" : "");
out:
    if (fd >= 0)
        close(fd);
    provider_destroy(prov);
    free(supervise);
    return r;
}

/* lendboxd image import [--provider lxd] SOURCE NAME | list | rm NAME. Returns the exit
 * status. */
int daemon_image_command(const struct lb_config *cfg, int argc, char **argv)
{
    char *dir = daemon_images_dir(cfg), path[PATH_MAX];
    struct lb_error err = {0};
    struct lb_image_info info, *all = NULL;
    struct lb_store *store = NULL;
    int64_t users = 0;
    size_t n = 0, i;
    bool existed;
    int rc = 1;

    umask(022);
    /* the default store is under the state dir, which a daemon may not have made yet */
    if (!cfg->images_dir && mkdir(cfg->state_dir, 0711) < 0 && errno != EEXIST)
        fprintf(stderr, "lendboxd: cannot make '%s': %s\n", cfg->state_dir, strerror(errno));
    if (!dir) {
        fprintf(stderr, "lendboxd: out of memory\n");
        return 1;
    }
    if (argc == 5 && strcmp(argv[0], "import") == 0 && strcmp(argv[1], "--provider") == 0) {
        /* into the local store (where it is unpacked and checked), then into LXD */
        if (strcmp(argv[2], "lxd") != 0) {
            lb_error_set(&err, -EINVAL, "image import --provider: only lxd (not '%s')", argv[2]);
            goto fail;
        }
        if (image_import(dir, argv[3], argv[4], &info, &existed, &err) < 0 ||
            image_publish_lxd(cfg, dir, argv[4], &err) < 0)
            goto fail;
        rc = 0;
    } else if (argc == 3 && strcmp(argv[0], "import") == 0) {
        if (image_import(dir, argv[1], argv[2], &info, &existed, &err) < 0)
            goto fail;
        /* a name imported anew leaves its old tree unnamed: collect it unless a sandbox
         * recorded in the state dir (the daemon may be running) still uses it */
        snprintf(path, sizeof(path), "%s/lendbox.db", cfg->state_dir);
        if (access(path, F_OK) == 0 && store_open(path, &store, &err) < 0)
            goto fail;
        if (store && image_gc(dir, daemon_image_in_use, store, &err) < 0)
            goto fail;
        printf("%s %s %lld%s\n", info.name, info.digest, (long long)info.size_bytes,
               existed ? " (already stored)" : "");
        rc = 0;
    } else if (argc == 1 && strcmp(argv[0], "list") == 0) {
        if (image_list(dir, &all, &n, &err) < 0)
            goto fail;
        for (i = 0; i < n; i++)
            printf("%s %s %lld %lld\n", all[i].name, all[i].digest, (long long)all[i].size_bytes,
                   (long long)all[i].created_at);
        rc = 0;
    } else if (argc == 2 && strcmp(argv[0], "rm") == 0) {
        /* refused while a record not yet stopped names it (the daemon may be running) */
        snprintf(path, sizeof(path), "%s/lendbox.db", cfg->state_dir);
        if (image_get(dir, argv[1], &info, &err) < 0 || store_open(path, &store, &err) < 0 ||
            store_count_using_image(store, argv[1], &users, &err) < 0)
            goto fail;
        if (users > 0) {
            lb_error_set(&err, -EBUSY, "image '%s' is in use by %lld sandbox(es)", argv[1],
                         (long long)users);
            goto fail;
        }
        if (image_remove(dir, argv[1], &err) < 0 ||
            image_gc(dir, daemon_image_in_use, store, &err) < 0)
            goto fail;
        rc = 0;
    } else {
        fprintf(stderr, "usage: lendboxd [OPTIONS] image import [--provider lxd] SOURCE NAME\n"
                        "       lendboxd [OPTIONS] image list\n"
                        "       lendboxd [OPTIONS] image rm NAME\n"
                        "SOURCE: docker-archive:PATH, oci-archive:PATH, oci:DIR[:TAG] or a path\n");
        rc = 2;
    }
    goto out;
fail:
    fprintf(stderr, "lendboxd: image: %s\n", err.message);
out:
    if (store)
        store_close(store);
    free(all);
    free(dir);
    return rc;
}
