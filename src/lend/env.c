/*
 * env.c - the environment a command in a sandbox gets (exec, the ready probe): the base of
 * the files that run commands, calling nothing of lend itself.
 */
#include "lend/lend_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* see lend_private.h */
char **lend_exec_env(json_t *spec, const char *workdir, json_t *req_env)
{
    /* no HOME: the supervisor sets the user's, from the sandbox's /etc/passwd */
    json_t *env = json_pack("{s:s,s:s,s:s}", "PATH",
                            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG",
                            "C.UTF-8", "LENDBOX_WORKDIR", workdir);
    json_t *seed_env = json_object_get(spec, "env");
    const char *k;
    json_t *v;
    char **out = NULL;
    size_t i = 0;

    json_t *image_env = json_object_get(spec, "image_env");

    if (!env)
        goto out;
    json_array_foreach(image_env, i, v) {
        const char *kv = json_string_value(v), *eq = kv ? strchr(kv, '=') : NULL;

        if (eq && eq != kv)
            json_object_setn_new(env, kv, (size_t)(eq - kv), json_string(eq + 1));
    }
    i = 0;
    if (json_is_object(seed_env))
        json_object_update(env, seed_env);
    if (json_is_object(req_env))
        json_object_update(env, req_env);
    out = calloc(json_object_size(env) + 1, sizeof(char *));
    if (!out)
        goto out;
    json_object_foreach(env, k, v) {
        const char *s = json_string_value(v);

        if (!s || asprintf(&out[i], "%s=%s", k, s) < 0) {
            out[i] = NULL;
            continue;
        }
        i++;
    }
out:
    json_decref(env);
    return out;
}

/* see lend_private.h */
void lend_exec_env_free(char **env)
{
    for (size_t i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}
