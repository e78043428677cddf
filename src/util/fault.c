/* fault.c - see fault.h. */
#include "util/fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

enum fault_action { FAULT_FAIL, FAULT_HANG, FAULT_DELAY, FAULT_HOLD };

/* How long a hold waits for its file at most, and how often it looks. */
#define FAULT_HOLD_MAX_MS 300000
#define FAULT_HOLD_STEP_MS 10

struct fault_rule {
    char op[64];
    enum fault_action action;
    long arg;       /* fail: remaining count (-1 = always); delay: ms */
    char path[256]; /* hold: the file whose existence lets calls proceed */
};

#define FAULT_MAX_RULES 32

static pthread_mutex_t fault_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct fault_rule fault_rules[FAULT_MAX_RULES];
static int fault_n;

static int fault_parse_one(const char *item, struct fault_rule *rule, struct lb_error *err)
{
    const char *eq = strchr(item, '='), *colon;
    char *end;

    if (!eq || eq == item || (size_t)(eq - item) >= sizeof(rule->op))
        return lb_error_set(err, -EINVAL, "fault '%s' must be OP=ACTION[:ARG]", item);
    memcpy(rule->op, item, (size_t)(eq - item));
    rule->op[eq - item] = '\0';
    colon = strchr(eq + 1, ':');
    if (!strncmp(eq + 1, "fail", 4) && (eq[5] == '\0' || eq[5] == ':')) {
        rule->action = FAULT_FAIL;
        rule->arg = -1;
        if (colon) {
            rule->arg = strtol(colon + 1, &end, 10);
            if (*end || rule->arg < 1)
                return lb_error_set(err, -EINVAL, "fault '%s': fail:N needs N >= 1", item);
        }
    } else if (!strcmp(eq + 1, "hang")) {
        rule->action = FAULT_HANG;
    } else if (!strncmp(eq + 1, "hold:", 5)) {
        rule->action = FAULT_HOLD;
        if (colon[1] != '/' || strlen(colon + 1) >= sizeof(rule->path))
            return lb_error_set(err, -EINVAL,
                                "fault '%s': hold:PATH needs an absolute PATH under %zu bytes",
                                item, sizeof(rule->path));
        memcpy(rule->path, colon + 1, strlen(colon + 1) + 1);
    } else if (!strncmp(eq + 1, "delay:", 6)) {
        rule->action = FAULT_DELAY;
        rule->arg = strtol(colon + 1, &end, 10);
        if (*end || rule->arg < 0)
            return lb_error_set(err, -EINVAL, "fault '%s': delay:MS needs MS >= 0", item);
    } else {
        return lb_error_set(
            err, -EINVAL, "fault '%s': action must be fail[:N], hang, delay:MS or hold:PATH", item);
    }
    return 0;
}

int fault_load(const char *spec, struct lb_error *err)
{
    struct fault_rule rules[FAULT_MAX_RULES];
    char *copy, *save = NULL, *item;
    int n = 0, r = 0;

    if (!spec || !*spec) {
        fault_reset();
        return 0;
    }
    copy = strdup(spec);
    if (!copy)
        return lb_error_set(err, -ENOMEM, "out of memory");
    for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ')
            item++;
        if (!*item)
            continue;
        if (n == FAULT_MAX_RULES) {
            r = lb_error_set(err, -EINVAL, "at most %d faults", FAULT_MAX_RULES);
            break;
        }
        r = fault_parse_one(item, &rules[n], err);
        if (r < 0)
            break;
        n++;
    }
    free(copy);
    if (r < 0)
        return r;
    pthread_mutex_lock(&fault_mutex);
    memcpy(fault_rules, rules, sizeof(rules[0]) * (size_t)n);
    fault_n = n;
    pthread_mutex_unlock(&fault_mutex);
    return 0;
}

bool fault_enabled(void)
{
    bool on;

    pthread_mutex_lock(&fault_mutex);
    on = fault_n > 0;
    pthread_mutex_unlock(&fault_mutex);
    return on;
}

void fault_reset(void)
{
    pthread_mutex_lock(&fault_mutex);
    fault_n = 0;
    pthread_mutex_unlock(&fault_mutex);
}

int fault_hit(const char *op, int64_t deadline_ms, struct lb_error *err)
{
    enum fault_action action = FAULT_DELAY;
    char path[sizeof(fault_rules[0].path)] = "";
    long arg = 0;
    bool found = false;

    pthread_mutex_lock(&fault_mutex);
    for (int i = 0; i < fault_n; i++) {
        struct fault_rule *rule = &fault_rules[i];

        if (strcmp(rule->op, op) != 0)
            continue;
        if (rule->action == FAULT_FAIL) {
            if (rule->arg == 0)
                continue; /* used up */
            if (rule->arg > 0)
                rule->arg--;
        }
        action = rule->action;
        arg = rule->arg;
        memcpy(path, rule->path, sizeof(path));
        found = true;
        break;
    }
    pthread_mutex_unlock(&fault_mutex);
    if (!found)
        return 0;
    switch (action) {
    case FAULT_FAIL:
        log_warn("fault injected: %s fails", op);
        return lb_error_set(err, -EIO, "injected fault: %s failed", op);
    case FAULT_HANG:
        log_warn("fault injected: %s hangs", op);
        clock_sleep_ms(deadline_ms > 0 ? deadline_ms : 30000);
        return lb_error_set(err, -ETIMEDOUT, "injected fault: %s hung past its deadline", op);
    case FAULT_DELAY:
        clock_sleep_ms(arg);
        return 0;
    case FAULT_HOLD:
        log_warn("fault injected: %s holds until %s exists", op, path);
        for (int64_t t = 0; t < FAULT_HOLD_MAX_MS && access(path, F_OK) < 0;
             t += FAULT_HOLD_STEP_MS)
            clock_sleep_ms(FAULT_HOLD_STEP_MS);
        return 0;
    }
    return 0;
}
