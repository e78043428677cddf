/*
 * image_internal.h - what image.c shares with image_snapshot.c: the store's layout and the
 * entry helpers. Not for use outside src/image/.
 *
 * Every function returns 0 (or the value said) or a negative errno; paths are absolute; `hex` is
 * an entry's 64-hex sha256 name under .store/sha256/. Thread-safety: callers that change the
 * store hold image_store_lock.
 */
#ifndef LB_IMAGE_INTERNAL_H
#define LB_IMAGE_INTERNAL_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "image/image.h"

#define STORE ".store"
#define IMAGE_PATH_MAX 4096

/* mkdir(2) that accepts an existing directory. */
int image_mkdir_mode(const char *path, mode_t mode);
/* Removes a tree (not following symlinks); a missing path is not an error. */
int image_remove_tree(const char *path);
/* Takes the store's exclusive lock; returns the lock's fd (the caller closes it to release). */
int image_store_lock(const char *images_dir);
/* Total bytes of the regular files under path, or a negative errno. */
int64_t image_tree_size(const char *path);
/* Points the name at entry hex by an atomic rename of a new symlink (replacing an older name);
 * -EEXIST if the name is a plain directory placed by hand. */
int image_link_name(const char *images_dir, const char *name, const char *hex,
                    struct lb_error *err);
/* The entry a name points at, without error detail; -ENOENT if the name is unknown. */
int image_name_hex(const char *images_dir, const char *name, char hex[65]);
/* The same for a valid name, with "no image" detail in err (-ENOENT). */
int image_find_hex(const char *images_dir, const char *name, char hex[65], struct lb_error *err);
/* A named image's entry: hex gets its sha256 name, *out its image.json (the caller's, to
 * json_decref). -ENOENT with detail when the name is unknown or its image.json unreadable. */
int image_load_entry(const char *images_dir, const char *name, char hex[65], json_t **out,
                     struct lb_error *err);
/* An entry's image.json read into out. */
int image_read_info(const char *images_dir, const char *name, const char *hex,
                    struct lb_image_info *out, struct lb_error *err);
/* The entry a snapshot entry stands on (lower gets its hex); -ENOENT if it stands on none. */
int image_entry_lower(const char *images_dir, const char *hex, char lower[65]);

#endif
