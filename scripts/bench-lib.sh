# scripts/bench-lib.sh - shell functions the bench scripts share (sourced, not run): daemons
# with state dirs of their own, lending many idle sandboxes, daemon RSS and host memory per
# idle sandbox, the shutdown sweep, the reconciliation of many records. The caller sets WORK (a
# 0711 scratch dir), runs from the repository's root, and calls bench_cleanup from its trap.
# Nothing here asserts on speed.

BENCH_PIDS=""
BENCH_CGROUPS=""

# bench_start NAME [--set k=v]...: a lendboxd with state dir $WORK/NAME, a random uid range of
# 6000 slots of 65536 ids (5,000 idle sandboxes fit)
# (kept in $WORK/NAME.base for a restart) and a cgroup parent of its own; waits until it is
# ready. Its pid: $WORK/NAME.pid. BENCH_PREFIX: a command to run it under (e.g. perf record);
# BENCH_LOG_LEVEL: its log level (warn); BENCH_KEEP_LOGS: a directory the daemons' logs are
# copied to at the end; BENCH_LENDBOXD: the daemon to run (build/lendboxd; it
# runs the lendbox-supervise next to it).
bench_start() {
    _name=$1
    shift
    [ -s "$WORK/$_name.base" ] ||
        echo $(( (18311 + $(od -An -N2 -tu2 /dev/urandom) % 1000) * 65536 )) >"$WORK/$_name.base"
    _cg="lendbox-bench-$$-$_name"
    BENCH_CGROUPS="$BENCH_CGROUPS $_cg"
    rm -f "$WORK/$_name/listen"
    ${BENCH_PREFIX:-} "${BENCH_LENDBOXD:-build/lendboxd}" --state-dir "$WORK/$_name" --listen 127.0.0.1:0 \
        --log-level "${BENCH_LOG_LEVEL:-warn}" --set lending.max_sandboxes=100000 \
        --set local.uid_base="$(cat "$WORK/$_name.base")" --set local.uid_count=6000 \
        --set local.cgroup_parent="$_cg" "$@" \
        >>"$WORK/$_name.log" 2>&1 &
    echo $! >"$WORK/$_name.pid"
    BENCH_PIDS="$BENCH_PIDS $!"
    # for tests/leftover-check --run-dir "$WORK" (bench_check_leftovers)
    printf 'daemon\t%s\t%s\t6000\n' "$WORK/$_name" "$(cat "$WORK/$_name.base")" >>"$WORK/run.list"
    until [ -s "$WORK/$_name/listen" ] &&
        curl -sf "http://$(cat "$WORK/$_name/listen")/readyz" >/dev/null 2>&1; do
        kill -0 "$(cat "$WORK/$_name.pid")" 2>/dev/null || { cat "$WORK/$_name.log" >&2; return 1; }
        sleep 0.05
    done
}
bench_url() { echo "http://$(cat "$WORK/$1/listen")"; }
bench_token() { cat "$WORK/$1/admin.token"; }
bench_pid() { cat "$WORK/$1.pid"; }

# bench_lend NAME N [BODY [FIRST]]: lend sandboxes to sessions idle-FIRST .. idle-(N-1)
# (FIRST: 0), 16 seeds at a time; BODY: the seeds' JSON ({"task_id":"idle"}).
bench_lend() {
    _url=$(bench_url "$1")
    _tok=$(bench_token "$1")
    _body=${3:-'{"task_id":"idle"}'}
    _i=${4:-0}
    _pids=""
    while [ $_i -lt "$2" ]; do
        curl -sf -X POST -H "Authorization: Bearer $_tok" -d "$_body" \
            "$_url/v1/sessions/idle-$_i/seed" >/dev/null &
        _pids="$_pids $!"
        _i=$((_i + 1))
        # wait for this batch only (a bare `wait` would also wait for the daemons)
        if [ $((_i % 16)) -eq 0 ]; then for _p in $_pids; do wait "$_p" || true; done; _pids=""; fi
    done
    for _p in $_pids; do wait "$_p" || true; done
}
bench_lent() {
    curl -sf -H "Authorization: Bearer $(bench_token "$1")" "$(bench_url "$1")/v1/sessions" |
        jq '.sessions | length'
}

mem_available_kib() { awk '/^MemAvailable:/ {print $2}' /proc/meminfo; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
# The processes running as a uid of [$1, $1 + 65536) (a daemon's sandbox uids): how many, and
# the sum of their proportional set sizes (Pss, KiB): "N KIB".
uid_range_pss() {
    _pids=$(grep -H '^Uid:' /proc/[0-9]*/status 2>/dev/null |
        awk -v lo="$1" -v hi=$(($1 + 65536)) '{ split($1, a, "/"); if ($2 >= lo && $2 < hi) print a[3] }')
    _np=$(echo $_pids | wc -w)
    if [ "$_np" -eq 0 ]; then echo "0 0"; return; fi
    echo "$_np $(for _p in $_pids; do echo "/proc/$_p/smaps_rollup"; done | xargs grep -h '^Pss:' 2>/dev/null |
        awk '{ s += $2 } END { print s + 0 }')"
}

# bench_idle NAME N: a fresh daemon NAME lends N idle sandboxes; prints the daemon's RSS before
# and after, the Pss of the sandboxes' processes per sandbox (their user memory; a v1 host gives
# a sandbox without memory limit no memory cgroup to read), and the host's MemAvailable drop per
# sandbox (all of it, kernel memory and tmpfs included; noisy when other work runs). The
# daemon keeps running.
bench_idle() {
    bench_start "$1"
    _pid=$(bench_pid "$1")
    _rss0=$(rss_kib "$_pid")
    _avail0=$(mem_available_kib)
    _t0=$(date +%s%N)
    bench_lend "$1" "$2"
    _t1=$(date +%s%N)
    sleep 1
    _n=$(bench_lent "$1")
    _rss1=$(rss_kib "$_pid")
    _avail1=$(mem_available_kib)
    set -- "$@" $(uid_range_pss "$(cat "$WORK/$1.base")")
    echo "  lent: $_n of $2 (seeded 16 at a time in $(( (_t1 - _t0) / 1000000 )) ms)"
    echo "  lendboxd RSS: $((_rss0 / 1024)) MiB idle, $((_rss1 / 1024)) MiB with $_n lent" \
        "($(( (_rss1 - _rss0) / (_n > 0 ? _n : 1) )) KiB per sandbox)"
    echo "  sandbox processes (bwrap monitor + init, by uid): $3, Pss $(($4 / 1024)) MiB =" \
        "$(($4 / (_n > 0 ? _n : 1))) KiB per sandbox (user memory only)"
    echo "  host MemAvailable drop: $(( (_avail0 - _avail1) / 1024 )) MiB =" \
        "$(( (_avail0 - _avail1) / (_n > 0 ? _n : 1) )) KiB per sandbox (machine shared: noisy)"
}

# bench_sweep NAME: SIGTERM the daemon NAME and time until it has exited (the shutdown sweep
# stops every live sandbox first).
bench_sweep() {
    _pid=$(bench_pid "$1")
    _n=$(bench_lent "$1")
    _t0=$(date +%s%N)
    kill -TERM "$_pid"
    wait "$_pid" || true
    _t1=$(date +%s%N)
    echo "  shutdown sweep of $_n live sandboxes: SIGTERM to exit $(( (_t1 - _t0) / 1000000 )) ms"
    grep -h "shutdown sweep" "$WORK/$1.log" | sed 's/^.*lendboxd: /  daemon: /' || true
}

# bench_reconcile NAME N: a daemon restarts over N lent records: 10 of real running sandboxes
# (lent, then the daemon killed -9) and N - 10 whose sandboxes are gone (pid 1 never matches
# the start time recorded). Prints the daemon's "reconciled in" line. RECON_PREFIX: a command
# to run that restart under (e.g. perf record). The daemon keeps running.
bench_reconcile() {
    _r="$WORK/$1"
    bench_start "$1"
    _url=$(bench_url "$1")
    _tok=$(bench_token "$1")
    for _i in $(seq 10); do
        curl -sf -X POST -H "Authorization: Bearer $_tok" -d '{"task_id":"live"}' \
            "$_url/v1/sessions/live-$_i/seed" >/dev/null
    done
    kill -KILL "$(bench_pid "$1")"
    wait "$(bench_pid "$1")" 2>/dev/null || true
    sqlite3 "$_r/lendbox.db" <<SQL
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $(($2 - 10)))
INSERT INTO sandboxes (id, rsid, task_id, provider, state, spec_json, descriptor_json,
                       token_hash, created_at, updated_at)
SELECT printf('sbx-gone%022d', i), printf('gone-%d', i), 't', 'local', 'lent', '{}',
       printf('{"pid":1,"start_time":1,"uid":%d,"dir":"%s/sandboxes/x","workdir":"/workspace"}',
              1000000000 + (i % 60000), '$_r'),
       NULL, strftime('%s','now'), strftime('%s','now')
FROM n;
COMMIT;
SQL
    BENCH_LOG_LEVEL=info BENCH_PREFIX="${RECON_PREFIX:-}" bench_start "$1"
    grep -h "reconciled in" "$WORK/$1.log" | tail -1 | sed 's/^.*lendboxd: /  /'
}

# Stop every daemon still running (the shutdown sweep stops their sandboxes).
bench_cleanup_daemons() {
    for _p in $BENCH_PIDS; do kill -TERM "$_p" 2>/dev/null || true; done
    for _p in $BENCH_PIDS; do wait "$_p" 2>/dev/null || true; done
    BENCH_PIDS=""
}

# Stop every daemon still running, then fail (naming them) when a process of the run is left:
# a daemon, a sandbox's processes (by the daemons' uid ranges and slot claims), or anything run
# with LENDBOX_RUN_DIR=$WORK in its environment (export it before bench_start to cover those).
bench_check_leftovers() {
    bench_cleanup_daemons
    tests/leftover-check --run-dir "$WORK"
}

# bench_cleanup_daemons, then remove the cgroup parents the daemons made and WORK.
bench_cleanup() {
    bench_cleanup_daemons
    for _cg in $BENCH_CGROUPS; do
        for _d in /sys/fs/cgroup/*/"$_cg" /sys/fs/cgroup/"$_cg"; do
            [ -d "$_d" ] && rmdir "$_d" 2>/dev/null || true
        done
    done
    if [ -n "${BENCH_KEEP_LOGS:-}" ]; then
        mkdir -p "$BENCH_KEEP_LOGS" && cp "$WORK"/*.log "$BENCH_KEEP_LOGS"/ 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
