/*
 * main.c - lendboxd's entry: the command line (flags become config assignments), then either a
 * subcommand (routes, image) or the daemon's life in order: configure, start, serve until a
 * signal, drain, close. The daemon's wiring is in src/daemon/ (daemon.h): config.c turns the
 * configuration into each component's, daemon.c starts, runs and stops the components,
 * image.c is the image subcommand. These files and main.c are the daemon binary's own; they
 * are the only ones that see every module.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "routes/routes.h"
#include "util/log.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lendboxd [--config FILE] [--listen HOST:PORT] [--state-dir DIR]\n"
            "                [--admin-token-file FILE] [--log-level LEVEL]\n"
            "                [--set SECTION.KEY=VALUE]... [--no-shutdown-sweep]\n"
            "                [--version] [--help]\n"
            "       lendboxd [OPTIONS] image import [--provider lxd] SOURCE NAME | image list | "
            "image rm NAME\n"
            "       lendboxd routes   (print the route table: METHOD PATTERN AUTH NAME)\n\n"
            "Lends Linux-namespace sandboxes to resources servers over HTTP (API: docs/api.md).\n"
            "Flags override the config file; --set sets any key of etc/lendbox.conf.\n"
            "LENDBOX_FAULTS=OP=ACTION[,...] injects failures (tests and rehearsals only).\n");
}

/* Command line: flags become assignments applied over the config file. Returns -1 to go on,
 * else the exit status (0 for --version/--help, 1 out of memory, 2 for a usage error). */
static int daemon_parse_args(struct daemon *d, int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"listen", required_argument, NULL, 'l'},
        {"state-dir", required_argument, NULL, 's'},
        {"admin-token-file", required_argument, NULL, 'a'},
        {"log-level", required_argument, NULL, 'L'},
        {"set", required_argument, NULL, 'S'},
        {"no-shutdown-sweep", no_argument, NULL, 'N'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;

    /* Flags override the file, so collect them first and apply them after loading it. Options
     * end at the first word ("+"): `image import --provider lxd` keeps its own. */
    while ((c = getopt_long(argc, argv, "+c:l:s:a:L:S:NVh", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            d->config_file = optarg;
            break;
        case 'l':
        case 's':
        case 'a':
        case 'L': {
            const char *key = c == 'l'   ? "server.listen="
                              : c == 's' ? "server.state_dir="
                              : c == 'a' ? "server.admin_token_file="
                                         : "server.log_level=";
            if (asprintf(&d->sets[d->n_sets++], "%s%s", key, optarg) < 0) {
                d->sets[--d->n_sets] = NULL;
                fprintf(stderr, "lendboxd: out of memory\n");
                return 1;
            }
            break;
        }
        case 'S':
            d->sets[d->n_sets++] = strdup(optarg);
            break;
        case 'N':
            d->sets[d->n_sets++] = strdup("lending.shutdown_sweep=no");
            break;
        case 'V':
            printf("lendboxd %s\n", LB_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc && strcmp(argv[optind], "routes") == 0 && optind + 1 == argc) {
        routes_print(stdout);
        return 0;
    }
    if (optind < argc && strcmp(argv[optind], "image") != 0) {
        fprintf(stderr, "lendboxd: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv)
{
    static struct daemon d = {.lock_fd = -1, .listen_fd = -1};
    struct lb_error err = {0};
    int rc;

    d.sets = calloc((size_t)argc + 1, sizeof(char *));
    if (!d.sets || config_init(&d.cfg) < 0) {
        fprintf(stderr, "lendboxd: out of memory\n");
        free(d.sets);
        return 1;
    }
    rc = daemon_parse_args(&d, argc, argv);
    if (rc >= 0)
        goto out;
    if (daemon_load_config(&d, &err) < 0)
        goto fail;
    if (optind < argc) { /* "image ...": the image store subcommand, no daemon */
        rc = daemon_image_command(&d.cfg, argc - optind - 1, argv + optind + 1);
        goto out;
    }
    daemon_setup_process(&d);
    if (daemon_fault_host_keyrings(&err) < 0 || daemon_open_state(&d, &err) < 0 ||
        daemon_open_backends(&d, &err) < 0 || daemon_start_services(&d, &err) < 0 ||
        daemon_become_ready(&d, &err) < 0)
        goto fail;
    daemon_wait_for_signal(&d);
    daemon_drain(&d);
    rc = 0;
    goto out;
fail:
    log_error("%s", err.message[0] ? err.message : "startup failed");
    rc = 1;
out:
    daemon_close(&d);
    return rc;
}
