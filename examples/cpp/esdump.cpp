// esdump.cpp: every engine of an engine-state source through the C ABI, with
// a small C++17 RAII wrapper around the handle (engine_state::Source): the
// handle is closed by the destructor, failures are exceptions, and the
// engine array is a std::vector reused by every read.
//
//   c++ -std=c++17 -Icapi/include examples/cpp/esdump.cpp -Ltarget/release
//       -lengine_state -Wl,-rpath,$PWD/target/release -o esdump-cpp   (one line)
//   ./esdump-cpp file:///dev/shm/agentic_engine_state
#include <cstdio>
#include <stdexcept>
#include <string>
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

// An open source. Move-only; one per thread (a handle used by two threads
// at once answers ES_CODE_BUSY, which read() throws).
class Source {
  public:
    // uri: file:///dir or redis://host:port/db; nullptr: the environment's.
    explicit Source(const char *uri, const EsOptions *options = nullptr) {
        EsCode code = es_open(uri, options, &handle_);
        if (code != ES_CODE_OK) throw Error("open", code);
    }
    ~Source() { es_close(handle_); }
    Source(const Source &) = delete;
    Source &operator=(const Source &) = delete;
    Source(Source &&other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    Source &operator=(Source &&other) noexcept {
        if (this != &other) {
            es_close(handle_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
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
    EsSource *handle_ = nullptr;
    std::vector<EsEngine> buffer_ = std::vector<EsEngine>(16);
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

int main(int argc, char **argv) {
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        std::fprintf(stderr, "usage: esdump-cpp [URI]   (file:///dir or redis://host:port/db)\n");
        return 2;
    }
    try {
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
