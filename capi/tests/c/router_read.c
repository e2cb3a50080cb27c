/*
 * router_read.c: router replicas' shared reservations read from C through
 * engine_state.h, for capi/tests/c_routers.rs (built there with ASan and
 * UBSan).
 *
 *   router_read file PATH      one line "code NAME", then on success "file
 *                              replica state writer_pid writer_pid_ns
 *                              generation created_unix_ns heartbeat_period_us
 *                              capacity seq heartbeat_mono_ns changed_mono_ns
 *                              count" and one line per live slot "engine
 *                              ID" and the six counters
 *   router_read dir URI [OWN]  es_open_replicas, a size query, then a read
 *                              into arrays of exactly the counts: "code
 *                              NAME", one line "replica ID STATUS
 *                              generation engine_count" per replica and its
 *                              entries as above, then "error NAME CODE" per
 *                              per-replica error
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine_state.h"

static void print_entry(const EsReservation *e) {
    const EsReservations *c = &e->counters;
    printf("engine %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
           e->engine_id, c->num_requests, c->ongoing_tokens, c->pending_prefill_tokens,
           c->ongoing_decode_tokens, c->num_prefilling, c->max_prefill_remaining);
}

static int read_file(const char *path) {
    EsRouterFile file;
    /* Size query first, then an array of exactly the count. */
    EsCode code = es_read_router_file(path, &file, NULL, 0);
    EsReservation *entries = NULL;
    if (code == ES_CODE_BUFFER_TOO_SMALL) {
        entries = malloc(file.count * sizeof *entries);
        code = es_read_router_file(path, &file, entries, file.count);
    }
    printf("code %s\n", es_code_name(code));
    if (code == ES_CODE_OK) {
        printf("file %s %u %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %u %" PRIu64 " %" PRIu64
               " %" PRIu64 " %" PRIu64 "\n",
               file.replica_id, (unsigned)file.state, file.writer_pid, file.writer_pid_ns,
               file.generation, file.created_unix_ns, file.heartbeat_period_us, file.capacity,
               file.seq, file.heartbeat_mono_ns, file.changed_mono_ns, file.count);
        for (uint64_t i = 0; i < file.count; i++) {
            print_entry(&entries[i]);
        }
    }
    free(entries);
    return 0;
}

static const char *status_name(EsStatus status) {
    switch (status) {
    case ES_STATUS_FRESH:
        return "fresh";
    case ES_STATUS_STALE:
        return "stale";
    case ES_STATUS_DEAD:
        return "dead";
    default:
        return "torn";
    }
}

static int read_dir(const char *uri, const char *own) {
    EsReplicas *replicas = NULL;
    EsCode code = es_open_replicas(uri, own, NULL, &replicas);
    if (code != ES_CODE_OK) {
        char message[512];
        es_last_error(message, sizeof message);
        printf("code %s %s\n", es_code_name(code), message);
        return 0;
    }
    size_t count = 0, engine_count = 0;
    code = es_read_replicas(replicas, NULL, 0, &count, NULL, 0, &engine_count);
    EsReplica *out = malloc((count ? count : 1) * sizeof *out);
    EsReservation *entries = malloc((engine_count ? engine_count : 1) * sizeof *entries);
    if (code == ES_CODE_BUFFER_TOO_SMALL || code == ES_CODE_OK) {
        code = es_read_replicas(replicas, out, count, &count, entries, engine_count, &engine_count);
    }
    printf("code %s\n", es_code_name(code));
    if (code == ES_CODE_OK) {
        for (size_t i = 0; i < count; i++) {
            const EsReplica *r = &out[i];
            printf("replica %s %s %" PRIu64 " %" PRIu64 "\n", r->replica_id, status_name(r->status),
                   r->generation, r->engine_count);
            for (uint64_t j = 0; j < r->engine_count; j++) {
                print_entry(&entries[r->first_engine + j]);
            }
        }
        size_t errors = 0;
        es_replica_error_count(replicas, &errors);
        for (size_t i = 0; i < errors; i++) {
            EsCode class;
            char name[128];
            char message[512];
            if (es_replica_error(replicas, i, &class, name, sizeof name, message, sizeof message) ==
                ES_CODE_OK) {
                printf("error %s %s\n", name, es_code_name(class));
            }
        }
    }
    free(entries);
    free(out);
    es_close_replicas(replicas);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && argv[1][0] == 'f') {
        return read_file(argv[2]);
    }
    if ((argc == 3 || argc == 4) && argv[1][0] == 'd') {
        return read_dir(argv[2], argc == 4 ? argv[3] : NULL);
    }
    fprintf(stderr, "usage: router_read file PATH | dir URI [OWN]\n");
    return 2;
}
