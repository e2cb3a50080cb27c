/*
 * cache_read.c: cache digests read from C through engine_state.h, for
 * capi/tests/c_cache.rs (built there with ASan and UBSan).
 *
 *   cache_read file PATH | value PATH   one line "code NAME", then on success
 *                                       "digest version count held capacity
 *                                       state generation" and one entry per line
 *   cache_read hashes PATH              the block hashes of the u32 tokens
 *                                       (native order) in PATH
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine_state.h"

static int print_digest(EsCode code, const EsCacheDigest *d, const uint64_t *entries) {
    printf("code %s\n", es_code_name(code));
    if (code != ES_CODE_OK) {
        return 0;
    }
    printf("digest %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %u %" PRIu64 "\n", d->version, d->count,
           d->held, d->capacity, (unsigned)d->state, d->generation);
    for (uint64_t i = 0; i < d->count; i++) {
        printf("%016" PRIx64 "\n", entries[i]);
    }
    return 0;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    uint8_t *buf = malloc(1 << 21);
    *len = fread(buf, 1, 1 << 21, f);
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: cache_read file|value|hashes PATH\n");
        return 2;
    }
    EsCacheDigest digest;
    if (argv[1][0] == 'f' || argv[1][0] == 'v') {
        /* Size query first, then an array of exactly the count. */
        EsCode code;
        size_t len = 0;
        uint8_t *value = NULL;
        if (argv[1][0] == 'f') {
            code = es_read_cache_file(argv[2], &digest, NULL, 0);
        } else {
            value = slurp(argv[2], &len);
            if (value == NULL) {
                return 1;
            }
            code = es_decode_cache_value(value, len, &digest, NULL, 0);
        }
        uint64_t *entries = NULL;
        if (code == ES_CODE_BUFFER_TOO_SMALL) {
            entries = malloc(digest.count * sizeof *entries);
            code = argv[1][0] == 'f'
                       ? es_read_cache_file(argv[2], &digest, entries, digest.count)
                       : es_decode_cache_value(value, len, &digest, entries, digest.count);
        }
        print_digest(code, &digest, entries);
        free(entries);
        free(value);
        return 0;
    }
    size_t bytes = 0, count = 0;
    uint32_t *tokens = (uint32_t *)slurp(argv[2], &bytes);
    if (tokens == NULL) {
        return 1;
    }
    size_t n = bytes / sizeof *tokens;
    EsCode code = es_block_hashes(tokens, n, NULL, 0, &count);
    uint64_t *hashes = malloc((count ? count : 1) * sizeof *hashes);
    if (code == ES_CODE_BUFFER_TOO_SMALL) {
        code = es_block_hashes(tokens, n, hashes, count, &count);
    }
    printf("code %s\n", es_code_name(code));
    for (size_t i = 0; i < count; i++) {
        printf("%016" PRIx64 "\n", hashes[i]);
    }
    free(hashes);
    free(tokens);
    return 0;
}
