/*
 * docker.h - the Docker Engine API provider (provider.name = docker).
 *
 * One container per sandbox, made through the Engine API on its unix socket (httpc.c,
 * libcurl). Tested against podman's Docker-compatible service (podman 4.3, API 1.41); real
 * Docker Engine is not installable on the test machine.
 *
 * Identity. A sandbox's container is named "lendbox-<instance>-<sandbox id>" and labelled
 * io.lendbox.instance=<instance>, io.lendbox.sandbox=<sandbox id>, so it is found and stopped
 * from the id alone, a create retried after a crash finds the first container instead of
 * making a second, and list returns exactly this daemon's containers. The container runs the
 * bind-mounted (read-only) lendbox-supervise --init as pid 1 at /run/lendbox/supervise.
 *
 * Spec mapping. resources.cpu -> NanoCpus, memory_mib -> Memory and MemorySwap (no swap),
 * pids -> PidsLimit, disk_mib -> size of the tmpfs mounted on the workdir and /tmp (the
 * container's own root layer is not bounded: the engine's storage driver decides). network:
 * only "no network" is enforceable (NetworkMode none): access absent/"inherit" with
 * network.inherit = none; anything else, and declared ports, are -EOPNOTSUPP (422).
 *
 * Exec protocol (docker_exec; meant for any engine with "run a command, give me its stdout",
 * e.g. LXD's exec with recorded output): the command runs as
 *   /run/lendbox/supervise --framed --max-output N --timeout-ms MS --cwd DIR [...] -- ARGV
 * through exec create + exec start (not detached, no TTY: a plain HTTP response carrying the
 * engine's multiplexed stdout/stderr stream, read by libcurl until the engine closes it). The
 * supervisor relays the command's stdout and stderr as frames on its stdout and ends with a
 * status frame (see supervise.c, "Framed mode"), so the timeout kills the whole process tree
 * inside the container, output is capped inside the container already, and the result fields
 * are those of the local provider. stdin bytes go in first as a file under /tmp through the
 * archive API (--stdin-file; the supervisor unlinks it). pass_fd: the daemon listens on a unix
 * socket under a random name in the sandbox's own host directory <state_dir>/docker-pass/<id>,
 * bind-mounted at /run/lendbox/pass; the supervisor (--pass-socket) connects, receives the fd
 * by SCM_RIGHTS and gives it to the command as fd 4. The daemon sends it only to the peer whose
 * SO_PEERCRED pid is the engine's "Pid" of the exec (docker_internal.h, struct docker_pass);
 * other sandbox processes that connect get nothing. exclusive: the supervisor (--exclusive)
 * first kills every process but the init; other execs of the sandbox get -EBUSY meanwhile.
 *
 * Files go through the archive API with tar streams made and read by libarchive: a write is
 * a one-file tar PUT at "/" (the engine creates missing parents and resolves the path inside
 * the container's root); a read stats the path (HEAD), follows the symlink target the engine
 * resolved inside the container, and extracts the GET's one regular file into an unlinked
 * temporary file on the host: that is file_open's fd + size. A file larger than
 * max_file_bytes (the stat's size) is refused before anything is spooled, and the spool
 * stops a tar that grows past it meanwhile, so one download holds at most about
 * max_file_bytes on the host's disk. Uploads (upload_begin) spool to
 * an unlinked temporary file on the host and are sent on commit.
 */
#ifndef LB_PROVIDER_DOCKER_H
#define LB_PROVIDER_DOCKER_H

#include "provider/engine/engine_config.h"
#include "provider/provider.h"

struct lb_docker_config {
    struct engine_config engine; /* socket (required, e.g. /run/docker.sock), default image,
                                  * instance label, state dir, supervisor, net_inherit */
    int64_t create_timeout_ms;   /* bound on each engine call of create */
    uint64_t max_file_bytes;     /* file_open refuses a larger file (-EFBIG) before spooling it,
                                  * and spools at most this (plus the tar's headers); 0: 1 GiB */
};

/* Make the provider: checks the socket answers /_ping and negotiates the API version (the
 * engine's, at most 1.43, at least 1.40). *out is owned by the caller (provider_destroy).
 * Returns 0, -EREMOTEIO when the engine cannot be reached or is too old, -EINVAL on a bad
 * config, -ENOMEM. */
int provider_docker_new(const struct lb_docker_config *cfg, struct lb_provider **out,
                        struct lb_error *err);

#endif
