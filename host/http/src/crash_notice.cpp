#include "crash_notice.hpp"

#include <signal.h>
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

void on_fatal(int sig) {
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
        for (int sig : {SIGSEGV, SIGILL, SIGBUS, SIGFPE, SIGABRT}) {
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
