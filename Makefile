# lendbox - hand-written GNU Makefile. Builds with pkg-config alone; `./configure` (autoconf)
# may write config.mak.autogen, which is read when present (git's pattern).
#
#   make            build build/lendboxd and build/lendbox-supervise
#   make run        install missing Debian packages, build, start lendboxd on 127.0.0.1:8787
#   make check      install missing Debian packages, build, run every test (e2e on two variants)
#   make e2e-image  the e2e suite with every sandbox on a test image (LENDBOX_E2E_VARIANT=image)
#   make e2e-docker part of the e2e suite on the docker provider against podman (variant docker)
#   make e2e-pool   part of the e2e suite with a warm pool in every daemon (variant pool; on
#                   lxd: variant lxd-pool, run by make e2e-lxd)
#   make e2e-lxd    part of the e2e suite on the lxd provider against a two-member LXD cluster
#   make asan       the same tests against an ASan+UBSan build (in build-asan/)
#   make tsan       the same tests against a ThreadSanitizer build (in build-tsan/)
#   make install    FHS install (PREFIX=/usr/local, DESTDIR supported; unit into UNITDIR)
#   make uninstall  remove what install put (keeps the operator's /etc/lendbox/lendbox.conf)
#   make deb        lendbox_VERSION_ARCH.deb and python3-lendbox_VERSION_all.deb into DEB_OUT
#                   (default: the parent directory of this tree, as dpkg-buildpackage does)
#   make systemd-test  the unit under a real systemd (nspawn; part of `make check`)
#   make bench      scripts/bench against a fresh daemon
#   make bench-warm scripts/bench-warm: a warm pool against none, interleaved
#   make bench-side scripts/bench-side: the bwrap floor, a container per episode (podman when
#                   installed), lendbox without and with a warm pool, interleaved; then idle
#                   memory, the shutdown sweep and reconciliation (BENCH_SIDE_ARGS: options)

-include config.mak.autogen
-include config.mak

PREFIX ?= /usr/local
SBINDIR ?= $(PREFIX)/sbin
LIBEXECDIR ?= $(PREFIX)/libexec
SYSCONFDIR ?= /etc
# The admin's unit dir by default; packagers set UNITDIR=$$(pkg-config systemd --variable
# systemdsystemunitdir) (/lib/systemd/system on Debian 12).
UNITDIR ?= /etc/systemd/system
DOCDIR ?= $(PREFIX)/share/doc/lendbox
MANDIR ?= $(PREFIX)/share/man

VERSION := 0.1.0
BUILD ?= build
CC ?= cc
PKG_CONFIG ?= pkg-config
PKGS := libmicrohttpd jansson sqlite3 libcurl libsystemd inih libcrypto libseccomp libnftables libnl-route-3.0 libarchive

OPT ?= -O2 -g
SAN ?=
CFLAGS_BASE := -std=c17 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wformat=2 \
	-Wno-unused-parameter -fno-strict-aliasing -pthread -Isrc \
	-DLB_VERSION='"$(VERSION)"'
ifeq ($(SAN),1)
CFLAGS_SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
ifeq ($(SAN),thread)
CFLAGS_SAN := -fsanitize=thread -fno-omit-frame-pointer
endif
DEPCFLAGS = $(shell $(PKG_CONFIG) --cflags $(PKGS) 2>/dev/null)
DEPLIBS = $(shell $(PKG_CONFIG) --libs $(PKGS) 2>/dev/null) -lm
CHECK_CFLAGS = $(shell $(PKG_CONFIG) --cflags check 2>/dev/null)
CHECK_LIBS = $(shell $(PKG_CONFIG) --libs check 2>/dev/null)
ALL_CFLAGS = $(CFLAGS_BASE) $(OPT) $(CFLAGS_SAN) $(DEPCFLAGS) $(CFLAGS) -MMD -MP
ALL_LDFLAGS = -pthread $(CFLAGS_SAN) $(LDFLAGS)

# Everything but the daemon binary's own wiring (src/main.c, src/daemon/) and the supervisor goes
# into one internal library.
LIB_SRCS := $(sort $(wildcard src/util/*.c src/store/*.c src/provider/*.c src/provider/local/*.c \
	src/provider/engine/*.c src/provider/docker/*.c src/provider/lxd/*.c src/pool/*.c src/auth/*.c \
	src/lend/*.c src/sweeper/*.c src/warm/*.c src/http/*.c src/routes/*.c src/image/*.c) \
	$(wildcard src/activation/*.c) \
	src/supervisor/user.c)
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
DAEMON_SRCS := src/main.c $(sort $(wildcard src/daemon/*.c))
DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(BUILD)/%.o)
UNIT_SRCS := $(sort $(wildcard tests/unit/check_*.c))
E2E_SRCS := $(sort $(wildcard tests/e2e/test_*.c))
E2E_LIB_SRCS := tests/e2e/harness.c
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
E2E_BINS := $(E2E_SRCS:tests/e2e/%.c=$(BUILD)/tests/%)

# The bench programs (scripts/bench*; not tests): built by `make unit` (so `make check`
# compiles them, -Werror) and by the bench targets.
BENCH_BINS := $(BUILD)/lendbox-bench $(BUILD)/lendbox-bench-docker $(BUILD)/lendbox-bench-side \
	$(BUILD)/lendbox-bench-fork

DAEMON := $(BUILD)/lendboxd
SUPERVISE := $(BUILD)/lendbox-supervise
LIB := $(BUILD)/liblendbox.a

.PHONY: all run check asan tsan install uninstall deb systemd-test deps test unit e2e e2e-image e2e-docker e2e-pool e2e-lxd pytest bench bench-warm bench-side clean format
all: $(DAEMON) $(SUPERVISE)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

# the code-context driver is built into the daemon (.incbin, a path from the top of the tree)
$(BUILD)/src/lend/context.o: src/lend/context_driver.py

$(LIB): $(LIB_OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

$(DAEMON): $(DAEMON_OBJS) $(LIB)
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(DEPLIBS)

# The supervisor runs inside every sandbox image: static, libc only, no sanitizers. It is every
# file of src/supervisor/ (user.c goes into the daemon's library too).
SUPERVISE_SRCS := $(sort $(wildcard src/supervisor/*.c))
$(SUPERVISE): $(SUPERVISE_SRCS) $(wildcard src/supervisor/*.h)
	@mkdir -p $(dir $@)
	$(CC) -std=c17 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -g -static -Isrc -o $@ \
		$(SUPERVISE_SRCS)
	@# exec-only: a sandbox uid cannot read it, so the kernel makes it non-dumpable at exec
	chmod 0711 $@

$(BUILD)/tests/check_%: tests/unit/check_%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) $(ALL_LDFLAGS) -o $@ $< $(LIB) $(DEPLIBS) $(CHECK_LIBS)

# check_engine_fake links the fake engine too (its files are no programs of their own).
UNIT_FAKE_SRCS := tests/unit/fake_engine.c tests/unit/fake_docker.c tests/unit/fake_lxd.c
$(BUILD)/tests/check_engine_fake: tests/unit/check_engine_fake.c $(UNIT_FAKE_SRCS) \
		tests/unit/fake_engine.h tests/unit/fake_engine_internal.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -Itests/unit $(ALL_LDFLAGS) -o $@ $< $(UNIT_FAKE_SRCS) \
		$(LIB) $(DEPLIBS) $(CHECK_LIBS)

$(BUILD)/tests/test_%: tests/e2e/test_%.c $(E2E_LIB_SRCS) tests/e2e/harness.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -Itests/e2e $(ALL_LDFLAGS) -o $@ $< $(E2E_LIB_SRCS) \
		$(LIB) $(DEPLIBS) $(CHECK_LIBS)

$(BENCH_BINS): $(BUILD)/lendbox-%: scripts/%.c scripts/bench-common.c scripts/bench-common.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $< scripts/bench-common.c $(DEPLIBS)

# The hostile probe test_forgery uploads into sandboxes: static, like the supervisor.
$(BUILD)/tests/lbt-probe: tests/e2e/lbt_probe.c
	@mkdir -p $(dir $@)
	$(CC) -std=c17 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -g -static -pthread -o $@ $<
$(BUILD)/tests/test_forgery: $(BUILD)/tests/lbt-probe
$(BUILD)/tests/test_activation: $(BUILD)/tests/lbt-probe
$(BUILD)/tests/test_reset: $(BUILD)/tests/lbt-probe

deps:
	@scripts/install-deps

run: deps
	@$(MAKE) --no-print-directory all
	@scripts/run-dev

# Tests find the binaries through these variables.
export LENDBOXD := $(abspath $(DAEMON))
export LENDBOX_SUPERVISE := $(abspath $(SUPERVISE))
export LENDBOX_SRCDIR := $(CURDIR)

unit: all $(UNIT_BINS) $(BENCH_BINS)
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; CK_FORK=yes $$t; done
	@echo "== tests/call-circles"; tests/call-circles $(BUILD)

e2e: all $(E2E_BINS)
	@set -e; for t in $(E2E_BINS); do echo "== $$t"; $$t; done
	@echo "== tests/readme-walkthrough"; tests/readme-walkthrough
	@echo "== tests/install-uninstall"; tests/install-uninstall
	@echo "== scripts/chaos (short run)"; scripts/chaos

# The e2e suite again on the "image" variant (tests/e2e/harness.h): every daemon's seeds run
# on a test image (tests/images/make-variant-image, built once into $(BUILD)/e2e-image). In
# `make check`, the programs about what runs inside a sandbox and what it leaves behind: its
# root and files, exec, activations, disk, isolation, network, lending, restarts and crashes.
# Left out there (E2E_IMAGE_PROGS=all runs them too; they pass on the image): those about the
# HTTP front, tokens, limits, pools, metrics, seccomp and bounded waits (auth_input, bounds,
# fair, forgery, limits, ops, service_env), which the root does not change, and the two that
# seed on images of their own (images, image_durability), to keep `make check` near 25 min on
# a busy 2-core machine. The shell tests above run on host only (the README walkthrough seeds
# on an image too). Another variant: a row in harness.c's lbt_variants[] and a target like
# this one.
E2E_IMAGE_PROGS ?= activation archive contexts disk durability exec files isolation lending lost \
	network reset restart snapshot fork probe
E2E_IMAGE_BINS = $(if $(filter all,$(E2E_IMAGE_PROGS)),$(E2E_BINS), \
	$(E2E_IMAGE_PROGS:%=$(BUILD)/tests/test_%))
e2e-image: all $(E2E_IMAGE_BINS)
	@tests/images/make-variant-image $(abspath $(BUILD))/e2e-image
	@set -e; for t in $(E2E_IMAGE_BINS); do echo "== $$t (variant image)"; \
		LENDBOX_E2E_VARIANT=image LENDBOX_E2E_IMAGE_DIR=$(abspath $(BUILD))/e2e-image $$t; done

# The e2e suite on the "docker" variant: every daemon runs provider.name = docker against one
# private podman API service (tests/podman-service, the test image lbtest:latest), started here
# once for all the programs and stopped after; without podman each program prints SKIP and
# passes. The programs of the suite shared with the local provider: lending, exec, files,
# durability (kill -9 and adoption, failed stops retried, the bounded sweep), activations; pty
# (its routes answer 501 there: no PTY capability); contexts (501 likewise); lost (a container
# removed behind lendbox's back answers 410 sandbox_lost; usage is the engine's stats); snapshot
# (commit plus the workdir's archive); warm_engine (a warm pool of 2: fill, take, refill,
# adoption, max age).
E2E_DOCKER_PROGS ?= lending exec files durability activation pty contexts lost snapshot archive \
	warm_engine
E2E_DOCKER_BINS = $(E2E_DOCKER_PROGS:%=$(BUILD)/tests/test_%)
e2e-docker: all $(E2E_DOCKER_BINS)
	@dir=$$(mktemp -d /tmp/lbt-podman-make-XXXXXX); \
	if [ -n "$$LENDBOX_RUN_DIR" ]; then printf 'podman\t%s\n' "$$dir" >>"$$LENDBOX_RUN_DIR/run.list"; fi; \
	if tests/podman-service start $$dir; then export LENDBOX_E2E_PODMAN_DIR=$$dir; \
	else echo "e2e-docker: podman cannot run here: every program skips"; \
		export LENDBOX_E2E_PODMAN_DIR=$$dir/none; fi; \
	rc=0; for t in $(E2E_DOCKER_BINS); do echo "== $$t (variant docker)"; \
		LENDBOX_E2E_VARIANT=docker $$t || { rc=1; break; }; done; \
	tests/podman-service stop $$dir; tests/leftover-check --podman-dir $$dir || rc=1; \
	rm -rf $$dir; exit $$rc

# The e2e suite on the "pool" variant (every test passes with a pool configured):
# every daemon a test starts keeps a warm pool of the default class (pool.size=2, small so that
# refills do not swamp two cores; a test's own pool.size wins). The programs whose seeds are of
# the default class (so they take warm sandboxes) and that count sandboxes, processes or uids,
# restart or crash the daemon, and probe (a warm sandbox taken is probed before it is lent).
# E2E_POOL_PROGS=all runs every program.
E2E_POOL_PROGS ?= activation exec files isolation lending restart durability reset probe seed_batch
E2E_POOL_BINS = $(if $(filter all,$(E2E_POOL_PROGS)),$(E2E_BINS), \
	$(E2E_POOL_PROGS:%=$(BUILD)/tests/test_%))
e2e-pool: all $(E2E_POOL_BINS)
	@set -e; for t in $(E2E_POOL_BINS); do echo "== $$t (variant pool)"; \
		LENDBOX_E2E_VARIANT=pool $$t; done

# The e2e suite on the "lxd" variant: every daemon runs provider.name = lxd through member a's
# socket of the two-member LXD cluster of scripts/lxd-cluster (brought up here once, left up:
# `scripts/lxd-cluster down` removes it; LXD_CLUSTER_INDEX says which, make check claims its
# own), plus test_lxd (cluster placement, adoption, a dead member, the octet-stream file
# pitfall), test_lxd_idmap (40 seeds at once, each instance in an id range of its own, kept
# across a restart) and test_lxd_burst (member b killed while 20 seeds are in flight). Where LXD cannot run the script exits 77 and every
# program is skipped (said here). activation runs on lxd with the receipt read back from the
# instance (capability receipt_file); its forged-receipt step is skipped there (said, and why).
# lost runs there for its usage case (the instance's state from LXD). snapshot, fork and reset
# run with LXD's own copies (the cases about the local provider's host-side copy, disk bounds
# and flattening skip, saying why). warm_engine: a warm pool of 4 fills (refills at once), a
# seed takes one, it refills, a restart adopts the pool, max age replaces one, nothing is left.
# lxd_burst: member b killed while 20 seeds are in flight; every seed answers, nothing is left.
E2E_LXD_PROGS ?= lending exec files durability activation lxd lxd_idmap lxd_burst lost snapshot fork \
	reset archive warm_engine
E2E_LXD_BINS = $(E2E_LXD_PROGS:%=$(BUILD)/tests/test_%)
# Then the pool variant's programs on lxd (variant lxd-pool: every daemon keeps a warm pool of
# 2 on the cluster), a subset to keep make check short: files (each test's seeds take warm
# instances; E2E_LXD_POOL_PROGS= others, e.g. lending exec, run them too; empty: none).
E2E_LXD_POOL_PROGS ?= files
E2E_LXD_POOL_BINS = $(E2E_LXD_POOL_PROGS:%=$(BUILD)/tests/test_%)
e2e-lxd: all $(E2E_LXD_BINS) $(E2E_LXD_POOL_BINS)
	@out=$$(scripts/lxd-cluster up); rc=$$?; echo "$$out" | tail -n 8; \
	if [ $$rc -eq 77 ]; then echo "e2e-lxd: SKIP: LXD cannot run here: $$out"; exit 0; fi; \
	[ $$rc -eq 0 ] || { echo "e2e-lxd: scripts/lxd-cluster up failed"; exit 1; }; \
	export LENDBOX_E2E_LXD_SOCKET=$$(echo "$$out" | sed -n 's/^socket=//p' | tail -n 1); \
	rc=0; for t in $(E2E_LXD_BINS); do echo "== $$t (variant lxd)"; \
		LENDBOX_E2E_VARIANT=lxd $$t || { rc=1; break; }; done; \
	[ $$rc -ne 0 ] || for t in $(E2E_LXD_POOL_BINS); do echo "== $$t (variant lxd-pool)"; \
		LENDBOX_E2E_VARIANT=lxd-pool $$t || { rc=1; break; }; done; exit $$rc

# The Python client (clients/python) against real daemons: Debian's python3 and pytest, never
# the python3 first on PATH (it may be a pyenv build without Debian's python3-* packages).
PYTHON ?= /usr/bin/python3
pytest: all
	@echo "== tests/python (pytest)"; cd tests/python && $(PYTHON) -m pytest -q -p no:cacheprovider

test: unit e2e e2e-image e2e-docker e2e-pool e2e-lxd pytest

# tests/with-run makes the run its own (as for asan and tsan): a run dir (LENDBOX_RUN_DIR), an
# LXD test cluster (make e2e-lxd) of its own (the first LXD_CLUSTER_INDEX from 1 that no other
# run claims, by flock on /run/lendbox-test/lxd-cluster.<i> held until the run ends, and where
# nothing of that index exists; LXD_CLUSTER_INDEX given: that one), taken down at the end, pass
# or fail. Then tests/leftover-check fails the check when any process of this run still runs (a
# daemon, a sandbox of one, a podman service or conmon of the run's roots): the run's processes
# carry LENDBOX_RUN_DIR, and the harness lists the run's uid ranges and podman roots there. What
# else two runs at once keep apart: docs/architecture.md, "Tests".
#
# The suites run in two lanes at once (tests/lanes; LANES=no runs them one after the other):
# lane-local, the local provider's suites (CPU bound), beside lane-engines, those that mostly
# wait on LXD, podman and systemd-nspawn (a run here: 32 and 45 min with the pool variant in
# the second, so it moved to the first). Everything is built first, so the lanes' makes never
# build the same file at once.
LANES ?= yes
TEST_BUILD = all $(UNIT_BINS) $(BENCH_BINS) $(E2E_BINS) $(BUILD)/tests/lbt-probe
lane-local: unit e2e e2e-image e2e-pool pytest
lane-engines: e2e-lxd e2e-docker systemd-test
check: deps
	@tests/with-run check sh -c '$(MAKE) --no-print-directory -j2 $(TEST_BUILD) >/dev/null && \
		if [ "$(LANES)" = yes ]; then tests/lanes "$(MAKE) --no-print-directory lane-local" \
			"$(MAKE) --no-print-directory lane-engines"; \
		else $(MAKE) --no-print-directory test && $(MAKE) --no-print-directory systemd-test; fi'

# A real two-member LXD cluster on this machine (scripts/lxd-cluster; root, Debian's lxd). The
# check uses a cluster of its own (the first free LXD_CLUSTER_INDEX from 1, claimed like make
# check's) and skips, saying why, where LXD cannot run.
.PHONY: lxd-cluster-up lxd-cluster-down lxd-check
lxd-cluster-up:
	@scripts/lxd-cluster up
lxd-cluster-down:
	@scripts/lxd-cluster down
lxd-check:
	@echo "== tests/lxd-cluster-check"; tests/lxd-cluster-check; rc=$$?; \
		if [ $$rc -eq 77 ]; then echo "lxd-check: SKIPPED (LXD cannot run on this machine)"; \
		exit 0; fi; exit $$rc

# The unit under a real systemd (systemd-nspawn of a cached debootstrap root), then the Debian
# packages of `make deb` installed, used and purged in a fresh copy of that root; needs root.
systemd-test: all
	@echo "== tests/systemd-unit"; tests/systemd-unit

asan: deps
	@tests/with-run asan $(MAKE) --no-print-directory BUILD=build-asan SAN=1 OPT='-O1 -g' test

# `make tsan`: every suite of `make test` (unit programs, e2e on the host and on the image,
# docker, pool and lxd variants, pytest) against a ThreadSanitizer build (in build-tsan/). Every
# instrumented process writes its reports to $(TSAN_DIR)/tsan.<pid> (a daemon's stderr goes to a
# log the tests delete); the run fails if any report was written. tests/tsan.supp lists races
# inside libraries only (a race in src/ is fixed, not listed there). Not instrumented, so not
# checked for races: lendbox-supervise and the test probe lbt-probe (static, libc only: they run
# inside sandbox roots that have no sanitizer runtime) and systemd-test, left out (it installs the
# release build into an nspawn root, which has no libtsan either). Like `make check`, the run has
# its own run dir and LXD cluster through tests/with-run, taken down with tests/leftover-check at
# the end, pass or fail.
TSAN_DIR = $(abspath build-tsan)/reports
tsan: deps
	@rm -rf $(TSAN_DIR) && mkdir -p $(TSAN_DIR); \
	rc=0; TSAN_OPTIONS="log_path=$(TSAN_DIR)/tsan second_deadlock_stack=1 \
		suppressions=$(CURDIR)/tests/tsan.supp $$TSAN_OPTIONS" tests/with-run tsan \
		$(MAKE) --no-print-directory BUILD=build-tsan SAN=thread OPT='-O1 -g' test || rc=$$?; \
	if ls $(TSAN_DIR)/tsan.* >/dev/null 2>&1; then \
		echo "ThreadSanitizer reports:"; cat $(TSAN_DIR)/tsan.*; exit 1; fi; exit $$rc

bench: all $(BENCH_BINS)
	@scripts/bench

bench-warm: all $(BENCH_BINS)
	@scripts/bench-warm

BENCH_SIDE_ARGS ?= $(if $(shell command -v podman 2>/dev/null),--podman)
bench-side: all $(BENCH_BINS)
	@scripts/bench-side $(BENCH_SIDE_ARGS)

install: all
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(LIBEXECDIR)/lendbox $(DESTDIR)$(SYSCONFDIR)/lendbox \
		$(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR) $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(MANDIR)/man1
	install -m 0755 $(DAEMON) $(DESTDIR)$(SBINDIR)/lendboxd
	install -m 0711 $(SUPERVISE) $(DESTDIR)$(LIBEXECDIR)/lendbox/lendbox-supervise
	@# an existing configuration is the operator's: install the new one beside it
	if [ -e $(DESTDIR)$(SYSCONFDIR)/lendbox/lendbox.conf ]; then \
		install -m 0644 etc/lendbox.conf $(DESTDIR)$(SYSCONFDIR)/lendbox/lendbox.conf.dist; \
	else \
		install -m 0644 etc/lendbox.conf $(DESTDIR)$(SYSCONFDIR)/lendbox/lendbox.conf; \
	fi
	sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
		-e 's|@DOCDIR@|$(DOCDIR)|g' systemd/lendboxd.service > $(DESTDIR)$(UNITDIR)/lendboxd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/lendboxd.service
	install -m 0644 README.md docs/*.md $(DESTDIR)$(DOCDIR)/
	sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
		-e 's|@DOCDIR@|$(DOCDIR)|g' -e 's|@LIBEXECDIR@|$(LIBEXECDIR)|g' \
		-e 's|@VERSION@|$(VERSION)|g' docs/lendboxd.8 > $(DESTDIR)$(MANDIR)/man8/lendboxd.8
	chmod 0644 $(DESTDIR)$(MANDIR)/man8/lendboxd.8
	@# lendbox(1), the command of clients/python (installed with that package)
	sed -e 's|@DOCDIR@|$(DOCDIR)|g' -e 's|@VERSION@|$(VERSION)|g' docs/lendbox.1 \
		> $(DESTDIR)$(MANDIR)/man1/lendbox.1
	chmod 0644 $(DESTDIR)$(MANDIR)/man1/lendbox.1

# Exactly what install put, and the directories it made if they are empty now. The operator's
# lendbox.conf stays (lendbox.conf.dist, ours, goes); so does the state dir.
uninstall:
	rm -f $(DESTDIR)$(SBINDIR)/lendboxd $(DESTDIR)$(LIBEXECDIR)/lendbox/lendbox-supervise \
		$(DESTDIR)$(UNITDIR)/lendboxd.service $(DESTDIR)$(MANDIR)/man8/lendboxd.8 \
		$(DESTDIR)$(MANDIR)/man1/lendbox.1 \
		$(DESTDIR)$(SYSCONFDIR)/lendbox/lendbox.conf.dist \
		$(addprefix $(DESTDIR)$(DOCDIR)/,README.md $(notdir $(wildcard docs/*.md)))
	rmdir $(DESTDIR)$(LIBEXECDIR)/lendbox $(DESTDIR)$(DOCDIR) 2>/dev/null || true
	rmdir $(DESTDIR)$(SYSCONFDIR)/lendbox 2>/dev/null || true

# Debian packages: dpkg-buildpackage -us -uc -b in a copy of the tracked files (git ls-files, or
# every file but the build dirs outside a git checkout) at $(DEB_STAGE) with scripts/debian/ as
# its debian/, then lintian (errors fail; warnings are printed), then the two .debs into DEB_OUT.
# The build tools are in scripts/install-deps; debian/changelog's version must be VERSION's.
# Debian's python3 and tools build it, never a python3 first on PATH (as for pytest below).
DEB_OUT ?= $(abspath $(CURDIR)/..)
DEB_STAGE := $(abspath $(BUILD))/deb/lendbox-$(VERSION)
deb:
	@v=$$(dpkg-parsechangelog -l scripts/debian/changelog -S Version) && [ "$$v" = "$(VERSION)" ] || \
		{ echo "make deb: scripts/debian/changelog says $$v, the Makefile's VERSION is $(VERSION)"; exit 1; }
	rm -rf $(dir $(DEB_STAGE))
	mkdir -p $(DEB_STAGE)
	if git -C $(CURDIR) rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		git -C $(CURDIR) ls-files -z --cached --others --exclude-standard | \
			tar -C $(CURDIR) --null -T - --ignore-failed-read -cf - | tar -C $(DEB_STAGE) -xf -; \
	else \
		tar -C $(CURDIR) --exclude=./build --exclude=./build-asan --exclude=./build-tsan \
			--exclude=./clients/python/build -cf - . | tar -C $(DEB_STAGE) -xf -; \
	fi
	rm -rf $(DEB_STAGE)/debian && cp -a scripts/debian $(DEB_STAGE)/debian
	cd $(DEB_STAGE) && env PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc -b -jauto
	lintian --fail-on error --tag-display-limit 0 $(dir $(DEB_STAGE))lendbox_$(VERSION)_*.changes
	mkdir -p $(DEB_OUT)
	cp $(dir $(DEB_STAGE))lendbox_$(VERSION)_*.deb $(dir $(DEB_STAGE))python3-lendbox_$(VERSION)_all.deb \
		$(DEB_OUT)/

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
