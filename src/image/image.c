/*
 * image.c - the image store (see image.h): skopeo copies a source into a temporary OCI
 * layout, umoci unpacks it, renames publish it.
 */
#include "image/image.h"
#include "image/image_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/log.h"

#define TOOL_LOG_MAX 1024

bool image_name_is_valid(const char *name)
{
    size_t i, n = name ? strlen(name) : 0;

    if (n == 0 || n > LB_IMAGE_NAME_MAX || strcmp(name, "host") == 0)
        return false;
    for (i = 0; i < n; i++) {
        char c = name[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');

        if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-')))
            return false;
    }
    return true;
}

int image_mkdir_mode(const char *path, mode_t mode)
{
    if (mkdir(path, mode) < 0 && errno != EEXIST)
        return -errno;
    return chmod(path, mode) < 0 ? -errno : 0;
}

int image_store_init(const char *images_dir, struct lb_error *err)
{
    char p[IMAGE_PATH_MAX];
    int r;

    r = image_mkdir_mode(images_dir, 0700);
    snprintf(p, sizeof(p), "%s/" STORE, images_dir);
    if (r == 0)
        r = image_mkdir_mode(p, 0700);
    snprintf(p, sizeof(p), "%s/" STORE "/sha256", images_dir);
    if (r == 0)
        r = image_mkdir_mode(p, 0700);
    snprintf(p, sizeof(p), "%s/" STORE "/tmp", images_dir);
    if (r == 0)
        r = image_mkdir_mode(p, 0700);
    if (r < 0)
        return lb_error_set(err, r, "cannot make the image store '%s': %s", images_dir,
                            strerror(-r));
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        return rmdir(path) < 0 && errno != ENOENT ? -1 : 0;
    return unlink(path) < 0 && errno != ENOENT ? -1 : 0;
}

/* rm -rf path (no symlinks followed). */
int image_remove_tree(const char *path)
{
    struct stat st;

    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode))
        return unlink(path) < 0 ? -errno : 0;
    return nftw(path, rm_entry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) < 0 ? -errno : 0;
}

/* opendir(path) into *d. 0, with *d NULL when path does not exist (nothing in it to read), or
 * -errno "cannot read '<path>'" with *d NULL. */
static int open_dir(const char *path, DIR **d, struct lb_error *err)
{
    *d = opendir(path);
    if (!*d && errno != ENOENT)
        return lb_error_set(err, -errno, "cannot read '%s': %s", path, strerror(errno));
    return 0;
}

int image_store_clean_tmp(const char *images_dir, struct lb_error *err)
{
    char tmp[IMAGE_PATH_MAX], p[IMAGE_PATH_MAX + 256];
    struct dirent *de;
    DIR *d;
    int r = 0;

    snprintf(tmp, sizeof(tmp), "%s/" STORE "/tmp", images_dir);
    r = open_dir(tmp, &d, err);
    if (!d)
        return r;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", tmp, de->d_name);
        if (image_remove_tree(p) < 0 && r == 0)
            r = lb_error_set(err, -errno, "cannot remove '%s': %s", p, strerror(errno));
        else
            log_info("image store: removed an interrupted import (%s)", p);
    }
    closedir(d);
    return r;
}

/* The store's lock (flock on .store/lock), held while names and trees change: an import's
 * publish and naming, a removal, a garbage collection, so that a collection by the daemon never
 * removes a tree that a concurrent `lendboxd image import` has stored but not yet named.
 * Returns the fd to close to unlock, or a negative errno. */
int image_store_lock(const char *images_dir)
{
    char p[IMAGE_PATH_MAX + 32];
    int fd;

    snprintf(p, sizeof(p), "%s/" STORE "/lock", images_dir);
    fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    while (flock(fd, LOCK_EX) < 0) {
        if (errno != EINTR) {
            int e = errno;

            close(fd);
            return -e;
        }
    }
    return fd;
}

/* Run argv (argv[0] looked up in PATH) with stdin /dev/null and stdout+stderr into log_path,
 * TMPDIR set to tmpdir. Returns 0 on exit status 0, else -EPROTO with err holding the end of
 * the tool's output. */
static int run_tool(char *const argv[], const char *log_path, const char *tmpdir,
                    struct lb_error *err)
{
    extern char **environ;
    posix_spawn_file_actions_t fa;
    char tmpenv[IMAGE_PATH_MAX + 8], out[TOOL_LOG_MAX + 1];
    char *envp[64];
    size_t ne = 0, i;
    pid_t pid;
    int r, status, fd;
    ssize_t n;

    snprintf(tmpenv, sizeof(tmpenv), "TMPDIR=%s", tmpdir);
    envp[ne++] = tmpenv;
    for (i = 0; environ[i] && ne < 62; i++)
        if (strncmp(environ[i], "TMPDIR=", 7) != 0)
            envp[ne++] = environ[i];
    envp[ne] = NULL;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    r = posix_spawnp(&pid, argv[0], &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    if (r != 0)
        return lb_error_set(err, -r, "cannot run %s: %s", argv[0], strerror(r));
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return lb_error_set(err, -errno, "waiting for %s: %s", argv[0], strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    out[0] = '\0';
    fd = open(log_path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        off_t end = lseek(fd, 0, SEEK_END);

        (void)lseek(fd, end > TOOL_LOG_MAX ? end - TOOL_LOG_MAX : 0, SEEK_SET);
        n = read(fd, out, TOOL_LOG_MAX);
        out[n > 0 ? n : 0] = '\0';
        close(fd);
        for (i = strlen(out); i > 0 && (out[i - 1] == '\n' || out[i - 1] == ' '); i--)
            out[i - 1] = '\0';
    }
    return lb_error_set(err, -EPROTO, "%s failed (%s %d): %s", argv[0],
                        WIFEXITED(status) ? "exit" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), out);
}

/* skopeo copy src oci:layout:img */
static int copy_source(const char *src, const char *layout, const char *work, struct lb_error *err)
{
    char dest[IMAGE_PATH_MAX + 16], log_path[IMAGE_PATH_MAX + 16];
    char *argv[] = {"skopeo", "--insecure-policy", "copy", "--quiet", (char *)src, dest, NULL};

    snprintf(dest, sizeof(dest), "oci:%s:img", layout);
    snprintf(log_path, sizeof(log_path), "%s/skopeo.log", work);
    return run_tool(argv, log_path, work, err);
}

static bool has_prefix(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

/* Copy source (see image_import) into layout. */
static int copy_any(const char *source, const char *layout, const char *work, struct lb_error *err)
{
    char src[IMAGE_PATH_MAX + 32];
    struct stat st;
    int r;

    if (has_prefix(source, "docker-archive:") || has_prefix(source, "oci-archive:") ||
        has_prefix(source, "oci:") || has_prefix(source, "containers-storage:") ||
        has_prefix(source, "docker-daemon:"))
        return copy_source(source, layout, work, err);
    if (strchr(source, ':') && source[0] != '/' && source[0] != '.')
        return lb_error_set(err, -EINVAL,
                            "unsupported image source '%s' (use docker-archive:, oci-archive:, "
                            "oci:, containers-storage:, docker-daemon: or a path; registries "
                            "are not used)",
                            source);
    if (stat(source, &st) < 0)
        return lb_error_set(err, -ENOENT, "image source '%s': %s", source, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        snprintf(src, sizeof(src), "oci:%s", source);
        return copy_source(src, layout, work, err);
    }
    snprintf(src, sizeof(src), "docker-archive:%s", source);
    r = copy_source(src, layout, work, err);
    if (r != -EPROTO)
        return r;
    (void)image_remove_tree(layout);
    lb_error_clear(err);
    snprintf(src, sizeof(src), "oci-archive:%s", source);
    return copy_source(src, layout, work, err);
}

static bool is_sha256_digest(const char *d)
{
    size_t i;

    if (!d || strncmp(d, "sha256:", 7) != 0 || strlen(d) != 7 + 64)
        return false;
    for (i = 7; d[i]; i++)
        if (!((d[i] >= '0' && d[i] <= '9') || (d[i] >= 'a' && d[i] <= 'f')))
            return false;
    return true;
}

static json_t *load_blob(const char *layout, const char *digest, struct lb_error *err)
{
    char p[IMAGE_PATH_MAX + 128];
    json_error_t je;
    json_t *j;

    if (!is_sha256_digest(digest)) {
        lb_error_set(err, -EPROTO, "the image names an invalid blob digest");
        return NULL;
    }
    snprintf(p, sizeof(p), "%s/blobs/sha256/%s", layout, digest + 7);
    j = json_load_file(p, 0, &je);
    if (!j)
        lb_error_set(err, -EPROTO, "cannot read image blob %s: %s", digest, je.text);
    return j;
}

/* The config of the layout's single image: *config_out (caller decrefs) and its digest. */
static int read_config(const char *layout, json_t **config_out, char *digest, size_t size,
                       struct lb_error *err)
{
    char p[IMAGE_PATH_MAX + 32];
    json_error_t je;
    json_t *index, *manifest = NULL, *config = NULL;
    const char *mdigest, *cdigest;
    int r = 0;

    snprintf(p, sizeof(p), "%s/index.json", layout);
    index = json_load_file(p, 0, &je);
    if (!index)
        return lb_error_set(err, -EPROTO, "cannot read the image index: %s", je.text);
    mdigest = json_string_value(
        json_object_get(json_array_get(json_object_get(index, "manifests"), 0), "digest"));
    manifest = load_blob(layout, mdigest, err);
    if (!manifest) {
        r = -EPROTO;
        goto out;
    }
    cdigest = json_string_value(json_object_get(json_object_get(manifest, "config"), "digest"));
    config = load_blob(layout, cdigest, err);
    if (!config) {
        r = -EPROTO;
        goto out;
    }
    snprintf(digest, size, "%s", cdigest);
    *config_out = config;
    config = NULL;
out:
    json_decref(config);
    json_decref(manifest);
    json_decref(index);
    return r;
}

const char *image_host_architecture(void)
{
    static const struct {
        const char *machine, *oci;
    } names[] = {{"x86_64", "amd64"},    {"aarch64", "arm64"}, {"armv7l", "arm"},
                 {"armv6l", "arm"},      {"i686", "386"},      {"i386", "386"},
                 {"ppc64le", "ppc64le"}, {"s390x", "s390x"},   {"riscv64", "riscv64"}};
    static char other[65];
    struct utsname u;

    if (uname(&u) < 0)
        return "unknown";
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(u.machine, names[i].machine) == 0)
            return names[i].oci;
    snprintf(other, sizeof(other), "%s", u.machine);
    return other;
}

/* The image must run here: config os linux (or unset) and the host's architecture. */
static int check_platform(json_t *config, struct lb_error *err)
{
    const char *arch = json_string_value(json_object_get(config, "architecture"));
    const char *os = json_string_value(json_object_get(config, "os"));
    const char *host = image_host_architecture();

    if (os && *os && strcmp(os, "linux") != 0)
        return lb_error_set(err, -EOPNOTSUPP,
                            "the image is for os '%s'; this host runs linux on %s", os, host);
    if (!arch || !*arch)
        return lb_error_set(err, -EOPNOTSUPP,
                            "the image's config names no architecture; this host is %s", host);
    if (strcmp(arch, host) != 0)
        return lb_error_set(err, -EOPNOTSUPP,
                            "the image's architecture is %s, this host's is %s: its programs "
                            "cannot run here",
                            arch, host);
    return 0;
}

static int64_t tree_bytes;

static int add_size(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)path;
    (void)ftw;
    if (flag == FTW_F && S_ISREG(st->st_mode))
        tree_bytes += st->st_size;
    return 0;
}

static int64_t devices_skipped;

static int drop_device(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    if (flag == FTW_F && (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode))) {
        if (unlink(path) < 0)
            return -1;
        devices_skipped++;
    }
    return 0;
}

/* nftw has no context argument: sizes are summed under a lock. */
static pthread_mutex_t size_lock = PTHREAD_MUTEX_INITIALIZER;

int64_t image_tree_size(const char *path)
{
    int64_t n;

    pthread_mutex_lock(&size_lock);
    tree_bytes = 0;
    (void)nftw(path, add_size, 32, FTW_PHYS | FTW_MOUNT);
    n = tree_bytes;
    pthread_mutex_unlock(&size_lock);
    return n;
}

/* Device nodes are skipped: removed from the unpacked tree (the overlay is nodev anyway, and
 * a sandbox's /dev is its own). Returns how many, or -errno. */
static int64_t drop_devices(const char *rootfs)
{
    int64_t n;
    int r;

    pthread_mutex_lock(&size_lock);
    devices_skipped = 0;
    r = nftw(rootfs, drop_device, 32, FTW_PHYS | FTW_MOUNT);
    n = r < 0 ? -errno : devices_skipped;
    pthread_mutex_unlock(&size_lock);
    return n;
}

/* Unpack layout into entry/rootfs and write entry/image.json. */
static int unpack_image(const char *layout, const char *entry, const char *work, const char *digest,
                        json_t *config, struct lb_error *err)
{
    char image_ref[IMAGE_PATH_MAX + 64], rootfs[IMAGE_PATH_MAX + 64];
    char log_path[IMAGE_PATH_MAX + 64], meta[IMAGE_PATH_MAX + 64];
    char *argv[] = {"umoci", "raw", "unpack", "--image", image_ref, rootfs, NULL};
    json_t *c = json_object_get(config, "config"), *info;
    int64_t devices;
    int r;

    snprintf(image_ref, sizeof(image_ref), "%s:img", layout);
    snprintf(rootfs, sizeof(rootfs), "%s/rootfs", entry);
    snprintf(log_path, sizeof(log_path), "%s/umoci.log", work);
    snprintf(meta, sizeof(meta), "%s/image.json", entry);
    if (mkdir(entry, 0700) < 0)
        return lb_error_set(err, -errno, "cannot make '%s': %s", entry, strerror(errno));
    r = run_tool(argv, log_path, work, err);
    if (r < 0)
        return r;
    if (chmod(rootfs, 0755) < 0)
        return lb_error_set(err, -errno, "cannot chmod '%s': %s", rootfs, strerror(errno));
    devices = drop_devices(rootfs);
    if (devices < 0)
        return lb_error_set(err, (int)devices, "cannot remove the image's device nodes: %s",
                            strerror((int)-devices));
    if (devices > 0)
        log_info("image store: %s: skipped %lld device node(s)", digest, (long long)devices);
    info =
        json_pack("{s:s,s:O?,s:O?,s:O?,s:O?,s:O?,s:I,s:I}", "digest", digest, "architecture",
                  json_object_get(config, "architecture"), "os", json_object_get(config, "os"),
                  "env", json_object_get(c, "Env"), "working_dir", json_object_get(c, "WorkingDir"),
                  "user", json_object_get(c, "User"), "size_bytes",
                  (json_int_t)image_tree_size(rootfs), "created_at", (json_int_t)time(NULL));
    if (!info)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = json_dump_file(info, meta, JSON_COMPACT);
    json_decref(info);
    if (r < 0)
        return lb_error_set(err, -EIO, "cannot write '%s'", meta);
    return 0;
}

/* Point images_dir/name at the digest's tree, atomically. */
int image_link_name(const char *images_dir, const char *name, const char *hex, struct lb_error *err)
{
    char target[128], tmp[IMAGE_PATH_MAX + 64], dst[IMAGE_PATH_MAX + 256];
    struct stat st;

    snprintf(target, sizeof(target), STORE "/sha256/%s/rootfs", hex);
    snprintf(tmp, sizeof(tmp), "%s/" STORE "/tmp/link-%d-%ld", images_dir, (int)getpid(),
             (long)random());
    snprintf(dst, sizeof(dst), "%s/%s", images_dir, name);
    if (lstat(dst, &st) == 0 && !S_ISLNK(st.st_mode))
        return lb_error_set(err, -EEXIST,
                            "'%s' is a plain image directory placed by hand; not replaced", name);
    if (symlink(target, tmp) < 0)
        return lb_error_set(err, -errno, "cannot make '%s': %s", tmp, strerror(errno));
    if (rename(tmp, dst) < 0) {
        int e = errno;

        (void)unlink(tmp);
        return lb_error_set(err, -e, "cannot name the image '%s': %s", name, strerror(e));
    }
    return 0;
}

/* The digest hex an imported name points to, from its symlink. */
int image_name_hex(const char *images_dir, const char *name, char hex[65])
{
    char p[IMAGE_PATH_MAX + 256], target[256];
    ssize_t n;

    snprintf(p, sizeof(p), "%s/%s", images_dir, name);
    n = readlink(p, target, sizeof(target) - 1);
    if (n < 0)
        return errno == EINVAL || errno == ENOENT ? -ENOENT : -errno;
    target[n] = '\0';
    if (n != (ssize_t)strlen(STORE "/sha256/") + 64 + 7 ||
        strncmp(target, STORE "/sha256/", strlen(STORE "/sha256/")) != 0 ||
        strcmp(target + n - 7, "/rootfs") != 0)
        return -ENOENT;
    memcpy(hex, target + strlen(STORE "/sha256/"), 64);
    hex[64] = '\0';
    return 0;
}

/* name_hex for a name a caller gave: "no image" (-ENOENT, or name_hex's error) when the name
 * is not a valid one or does not point to a stored image. */
int image_find_hex(const char *images_dir, const char *name, char hex[65], struct lb_error *err)
{
    int r;

    if (!image_name_is_valid(name))
        return lb_error_set(err, -ENOENT, "no image '%s'", name ? name : "");
    r = image_name_hex(images_dir, name, hex);
    if (r < 0)
        return lb_error_set(err, r, "no image '%s'", name);
    return 0;
}

int image_read_info(const char *images_dir, const char *name, const char *hex,
                    struct lb_image_info *out, struct lb_error *err)
{
    char p[IMAGE_PATH_MAX + 128];
    json_error_t je;
    json_t *j;

    snprintf(p, sizeof(p), "%s/" STORE "/sha256/%s/image.json", images_dir, hex);
    j = json_load_file(p, 0, &je);
    if (!j)
        return lb_error_set(err, -ENOENT, "image '%s': cannot read '%s': %s", name, p, je.text);
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", name);
    snprintf(out->digest, sizeof(out->digest), "sha256:%s", hex);
    out->size_bytes = json_integer_value(json_object_get(j, "size_bytes"));
    out->created_at = json_integer_value(json_object_get(j, "created_at"));
    out->snapshot = json_is_string(json_object_get(j, "kind")) &&
                    strcmp(json_string_value(json_object_get(j, "kind")), "snapshot") == 0;
    if (out->snapshot) {
        const char *base = json_string_value(json_object_get(j, "base"));
        const char *src = json_string_value(json_object_get(j, "source_sandbox_id"));

        snprintf(out->base, sizeof(out->base), "%s", base ? base : "");
        snprintf(out->source_sandbox_id, sizeof(out->source_sandbox_id), "%s", src ? src : "");
        out->depth = (int)json_integer_value(json_object_get(j, "depth"));
        out->hidden = json_is_true(json_object_get(j, "hidden"));
    }
    json_decref(j);
    return 0;
}

int image_import(const char *images_dir, const char *source, const char *name,
                 struct lb_image_info *out, bool *existed, struct lb_error *err)
{
    char work[IMAGE_PATH_MAX], layout[IMAGE_PATH_MAX + 16], entry[IMAGE_PATH_MAX + 16];
    char stored[IMAGE_PATH_MAX + 128], digest[LB_IMAGE_DIGEST_MAX];
    struct lb_image_info info;
    json_t *config = NULL;
    struct stat st;
    bool had = false;
    int r, lock = -1;

    if (existed)
        *existed = false;
    if (!image_name_is_valid(name))
        return lb_error_set(err, -EINVAL,
                            "invalid image name '%s' (want [A-Za-z0-9][A-Za-z0-9._-]*, at most "
                            "%d bytes, not 'host')",
                            name ? name : "", LB_IMAGE_NAME_MAX);
    r = image_store_init(images_dir, err);
    if (r < 0)
        return r;
    if (snprintf(work, sizeof(work), "%s/" STORE "/tmp/import-XXXXXX", images_dir) >=
        (int)sizeof(work))
        return lb_error_set(err, -ENAMETOOLONG, "images dir path is too long");
    if (!mkdtemp(work))
        return lb_error_set(err, -errno, "cannot make '%s': %s", work, strerror(errno));
    snprintf(layout, sizeof(layout), "%s/layout", work);
    snprintf(entry, sizeof(entry), "%s/entry", work);
    r = copy_any(source, layout, work, err);
    if (r < 0)
        goto out;
    r = read_config(layout, &config, digest, sizeof(digest), err);
    if (r == 0)
        r = check_platform(config, err);
    if (r < 0)
        goto out;
    snprintf(stored, sizeof(stored), "%s/" STORE "/sha256/%s", images_dir, digest + 7);
    had = stat(stored, &st) == 0;
    if (!had) {
        r = unpack_image(layout, entry, work, digest, config, err);
        if (r == 0) /* tests: a crash (delay + kill -9) or failure right before publishing */
            r = fault_hit("image.publish", 0, err);
        if (r < 0)
            goto out;
    }
    lock = image_store_lock(images_dir);
    if (lock < 0) {
        r = lb_error_set(err, lock, "cannot lock the image store: %s", strerror(-lock));
        goto out;
    }
    if (!had && rename(entry, stored) < 0 && errno != EEXIST && errno != ENOTEMPTY) {
        r = lb_error_set(err, -errno, "cannot store the image: %s", strerror(errno));
        goto out;
    }
    r = image_link_name(images_dir, name, digest + 7, err);
    if (r < 0)
        goto out;
    r = image_read_info(images_dir, name, digest + 7, &info, err);
    if (r < 0)
        goto out;
    if (out)
        *out = info;
    if (existed)
        *existed = had;
    log_info("image store: %s -> %s (%s)", name, digest, had ? "already stored" : "unpacked");
out:
    if (lock >= 0)
        close(lock);
    json_decref(config);
    if (image_remove_tree(work) < 0)
        log_warn("image store: cannot remove '%s': %s", work, strerror(errno));
    return r;
}

int image_get(const char *images_dir, const char *name, struct lb_image_info *out,
              struct lb_error *err)
{
    char hex[65];
    int r;

    r = image_find_hex(images_dir, name, hex, err);
    if (r < 0)
        return r;
    return image_read_info(images_dir, name, hex, out, err);
}

int image_load_entry(const char *images_dir, const char *name, char hex[65], json_t **out,
                     struct lb_error *err)
{
    char p[IMAGE_PATH_MAX + 128];
    json_error_t je;
    int r = image_find_hex(images_dir, name, hex, err);

    *out = NULL;
    if (r < 0)
        return r;
    snprintf(p, sizeof(p), "%s/" STORE "/sha256/%s/image.json", images_dir, hex);
    *out = json_load_file(p, 0, &je);
    if (!*out)
        return lb_error_set(err, -ENOENT, "image '%s': cannot read '%s': %s", name, p, je.text);
    return 0;
}

int image_read_config(const char *images_dir, const char *name, json_t **env_out,
                      char **working_dir_out, struct lb_error *err)
{
    char hex[65];
    json_t *j, *env, *wd;
    int r;

    if (env_out)
        *env_out = NULL;
    if (working_dir_out)
        *working_dir_out = NULL;
    r = image_load_entry(images_dir, name, hex, &j, err);
    if (r < 0)
        return r;
    env = json_object_get(j, "env");
    wd = json_object_get(j, "working_dir");
    if (env_out && json_is_array(env))
        *env_out = json_incref(env);
    if (working_dir_out && json_is_string(wd) && json_string_length(wd) > 0) {
        *working_dir_out = strdup(json_string_value(wd));
        if (!*working_dir_out)
            r = lb_error_set(err, -ENOMEM, "out of memory");
    }
    json_decref(j);
    return r;
}

static int cmp_info(const void *a, const void *b)
{
    return strcmp(((const struct lb_image_info *)a)->name, ((const struct lb_image_info *)b)->name);
}

int image_list(const char *images_dir, struct lb_image_info **out, size_t *n, struct lb_error *err)
{
    struct lb_image_info *v = NULL, *nv;
    size_t cnt = 0, cap = 0;
    struct dirent *de;
    DIR *d;
    char hex[65];
    int r;

    *out = NULL;
    *n = 0;
    r = open_dir(images_dir, &d, err);
    if (!d)
        return r;
    while ((de = readdir(d))) {
        if (!image_name_is_valid(de->d_name) || image_name_hex(images_dir, de->d_name, hex) < 0)
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            nv = realloc(v, cap * sizeof(*v));
            if (!nv) {
                closedir(d);
                free(v);
                return lb_error_set(err, -ENOMEM, "out of memory");
            }
            v = nv;
        }
        if (image_read_info(images_dir, de->d_name, hex, &v[cnt], NULL) == 0)
            cnt++;
    }
    closedir(d);
    if (cnt > 1)
        qsort(v, cnt, sizeof(*v), cmp_info);
    *out = v;
    *n = cnt;
    return 0;
}

int image_remove(const char *images_dir, const char *name, struct lb_error *err)
{
    char hex[65], p[IMAGE_PATH_MAX + 256];
    int r, lock;

    r = image_find_hex(images_dir, name, hex, err);
    if (r < 0)
        return r;
    lock = image_store_lock(images_dir);
    if (lock < 0)
        return lb_error_set(err, lock, "cannot lock the image store: %s", strerror(-lock));
    snprintf(p, sizeof(p), "%s/%s", images_dir, name);
    r = unlink(p) < 0 ? lb_error_set(err, -errno, "cannot remove '%s': %s", p, strerror(errno)) : 0;
    close(lock);
    if (r == 0)
        log_info("image store: removed the name %s (sha256:%s)", name, hex);
    return r;
}

/* Does a mount of this process's mount table show one of the digest's trees (its rootfs, or
 * its workspace under a seeded sandbox's workdir)? */
static bool tree_is_mounted(const char *hex)
{
    char line[8192], needle[128];
    bool found = false;
    FILE *f = fopen("/proc/self/mountinfo", "re");

    if (!f)
        return true; /* cannot tell: keep it */
    snprintf(needle, sizeof(needle), "/" STORE "/sha256/%.64s/", hex);
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* Is hex named by an image name under images_dir? */
static bool hex_is_named(const char *images_dir, const char *hex)
{
    struct dirent *de;
    char other[65];
    bool named = false;
    DIR *d = opendir(images_dir);

    if (!d)
        return true; /* cannot tell: keep it */
    while (!named && (de = readdir(d)))
        named = image_name_is_valid(de->d_name) &&
                image_name_hex(images_dir, de->d_name, other) == 0 && strcmp(other, hex) == 0;
    closedir(d);
    return named;
}

/* The lower (hex) an entry's image.json names, into lower (65 bytes): 0, or -ENOENT when it
 * names none (an image, a flat snapshot). */
int image_entry_lower(const char *images_dir, const char *hex, char lower[65])
{
    char p[IMAGE_PATH_MAX + 128];
    const char *l;
    json_t *j;
    int r = -ENOENT;

    snprintf(p, sizeof(p), "%s/" STORE "/sha256/%.64s/image.json", images_dir, hex);
    j = json_load_file(p, 0, NULL);
    l = json_string_value(json_object_get(j, "lower"));
    if (l && strlen(l) == 64) {
        memcpy(lower, l, 65);
        r = 0;
    }
    json_decref(j);
    return r;
}

/* Does some stored entry (named or not) stack on hex? */
static bool hex_is_lower(const char *images_dir, const char *hex)
{
    char dir[IMAGE_PATH_MAX], lower[65];
    struct dirent *de;
    bool found = false;
    DIR *d;

    snprintf(dir, sizeof(dir), "%s/" STORE "/sha256", images_dir);
    d = opendir(dir);
    if (!d)
        return true; /* cannot tell: keep it */
    while (!found && (de = readdir(d)))
        found = strlen(de->d_name) == 64 && image_entry_lower(images_dir, de->d_name, lower) == 0 &&
                strcmp(lower, hex) == 0;
    closedir(d);
    return found;
}

static int gc_pass(const char *images_dir, bool (*in_use)(void *ctx, const char *digest), void *ctx,
                   struct lb_error *err);

int image_remove_unused(const char *images_dir, const char *name,
                        bool (*in_use)(void *ctx, const char *digest), void *ctx,
                        struct lb_error *err)
{
    char hex[65], digest[LB_IMAGE_DIGEST_MAX], p[IMAGE_PATH_MAX + 256], gone[IMAGE_PATH_MAX + 256];
    int r, lock;

    lock = image_store_lock(images_dir);
    if (lock < 0)
        return lb_error_set(err, lock, "cannot lock the image store: %s", strerror(-lock));
    r = image_find_hex(images_dir, name, hex, err);
    if (r < 0)
        goto out;
    snprintf(p, sizeof(p), "%s/%s", images_dir, name);
    if (unlink(p) < 0) {
        r = lb_error_set(err, -errno, "cannot remove '%s': %s", p, strerror(errno));
        goto out;
    }
    snprintf(digest, sizeof(digest), "sha256:%s", hex);
    if (hex_is_named(images_dir, hex) || tree_is_mounted(hex) || hex_is_lower(images_dir, hex) ||
        (in_use && in_use(ctx, digest))) {
        log_info("image store: removed the name %s (sha256:%s; its tree is still used)", name, hex);
        goto out; /* r == 0: image_gc takes the tree later */
    }
    /* out of sight first (one rename), then deleted: a crash leaves only .store/tmp */
    snprintf(p, sizeof(p), "%s/" STORE "/sha256/%s", images_dir, hex);
    snprintf(gone, sizeof(gone), "%s/" STORE "/tmp/gc-%s", images_dir, hex);
    if (rename(p, gone) < 0 || image_remove_tree(gone) < 0) {
        r = lb_error_set(err, -errno, "cannot remove the tree of %s: %s", name, strerror(errno));
        goto out;
    }
    log_info("image store: removed %s and its tree sha256:%s", name, hex);
    r = 1;
out:
    close(lock);
    return r;
}

int image_gc(const char *images_dir, bool (*in_use)(void *ctx, const char *digest), void *ctx,
             struct lb_error *err)
{
    int total = 0, r;

    /* a removed snapshot frees the entry below it for the next pass */
    do {
        r = gc_pass(images_dir, in_use, ctx, err);
        total += r > 0 ? r : 0;
    } while (r > 0);
    return r < 0 ? r : total;
}

static int gc_pass(const char *images_dir, bool (*in_use)(void *ctx, const char *digest), void *ctx,
                   struct lb_error *err)
{
    char dir[IMAGE_PATH_MAX], p[IMAGE_PATH_MAX + 128], gone[IMAGE_PATH_MAX + 128];
    char digest[LB_IMAGE_DIGEST_MAX];
    struct dirent *de;
    int removed = 0, r = 0, lock;
    DIR *d;

    snprintf(dir, sizeof(dir), "%s/" STORE "/sha256", images_dir);
    r = open_dir(dir, &d, err);
    if (!d)
        return r;
    lock = image_store_lock(images_dir);
    if (lock < 0) {
        closedir(d);
        return lb_error_set(err, lock, "cannot lock the image store: %s", strerror(-lock));
    }
    while ((de = readdir(d))) {
        snprintf(digest, sizeof(digest), "sha256:%.64s", de->d_name);
        if (!is_sha256_digest(digest) || strlen(de->d_name) != 64)
            continue;
        if (hex_is_named(images_dir, de->d_name) || tree_is_mounted(de->d_name) ||
            hex_is_lower(images_dir, de->d_name) || (in_use && in_use(ctx, digest)))
            continue;
        /* out of sight first (one rename), then deleted: a crash leaves only .store/tmp */
        snprintf(p, sizeof(p), "%s/%.64s", dir, de->d_name);
        snprintf(gone, sizeof(gone), "%s/" STORE "/tmp/gc-%.64s", images_dir, de->d_name);
        if (rename(p, gone) < 0 || image_remove_tree(gone) < 0) {
            if (r == 0)
                r = lb_error_set(err, -errno, "cannot remove the unnamed image %s: %s", digest,
                                 strerror(errno));
            continue;
        }
        log_info("image store: removed %s (no name and no live sandbox uses it)", digest);
        removed++;
    }
    closedir(d);
    close(lock);
    return r < 0 ? r : removed;
}
