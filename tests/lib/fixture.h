/*
 * fixture.h - the criterion fixture of the tests that run kvcached: one
 * daemon per test (ops_d, started by the launcher of daemon.h: G2 2 MiB
 * of 1 MiB pages, unlocked, G3 off, warnings only), raw HTTP over its stats
 * and admin sockets, workers on it through libkvclient and blocks stored
 * by them. Every function fails the running test (cr_assert) when what it
 * needs does not hold.
 */
#ifndef KV_TESTS_LIB_FIXTURE_H
#define KV_TESTS_LIB_FIXTURE_H

#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/kvclient.h"
#include "ipc/sock.h"
#include "tests/lib/daemon.h"
#include "tests/lib/keys.h"
#include "tests/lib/metrics.h"

#define OPS_BLOCK 65536u

extern kvt_daemon ops_d;  /* the test's daemon: its directory, sockets and pid */
extern rlim_t ops_nofile; /* when set before starting, the daemon's RLIMIT_NOFILE */

/* Starts kvcached on a fresh directory with `--set` for each of extra
 * (NULL-terminated, may be NULL). tenants: NULL for the one default
 * tenant, or names, comma-separated, each configured ([tenant.NAME]) for
 * this test's own uid, sharing G2 evenly. 0 once it serves; its exit
 * status (> 0; 128 + signal) when it exits before it does, its directory
 * removed. */
int ops_try_start(const char *tenants, const char *const *extra);

/* ops_try_start that must serve. */
void ops_start(const char *tenants, const char *const *extra);

/* SIGTERM (expecting a clean exit), then the directory goes. */
void ops_stop(void);

/* kvt_http_raw / kvt_http to a socket that must accept: the HTTP status,
 * or -1 when the answer has none. */
int ops_raw(const char *sock, const void *req, size_t n, char *resp, size_t cap);
int ops_req(const char *sock, const char *method, const char *target, char *resp, size_t cap,
            const char **body);

/* The JSON body of a request that must answer `want`. Caller decrefs. */
json_t *ops_json(const char *sock, const char *method, const char *target, int want);

/* A number inside a JSON object by a dotted path ("tiers.g2.used_bytes"). */
long long ops_num(json_t *o, const char *path);

/* A number of GET /stats by its dotted path. */
long long ops_stat(const char *path);

/* The value of a /metrics sample (`series`: "name" or "name{labels}"),
 * -1 when there is none; /metrics must answer 200. */
long long ops_metric(const char *series);

/* A worker of `tenant` (and salt, NULL for none) of the daemon at socket
 * sock; no_g1 and g1_uuid as in kvc_opts. */
kvc *ops_open_at(const char *sock, const char *tenant, const char *salt, int no_g1,
                 const uint8_t *g1_uuid);
/* A worker of `tenant` of ops_d; no_g1 and g1_uuid as in kvc_opts. */
kvc *ops_open_on(const char *tenant, int no_g1, const uint8_t *g1_uuid);
kvc *ops_open_with(const char *tenant, int no_g1);
kvc *ops_open(const char *tenant);
/* A worker connection to the socket sock without libkvclient, for raw
 * frames: SO_RCVTIMEO and SO_SNDTIMEO of 3 s, and, when tenant is not NULL,
 * a HELLO of that tenant for OPS_BLOCK blocks answered (its descriptors
 * closed). The fd. */
int ops_raw_worker(const char *sock, const char *tenant);

/* Stores blocks KC(first)..KC(last), unrelated (no chain). */
void ops_store(kvc *c, uint64_t first, uint64_t last);

/* How many of first..last are resident. */
int ops_resident(kvc *c, uint64_t first, uint64_t last);

/* The namespace digest (hex) of the one namespace holding blocks. */
void ops_ns_hex(char out[65]);

#endif
