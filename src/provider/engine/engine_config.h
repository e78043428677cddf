/*
 * engine_config.h - what the configuration of every engine-backed provider carries (docker.h
 * and lxd.h embed it; engine_setup in engine.h copies it). Plain data, no functions.
 */
#ifndef LB_PROVIDER_ENGINE_CONFIG_H
#define LB_PROVIDER_ENGINE_CONFIG_H

struct engine_config {
    const char *socket;         /* the engine's unix socket; NULL or "": none (e.g. HTTPS) */
    const char *default_image;  /* for a spec without one (or "host"); NULL or "": none */
    const char *instance;       /* this daemon's label value; NULL or "": from state_dir */
    const char *state_dir;      /* the spool is <state_dir>/<provider name>-spool */
    const char *supervise_path; /* host path of the static lendbox-supervise */
    const char *net_inherit;    /* [network] inherit (only "none" is enforceable); NULL: "none" */
    const char *images_dir;     /* the daemon's image store (snapshots); NULL: none */
};

#endif
