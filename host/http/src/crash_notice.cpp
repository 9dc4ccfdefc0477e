#include "crash_notice.hpp"

#include "eh/http/last_words.hpp"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

namespace eh::http::crash_notice {
namespace {

enum State : int { NoResponse, HeadPartial, StreamAtBoundary, StreamMidChunk, Untouchable };

struct Slot {
    std::atomic<int> fd{-1};
    std::atomic<int> state{Untouchable};
    std::atomic<bool> openai{false};
    std::string head;  // response head bytes seen so far (owner thread only)
    bool head_done = false;
};

constexpr int kSlots = 1024;  // more requests in flight than this go unwatched
Slot g_slots[kSlots];
thread_local int t_slot = -1;

// Pre-built, so the handler allocates nothing.
const std::string kBody =
    R"({"error":{"code":"INTERNAL","message":"the engine crashed; this worker is exiting and will be restarted","details":{"retriable":true},"retriable":true,"correlation_id":null,"type":"server_error","param":null}})";
const std::string kHttp500 = "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             "Content-Length: " + std::to_string(kBody.size()) + "\r\n\r\n" + kBody;
std::string chunk(const std::string& payload) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%zx\r\n", payload.size());
    return hex + payload + "\r\n";
}
const std::string kNativeTail =
    chunk("event: error\ndata: {\"code\":\"INTERNAL\",\"message\":\"the engine crashed; this worker is exiting and will "
          "be restarted\",\"retriable\":true}\n\n") + "0\r\n\r\n";
const std::string kOpenAiTail = chunk("data: " + kBody + "\n\ndata: [DONE]\n\n") + "0\r\n\r\n";

void write_all(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
        ssize_t n = ::write(fd, s.data() + off, s.size() - off);
        if (n <= 0) return;
        off += size_t(n);
    }
}

// The process that installed the handler: a forked child (the loader's
// pre-flight) inherits the handler and the sockets, but the requests are not
// its to answer.
std::atomic<pid_t> g_owner{0};

// The last-words lines (last_words.hpp), one per fatal signal, in two sets
// so a new set is written while the handler may read the other.
constexpr int kFatal[] = {SIGSEGV, SIGILL, SIGBUS, SIGFPE, SIGABRT};
constexpr const char* kFatalNames[] = {"SIGSEGV", "SIGILL", "SIGBUS", "SIGFPE", "SIGABRT"};
constexpr int kFatalCount = 5;
struct LastWords {
    std::string line[kFatalCount];
    size_t ts_at[kFatalCount] = {};  // where the placeholder timestamp is (npos: none)
};
LastWords g_words[2];
std::atomic<int> g_words_active{-1};  // -1: none set
std::mutex g_words_mu;               // writers only

// RFC 3339 UTC with milliseconds from the clock, by arithmetic only (no
// locale, no allocation: safe in a signal handler). 24 bytes.
void format_time(char* out) {
    timespec t{};
    ::clock_gettime(CLOCK_REALTIME, &t);
    int64_t secs = t.tv_sec, days = secs / 86400, rem = secs % 86400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    int64_t z = days + 719468, era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097, yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t y = yoe + era * 400, doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    int64_t d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9;
    y += m <= 2;
    const int64_t fields[] = {y, m, d, rem / 3600, rem / 60 % 60, rem % 60, t.tv_nsec / 1000000};
    const int widths[] = {4, 2, 2, 2, 2, 2, 3};
    const char seps[] = {'-', '-', 'T', ':', ':', '.', 'Z'};
    int k = 0;
    for (int f = 0; f < 7; ++f) {
        for (int w = widths[f] - 1; w >= 0; --w) {
            int64_t v = fields[f];
            for (int p = 0; p < w; ++p) v /= 10;
            out[k++] = char('0' + v % 10);
        }
        out[k++] = seps[f];
    }
}

void write_last_words(int sig) {
    int set = g_words_active.load();
    if (set < 0) return;
    for (int i = 0; i < kFatalCount; ++i) {
        if (kFatal[i] != sig) continue;
        const std::string& line = g_words[set].line[i];
        const size_t at = g_words[set].ts_at[i];
        if (at == std::string::npos) {
            write_all(STDOUT_FILENO, line);
        } else {
            char ts[sizeof kLastWordsTimePlaceholder];
            format_time(ts);
            (void)!::write(STDOUT_FILENO, line.data(), at);
            (void)!::write(STDOUT_FILENO, ts, sizeof kLastWordsTimePlaceholder - 1);
            (void)!::write(STDOUT_FILENO, line.data() + at + sizeof kLastWordsTimePlaceholder - 1,
                           line.size() - at - (sizeof kLastWordsTimePlaceholder - 1));
        }
    }
}

void on_fatal(int sig) {
    if (::getpid() == g_owner.load()) write_last_words(sig);
    for (auto& s : g_slots) {
        if (::getpid() != g_owner.load()) break;
        int fd = s.fd.load();
        if (fd < 0) continue;
        switch (s.state.load()) {
        case NoResponse: write_all(fd, kHttp500); break;
        case StreamAtBoundary: write_all(fd, s.openai.load() ? kOpenAiTail : kNativeTail); break;
        default: break;
        }
    }
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}

}  // namespace

void install() {
    static std::once_flag once;
    std::call_once(once, [] {
        g_owner.store(::getpid());
        for (int sig : kFatal) {
            struct sigaction sa {};
            sa.sa_handler = on_fatal;
            sigemptyset(&sa.sa_mask);
            sa.sa_flags = SA_RESETHAND;
            ::sigaction(sig, &sa, nullptr);
        }
    });
}

Watch::Watch(int fd, bool openai) : slot_(-1) {
    for (int i = 0; i < kSlots; ++i) {
        int expected = -1;
        Slot& s = g_slots[i];
        // A free slot's state is Untouchable, so the handler ignores it
        // until it is set up here.
        if (s.fd.load() != -1 || !s.fd.compare_exchange_strong(expected, fd)) continue;
        s.openai.store(openai);
        s.head.clear();
        s.head_done = false;
        s.state.store(NoResponse);
        slot_ = i;
        break;
    }
    t_slot = slot_;
}

Watch::~Watch() {
    if (slot_ >= 0) {
        g_slots[slot_].state.store(Untouchable);
        g_slots[slot_].fd.store(-1);
    }
    t_slot = -1;
}

void wrote(int fd, std::string_view bytes, bool whole_call) {
    if (t_slot < 0) return;
    Slot& s = g_slots[t_slot];
    if (s.fd.load() != fd || s.state.load() == Untouchable) return;
    if (!s.head_done) {
        s.head.append(bytes);
        size_t end = s.head.find("\r\n\r\n");
        if (end == std::string::npos) {
            s.state.store(HeadPartial);  // nothing can be added to half a head
            return;
        }
        s.head_done = true;
        std::string h = s.head.substr(0, end);
        for (auto& c : h) c = char(std::tolower(static_cast<unsigned char>(c)));
        const bool sse = h.find("content-type: text/event-stream") != std::string::npos &&
                         h.find("transfer-encoding: chunked") != std::string::npos;
        // Bytes after the head in the same write are body bytes.
        bool rest = end + 4 < s.head.size();
        s.head.clear();
        s.state.store(sse && !rest && whole_call ? StreamAtBoundary : Untouchable);
        return;
    }
    // Body bytes of an SSE stream: a chunk ends where a write call ended.
    if (bytes.find("event: end\n") != std::string_view::npos || bytes.find("event: error\n") != std::string_view::npos ||
        bytes.find("data: [DONE]") != std::string_view::npos || bytes.find("0\r\n\r\n") == 0) {
        s.state.store(Untouchable);  // the stream has its terminal event
        return;
    }
    s.state.store(whole_call ? StreamAtBoundary : StreamMidChunk);
}

}  // namespace eh::http::crash_notice

namespace eh::http {

void set_last_words(const std::function<std::string(const char* signal_name, const std::string& ts)>& line_for) {
    using namespace crash_notice;
    std::lock_guard lock(g_words_mu);
    const int next = g_words_active.load() == 0 ? 1 : 0;
    for (int i = 0; i < kFatalCount; ++i) {
        std::string line = line_for(kFatalNames[i], kLastWordsTimePlaceholder) + "\n";
        g_words[next].ts_at[i] = line.find(kLastWordsTimePlaceholder);
        g_words[next].line[i] = std::move(line);
    }
    g_words_active.store(next);
    install();
}

}  // namespace eh::http
