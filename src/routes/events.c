/*
 * events.c - GET /v1/events: the event feed (store.h, "the event feed"), read from a seq on,
 * as one answer, as a long-poll (wait_ms) or as an application/x-ndjson stream.
 *
 * Long-polls hold no worker: a reader that finds nothing parks (http_park) and registers its
 * park with the hub; the store's event hook (after every commit that wrote events) wakes every
 * registered park, whose answer hands a new read to a worker, which answers or parks again.
 * No wake is lost: the reader notes the hub's generation before it reads, and parks only if,
 * under the hub's lock, the generation has not moved since (the hook moves it under that lock
 * before it wakes anyone).
 *
 * Streams: the job begins the streamed response and hands it to the hub's one streamer
 * thread (http_stream_keep), then returns its worker. The thread, woken by the hook (an
 * eventfd) or every TICK_MS, writes each stream's new events, one JSON object a line, from
 * the seq it has written up to. Bounded per connection: a stream whose client has not taken
 * QUEUE_MAX bytes is not read further until it drains (http_stream_on_drain wakes the thread),
 * and each round writes at most ROUND_EVENTS events per stream. A client that leaves is found
 * at the next round (a write fails). At most STREAMS_MAX streams at once (429 past them).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "routes/routes.h"
#include "util/clock.h"
#include "util/log.h"

#define DEFAULT_LIMIT 1000
#define MAX_LIMIT 10000
#define MAX_WAIT_MS 60000
#define TICK_MS 1000
#define QUEUE_MAX (256 * 1024) /* unsent bytes past which a stream is not read */
#define ROUND_EVENTS 256       /* events written per stream per round */
#define STREAMS_MAX 64

static const char *const event_types[] = {
    "seeded", "paused",   "resumed", "renewed",     "idle",
    "reset",  "snapshot", "stopped", "stop_failed", "lost",
};

/* One read of the feed: the request's parameters. */
struct events_query {
    int64_t since;
    int64_t from; /* reads start after this seq (>= since: what earlier reads walked) */
    int64_t limit;
    int64_t deadline_ms; /* clock_mono_ms; 0: answer at once */
    char *rsid, *sandbox_id;
    json_t *types; /* array of names, or NULL */
};

struct waiter {
    struct lb_park *park;
    int64_t deadline_ms;
    char *rsid, *sandbox_id; /* the read's filters (NULL: any): whose events wake it */
    struct waiter *next;
};

static void waiter_free(struct waiter *w)
{
    http_park_release(w->park);
    free(w->rsid);
    free(w->sandbox_id);
    free(w);
}

/* Could a commit that wrote the events of notes (n == 0: not known) have one for w? */
static bool waiter_wanted(const struct waiter *w, const struct lb_event_note *notes, size_t n)
{
    if (n == 0 || (!w->rsid && !w->sandbox_id))
        return true;
    for (size_t i = 0; i < n; i++)
        if ((!w->rsid || (notes[i].rsid && strcmp(notes[i].rsid, w->rsid) == 0)) &&
            (!w->sandbox_id || strcmp(notes[i].sandbox_id, w->sandbox_id) == 0))
            return true;
    return false;
}

struct estream {
    struct lb_stream *s;
    struct events_query q; /* q.since, q.from: the seq read up to (written, or walked) */
    struct estream *next;
};

struct lb_events_hub {
    struct lb_app *app;
    pthread_mutex_t lock; /* guards gen, waiters, streams, n_streams, stopping */
    uint64_t gen;         /* moved by every commit that wrote events */
    struct waiter *waiters;
    struct estream *streams;
    size_t n_streams;
    bool stopping;
    int efd;
    pthread_t thread;
    bool started;
};

/* ---------- queries ---------- */

static void query_release(struct events_query *q)
{
    free(q->rsid);
    free(q->sandbox_id);
    json_decref(q->types);
    memset(q, 0, sizeof(*q));
}

static void query_free(void *arg)
{
    struct events_query *q = arg;

    if (!q)
        return;
    query_release(q);
    free(q);
}

static struct events_query *query_dup(const struct events_query *q)
{
    struct events_query *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    *c = *q;
    c->rsid = q->rsid ? strdup(q->rsid) : NULL;
    c->sandbox_id = q->sandbox_id ? strdup(q->sandbox_id) : NULL;
    c->types = q->types ? json_incref(q->types) : NULL;
    if ((q->rsid && !c->rsid) || (q->sandbox_id && !c->sandbox_id)) {
        query_free(c);
        return NULL;
    }
    return c;
}

/* A query parameter as an integer in [lo, hi] (absent: def). -EINVAL (400) otherwise. */
static int param_int(struct lb_request *req, const char *key, int64_t def, int64_t lo, int64_t hi,
                     int64_t *out, struct lb_error *err)
{
    const char *v = http_query(req, key);
    char *end;
    long long n;

    *out = def;
    if (!v)
        return 0;
    errno = 0;
    n = strtoll(v, &end, 10);
    if (!*v || *end || errno || n < lo || n > hi)
        return lb_error_set(err, -EINVAL, "'%s' must be an integer from %lld to %lld", key,
                            (long long)lo, (long long)hi);
    *out = n;
    return 0;
}

static bool type_known(const char *t, size_t len)
{
    for (size_t i = 0; i < sizeof(event_types) / sizeof(event_types[0]); i++)
        if (strlen(event_types[i]) == len && strncmp(event_types[i], t, len) == 0)
            return true;
    return false;
}

/* "a,b": known type names into q->types. -EINVAL (400) naming an unknown one. */
static int parse_types(const char *v, struct events_query *q, struct lb_error *err)
{
    q->types = json_array();
    if (!q->types)
        return lb_error_set(err, -ENOMEM, "out of memory");
    for (const char *p = v;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);

        if (!type_known(p, len))
            return lb_error_set(err, -EINVAL,
                                "'types' has an unknown event type '%.*s' (known: seeded, "
                                "paused, resumed, renewed, idle, reset, snapshot, stopped, "
                                "stop_failed, lost)",
                                (int)(len > 64 ? 64 : len), p);
        if (json_array_append_new(q->types, json_stringn(p, len)) < 0)
            return lb_error_set(err, -ENOMEM, "out of memory");
        if (!c)
            return 0;
        p = c + 1;
    }
}

static int parse_query(struct lb_request *req, struct events_query *q, struct lb_error *err)
{
    const char *rsid = http_query(req, "rsid"), *sid = http_query(req, "sandbox_id");
    const char *types = http_query(req, "types");
    int64_t wait_ms;
    int r;

    memset(q, 0, sizeof(*q));
    r = param_int(req, "since", 0, 0, INT64_MAX, &q->since, err);
    if (r == 0)
        r = param_int(req, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT, &q->limit, err);
    if (r == 0)
        r = param_int(req, "wait_ms", 0, 0, MAX_WAIT_MS, &wait_ms, err);
    if (r < 0)
        return r;
    if (rsid && !routes_rsid_is_valid(rsid))
        return lb_error_set(err, -EINVAL, "'rsid' is not a valid resources session id");
    if (sid && (!*sid || strlen(sid) >= LB_ID_MAX))
        return lb_error_set(err, -EINVAL, "'sandbox_id' must be 1 to %d bytes", LB_ID_MAX - 1);
    if (types && (r = parse_types(types, q, err)) < 0)
        return r;
    q->from = q->since;
    q->deadline_ms = wait_ms > 0 ? clock_mono_ms() + wait_ms : 0;
    if ((rsid && !(q->rsid = strdup(rsid))) || (sid && !(q->sandbox_id = strdup(sid))))
        return lb_error_set(err, -ENOMEM, "out of memory");
    return 0;
}

/* The events after q->from matching q: *out (array), *next (q->since when none), *read_to
 * (store_events_list_to: where the next read may start). */
static int query_read(struct lb_app *app, const struct events_query *q, int64_t limit, json_t **out,
                      int64_t *next, int64_t *read_to, struct lb_error *err)
{
    struct lb_event_filter f = {.since = q->from,
                                .rsid = q->rsid,
                                .sandbox_id = q->sandbox_id,
                                .types = q->types,
                                .limit = limit};

    int r = store_events_list_to(app->store, &f, out, next, read_to, err);

    if (r == 0 && json_array_size(*out) == 0)
        *next = q->since;
    return r;
}

static void respond_events(struct lb_request *req, json_t *events, int64_t next)
{
    json_t *body = json_pack("{s:o,s:I}", "events", events, "next", (json_int_t)next);
    struct lb_error err = {0};

    if (!body) {
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    http_respond_json(req, 200, body);
}

/* ---------- long-polls ---------- */

static void poll_job(struct lb_request *req, void *arg);

/* A parked read's answer (MHD thread): woken, read again on a worker; else nothing came. */
static void poll_answer(struct lb_request *req, void *arg, enum lb_park_end why)
{
    struct events_query *q = arg, *again;
    struct lb_error err = {0};
    json_t *none = json_array();

    if (why == LB_PARK_WOKEN) {
        log_debug("events: a parked read (rsid %s, sandbox_id %s) was woken",
                  q->rsid ? q->rsid : "any", q->sandbox_id ? q->sandbox_id : "any");
        again = query_dup(q);
        if (again && http_defer(req, poll_job, again, query_free, &err) == 0) {
            json_decref(none);
            return;
        }
        if (!again)
            lb_error_set(&err, -ENOMEM, "out of memory");
        json_decref(none);
        http_respond_error(req, &err);
        return;
    }
    if (!none) {
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    respond_events(req, none, q->since);
}

/* Drop the registrations whose deadline passed (their park ended or ends now). Hub lock held. */
static void waiters_trim_locked(struct lb_events_hub *h, int64_t now_ms)
{
    for (struct waiter **pp = &h->waiters; *pp;) {
        struct waiter *w = *pp;

        if (w->deadline_ms > now_ms) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        waiter_free(w);
    }
}

/* Read; answer what is there, or park until the next event (see the file's comment). */
static int poll_read(struct lb_request *req, struct events_query *q, struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    struct lb_events_hub *h = app->events;

    for (;;) {
        json_t *events = NULL;
        int64_t next = q->since, read_to = q->from, gen;
        int r;

        pthread_mutex_lock(&h->lock);
        gen = (int64_t)h->gen;
        pthread_mutex_unlock(&h->lock);
        r = query_read(app, q, q->limit, &events, &next, &read_to, err);
        if (r < 0)
            return r;
        if (json_array_size(events) > 0 || q->deadline_ms <= clock_mono_ms()) {
            respond_events(req, events, next);
            return 0;
        }
        json_decref(events);
        q->from = read_to; /* the next read (after a wake) does not walk these rows again */

        pthread_mutex_lock(&h->lock);
        if ((int64_t)h->gen != gen || h->stopping) {
            bool stopping = h->stopping;

            pthread_mutex_unlock(&h->lock);
            if (stopping)
                return lb_error_set(err, -ESHUTDOWN, "the daemon is shutting down");
            continue;
        }
        struct waiter *w = calloc(1, sizeof(*w));
        struct events_query *c = w ? query_dup(q) : NULL;

        if (c && ((q->rsid && !(w->rsid = strdup(q->rsid))) ||
                  (q->sandbox_id && !(w->sandbox_id = strdup(q->sandbox_id))))) {
            query_free(c);
            c = NULL;
        }
        if (!c) {
            pthread_mutex_unlock(&h->lock);
            if (w) {
                free(w->rsid);
                free(w->sandbox_id);
            }
            free(w);
            return lb_error_set(err, -ENOMEM, "out of memory");
        }
        waiters_trim_locked(h, clock_mono_ms());
        r = http_park(req, q->deadline_ms, poll_answer, c, query_free, &w->park, err);
        if (r < 0) {
            pthread_mutex_unlock(&h->lock);
            free(w->rsid);
            free(w->sandbox_id);
            free(w);
            return r;
        }
        w->deadline_ms = q->deadline_ms;
        log_debug("events: a read (rsid %s, sandbox_id %s) parked", q->rsid ? q->rsid : "any",
                  q->sandbox_id ? q->sandbox_id : "any");
        w->next = h->waiters;
        h->waiters = w;
        pthread_mutex_unlock(&h->lock);
        return 0;
    }
}

static void poll_job(struct lb_request *req, void *arg)
{
    struct lb_error err = {0};

    if (poll_read(req, arg, &err) < 0)
        http_respond_error(req, &err);
}

/* ---------- streams ---------- */

static void hub_kick(struct lb_events_hub *h)
{
    uint64_t one = 1;

    (void)!write(h->efd, &one, sizeof(one));
}

static void stream_drained(void *arg)
{
    hub_kick(arg);
}

/* End a stream (an error line first when code is set) and free it. */
static void stream_finish(struct estream *e, const char *code, const char *message)
{
    if (code)
        (void)http_stream_write_json_line(
            e->s, json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", message));
    http_stream_on_drain(e->s, NULL, NULL);
    http_stream_end(e->s);
    http_stream_release(e->s);
    query_release(&e->q);
    free(e);
}

/* Write e's new events. false when its client is gone (or the store failed). *more: it has
 * more than one round's worth. */
static bool stream_pump(struct lb_events_hub *h, struct estream *e, bool *more)
{
    struct lb_error err = {0};
    json_t *events = NULL, *ev;
    int64_t next, read_to;
    size_t i;

    if (http_stream_write(e->s, "", 0) < 0)
        return false; /* the client left */
    if (http_stream_queued(e->s) > QUEUE_MAX)
        return true; /* the drain wakes us */
    if (query_read(h->app, &e->q, ROUND_EVENTS, &events, &next, &read_to, &err) < 0) {
        log_warn("events stream: %s", err.message);
        return true; /* the next round tries again */
    }
    json_array_foreach(events, i, ev) {
        if (!http_stream_write_json_line(e->s, json_incref(ev))) {
            json_decref(events);
            return false;
        }
    }
    if (json_array_size(events) == ROUND_EVENTS)
        *more = true;
    e->q.since = e->q.from = read_to; /* past what this read walked, matching or not */
    json_decref(events);
    return true;
}

static void *streamer_main(void *arg)
{
    struct lb_events_hub *h = arg;
    struct pollfd pfd = {.fd = h->efd, .events = POLLIN};

    for (;;) {
        uint64_t n;
        bool more = false;

        if (poll(&pfd, 1, TICK_MS) > 0)
            (void)!read(h->efd, &n, sizeof(n));
        pthread_mutex_lock(&h->lock);
        if (h->stopping) {
            pthread_mutex_unlock(&h->lock);
            break;
        }
        /* only this thread removes streams: the list's members stay while it walks them */
        struct estream *list = h->streams;
        pthread_mutex_unlock(&h->lock);

        for (struct estream *e = list; e; e = e->next)
            if (!stream_pump(h, e, &more))
                e->q.limit = -1; /* gone: removed below */
        pthread_mutex_lock(&h->lock);
        for (struct estream **pp = &h->streams; *pp;) {
            struct estream *e = *pp;

            if (e->q.limit >= 0) {
                pp = &e->next;
                continue;
            }
            *pp = e->next;
            h->n_streams--;
            pthread_mutex_unlock(&h->lock);
            stream_finish(e, NULL, NULL);
            pthread_mutex_lock(&h->lock);
        }
        pthread_mutex_unlock(&h->lock);
        if (more)
            hub_kick(h);
    }
    return NULL;
}

static void stream_job(struct lb_request *req, void *arg)
{
    struct events_query *q = arg;
    struct lb_app *app = http_app(req);
    struct lb_events_hub *h = app->events;
    struct lb_error err = {0};
    struct estream *e = calloc(1, sizeof(*e));
    struct lb_stream *s;

    if (!e) {
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    pthread_mutex_lock(&h->lock);
    if (h->stopping || h->n_streams >= STREAMS_MAX) {
        bool stopping = h->stopping;

        pthread_mutex_unlock(&h->lock);
        free(e);
        if (stopping)
            lb_error_set(&err, -ESHUTDOWN, "the daemon is shutting down");
        else
            lb_error_set(&err, -EUSERS, "too many event streams at once (%d); long-poll instead",
                         STREAMS_MAX);
        http_respond_error(req, &err);
        return;
    }
    h->n_streams++; /* the place is held while the stream begins */
    pthread_mutex_unlock(&h->lock);
    s = http_stream_begin(req, 200, "application/x-ndjson");
    if (!s) {
        pthread_mutex_lock(&h->lock);
        h->n_streams--;
        pthread_mutex_unlock(&h->lock);
        free(e);
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    http_stream_keep(s);
    e->s = s;
    e->q = *q;
    e->q.limit = ROUND_EVENTS;
    memset(q, 0, sizeof(*q)); /* e owns its strings now */
    http_stream_on_drain(s, stream_drained, h);
    pthread_mutex_lock(&h->lock);
    e->next = h->streams;
    h->streams = e;
    pthread_mutex_unlock(&h->lock);
    hub_kick(h);
}

/* ---------- the route ---------- */

int route_events(struct lb_request *req, struct lb_error *err)
{
    const char *accept = http_header(req, "Accept");
    struct events_query *q = calloc(1, sizeof(*q));
    int r;

    if (!q)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = parse_query(req, q, err);
    if (r < 0) {
        query_free(q);
        return r;
    }
    if (accept && strcasestr(accept, "application/x-ndjson"))
        return http_defer(req, stream_job, q, query_free, err);
    return http_defer(req, poll_job, q, query_free, err);
}

/* ---------- the hub ---------- */

/* The store's event hook: a commit wrote the events of notes (n == 0: not known; store lock
 * held: quick, no store calls). Wakes the parked reads those events may answer; the others stay
 * parked (each woken read costs a worker's job: every read woken at every commit would flood the
 * worker queue with a thousand parked polls). */
static void hub_notify(void *arg, const struct lb_event_note *notes, size_t n)
{
    struct lb_events_hub *h = arg;
    struct waiter *wake = NULL;
    bool streams;

    pthread_mutex_lock(&h->lock);
    h->gen++;
    for (struct waiter **pp = &h->waiters; *pp;) {
        struct waiter *w = *pp;

        if (!waiter_wanted(w, notes, n)) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        w->next = wake;
        wake = w;
    }
    streams = h->n_streams > 0;
    pthread_mutex_unlock(&h->lock);
    while (wake) {
        struct waiter *next = wake->next;

        (void)http_wake(wake->park);
        waiter_free(wake);
        wake = next;
    }
    if (streams)
        hub_kick(h);
}

int events_hub_new(struct lb_app *app, struct lb_events_hub **out)
{
    struct lb_events_hub *h = calloc(1, sizeof(*h));
    int e;

    *out = NULL;
    if (!h)
        return -ENOMEM;
    h->app = app;
    pthread_mutex_init(&h->lock, NULL);
    h->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (h->efd < 0) {
        e = errno;
        pthread_mutex_destroy(&h->lock);
        free(h);
        return -e;
    }
    e = pthread_create(&h->thread, NULL, streamer_main, h);
    if (e != 0) {
        close(h->efd);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return -e;
    }
    h->started = true;
    store_events_set_hook(app->store, hub_notify, h);
    *out = h;
    return 0;
}

void events_hub_stop(struct lb_events_hub *h)
{
    struct estream *e;

    if (!h)
        return;
    store_events_set_hook(h->app->store, NULL, NULL); /* no hook runs after this */
    pthread_mutex_lock(&h->lock);
    h->stopping = true;
    pthread_mutex_unlock(&h->lock);
    if (h->started) {
        hub_kick(h);
        pthread_join(h->thread, NULL);
        h->started = false;
    }
    pthread_mutex_lock(&h->lock);
    e = h->streams;
    h->streams = NULL;
    h->n_streams = 0;
    while (h->waiters) {
        struct waiter *w = h->waiters;

        h->waiters = w->next;
        (void)http_wake(w->park);
        waiter_free(w);
    }
    pthread_mutex_unlock(&h->lock);
    while (e) {
        struct estream *next = e->next;

        stream_finish(e, "draining", "the daemon is shutting down; read on from your last seq");
        e = next;
    }
}

void events_hub_free(struct lb_events_hub *h)
{
    if (!h)
        return;
    events_hub_stop(h);
    close(h->efd);
    pthread_mutex_destroy(&h->lock);
    free(h);
}
