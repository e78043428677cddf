/*
 * test_network.c - acceptance for network access: model_only / model_and_tools /
 * inherit, enforced by host-side nftables rules on a per-sandbox veth; endpoints.
 *
 * Network safety: every address dialled is on this machine. The test hosts are addresses this
 * test adds to the host's lo (198.18.A.1-3 and fd00:1db8:A::1, A from the pid) before anything
 * dials them and removes afterwards; the servers on them are python3 http.server / a UDP echo
 * started by the test. The sandboxes' own addresses come from 10.213.A.0/24 and exist only on
 * the veths the daemon makes. Each daemon gets its own nftables table (lbt<pid>), deleted at
 * teardown.
 *
 * The test hosts on lo are addresses of this machine, so the daemon treats them as host-local
 * servers: only their listed ports are open. Remote hosts (every port open) are made in a
 * network namespace of this test's own (lbtn<pid>) behind a veth (lbtv<pid>h on the host) with
 * 198.51.100.B/29 (TEST-NET-2): forwarding is turned on for that veth only (the daemon turns it
 * on for its sandbox veths), never the host-wide net.ipv4.ip_forward; deleted at teardown.
 *
 * inherit = nat needs net.ipv4.ip_forward, so it is tested with a daemon run inside a network
 * namespace of this test's own (lbtq<pid>, forwarding on there only), linked by a veth to a
 * second one (lbtr<pid>) that plays a remote host; both use 203.0.113.0/24 (TEST-NET-3) and
 * have no route anywhere else. Deleted at teardown.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;
static int A;                               /* this run's third octet */
static char MODEL[32], TOOL[32], OTHER[32]; /* test hosts on lo */
static char V6[64];                         /* an IPv6 test host on lo */
static char HOSTLOCAL[32]; /* 192.0.2.A on lo: a non-loopback address of this host */
static char RANGE[32], TABLE[32];
static char HOSTSIDE0[32], SBX1[32];         /* host end of the first link, the second sandbox */
static int P1, P2, PLOOP, PLOOP_OTHER, PUDP; /* server ports */
static pid_t servers[24];
static int n_servers;
static bool added[5];

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fprintf(stderr, "test_network: '%s' failed\n", cmd);
}

static int sh_rc(const char *cmd)
{
    int st = system(cmd);

    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void hosts_down(void);
static void netns_down(void);
static void netns_up(void);
static void natns_down(void);
static void natns_up(void);
static void registry_add(const struct lbt_daemon *d);

/* Start argv as a host process of the test (its own session); remembered for teardown. */
static void spawn(const char *const *argv)
{
    pid_t pid = fork();

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open("/dev/null", 2);

        setsid();
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    servers[n_servers++] = pid;
}

/* Wait until addr:port (TCP) accepts (up to 20 s: python3 starts slowly on a loaded machine). */
static void wait_listening(const char *addr, int port)
{
    for (int i = 0; i < 400; i++) {
        struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
        bool v6 = strchr(addr, ':') != NULL;
        int s = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;

        if (v6)
            inet_pton(AF_INET6, addr, &in6.sin6_addr);
        else
            inet_pton(AF_INET, addr, &in.sin_addr);
        ok = connect(s, v6 ? (struct sockaddr *)&in6 : (struct sockaddr *)&in,
                     v6 ? sizeof(in6) : sizeof(in)) == 0;
        close(s);
        if (ok)
            return;
        lbt_sleep_ms(50);
    }
    hosts_down();
    ck_abort_msg("test server %s:%d did not start", addr, port);
}

static void http_server(const char *addr, int port)
{
    char p[16];
    const char *argv[] = {"python3", "-m",          "http.server", p,   "--bind",
                          addr,      "--directory", "/tmp",        NULL};

    snprintf(p, sizeof(p), "%d", port);
    spawn(argv);
}

static void add_lo_addr(int i, const char *addr, const char *prefix)
{
    char cmd[256];

    /* the address must not exist yet: then it is this test's own */
    snprintf(cmd, sizeof(cmd), "ip -o addr show dev lo | grep -qw '%s'", addr);
    if (sh_rc(cmd) == 0) {
        hosts_down();
        ck_abort_msg("test host address %s already exists", addr);
    }
    snprintf(cmd, sizeof(cmd), "ip addr add %s/%s dev lo", addr, prefix);
    if (sh_rc(cmd) != 0) {
        hosts_down();
        ck_abort_msg("cannot add %s to lo", addr);
    }
    added[i] = true;
}

/* This program's index NET_K of the 30 test networks, claimed host-wide (harness.h: lbt_claim)
 * for as long as it runs: two test_network at once (two clones' make check) never share an
 * address, a port or a range. Names of links, namespaces and the nft table carry the pid. */
static int NET_K = -1;

/* This run's names, addresses and ports (from NET_K and the pid of the process running the
 * tests). */
static void names_init(void)
{
    if (NET_K < 0)
        NET_K = lbt_claim("test-network", 30, 1, NULL);
    /* ports below the ephemeral range (32768-60999), so no outgoing connection holds them */
    A = NET_K + 20;
    P1 = 20000 + NET_K * 2;
    P2 = P1 + 1;
    PLOOP = 12000 + NET_K * 2;
    PLOOP_OTHER = PLOOP + 1;
    PUDP = 28000 + NET_K;
    snprintf(MODEL, sizeof(MODEL), "198.18.%d.1", A);
    snprintf(TOOL, sizeof(TOOL), "198.18.%d.2", A);
    snprintf(OTHER, sizeof(OTHER), "198.18.%d.3", A);
    snprintf(V6, sizeof(V6), "fd00:1db8:%x::1", A);
    snprintf(HOSTLOCAL, sizeof(HOSTLOCAL), "192.0.2.%d", A);
    snprintf(RANGE, sizeof(RANGE), "10.213.%d.0/24", A);
    snprintf(HOSTSIDE0, sizeof(HOSTSIDE0), "10.213.%d.0", A);
    snprintf(SBX1, sizeof(SBX1), "10.213.%d.3", A);
    snprintf(TABLE, sizeof(TABLE), "lbt%d", (int)getpid());
}

static void hosts_up(void)
{
    const char *udp[] = {"python3",
                         "-c",
                         "import socket,sys\n"
                         "socks=[]\n"
                         "for port in (53, int(sys.argv[2])):\n"
                         "  s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                         "  s.bind((sys.argv[1],port)); socks.append(s)\n"
                         "import select\n"
                         "while True:\n"
                         "  r,_,_=select.select(socks,[],[])\n"
                         "  for s in r:\n"
                         "    d,a=s.recvfrom(512); s.sendto(d,a)\n",
                         MODEL,
                         NULL,
                         NULL};
    char pudp[16];

    names_init();
    add_lo_addr(0, MODEL, "32");
    add_lo_addr(1, TOOL, "32");
    add_lo_addr(2, OTHER, "32");
    add_lo_addr(3, V6, "128");
    add_lo_addr(4, HOSTLOCAL, "32");
    http_server(MODEL, P1);
    http_server(MODEL, P2);
    http_server(TOOL, P1);
    http_server(OTHER, P1);
    http_server(V6, P1);
    http_server(HOSTLOCAL, P1);
    http_server(HOSTLOCAL, P2);
    http_server("127.0.0.1", PLOOP);
    http_server("127.0.0.1", PLOOP_OTHER);
    snprintf(pudp, sizeof(pudp), "%d", PUDP);
    udp[3] = MODEL;
    udp[4] = pudp;
    spawn(udp);
    wait_listening(MODEL, P1);
    wait_listening(MODEL, P2);
    wait_listening(TOOL, P1);
    wait_listening(OTHER, P1);
    wait_listening(V6, P1);
    wait_listening(HOSTLOCAL, P1);
    wait_listening(HOSTLOCAL, P2);
    wait_listening("127.0.0.1", PLOOP);
    wait_listening("127.0.0.1", PLOOP_OTHER);
    netns_up();
}

/* The remote test hosts: a network namespace NETNS of this test's own, reached over a veth
 * pair VETH (host end) / VETH_NS, addresses from 198.51.100.0/24 (TEST-NET-2, used by nothing
 * else here): 198.51.100.B+1 the host end, +2 the model host, +3 a host nobody allows, +4 the
 * tool host, /29. Forwarding is turned on for VETH only (the replies come in there); the
 * host-wide net.ipv4.ip_forward is left as it is. */
static char NETNS[32], VETH[16], VETH_NS[16], NS_HOSTEND[32], NS_MODEL[32], NS_OTHER[32],
    NS_TOOL[32];
static bool netns_made;

static void netns_server(const char *addr, int port)
{
    char p[16];
    const char *argv[] = {"ip", "netns",  "exec", NETNS,         "python3", "-m", "http.server",
                          p,    "--bind", addr,   "--directory", "/tmp",    NULL};

    snprintf(p, sizeof(p), "%d", port);
    spawn(argv);
}

static void netns_up(void)
{
    char cmd[1024], path[64];
    int b = NET_K * 8;

    snprintf(NETNS, sizeof(NETNS), "lbtn%d", (int)getpid());
    snprintf(VETH, sizeof(VETH), "lbtv%dh", (int)getpid());
    snprintf(VETH_NS, sizeof(VETH_NS), "lbtv%dn", (int)getpid());
    snprintf(NS_HOSTEND, sizeof(NS_HOSTEND), "198.51.100.%d", b + 1);
    snprintf(NS_MODEL, sizeof(NS_MODEL), "198.51.100.%d", b + 2);
    snprintf(NS_OTHER, sizeof(NS_OTHER), "198.51.100.%d", b + 3);
    snprintf(NS_TOOL, sizeof(NS_TOOL), "198.51.100.%d", b + 4);
    /* nothing of ours may exist yet, and no address of the /29 either */
    snprintf(cmd, sizeof(cmd), "ip -o addr show | grep -q ' 198\\.51\\.100\\.%d/29'", b + 1);
    snprintf(path, sizeof(path), "/run/netns/%s", NETNS);
    if (sh_rc(cmd) == 0 || access(path, F_OK) == 0) {
        hosts_down();
        ck_abort_msg("test network 198.51.100.%d/29 already exists", b);
    }
    netns_made = true;
    snprintf(cmd, sizeof(cmd),
             "set -e; ip netns add %1$s; ip link add %2$s type veth peer name %3$s netns %1$s; "
             "ip addr add %4$s/29 dev %2$s; ip link set %2$s up; "
             "echo 1 > /proc/sys/net/ipv4/conf/%2$s/forwarding; "
             "ip -n %1$s link set lo up; ip -n %1$s link set %3$s up; "
             "ip -n %1$s addr add %5$s/29 dev %3$s; ip -n %1$s addr add %6$s/29 dev %3$s; "
             "ip -n %1$s addr add %7$s/29 dev %3$s; ip -n %1$s route add default via %4$s",
             NETNS, VETH, VETH_NS, NS_HOSTEND, NS_MODEL, NS_OTHER, NS_TOOL);
    if (sh_rc(cmd) != 0) {
        hosts_down();
        ck_abort_msg("cannot make the test network namespace %s", NETNS);
    }
    netns_server(NS_MODEL, P1);
    netns_server(NS_MODEL, P2);
    netns_server(NS_OTHER, P1);
    netns_server(NS_TOOL, P1);
    netns_server(NS_TOOL, P2);
    wait_listening(NS_MODEL, P1);
    wait_listening(NS_MODEL, P2);
    wait_listening(NS_OTHER, P1);
    wait_listening(NS_TOOL, P1);
    wait_listening(NS_TOOL, P2);
}

static void netns_down(void)
{
    if (!netns_made)
        return;
    sh("ip link del %s 2>/dev/null; ip netns del %s 2>/dev/null; true", VETH, NETNS);
    netns_made = false;
}

/* The nat test network: NAT_NS is where the nat test's daemon runs ("the host": forwarding on,
 * 203.0.113.1/24 with its broadcast 203.0.113.255), NAT_PEER a remote host behind it
 * (203.0.113.2, default route via NAT_NS). Each runs a UDP echo on 0.0.0.0:PUDP that answers
 * "<its name>:<what it got>". */
static char NAT_NS[32], NAT_PEER[32];
static bool natns_made;

static void udp_echo_in(const char *ns, const char *tag)
{
    char p[16];
    const char *argv[] = {"ip",
                          "netns",
                          "exec",
                          ns,
                          "python3",
                          "-c",
                          "import socket,sys\n"
                          "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                          "s.bind(('0.0.0.0',int(sys.argv[1])))\n"
                          "while True:\n"
                          "  d,a=s.recvfrom(512); s.sendto(sys.argv[2].encode()+b':'+d,a)\n",
                          p,
                          tag,
                          NULL};

    snprintf(p, sizeof(p), "%d", PUDP);
    spawn(argv);
}

static void natns_up(void)
{
    char cmd[1024], path[64];

    snprintf(NAT_NS, sizeof(NAT_NS), "lbtq%d", (int)getpid());
    snprintf(NAT_PEER, sizeof(NAT_PEER), "lbtr%d", (int)getpid());
    snprintf(path, sizeof(path), "/run/netns/%s", NAT_NS);
    if (access(path, F_OK) == 0) {
        hosts_down();
        ck_abort_msg("test network namespace %s already exists", NAT_NS);
    }
    natns_made = true;
    snprintf(cmd, sizeof(cmd),
             "set -e; ip netns add %1$s; ip netns add %2$s; "
             "ip -n %1$s link add q0 type veth peer name r0 netns %2$s; "
             "ip -n %1$s link set lo up; ip -n %2$s link set lo up; "
             "ip -n %1$s addr add 203.0.113.1/24 brd + dev q0; ip -n %1$s link set q0 up; "
             "ip -n %2$s addr add 203.0.113.2/24 brd + dev r0; ip -n %2$s link set r0 up; "
             "ip -n %2$s route add default via 203.0.113.1; "
             "ip netns exec %1$s sysctl -qw net.ipv4.ip_forward=1",
             NAT_NS, NAT_PEER);
    if (sh_rc(cmd) != 0) {
        hosts_down();
        ck_abort_msg("cannot make the nat test namespaces %s, %s", NAT_NS, NAT_PEER);
    }
    udp_echo_in(NAT_NS, "host");
    udp_echo_in(NAT_PEER, "peer");
    for (int i = 0;; i++) {
        snprintf(cmd, sizeof(cmd),
                 "ip netns exec %s ss -Hlun 'sport = :%d' | grep -q . && "
                 "ip netns exec %s ss -Hlun 'sport = :%d' | grep -q .",
                 NAT_NS, PUDP, NAT_PEER, PUDP);
        if (sh_rc(cmd) == 0)
            break;
        if (i == 400) {
            hosts_down();
            ck_abort_msg("the nat test's UDP echo servers did not start");
        }
        lbt_sleep_ms(50);
    }
}

static void natns_down(void)
{
    if (!natns_made)
        return;
    sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null; true", NAT_NS, NAT_PEER);
    natns_made = false;
}

static void hosts_down(void)
{
    const char *addrs[5] = {MODEL, TOOL, OTHER, V6, HOSTLOCAL};
    const char *prefix[5] = {"32", "32", "32", "128", "32"};

    for (int i = 0; i < n_servers; i++) {
        kill(servers[i], SIGKILL);
        waitpid(servers[i], NULL, 0);
    }
    n_servers = 0;
    netns_down();
    natns_down();
    for (int i = 0; i < 5; i++) {
        if (added[i])
            sh("ip addr del %s/%s dev lo", addrs[i], prefix[i]);
        added[i] = false;
    }
}

static void daemon_start(const char *listen, const char *faults)
{
    char range[64], table[64], l[64], f[160];
    const char *args[12];
    int n = 0;

    snprintf(range, sizeof(range), "network.range=%s", RANGE);
    snprintf(table, sizeof(table), "network.nft_table=%s", TABLE);
    args[n++] = "--set";
    args[n++] = range;
    args[n++] = "--set";
    args[n++] = table;
    if (listen) {
        snprintf(l, sizeof(l), "%s", listen);
        args[n++] = "--listen";
        args[n++] = l;
    }
    if (faults) {
        snprintf(f, sizeof(f), "faults.spec=%s", faults);
        args[n++] = "--set";
        args[n++] = f;
    }
    args[n] = NULL;
    lbt_daemon_start(&D, args);
    registry_add(&D);
}

/*
 * Cleanup when a check fails: Check ends a failed test's process without its checked teardown
 * (and without atexit), so what must go is handled from places that still run. The test hosts
 * belong to the unchecked fixture, in the parent process, whose teardown runs after every test
 * whatever happened. Each test's daemon is written to a registry file; the next test's setup
 * and the parent's teardown stop any daemon still running (SIGTERM: its shutdown sweep removes
 * its sandboxes, links and rule elements) and remove its state dir.
 */
static char REGISTRY[64];

static void registry_add(const struct lbt_daemon *d)
{
    FILE *f = fopen(REGISTRY, "ae");

    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s\n", d->state_dir);
    fclose(f);
}

static bool pid_runs_daemon_of(pid_t pid, const char *state_dir)
{
    char path[64], buf[4096];
    size_t n;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    f = fopen(path, "re");
    if (!f)
        return false;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        buf[i] = buf[i] ? buf[i] : ' ';
    buf[n] = '\0';
    return strstr(buf, "lendboxd") && strstr(buf, state_dir);
}

static void registry_reap(void)
{
    char dir[512], path[600];
    FILE *f = fopen(REGISTRY, "re");

    if (!f)
        return;
    while (fgets(dir, sizeof(dir), f)) {
        FILE *pf;
        int pid = 0;

        dir[strcspn(dir, "\n")] = '\0';
        if (strncmp(dir, "/tmp/lendbox-e2e-", 17) != 0)
            continue;
        snprintf(path, sizeof(path), "%s.pid", dir);
        pf = fopen(path, "re");
        if (pf) {
            if (fscanf(pf, "%d", &pid) != 1)
                pid = 0;
            fclose(pf);
        }
        if (pid > 0 && pid_runs_daemon_of(pid, dir)) {
            fprintf(stderr, "test_network: stopping daemon %d of a failed test\n", pid);
            kill(pid, SIGTERM);
            for (int i = 0; i < 1200 && pid_runs_daemon_of(pid, dir); i++)
                lbt_sleep_ms(50);
        }
        sh("rm -rf '%s' '%s.log' '%s.pid'", dir, dir, dir);
    }
    fclose(f);
    f = fopen(REGISTRY, "we");
    if (f)
        fclose(f);
}

static void setup_hosts(void)
{
    snprintf(REGISTRY, sizeof(REGISTRY), "/tmp/lbt-network-%d.daemons", (int)getpid());
    hosts_up();
}

static void teardown_hosts(void)
{
    registry_reap();
    unlink(REGISTRY);
    hosts_down();
    sh("nft delete table inet %s 2>/dev/null || true", TABLE);
}

/* The nat test's own hosts: only its namespaces (no test hosts on lo). */
static void setup_nat_hosts(void)
{
    snprintf(REGISTRY, sizeof(REGISTRY), "/tmp/lbt-network-%d.daemons", (int)getpid());
    names_init();
    natns_up();
}

/* Each test starts D with this run's network settings; the fixture's clean-up stops it, and
 * its shutdown sweep removes the sandboxes with those settings. Before each test:
 * registry_reap, for what a failed test before this one left running. */
static const struct lbt_fixture NET_FIXTURE = {
    .d = &D, .prepare = registry_reap, .test_starts = true};

/* ---------- helpers ---------- */

static json_t *seed_net(const char *rsid, const char *network_json, const char *more)
{
    char extra[2048];

    snprintf(extra, sizeof(extra), "\"network\": %s%s%s", network_json, more ? ", " : "",
             more ? more : "");
    return lbt_seed(&D, rsid, "t", extra);
}

static char *model_only(void)
{
    static char buf[256];

    snprintf(buf, sizeof(buf), "{\"access\": \"model_only\", \"model_server\": \"http://%s:%d\"}",
             MODEL, P1);
    return buf;
}

/* curl from inside the sandbox: "<http code> <seconds>" (000 when refused). */
static void sbx_curl(const char *id, const char *url, char *code, double *secs)
{
    char cmd[512];
    char *out;

    snprintf(cmd, sizeof(cmd),
             "curl -s -m 5 -o /dev/null -w '%%{http_code} %%{time_total}' '%s'; true", url);
    out = lbt_sh(&D, id, cmd);
    ck_assert_msg(sscanf(out, "%3s %lf", code, secs) == 2, "curl said '%s'", out);
    free(out);
}

static void assert_reaches(const char *id, const char *url)
{
    char code[8];
    double s;

    sbx_curl(id, url, code, &s);
    ck_assert_msg(strcmp(code, "200") == 0, "%s from %s: %s, want 200", url, id, code);
}

static void assert_refused(const char *id, const char *url)
{
    char code[8];
    double s;

    sbx_curl(id, url, code, &s);
    ck_assert_msg(strcmp(code, "000") == 0, "%s from %s: %s, want refused", url, id, code);
    ck_assert_msg(s < 1.0, "%s from %s took %.3f s to be refused (want < 1 s)", url, id, s);
}

static char *url(const char *host, int port)
{
    static char bufs[8][128];
    static int i;
    char *b = bufs[i++ % 8];

    snprintf(b, 128, strchr(host, ':') ? "http://[%s]:%d/" : "http://%s:%d/", host, port);
    return b;
}

static int api_port(void)
{
    const char *c = strrchr(D.base_url, ':');

    return c ? atoi(c + 1) : 0;
}

/* Lines of `cmd` output on the host. */
static int count_lines(const char *cmd)
{
    char buf[512];
    int n = 0;
    FILE *p = popen(cmd, "r");

    ck_assert_ptr_nonnull(p);
    while (fgets(buf, sizeof(buf), p))
        n++;
    pclose(p);
    return n;
}

/* Elements in the table's sets and map (one per line of JSON-free listing). */
static int count_nft_elements(void)
{
    char cmd[256];

    snprintf(
        cmd, sizeof(cmd),
        "for s in ifs nat_ifs allow4 allowp4 hostside4 lport4; do nft list set inet %s $s; done "
        "2>/dev/null | grep -o '\"lb[0-9a-z]*\"' ; nft list map inet %s lmap4 2>/dev/null "
        "| grep -o '\"lb[0-9a-z]*\"'",
        TABLE, TABLE);
    return count_lines(cmd);
}

/* Host-side link addresses in this run's range (one per link). */
static int count_links(void)
{
    char cmd[128];

    snprintf(cmd, sizeof(cmd), "ip -o -4 addr show | grep ' 10\\.213\\.%d\\.'", A);
    return count_lines(cmd);
}

static const char *ifname_of(const char *id, char *buf, size_t size)
{
    json_t *desc = lbt_read_descriptor(&D, id);
    const char *n;

    ck_assert_ptr_nonnull(desc);
    n = json_string_value(json_object_get(json_object_get(desc, "net"), "ifname"));
    ck_assert_ptr_nonnull(n);
    snprintf(buf, size, "%s", n);
    json_decref(desc);
    return buf;
}

static void release(const char *rsid)
{
    char path[256];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sessions/%s/release", rsid);
    lbt_json(&D, "POST", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}

/* ---------- tests ---------- */

START_TEST(test_model_only)
{
    json_t *lease;
    const char *id;
    char *out, cmd[512], net[512];

    daemon_start(NULL, NULL);
    lease = seed_net("mo", model_only(), NULL);
    id = json_string_value(json_object_get(lease, "sandbox_id"));
    /* the model host on its listed port; it is an address of this host, so its other ports
     * are closed */
    assert_reaches(id, url(MODEL, P1));
    assert_refused(id, url(MODEL, P2));
    /* other hosts are refused at once, the tool host too under model_only */
    assert_refused(id, url(OTHER, P1));
    assert_refused(id, url(TOOL, P1));
    /* loopback servers of the host are not reachable without being listed */
    assert_refused(id, url(HOSTSIDE0, PLOOP));
    /* DNS: UDP to port 53 of the allowed host is refused, as is any UDP port of it that is not
     * listed (a host-local server: its listed TCP port only) */
    snprintf(cmd, sizeof(cmd),
             "python3 -c \"import socket\n"
             "for port in (%d, 53):\n"
             "  s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)\n"
             "  s.connect(('%s', port)); s.send(b'q')\n"
             "  try: print(port, s.recv(16))\n"
             "  except OSError as e: print(port, 'error', e.errno)\n\"",
             PUDP, MODEL);
    out = lbt_sh(&D, id, cmd);
    snprintf(net, sizeof(net), "%d error ", PUDP);
    ck_assert_msg(strncmp(out, net, strlen(net)) == 0, "UDP to an unlisted port: %s", out);
    snprintf(net, sizeof(net), "\n53 error %d\n", ECONNREFUSED);
    ck_assert_msg(strstr(out, net) != NULL, "UDP to port 53: %s", out);
    free(out);
    /* IPv6 is closed: the test host's IPv6 address fails at once */
    snprintf(cmd, sizeof(cmd),
             "curl -s -m 5 -o /dev/null -w '%%{http_code} %%{time_total}' '%s'; echo \" $?\"",
             url(V6, P1));
    out = lbt_sh(&D, id, cmd);
    ck_assert_msg(strncmp(out, "000 ", 4) == 0, "IPv6 connect: %s", out);
    free(out);
    /* no DNS: the names the sandbox knows are in its /etc/hosts */
    out = lbt_sh(&D, id, "grep -c host.lendbox.internal /etc/hosts");
    ck_assert_str_eq(out, "1\n");
    free(out);
    json_decref(lease);
    release("mo");
}
END_TEST

START_TEST(test_loopback_model_server)
{
    json_t *lease;
    const char *id;
    char net[256];

    daemon_start(NULL, NULL);
    snprintf(net, sizeof(net),
             "{\"access\": \"model_only\", \"model_server\": \"http://localhost:%d/v1\"}", PLOOP);
    lease = seed_net("loop", net, NULL);
    id = json_string_value(json_object_get(lease, "sandbox_id"));
    assert_reaches(id, url("host.lendbox.internal", PLOOP));
    /* only the listed port: another loopback server of the host, the API, other hosts */
    assert_refused(id, url("host.lendbox.internal", PLOOP_OTHER));
    assert_refused(id, url("host.lendbox.internal", api_port()));
    assert_refused(id, url(MODEL, P1));
    json_decref(lease);
    release("loop");
}
END_TEST

START_TEST(test_model_and_tools)
{
    json_t *a, *b;
    char net[512];

    daemon_start(NULL, NULL);
    snprintf(net, sizeof(net),
             "{\"access\": \"model_and_tools\", \"model_server\": \"%s:%d\", "
             "\"tool_servers\": [\"http://%s:%d/mcp\"]}",
             MODEL, P1, TOOL, P1);
    a = seed_net("mt", net, NULL);
    b = seed_net("mo", model_only(), NULL);
    assert_reaches(json_string_value(json_object_get(a, "sandbox_id")), url(TOOL, P1));
    assert_reaches(json_string_value(json_object_get(a, "sandbox_id")), url(MODEL, P1));
    /* both are addresses of this host: their listed ports only */
    assert_refused(json_string_value(json_object_get(a, "sandbox_id")), url(MODEL, P2));
    assert_refused(json_string_value(json_object_get(a, "sandbox_id")), url(OTHER, P1));
    assert_refused(json_string_value(json_object_get(b, "sandbox_id")), url(TOOL, P1));
    /* one sandbox cannot reach another's address */
    assert_refused(json_string_value(json_object_get(a, "sandbox_id")), url(SBX1, P1));
    json_decref(a);
    json_decref(b);
    release("mt");
    release("mo");
}
END_TEST

START_TEST(test_sandbox_root_cannot_change_policy)
{
    json_t *lease;
    const char *id;
    char *out, cmd[512];

    daemon_start(NULL, NULL);
    lease = seed_net("root", model_only(), NULL);
    id = json_string_value(json_object_get(lease, "sandbox_id"));
    snprintf(cmd, sizeof(cmd),
             "id -u; ip link set eth0 down 2>/dev/null; echo link $?; "
             "ip addr add %s/32 dev eth0 2>/dev/null; echo addr $?; "
             "ip route add %s/32 dev eth0 2>/dev/null; echo route $?; "
             "nft flush ruleset 2>/dev/null; echo nft $?; "
             "ip link add x0 type dummy 2>/dev/null; echo newlink $?",
             OTHER, OTHER);
    out = lbt_sh(&D, id, cmd);
    ck_assert_str_eq(out, "0\nlink 2\naddr 2\nroute 2\nnft 1\nnewlink 2\n");
    free(out);
    /* the policy holds */
    assert_reaches(id, url(MODEL, P1));
    assert_refused(id, url(OTHER, P1));
    json_decref(lease);
    release("root");
}
END_TEST

START_TEST(test_api_port_unreachable)
{
    json_t *mo, *none, *loop;
    char net[256], target[128];
    int port;

    /* the API on every address of the host: the model host's address serves it too */
    daemon_start("0.0.0.0:0", NULL);
    port = api_port();
    mo = seed_net("api-mo", model_only(), NULL);
    snprintf(net, sizeof(net),
             "{\"access\": \"model_only\", \"model_server\": \"http://127.0.0.1:%d\"}", PLOOP);
    loop = seed_net("api-loop", net, NULL);
    none = lbt_seed(&D, "api-none", "t", NULL);
    /* from the host the API answers on the model host's address */
    snprintf(target, sizeof(target), "curl -s -o /dev/null %s", url(MODEL, port));
    ck_assert_int_eq(sh_rc(target), 0);
    assert_reaches(json_string_value(json_object_get(mo, "sandbox_id")), url(MODEL, P1));
    assert_refused(json_string_value(json_object_get(mo, "sandbox_id")), url(MODEL, port));
    assert_refused(json_string_value(json_object_get(mo, "sandbox_id")), url(HOSTSIDE0, port));
    assert_refused(json_string_value(json_object_get(loop, "sandbox_id")),
                   url("host.lendbox.internal", port));
    assert_refused(json_string_value(json_object_get(none, "sandbox_id")), url("127.0.0.1", port));
    assert_refused(json_string_value(json_object_get(none, "sandbox_id")), url(MODEL, port));
    json_decref(mo);
    json_decref(loop);
    json_decref(none);
}
END_TEST

START_TEST(test_inherit_none_is_loopback_only)
{
    json_t *lease;
    const char *id;
    char *out;

    daemon_start(NULL, NULL);
    lease = seed_net("inh", "{\"access\": \"inherit\"}", NULL);
    id = json_string_value(json_object_get(lease, "sandbox_id"));
    out = lbt_sh(&D, id, "ip -o link | cut -d: -f2");
    ck_assert_str_eq(out, " lo\n");
    free(out);
    assert_refused(id, url(MODEL, P1));
    {
        json_t *desc = lbt_read_descriptor(&D, id);

        ck_assert_ptr_null(json_object_get(desc, "net"));
        json_decref(desc);
    }
    json_decref(lease);
}
END_TEST

START_TEST(test_unenforceable)
{
    struct lbt_resp r;
    char body[512];

    daemon_start(NULL, "network.enforce=fail");
    snprintf(body, sizeof(body), "{\"task_id\": \"t\", \"network\": %s}", model_only());
    lbt_json(&D, "POST", "/v1/sessions/u1/seed", "", body, &r);
    lbt_assert_error(&r, 422, "unenforceable");
    ck_assert_ptr_nonnull(
        strstr(json_string_value(json_object_get(json_object_get(r.json, "error"), "message")),
               "nftables is not available"));
    lbt_resp_free(&r);
    /* inherit (none) needs nothing and still works */
    json_decref(lbt_seed(&D, "u2", "t", "\"network\": {\"access\": \"inherit\"}"));
}
END_TEST

START_TEST(test_unenforceable_requests)
{
    struct lbt_resp r;
    char body[512];

    daemon_start(NULL, NULL);
    /* an IPv6-only model host */
    snprintf(body, sizeof(body),
             "{\"task_id\": \"t\", \"network\": {\"access\": \"model_only\", "
             "\"model_server\": \"http://[%s]:%d\"}}",
             V6, P1);
    lbt_json(&D, "POST", "/v1/sessions/v6/seed", "", body, &r);
    lbt_assert_error(&r, 422, "unenforceable");
    ck_assert_ptr_nonnull(strstr(r.body, "IPv6"));
    lbt_resp_free(&r);
    /* a loopback model server without a port */
    lbt_json(&D, "POST", "/v1/sessions/lp/seed", "",
             "{\"task_id\": \"t\", \"network\": {\"access\": \"model_only\", "
             "\"model_server\": \"127.0.0.1\"}}",
             &r);
    lbt_assert_error(&r, 422, "unenforceable");
    lbt_resp_free(&r);
    /* bad input is 400 */
    lbt_json(&D, "POST", "/v1/sessions/b1/seed", "",
             "{\"task_id\": \"t\", \"network\": {\"access\": \"model_only\"}}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/b2/seed", "",
             "{\"task_id\": \"t\", \"network\": {\"access\": \"model_only\", "
             "\"model_server\": \"http://x:1\", \"tool_servers\": [\"y:2\"]}}",
             &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/b3/seed", "", "{\"task_id\": \"t\", \"ports\": [0]}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/b4/seed", "",
             "{\"task_id\": \"t\", \"ports\": [8080, 8080]}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
}
END_TEST

/* A model server on a non-loopback address of the daemon's own host (finding B of the hostile
 * review: it opened every port of the host): only its listed port is reachable; such a server
 * without a port, the daemon's own API and addresses of the sandbox range are refused 422.
 * The address is one from TEST-NET-1 that this test adds to lo and removes at the end. */
START_TEST(test_host_local_model_server)
{
    char host[32], net[256], body[512];
    const char *id;
    struct lbt_resp r;
    json_t *lease;

    /* HOSTLOCAL (192.0.2.A, TEST-NET-1) is on lo with servers on P1 and P2 (hosts_up) */
    snprintf(host, sizeof(host), "%s", HOSTLOCAL);
    daemon_start(NULL, NULL);
    snprintf(net, sizeof(net), "{\"access\": \"model_only\", \"model_server\": \"%s:%d\"}", host,
             P1);
    lease = seed_net("hl", net, NULL);
    id = json_string_value(json_object_get(lease, "sandbox_id"));
    assert_reaches(id, url(host, P1));
    assert_refused(id, url(host, P2));
    assert_refused(id, url(host, api_port()));
    json_decref(lease);
    release("hl");
    /* refused at seed: no port, the API itself (loopback and host-local), the sandbox range */
    {
        const char *const bad[][2] = {{"", "give its port"},
                                      {":API", "daemon's own API"},
                                      {"127.0.0.1:API", "daemon's own API"},
                                      {"RANGE", "network.range"}};

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            char server[64];

            if (!strcmp(bad[i][0], ""))
                snprintf(server, sizeof(server), "%s", host);
            else if (!strcmp(bad[i][0], ":API"))
                snprintf(server, sizeof(server), "%s:%d", host, api_port());
            else if (!strcmp(bad[i][0], "127.0.0.1:API"))
                snprintf(server, sizeof(server), "http://127.0.0.1:%d/v1", api_port());
            else
                snprintf(server, sizeof(server), "10.213.%d.9:8000", A);
            snprintf(body, sizeof(body),
                     "{\"task_id\": \"t\", \"network\": {\"access\": \"model_only\", "
                     "\"model_server\": \"%s\"}}",
                     server);
            lbt_json(&D, "POST", "/v1/sessions/hl-bad/seed", "", body, &r);
            lbt_assert_error(&r, 422, "unenforceable");
            ck_assert_msg(strstr(r.body, bad[i][1]), "%s: %s", server, r.body);
            lbt_resp_free(&r);
        }
    }
}
END_TEST

#define N_KILL 20

START_TEST(test_kill9_adopt_then_release_leaves_nothing)
{
    char ids[N_KILL][64], ifnames[N_KILL][16], rsid[32], cmd[512];
    int links0, elems0;

    daemon_start(NULL, NULL);
    links0 = count_links();
    elems0 = count_nft_elements();
    for (int i = 0; i < N_KILL; i++) {
        json_t *lease;

        snprintf(rsid, sizeof(rsid), "k%d", i);
        lease = seed_net(rsid, model_only(), NULL);
        snprintf(ids[i], sizeof(ids[i]), "%s",
                 json_string_value(json_object_get(lease, "sandbox_id")));
        ifname_of(ids[i], ifnames[i], sizeof(ifnames[i]));
        json_decref(lease);
    }
    ck_assert_int_eq(count_links(), links0 + N_KILL);
    lbt_daemon_kill(&D);
    /* one sandbox vanishes while the daemon is down: reconciliation removes its network */
    {
        json_t *desc = lbt_read_descriptor(&D, ids[0]);
        pid_t init = (pid_t)json_integer_value(json_object_get(desc, "pid"));

        ck_assert_int_gt(init, 1);
        kill(init, SIGKILL);
        for (int i = 0; i < 100 && kill(init, 0) == 0; i++)
            lbt_sleep_ms(20);
        json_decref(desc);
    }
    {
        char range[64], table[64];
        const char *args[] = {"--set", range, "--set", table, NULL};

        snprintf(range, sizeof(range), "network.range=%s", RANGE);
        snprintf(table, sizeof(table), "network.nft_table=%s", TABLE);
        lbt_daemon_restart(&D, args);
    }
    snprintf(cmd, sizeof(cmd), "ip link show %s >/dev/null 2>&1", ifnames[0]);
    ck_assert_int_ne(sh_rc(cmd), 0);
    ck_assert_int_eq(count_links(), links0 + N_KILL - 1);
    for (int i = 1; i < N_KILL; i++) {
        /* adopted sandboxes keep their policy: the listed port, not another one */
        assert_reaches(ids[i], url(MODEL, P1));
        assert_refused(ids[i], url(MODEL, P2));
        assert_refused(ids[i], url(OTHER, P1));
    }
    /* a new seed after the restart gets an address no adopted sandbox has */
    {
        json_t *lease = seed_net("k-new", model_only(), NULL), *desc;
        const char *addr;

        desc = lbt_read_descriptor(&D, json_string_value(json_object_get(lease, "sandbox_id")));
        addr = json_string_value(json_object_get(json_object_get(desc, "net"), "addr"));
        for (int i = 1; i < N_KILL; i++) {
            json_t *d2 = lbt_read_descriptor(&D, ids[i]);

            ck_assert_str_ne(
                addr, json_string_value(json_object_get(json_object_get(d2, "net"), "addr")));
            json_decref(d2);
        }
        json_decref(desc);
        json_decref(lease);
        release("k-new");
    }
    for (int i = 0; i < N_KILL; i++) {
        snprintf(rsid, sizeof(rsid), "k%d", i);
        release(rsid);
    }
    ck_assert_int_eq(count_links(), links0);
    ck_assert_int_eq(count_nft_elements(), elems0);
    for (int i = 0; i < N_KILL; i++) {
        snprintf(cmd, sizeof(cmd), "ip link show %s >/dev/null 2>&1", ifnames[i]);
        ck_assert_int_ne(sh_rc(cmd), 0);
    }
}
END_TEST

START_TEST(test_episodes_return_to_baseline)
{
    int links0, elems0;

    daemon_start(NULL, NULL);
    links0 = count_links();
    elems0 = count_nft_elements();
    for (int i = 0; i < 200; i++) {
        json_decref(seed_net("ep", model_only(), NULL));
        release("ep");
    }
    ck_assert_int_eq(count_links(), links0);
    ck_assert_int_eq(count_nft_elements(), elems0);
}
END_TEST

START_TEST(test_endpoint)
{
    json_t *lease;
    const char *id;
    char path[256], cmd[512];
    struct lbt_resp r;
    const char *endpoint;

    daemon_start(NULL, NULL);
    lease = seed_net("ep", model_only(), "\"ports\": [8080]");
    id = json_string_value(json_object_get(lease, "sandbox_id"));
    json_decref(
        lbt_exec_ok(&D, id, "",
                    "{\"command\": \"echo hello-endpoint > /workspace/index.html; "
                    "setsid python3 -m http.server 8080 --directory /workspace "
                    ">/dev/null 2>&1 & sleep 1\", \"preserve_background_services\": true}"));
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/endpoints/8080", id);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    endpoint = json_string_value(json_object_get(r.json, "endpoint"));
    ck_assert_ptr_nonnull(endpoint);
    ck_assert(json_is_object(json_object_get(r.json, "headers")));
    snprintf(cmd, sizeof(cmd), "curl -sf -m 5 %s/index.html | grep -qx hello-endpoint", endpoint);
    ck_assert_msg(sh_rc(cmd) == 0, "cannot fetch %s from the host", endpoint);
    lbt_resp_free(&r);
    /* an undeclared port */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/endpoints/9090", id);
    lbt_json(&D, "GET", path, "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/endpoints/0", id);
    lbt_json(&D, "GET", path, "", NULL, &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    json_decref(lease);
}
END_TEST

START_TEST(test_endpoint_relay)
{
    json_t *lease;
    const char *id;
    char path[256], cmd[512], endpoint[256];
    struct lbt_resp r;

    daemon_start(NULL, NULL);
    /* no network: the daemon relays from the host's loopback into the sandbox's */
    lease = lbt_seed(&D, "relay", "t", "\"ports\": [8080, 8081]");
    id = json_string_value(json_object_get(lease, "sandbox_id"));
    json_decref(
        lbt_exec_ok(&D, id, "",
                    "{\"command\": \"echo hello-relay > /workspace/index.html; "
                    "setsid python3 -m http.server 8080 --bind 127.0.0.1 --directory /workspace "
                    ">/dev/null 2>&1 & sleep 1\", \"preserve_background_services\": true}"));
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/endpoints/8080", id);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    snprintf(endpoint, sizeof(endpoint), "%s",
             json_string_value(json_object_get(r.json, "endpoint")));
    ck_assert_msg(strncmp(endpoint, "http://127.0.0.1:", 17) == 0, "endpoint %s", endpoint);
    lbt_resp_free(&r);
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof(cmd), "curl -sf -m 5 %s/index.html | grep -qx hello-relay", endpoint);
        ck_assert_msg(sh_rc(cmd) == 0, "cannot fetch %s from the host", endpoint);
    }
    /* the same relay answers a second request for the port */
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "endpoint")), endpoint);
    lbt_resp_free(&r);
    /* a declared port nobody listens on: the relayed connection is closed */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/endpoints/8081", id);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    snprintf(cmd, sizeof(cmd), "curl -sf -m 5 %s/ >/dev/null",
             json_string_value(json_object_get(r.json, "endpoint")));
    ck_assert_int_ne(sh_rc(cmd), 0);
    lbt_resp_free(&r);
    json_decref(lease);
    /* the relay ends with the sandbox */
    release("relay");
    snprintf(cmd, sizeof(cmd), "curl -s -m 5 %s/ >/dev/null", endpoint);
    ck_assert_int_eq(sh_rc(cmd), 7); /* could not connect */
}
END_TEST

START_TEST(test_inherit_nat_needs_forwarding)
{
    struct lbt_resp r;
    char c = '1';
    FILE *f = fopen("/proc/sys/net/ipv4/ip_forward", "re");
    const char *args[] = {"--set", NULL, "--set", NULL, "--set", "network.inherit=nat", NULL};
    char range[64], table[64];

    if (f) {
        c = (char)fgetc(f);
        fclose(f);
    }
    if (c != '0')
        return; /* forwarding on: nat would need an off-host test network (not built here) */
    snprintf(range, sizeof(range), "network.range=%s", RANGE);
    snprintf(table, sizeof(table), "network.nft_table=%s", TABLE);
    args[1] = range;
    args[3] = table;
    lbt_daemon_start(&D, args);
    registry_add(&D);
    lbt_json(&D, "POST", "/v1/sessions/nat/seed", "", "{\"task_id\": \"t\"}", &r);
    lbt_assert_error(&r, 422, "unenforceable");
    ck_assert_ptr_nonnull(strstr(r.body, "ip_forward"));
    lbt_resp_free(&r);
}
END_TEST

/* A remote model host (in the test's netns, reached through the host by forwarding on the
 * sandbox's link and the test's veth only): every port of it is open, other hosts are not. */
START_TEST(test_remote_model_host_every_port)
{
    json_t *lease;
    const char *id;
    char net[256];
    struct lbt_resp r;

    daemon_start(NULL, NULL);
    snprintf(net, sizeof(net), "{\"access\": \"model_only\", \"model_server\": \"http://%s:%d\"}",
             NS_MODEL, P1);
    lease = seed_net("rmo", net, NULL);
    id = json_string_value(json_object_get(lease, "sandbox_id"));
    assert_reaches(id, url(NS_MODEL, P1));
    assert_reaches(id, url(NS_MODEL, P2));
    assert_refused(id, url(NS_OTHER, P1));
    assert_refused(id, url(NS_TOOL, P1));
    assert_refused(id, url(NS_HOSTEND, P1));
    json_decref(lease);
    release("rmo");
    /* forwarding off where the replies would come in: refused 422, no sandbox */
    sh("echo 0 > /proc/sys/net/ipv4/conf/%s/forwarding", VETH);
    snprintf(net, sizeof(net),
             "{\"task_id\": \"t\", \"network\": {\"access\": \"model_only\", "
             "\"model_server\": \"http://%s:%d\"}}",
             NS_MODEL, P1);
    lbt_json(&D, "POST", "/v1/sessions/rmo2/seed", "", net, &r);
    sh("echo 1 > /proc/sys/net/ipv4/conf/%s/forwarding", VETH);
    lbt_assert_error(&r, 422, "unenforceable");
    ck_assert_msg(strstr(r.body, VETH) != NULL, "422 names the uplink: %s", r.body);
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_remote_tool_host)
{
    json_t *a, *b;
    char net[512];

    daemon_start(NULL, NULL);
    snprintf(net, sizeof(net),
             "{\"access\": \"model_and_tools\", \"model_server\": \"%s:%d\", "
             "\"tool_servers\": [\"http://%s:%d/mcp\"]}",
             NS_MODEL, P1, NS_TOOL, P1);
    a = seed_net("rmt", net, NULL);
    snprintf(net, sizeof(net), "{\"access\": \"model_only\", \"model_server\": \"%s:%d\"}",
             NS_MODEL, P1);
    b = seed_net("rmo", net, NULL);
    assert_reaches(json_string_value(json_object_get(a, "sandbox_id")), url(NS_TOOL, P1));
    assert_reaches(json_string_value(json_object_get(a, "sandbox_id")), url(NS_TOOL, P2));
    assert_reaches(json_string_value(json_object_get(a, "sandbox_id")), url(NS_MODEL, P2));
    assert_refused(json_string_value(json_object_get(a, "sandbox_id")), url(NS_OTHER, P1));
    assert_refused(json_string_value(json_object_get(b, "sandbox_id")), url(NS_TOOL, P1));
    json_decref(a);
    json_decref(b);
    release("rmt");
    release("rmo");
}
END_TEST

/* inherit = nat reaches remote hosts, but nothing that reaches more than one host: UDP to the
 * limited broadcast, the broadcast of a subnet of the daemon's host and the all-hosts
 * multicast group gets no answer from the host's wildcard-bound echo (the daemon runs in
 * NAT_NS, forwarding on there only), nor does the host's own unicast address; the remote
 * peer's echo answers through nat. Servers at such addresses are refused at seed (422). */
START_TEST(test_nat_refuses_broadcast_and_multicast)
{
    const char *args[] = {"--set", NULL, "--set", NULL, "--set", "network.inherit=nat", NULL};
    char range[64], table[64], path[64], cmd[1024], want[256], body[512];
    const char *bad[] = {"255.255.255.255:80", "203.0.113.255:80", "224.0.0.1:80", "239.1.2.3:80",
                         "0.0.0.0:80"};
    struct lbt_resp r;
    json_t *lease;
    const char *id;
    char *out;
    int fd, self;

    snprintf(path, sizeof(path), "/run/netns/%s", NAT_NS);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(self, 0);
    ck_assert_int_eq(setns(fd, CLONE_NEWNET), 0);
    close(fd);
    snprintf(range, sizeof(range), "network.range=%s", RANGE);
    snprintf(table, sizeof(table), "network.nft_table=%s", TABLE);
    args[1] = range;
    args[3] = table;
    lbt_daemon_start(&D, args);
    registry_add(&D);
    lease = lbt_seed(&D, "nat", "t", NULL);
    id = json_string_value(json_object_get(lease, "sandbox_id"));
    snprintf(cmd, sizeof(cmd),
             "python3 -c \"import socket\n"
             "for dst in ('255.255.255.255', '203.0.113.255', '224.0.0.1', '203.0.113.1', "
             "'203.0.113.2'):\n"
             "  s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)\n"
             "  s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)\n"
             "  try:\n"
             "    s.sendto(b'q', (dst, %d)); d,a=s.recvfrom(64); print(dst, d.decode(), a[0])\n"
             "  except socket.timeout: print(dst, 'none')\n"
             "  except OSError as e: print(dst, 'error', e.errno)\n\"",
             PUDP);
    out = lbt_sh(&D, id, cmd);
    ck_assert_str_eq(out, "255.255.255.255 none\n203.0.113.255 none\n224.0.0.1 none\n"
                          "203.0.113.1 none\n203.0.113.2 peer:q 203.0.113.2\n");
    free(out);
    json_decref(lease);
    release("nat");
    /* the same destinations as a model server of a filtered mode */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(body, sizeof(body),
                 "{\"task_id\": \"t\", \"network\": {\"access\": \"model_only\", "
                 "\"model_server\": \"http://%s\"}}",
                 bad[i]);
        lbt_json(&D, "POST", "/v1/sessions/nat-bad/seed", "", body, &r);
        lbt_assert_error(&r, 422, "unenforceable");
        snprintf(want, sizeof(want), "is a broadcast, multicast or reserved address");
        ck_assert_msg(strstr(r.body, want), "%s: %s", bad[i], r.body);
        lbt_resp_free(&r);
    }
    /* back to the test's own namespace; teardown stops the daemon (by its pid) */
    ck_assert_int_eq(setns(self, CLONE_NEWNET), 0);
    close(self);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("network");
    TCase *tc = tcase_create("network");

    tcase_add_unchecked_fixture(tc, setup_hosts, teardown_hosts);
    lbt_fixture_add(tc, &NET_FIXTURE, false);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_model_only);
    tcase_add_test(tc, test_loopback_model_server);
    tcase_add_test(tc, test_model_and_tools);
    tcase_add_test(tc, test_sandbox_root_cannot_change_policy);
    tcase_add_test(tc, test_api_port_unreachable);
    tcase_add_test(tc, test_inherit_none_is_loopback_only);
    tcase_add_test(tc, test_unenforceable);
    tcase_add_test(tc, test_unenforceable_requests);
    tcase_add_test(tc, test_host_local_model_server);
    tcase_add_test(tc, test_kill9_adopt_then_release_leaves_nothing);
    tcase_add_test(tc, test_episodes_return_to_baseline);
    tcase_add_test(tc, test_endpoint);
    tcase_add_test(tc, test_endpoint_relay);
    tcase_add_test(tc, test_inherit_nat_needs_forwarding);
    tcase_add_test(tc, test_remote_model_host_every_port);
    tcase_add_test(tc, test_remote_tool_host);
    suite_add_tcase(s, tc);
    tc = tcase_create("nat");
    tcase_add_unchecked_fixture(tc, setup_nat_hosts, teardown_hosts);
    lbt_fixture_add(tc, &NET_FIXTURE, false);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_nat_refuses_broadcast_and_multicast);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
