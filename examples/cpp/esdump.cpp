// esdump.cpp: every engine of an engine-state source through the C ABI, with
// a small C++17 RAII wrapper around the handle (engine_state::Source): the
// handle is closed by the destructor, failures are exceptions, and the
// engine array and the digest entries are std::vectors that a Source owns
// and reuses for every read.
//
// --prefix-hit is what a cache-aware router does with an engine's cache
// digest (docs/FORMAT.md, "Cache residency"): hash a prompt into its router
// block hashes (es_block_hashes: one per full 512-token block, chained, so
// the k-th hash names the whole prefix up to it) and count the leading run
// of them in the digest (sorted ascending: a binary search each). That run
// times ES_BLOCK_TOKENS is how much of the prompt's prefix the engine holds.
//
//   c++ -std=c++17 -Icapi/include examples/cpp/esdump.cpp -Ltarget/release
//       -lengine_state -Wl,-rpath,$PWD/target/release -o esdump-cpp   (one line)
//   ./esdump-cpp file:///dev/shm/agentic_engine_state
//   seq 0 3071 | ./esdump-cpp --prefix-hit ENGINE [URI]   the prompt's token
//       ids on stdin (whitespace-separated); prints the digest's header, one
//       line per prompt block, then the leading run
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine_state.h"

namespace engine_state {

// A failed call: the EsCode and the library's message.
class Error : public std::runtime_error {
  public:
    Error(const std::string &what, EsCode code)
        : std::runtime_error(what + ": " + es_code_name(code) + ": " + last_message()),
          code_(code) {}
    EsCode code() const noexcept { return code_; }

  private:
    static std::string last_message() {
        std::string message(es_last_error(nullptr, 0), '\0');
        es_last_error(message.data(), message.size() + 1);
        return message;
    }
    EsCode code_;
};

// The engines of one read (a view into the Source's buffer, valid until the
// next read).
struct Engines {
    const EsEngine *first;
    size_t count;
    const EsEngine *begin() const { return first; }
    const EsEngine *end() const { return first + count; }
    size_t size() const { return count; }
};

// One engine that could not be read.
struct EngineError {
    std::string name;
    EsCode code;
    std::string message;
};

// One engine's cache digest as es_read_cache gives it: the engine's state,
// the digest's header, and its entries (a view into the Source's buffer,
// valid until the next read_cache), the router block hashes ascending.
struct Cache {
    EsEngine engine;
    EsCacheDigest digest;
    const uint64_t *first;
    size_t count;
    const uint64_t *begin() const { return first; }
    const uint64_t *end() const { return first + count; }
    bool holds(uint64_t block) const { return std::binary_search(begin(), end(), block); }
};

// The router block hashes of a prompt's token ids, in prompt order: one per
// full ES_BLOCK_TOKENS-token block (a trailing partial block has none).
inline std::vector<uint64_t> block_hashes(const std::vector<uint32_t> &tokens) {
    size_t count = 0;
    EsCode code = es_block_hashes(tokens.data(), tokens.size(), nullptr, 0, &count);
    if (code != ES_CODE_OK && code != ES_CODE_BUFFER_TOO_SMALL) throw Error("block hashes", code);
    std::vector<uint64_t> hashes(count);
    code = es_block_hashes(tokens.data(), tokens.size(), hashes.data(), hashes.size(), &count);
    if (code != ES_CODE_OK) throw Error("block hashes", code);
    return hashes;
}

// How many of `hashes` (a prompt's, in order) lead the prompt in `cache`:
// the first one missing ends the run (a later one cannot be reused without
// its predecessors).
inline size_t leading_run(const std::vector<uint64_t> &hashes, const Cache &cache) {
    size_t run = 0;
    while (run < hashes.size() && cache.holds(hashes[run])) run++;
    return run;
}

// An open source. Move-only; one per thread (a handle used by two threads
// at once answers ES_CODE_BUSY, which read() throws).
class Source {
  public:
    // uri: file:///dir or redis://host:port/db; nullptr: the environment's.
    explicit Source(const char *uri, const EsOptions *options = nullptr) {
        if (options != nullptr) cache_digests_ = options->read_cache_digests != 0;
        EsCode code = es_open(uri, options, &handle_);
        if (code != ES_CODE_OK) throw Error("open", code);
    }
    ~Source() { es_close(handle_); }
    Source(const Source &) = delete;
    Source &operator=(const Source &) = delete;
    Source(Source &&other) noexcept
        : handle_(std::exchange(other.handle_, nullptr)), buffer_(std::move(other.buffer_)),
          entries_(std::move(other.entries_)), cache_digests_(other.cache_digests_) {}
    Source &operator=(Source &&other) noexcept {
        if (this != &other) {
            es_close(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
            buffer_ = std::move(other.buffer_);
            entries_ = std::move(other.entries_);
            cache_digests_ = other.cache_digests_;
        }
        return *this;
    }

    // A source that also reads cache digests (what read_cache needs).
    static Source with_cache_digests(const char *uri) {
        EsOptions options;
        EsCode code = es_options_init(&options);
        if (code != ES_CODE_OK) throw Error("options", code);
        options.read_cache_digests = 1;
        return Source(uri, &options);
    }

    // The digest of engine `engine_id`, usable to route: the engine is
    // fresh and the digest of its run (anything else throws, saying why).
    // The entry buffer only grows. A digest being replaced (ES_CODE_TORN)
    // is read again, a bounded number of times.
    Cache read_cache(const char *engine_id) {
        if (!cache_digests_) {
            throw std::logic_error("read_cache: open the Source with with_cache_digests()");
        }
        for (int torn = 0;; torn++) {
            Cache cache{};
            EsCode code = es_read_cache(handle_, engine_id, &cache.engine, &cache.digest,
                                        entries_.data(), entries_.size());
            if (code == ES_CODE_BUFFER_TOO_SMALL) {
                entries_.resize(cache.digest.count);  // a larger digest: grow, read again
                continue;
            }
            if (code == ES_CODE_TORN && torn < kTornRetries) {
                std::this_thread::yield();
                continue;
            }
            if (code != ES_CODE_OK) throw Error(std::string("cache of ") + engine_id, code);
            cache.first = entries_.data();
            cache.count = cache.digest.count;
            return cache;
        }
    }

    // Every engine, sorted by id. The buffer only grows: once it holds
    // every engine, a read allocates nothing.
    Engines read() {
        for (;;) {
            size_t count = 0;
            EsCode code = es_read(handle_, buffer_.data(), buffer_.size(), &count);
            if (code == ES_CODE_OK) return Engines{buffer_.data(), count};
            if (code != ES_CODE_BUFFER_TOO_SMALL) throw Error("read", code);
            buffer_.resize(count);  // more engines than fit: grow, read again
        }
    }

    // The engines the last read could not read, and why.
    std::vector<EngineError> errors() const {
        size_t count = 0;
        EsCode code = es_error_count(handle_, &count);
        if (code != ES_CODE_OK) throw Error("error count", code);
        std::vector<EngineError> out;
        for (size_t i = 0; i < count; i++) {
            EsCode class_code = ES_CODE_OK;
            char name[256] = "", message[1024] = "";
            // A too-small buffer still gets what fits, NUL-terminated
            // (ES_CODE_BUFFER_TOO_SMALL); any other code is a failure.
            code = es_engine_error(handle_, i, &class_code, name, sizeof name, message,
                                   sizeof message);
            if (code != ES_CODE_OK && code != ES_CODE_BUFFER_TOO_SMALL) {
                throw Error("engine error", code);
            }
            out.push_back({name, class_code, message});
        }
        return out;
    }

  private:
    static constexpr int kTornRetries = 100;
    EsSource *handle_ = nullptr;
    std::vector<EsEngine> buffer_ = std::vector<EsEngine>(16);
    std::vector<uint64_t> entries_;
    bool cache_digests_ = false;
};

const char *status_name(EsStatus status) {
    switch (status) {
    case ES_STATUS_FRESH: return "fresh";
    case ES_STATUS_STALE: return "stale";
    case ES_STATUS_DEAD: return "dead";
    case ES_STATUS_TORN: return "torn";
    }
    return "?";
}

}  // namespace engine_state

// --prefix-hit ENGINE: the prompt on stdin against ENGINE's digest.
static int prefix_hit(const char *uri, const char *engine_id) {
    std::vector<uint32_t> tokens;
    for (unsigned long long token; std::cin >> token;) {
        if (token > UINT32_MAX) {
            std::fprintf(stderr, "esdump-cpp: token id %llu does not fit 32 bits\n", token);
            return 2;
        }
        tokens.push_back(static_cast<uint32_t>(token));
    }
    if (!std::cin.eof()) {
        std::fprintf(stderr, "esdump-cpp: --prefix-hit reads token ids (whitespace-separated "
                             "decimal numbers) from stdin; found something else\n");
        return 2;
    }
    engine_state::Source source = engine_state::Source::with_cache_digests(uri);
    const std::vector<uint64_t> hashes = engine_state::block_hashes(tokens);
    const engine_state::Cache cache = source.read_cache(engine_id);
    std::printf("%s version %" PRIu64 " count %" PRIu64 " generation %" PRIu64 " %s\n",
                engine_id, cache.digest.version, cache.digest.count, cache.digest.generation,
                engine_state::status_name(cache.engine.status));
    const size_t run = engine_state::leading_run(hashes, cache);
    for (size_t i = 0; i < hashes.size(); i++) {
        std::printf("block %zu %016" PRIx64 " %s\n", i, hashes[i], i < run ? "cached" : "-");
    }
    std::printf("prompt %zu tokens %zu blocks leading run %zu (%zu tokens cached on %s)\n",
                tokens.size(), hashes.size(), run, run * ES_BLOCK_TOKENS, engine_id);
    return 0;
}

int main(int argc, char **argv) {
    const bool hit = argc >= 3 && argc <= 4 && std::strcmp(argv[1], "--prefix-hit") == 0;
    if (!hit && (argc > 2 || (argc == 2 && argv[1][0] == '-'))) {
        std::fprintf(stderr, "usage: esdump-cpp [URI] | esdump-cpp --prefix-hit ENGINE [URI] < "
                             "token-ids   (URI: file:///dir or redis://host:port/db)\n");
        return 2;
    }
    try {
        if (hit) return prefix_hit(argc == 4 ? argv[3] : nullptr, argv[2]);
        engine_state::Source source(argc == 2 ? argv[1] : nullptr);
        engine_state::Engines engines = source.read();
        std::printf("%-24s %-6s %8s %8s %8s %10s %10s %4s\n", "ENGINE", "STATUS", "RUNNING",
                    "WAITING", "KV_USED", "HB_AGE_MS", "CAP_AGE_MS", "GEN");
        for (const EsEngine &e : engines) {
            std::string kv = "-";
            if (e.gpu_kv_used_frac >= 0) {
                char text[16];
                std::snprintf(text, sizeof text, "%.3f", e.gpu_kv_used_frac);
                kv = text;
            }
            std::printf("%-24s %-6s %8llu %8llu %8s %10.3f %10.3f %4llu\n", e.engine_id,
                        engine_state::status_name(e.status),
                        static_cast<unsigned long long>(e.snapshot.num_running),
                        static_cast<unsigned long long>(e.snapshot.num_waiting), kv.c_str(),
                        e.heartbeat_age_ns / 1e6, e.capture_age_ns / 1e6,
                        static_cast<unsigned long long>(e.generation));
        }
        for (const auto &error : source.errors()) {
            std::printf("error %s %s: %s\n", error.name.c_str(), es_code_name(error.code),
                        error.message.c_str());
        }
    } catch (const engine_state::Error &error) {
        std::fprintf(stderr, "esdump-cpp: %s\n", error.what());
        return 1;
    }
    return 0;
}
