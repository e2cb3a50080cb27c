/*
 * esdump.c: every engine of an engine-state source, read through the C ABI
 * (capi/include/engine_state.h), one line per engine, then the engines that
 * could not be read.
 *
 *   cc -std=c11 -Icapi/include examples/c/esdump.c \
 *      target/release/libengine_state.a -lgcc_s -lutil -lrt -lpthread -lm -ldl -o esdump-c
 *   ./esdump-c file:///dev/shm/agentic_engine_state
 *   ./esdump-c --cache ENGINE [URI]   one engine's cache digest: a header
 *                                     line, then one 16-hex entry per line
 *   ./esdump-c --replicas OWN [URI]   the router replicas' shared reservations
 *                                     but replica OWN's ("-": every replica):
 *                                     a line per replica, one per engine it
 *                                     holds reservations on, then the errors
 *
 * With no URI: $AGENTIC_ENGINE_STATE_URI, else the default directory.
 * Exit status: 0 when the source was read, 1 otherwise (with the reason).
 */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine_state.h"

static const char *status_name(EsStatus status) {
    switch (status) {
    case ES_STATUS_FRESH: return "fresh";
    case ES_STATUS_STALE: return "stale";
    case ES_STATUS_DEAD: return "dead";
    case ES_STATUS_TORN: return "torn";
    default: return "?";
    }
}

static int fail(const char *what, EsCode code) {
    char message[1024];
    es_last_error(message, sizeof message);
    fprintf(stderr, "esdump-c: %s: %s: %s\n", what, es_code_name(code), message);
    return 1;
}

/* Reads every engine into *engines (grown as needed); returns the code. */
static EsCode read_all(EsSource *source, EsEngine **engines, size_t *capacity, size_t *count) {
    for (;;) {
        EsCode code = es_read(source, *engines, *capacity, count);
        if (code != ES_CODE_BUFFER_TOO_SMALL) {
            return code;
        }
        /* More engines than fit: *count says how many; grow and read again. */
        EsEngine *grown = realloc(*engines, *count * sizeof **engines);
        if (grown == NULL) {
            fprintf(stderr, "esdump-c: out of memory for %zu engines\n", *count);
            exit(1);
        }
        *engines = grown;
        *capacity = *count;
    }
}

/* --cache ENGINE: the digest of one engine (es_read_cache). */
static int dump_cache(const char *uri, const char *engine_id) {
    EsOptions options;
    es_options_init(&options);
    options.read_cache_digests = 1;
    EsSource *source = NULL;
    EsCode code = es_open(uri, &options, &source);
    if (code != ES_CODE_OK) {
        return fail("open", code);
    }
    EsEngine engine;
    EsCacheDigest digest;
    /* Size query, then an array of exactly the count. */
    code = es_read_cache(source, engine_id, &engine, &digest, NULL, 0);
    uint64_t *entries = NULL;
    if (code == ES_CODE_BUFFER_TOO_SMALL) {
        entries = malloc(digest.count * sizeof *entries);
        if (entries == NULL) {
            es_close(source);
            return 1;
        }
        code = es_read_cache(source, engine_id, &engine, &digest, entries, digest.count);
    }
    int status = 0;
    if (code == ES_CODE_OK || (code == ES_CODE_NOT_FRESH && entries != NULL)) {
        printf("%s version %llu count %llu generation %llu %s\n", engine_id,
               (unsigned long long)digest.version, (unsigned long long)digest.count,
               (unsigned long long)digest.generation, status_name(engine.status));
        for (uint64_t i = 0; i < digest.count; i++) {
            printf("%016llx\n", (unsigned long long)entries[i]);
        }
        if (code != ES_CODE_OK) {
            status = fail("cache", code);
        }
    } else {
        status = fail("cache", code);
    }
    free(entries);
    es_close(source);
    return status;
}

/* --replicas OWN: every peer replica's reservations (es_read_replicas). */
static int dump_replicas(const char *uri, const char *own) {
    EsReplicas *replicas = NULL;
    EsCode code = es_open_replicas(uri, strcmp(own, "-") == 0 ? NULL : own, NULL, &replicas);
    if (code != ES_CODE_OK) {
        return fail("open replicas", code);
    }
    /* Size query, then arrays of exactly the counts (a replica may start
     * sharing between the two calls: then read again). */
    size_t count = 0, engine_count = 0;
    EsReplica *out = NULL;
    EsReservation *entries = NULL;
    for (;;) {
        code = es_read_replicas(replicas, out, count, &count, entries, engine_count, &engine_count);
        if (code != ES_CODE_BUFFER_TOO_SMALL) {
            break;
        }
        free(out);
        free(entries);
        out = malloc((count ? count : 1) * sizeof *out);
        entries = malloc((engine_count ? engine_count : 1) * sizeof *entries);
        if (out == NULL || entries == NULL) {
            fprintf(stderr, "esdump-c: out of memory\n");
            exit(1);
        }
    }
    int status = 0;
    if (code != ES_CODE_OK) {
        status = fail("read replicas", code);
        count = 0;
    }
    for (size_t i = 0; i < count; i++) {
        const EsReplica *r = &out[i];
        /* Only a fresh replica's reservations may be added to a router's own. */
        printf("replica %s %s engines %llu generation %llu hb_age_ms %.3f\n", r->replica_id,
               status_name(r->status), (unsigned long long)r->engine_count,
               (unsigned long long)r->generation, r->heartbeat_age_ns / 1e6);
        for (uint64_t j = 0; j < r->engine_count; j++) {
            const EsReservation *e = &entries[r->first_engine + j];
            printf("  %s num_requests %llu ongoing_tokens %llu pending_prefill_tokens %llu\n",
                   e->engine_id, (unsigned long long)e->counters.num_requests,
                   (unsigned long long)e->counters.ongoing_tokens,
                   (unsigned long long)e->counters.pending_prefill_tokens);
        }
    }
    size_t errors = 0;
    if (status == 0 && es_replica_error_count(replicas, &errors) == ES_CODE_OK) {
        for (size_t i = 0; i < errors; i++) {
            EsCode class_code = ES_CODE_OK;
            char name[256] = "", message[1024] = "";
            es_replica_error(replicas, i, &class_code, name, sizeof name, message, sizeof message);
            /* A code this header does not know, 100 or more, is that
             * replica's error all the same. */
            printf("error %s %s: %s\n", name, es_code_name(class_code), message);
        }
    }
    free(out);
    free(entries);
    es_close_replicas(replicas);
    return status;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "--cache") == 0 && argc <= 4) {
        return dump_cache(argc == 4 ? argv[3] : NULL, argv[2]);
    }
    if (argc >= 3 && strcmp(argv[1], "--replicas") == 0 && argc <= 4) {
        return dump_replicas(argc == 4 ? argv[3] : NULL, argv[2]);
    }
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        fprintf(stderr, "usage: esdump-c [URI] | esdump-c --cache ENGINE [URI] | "
                        "esdump-c --replicas OWN|- [URI]   "
                        "(file:///dir or redis://host:port/db)\n");
        return 2;
    }
    if (es_abi_version() != ES_ABI_VERSION) {
        fprintf(stderr, "esdump-c: built against ABI %d, library has %u: rebuild\n",
                ES_ABI_VERSION, es_abi_version());
        return 1;
    }
    EsOptions options;
    es_options_init(&options);

    EsSource *source = NULL;
    EsCode code = es_open(argc == 2 ? argv[1] : NULL, &options, &source);
    if (code != ES_CODE_OK) {
        return fail("open", code);
    }

    /* Start with room for one engine: read_all grows the array. */
    size_t capacity = 1, count = 0;
    EsEngine *engines = malloc(capacity * sizeof *engines);
    if (engines == NULL) {
        es_close(source);
        return 1;
    }
    code = read_all(source, &engines, &capacity, &count);
    if (code != ES_CODE_OK) {
        free(engines);
        es_close(source);
        return fail("read", code);
    }

    printf("%-24s %-6s %8s %8s %8s %10s %10s %4s\n", "ENGINE", "STATUS", "RUNNING", "WAITING",
           "KV_USED", "HB_AGE_MS", "CAP_AGE_MS", "GEN");
    for (size_t i = 0; i < count; i++) {
        const EsEngine *e = &engines[i];
        char kv[16] = "-";
        if (e->gpu_kv_used_frac >= 0) {
            snprintf(kv, sizeof kv, "%.3f", e->gpu_kv_used_frac);
        }
        printf("%-24s %-6s %8llu %8llu %8s %10.3f %10.3f %4llu\n", e->engine_id,
               status_name(e->status), (unsigned long long)e->snapshot.num_running,
               (unsigned long long)e->snapshot.num_waiting, kv, e->heartbeat_age_ns / 1e6,
               e->capture_age_ns / 1e6, (unsigned long long)e->generation);
    }

    int status = 0;
    size_t errors = 0;
    code = es_error_count(source, &errors);
    if (code != ES_CODE_OK) {
        status = fail("error count", code);
        errors = 0;
    }
    for (size_t i = 0; i < errors; i++) {
        EsCode class_code = ES_CODE_OK;
        char name[256] = "", message[1024] = "";
        /* A too-small buffer still gets what fits, NUL-terminated
         * (ES_CODE_BUFFER_TOO_SMALL); any other code is a failure. */
        code = es_engine_error(source, i, &class_code, name, sizeof name, message, sizeof message);
        if (code != ES_CODE_OK && code != ES_CODE_BUFFER_TOO_SMALL) {
            status = fail("engine error", code);
            break;
        }
        printf("error %s %s: %s\n", name, es_code_name(class_code), message);
    }

    free(engines);
    es_close(source);
    return status;
}
