/*
 * image.h - the image store: OCI/Docker images imported with skopeo and unpacked with umoci,
 * kept by digest, named by symlinks.
 *
 * Layout of an images dir (local.images_dir, default <state_dir>/images):
 *   NAME                          symlink -> .store/sha256/<hex>/rootfs (a name of the image)
 *   .store/sha256/<hex>/rootfs/   the unpacked root tree, owned as the image says (root-owned)
 *   .store/sha256/<hex>/image.json {"digest","architecture","os","env","working_dir",
 *                                   "size_bytes","created_at"}
 *   .store/tmp/                   imports and snapshots in progress; never visible under a name
 * A snapshot (see "snapshots" below) is an entry too: its rootfs is a layer over the entry its
 * image.json names as lower, beside a workspace/ dir (docs/architecture.md, "Snapshots on
 * disk").
 * Because a name is a directory (through its symlink), the provider's plain-directory images
 * (a tree placed under images_dir by hand) and imported images are named the same way.
 *
 * The digest of an image is the digest of its OCI config blob as skopeo writes it into an OCI
 * layout (for an OCI source, the source's own config digest; skopeo converts a docker-save
 * config, so the same image saved both ways may get two digests). An import copies the source
 * into a temporary OCI layout (skopeo), reads the config digest, and
 * unpacks (umoci raw unpack) only when no image of that digest is stored; the finished tree is
 * renamed into place, then the name's symlink is replaced atomically (rename). A crash leaves
 * only a directory under .store/tmp, removed by image_store_clean_tmp. Publishing and naming,
 * removals and garbage collection hold the store's lock (flock on .store/lock), also across
 * processes (the daemon and `lendboxd image`).
 *
 * Thread-safety: the functions only touch the file system and the arguments; concurrent
 * imports of the same digest are safe (the first rename wins, the others discard theirs).
 * Removing a name while a seed resolves it is not serialised here (the caller checks use).
 */
#ifndef LB_IMAGE_H
#define LB_IMAGE_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include <jansson.h>

#include "util/error.h"

#define LB_IMAGE_NAME_MAX 128
#define LB_IMAGE_DIGEST_MAX 72 /* "sha256:" + 64 hex + NUL */

/* A snapshot stacks at most this many layers above its base image's tree; a snapshot of a
 * sandbox whose image already has that many is flattened (its whole merged root is stored). */
#define LB_IMAGE_DEPTH_MAX 4
#define LB_IMAGE_SOURCE_MAX 64

struct lb_image_info {
    char name[LB_IMAGE_NAME_MAX + 1];
    char digest[LB_IMAGE_DIGEST_MAX];
    int64_t size_bytes; /* total of the regular files' sizes in the root tree (a snapshot: in
                           its layer and workspace) */
    int64_t created_at; /* unix seconds of the unpack (a snapshot: of its capture) */
    bool snapshot;      /* kind "snapshot" (else "image") */
    char base[LB_IMAGE_NAME_MAX + 1];            /* a snapshot's base image name, or "host" */
    char source_sandbox_id[LB_IMAGE_SOURCE_MAX]; /* a snapshot's source sandbox */
    int depth;   /* layers above the bottom full tree: 0 for an image or a flat snapshot */
    bool hidden; /* a fork's implicit snapshot: not listed by GET /v1/images, removed by
                    image_remove_unused once nothing stands on it */
};

/* The trees a seed of an image stacks, top first (see image_layers). */
struct lb_image_layers {
    size_t n;                                 /* 0: a snapshot of "host" (no root tree) */
    char paths[LB_IMAGE_DEPTH_MAX + 1][4200]; /* rootfs dirs; the last is a full tree */
    char workspace[4200];                     /* the top snapshot's workspace dir, or "" */
    bool host;                                /* the root is the host's (a host snapshot) */
};

/* true if name is usable as an image name: [A-Za-z0-9][A-Za-z0-9._-]*, at most
 * LB_IMAGE_NAME_MAX bytes, and not "host" (the host's root is not a stored image). */
bool image_name_is_valid(const char *name);

/* Make images_dir and its .store dirs, 0700: only root reaches the trees (their setuid files and
 * device nodes are root's as the image says; sandboxes see them only through the nosuid, nodev
 * mounts local_image_mount makes).
 * Returns 0 or a negative errno with err set. */
int image_store_init(const char *images_dir, struct lb_error *err);

/* Remove every leftover of an interrupted import under .store/tmp. Call with no import
 * running (the daemon's start). Returns 0 or a negative errno with err set. */
int image_store_clean_tmp(const char *images_dir, struct lb_error *err);

/*
 * Import source as name. source is "docker-archive:PATH", "oci-archive:PATH", "oci:DIR[:REF]",
 * a local engine's image store ("containers-storage:[DRIVER@ROOT+RUNROOT]IMAGE" for podman /
 * CRI-O, "docker-daemon:IMAGE" for a Docker engine's socket), or a bare path: a directory is an
 * OCI layout, a file a docker-save or OCI archive (tried in that order). Registry transports
 * are refused (-EINVAL). Runs skopeo and umoci, found in PATH. The image must be for linux on
 * the host's architecture (else -EOPNOTSUPP, nothing stored). Device nodes in its layers are
 * skipped (removed from the unpacked tree, logged).
 * out (may be NULL) gets the image's name, digest, size and creation time; *existed (may be
 * NULL) is true when the digest was already stored (nothing was unpacked).
 * Returns 0, -EINVAL (bad name or source), -ENOENT (source missing), -EPROTO (the tools
 * refused the source; err has their message), or another negative errno.
 */
int image_import(const char *images_dir, const char *source, const char *name,
                 struct lb_image_info *out, bool *existed, struct lb_error *err);

/* The stored image name: fills out. Returns 0, -ENOENT (no such imported image; a plain
 * directory placed by hand is not an imported image), or a negative errno. */
int image_get(const char *images_dir, const char *name, struct lb_image_info *out,
              struct lb_error *err);

/* The run config of the imported image name: *env_out (may be NULL) gets its config Env (a
 * JSON array of "K=V" strings, or NULL when it has none; the caller decrefs), *working_dir_out
 * (may be NULL) its WorkingDir (malloc'd, NULL when it has none). Returns 0, -ENOENT (not an
 * imported image, e.g. a tree placed by hand: no config), or a negative errno. */
int image_read_config(const char *images_dir, const char *name, json_t **env_out,
                      char **working_dir_out, struct lb_error *err);

/* Every named imported image, sorted by name. *out is a malloc'd array of *n entries (the
 * caller frees it); empty store: *out NULL, *n 0. Returns 0 or a negative errno. */
int image_list(const char *images_dir, struct lb_image_info **out, size_t *n, struct lb_error *err);

/* Remove the name (its tree stays for image_gc, which removes it once nothing uses it). The
 * caller checks first that no live sandbox uses the image. Returns 0, -ENOENT, or a negative
 * errno. */
int image_remove(const char *images_dir, const char *name, struct lb_error *err);

/* The image's config User resolved for running in a sandbox, whose ids are 0..65535 (each
 * sandbox maps that whole range):
 * no User (or "") → 0 with *user_out NULL; a User that resolves, by number or through the
 * image's /etc/passwd and /etc/group (read inside the image's root), to ids in that range →
 * 0 with *user_out a malloc'd "UID" or "UID:GID" (when it names a group; the caller frees),
 * the default user of the sandbox's execs; a User the image does not name or outside the
 * range → -EOPNOTSUPP naming it (never run silently as another user). -ENOENT: not an imported
 * image (a tree placed by hand has no config). Thread-safe. */
int image_resolve_user(const char *images_dir, const char *name, char **user_out,
                       struct lb_error *err);

/* The imported image name as an LXD unified tarball, written to out_fd (a plain tar, which LXD
 * takes as is): metadata.yaml (architecture: uname's machine, creation_date now, properties
 * description/os/release naming the image) and rootfs/ (the image's tree with owners, modes and
 * links as stored; hard links become copies). What LXD or the lxd provider need and the image
 * lacks is added: the directories dev, proc, sys, run, tmp (1777) and workspace, and, when the
 * image has no /sbin/init (or /sbin is a link to a directory of the image without one), the file
 * at init_path (the static lendbox-supervise, which runs as an init when it is pid 1 without
 * arguments) as /sbin/init, mode 0755; *init_added says whether it was. Returns 0, -ENOENT (no
 * such imported image), -EOPNOTSUPP (an /sbin that is no directory of the image, and no init),
 * or a negative errno with err set. Thread-safe. */
int image_write_lxd_tarball(const char *images_dir, const char *name, const char *init_path,
                            int out_fd, bool *init_added, struct lb_error *err);

/* The host's architecture as OCI names it ("amd64", "arm64", ...; else uname's machine).
 * Imports refuse (-EOPNOTSUPP) an image whose config names another architecture or an os
 * other than linux. Returns a static string. Thread-safe. */
const char *image_host_architecture(void);

/* ---- snapshots (docs/architecture.md, "Snapshots on disk") ----
 *
 * A snapshot is made in three steps: image_snapshot_prepare makes a work dir under .store/tmp
 * with empty rootfs/ and workspace/ (0755, root's) into which the provider captures; then
 * image_snapshot_publish writes its image.json, renames it into .store/sha256/<random hex> and
 * links the name, all under the store's lock; image_snapshot_discard removes a work dir that
 * will not be published. A crash at any point leaves only .store/tmp (image_store_clean_tmp) or
 * an unnamed tree (image_gc). */

/* Make the work dir: *work_out (size bytes) gets its path. 0 or a negative errno. */
int image_snapshot_prepare(const char *images_dir, char *work_out, size_t size,
                           struct lb_error *err);

/* Publish work as the snapshot name of a sandbox seeded from base ("host" or a stored image
 * name) by source_id. flattened: work/rootfs holds a whole tree (stacks on nothing) rather
 * than a layer over base. hidden: a fork's implicit snapshot (image.json "hidden": true, info
 * .hidden). labels: a JSON object of strings kept in its image.json (NULL: none; borrowed).
 * out (may be NULL) gets the new image's info. Consumes work (removed
 * on failure too). Returns 0; -EINVAL (bad name); -EEXIST (the name exists: 409); -ENOENT
 * (base is no stored image any more); or another negative errno. Thread-safe (store lock). */
int image_snapshot_publish(const char *images_dir, const char *work, const char *name,
                           const char *base, const char *source_id, bool flattened, bool hidden,
                           json_t *labels, struct lb_image_info *out, struct lb_error *err);

/* The labels of the stored image name: *out gets a new reference to a JSON object (empty for
 * an image or a snapshot taken without labels; the caller decrefs). 0, -ENOENT (no such stored
 * image), -ENOMEM. Thread-safe. */
int image_labels(const char *images_dir, const char *name, json_t **out, struct lb_error *err);

/* Remove a work dir of image_snapshot_prepare. */
void image_snapshot_discard(const char *work);

/* The trees a sandbox of image name mounts, top first: for an imported image (or a directory
 * placed by hand) its one tree; for a snapshot its layer, each lower snapshot's layer, then the
 * bottom full tree; for a snapshot of "host" none (out->host). out->workspace is the top
 * snapshot's workspace ("" for an image). Returns 0, -ENOENT (no such image or a broken
 * chain), or a negative errno. Thread-safe. */
int image_layers(const char *images_dir, const char *name, struct lb_image_layers *out,
                 struct lb_error *err);

/* ---- engine snapshots ----
 *
 * A snapshot an engine provider (docker, lxd) captures is an entry like the others whose
 * rootfs/ and workspace/ stay empty: the provider writes IMAGE_ENGINE_JSON into the work dir,
 * naming the engine image that holds the snapshot's root ("image"), the provider
 * ("provider"), the workdir it was taken from ("workdir", "" when the root holds it) and the
 * file in the entry holding that workdir as a tar archive ("archive", absent when the root
 * holds it: lxd). The local provider refuses such an entry; the
 * engine provider that made it seeds from its engine image and archive. */
#define IMAGE_ENGINE_JSON "engine.json"

struct lb_image_engine {
    char image[256];    /* the engine's image reference (e.g. "sha256:<hex>") */
    char workdir[256];  /* the source sandbox's workdir, absolute; "" when the root holds it */
    char archive[4300]; /* absolute path of the workdir's tar archive, or "" */
};

/* What stored image name is to provider: 0 and *out when it is a snapshot provider made;
 * -ENOENT (err untouched) when name is no such snapshot (not in the store, an imported image:
 * the engine's own name); -EMEDIUMTYPE (err set) when it is a snapshot of another provider
 * (the local one included). Thread-safe. */
int image_engine_snapshot(const char *images_dir, const char *name, const char *provider,
                          struct lb_image_engine *out, struct lb_error *err);

/* Whether a stored tree (named or not yet collected) or a capture's work dir under .store/tmp
 * holds provider's engine.json naming engine image image; true also when the store cannot be
 * read. A capture's publish (tmp -> sha256) during the call is seen. Thread-safe. */
bool image_engine_image_kept(const char *images_dir, const char *provider, const char *image);

/* *out = how many named snapshots stack directly on the tree name points to (their lower).
 * Returns 0 or a negative errno. */
int image_count_dependents(const char *images_dir, const char *name, int64_t *out,
                           struct lb_error *err);

/* Remove the name and, under the same lock, its stored tree when nothing else holds it: no
 * other name points to it, no mount of this process shows it, no stored entry stacks on it,
 * and in_use(ctx, "sha256:<hex>") (may be NULL) is false. Safe while imports or snapshots run
 * (unlike image_gc: it touches only this name's tree). Returns 1 when the tree went too, 0 when
 * only the name went, -ENOENT (no such name), or a negative errno. Thread-safe. */
int image_remove_unused(const char *images_dir, const char *name,
                        bool (*in_use)(void *ctx, const char *digest), void *ctx,
                        struct lb_error *err);

/* Garbage-collect the store: remove every stored digest that no name points to, that no mount
 * of this process's mount table shows, that no remaining entry's lower names, and for which
 * in_use(ctx, "sha256:<hex>") (may be NULL) is false (the caller answers from its records: a live
 * sandbox's digest). Call it with no import or removal running on images_dir. Returns the number of
 * trees removed, or a negative errno with err set (the others are still tried). */
int image_gc(const char *images_dir, bool (*in_use)(void *ctx, const char *digest), void *ctx,
             struct lb_error *err);

#endif
