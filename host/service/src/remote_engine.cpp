// The parent's side of the engine process: starting it, one request and
// reply at a time over the socket, noticing its death (EOF or EPIPE, then
// waitpid), killing it when a step runs past a deadline, and starting it
// again under the restart policy.
#include "eh/service/remote_engine.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "engine_wire.hpp"
#include "eh/service/event_log.hpp"

namespace eh::service {
namespace {

using Clock = std::chrono::steady_clock;

// How long an idle engine process may take to answer the scheduler's ping,
// and /health's residency check (which asks the plugin).
constexpr auto kIdleAnswer = std::chrono::seconds(2);
constexpr auto kResidencyAnswer = std::chrono::seconds(10);
namespace lvl = spdlog::level;

constexpr int kChildFd = 3;

std::string describe_status(int status) {
    if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        const char* abbrev = sigabbrev_np(sig);
        return fmt::format("died on SIG{} ({})", abbrev ? abbrev : std::to_string(sig).c_str(), strsignal(sig));
    }
    if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
    return "ended";
}

// In the forked child, before exec: only async-signal-safe calls.
[[noreturn]] void exec_child(char* const* argv, int child_fd, pid_t parent) {
    // The parent's death kills the engine (no orphan keeps the GPU); a
    // parent that died before this line is seen by getppid().
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    if (child_fd == kChildFd) fcntl(kChildFd, F_SETFD, 0);
    else if (dup2(child_fd, kChildFd) < 0) _exit(1);
    // Client sockets and the listener must not outlive the parent's close
    // of them in a child that keeps running.
    if (syscall(SYS_close_range, kChildFd + 1, ~0u, 0) != 0)
        for (int fd = kChildFd + 1; fd < 65536; ++fd) close(fd);
    // The parent ends the child by closing the socket: a terminal's Ctrl-C
    // or a SIGTERM to the process group is the parent's to handle.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGINT, &ign, nullptr);
    sigaction(SIGTERM, &ign, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv);
    _exit(127);
}

// Forks every child from one thread that lives as long as the engine:
// PR_SET_PDEATHSIG fires when the thread that forked the child ends, and
// the scheduler's thread (which restarts the engine) ends before the child
// is closed at shutdown.
class Spawner {
public:
    Spawner() : thread_([this] { loop(); }) {}
    ~Spawner() {
        {
            std::lock_guard lock(mu_);
            quit_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    // The child's pid (its end of the socket is its fd 3), or -1 with errno's text in `err`.
    pid_t spawn(const std::vector<std::string>& argv, int child_fd, std::string& err) {
        std::unique_lock lock(mu_);
        argv_ = &argv;
        fd_ = child_fd;
        done_ = false;
        cv_.notify_all();
        cv_.wait(lock, [&] { return done_; });
        err = err_;
        return pid_;
    }

private:
    void loop() {
        std::unique_lock lock(mu_);
        for (;;) {
            cv_.wait(lock, [&] { return quit_ || argv_; });
            if (quit_) return;
            std::vector<char*> args;
            for (const std::string& a : *argv_) args.push_back(const_cast<char*>(a.c_str()));
            args.push_back(nullptr);
            const pid_t parent = getpid();
            pid_ = fork();
            if (pid_ == 0) exec_child(args.data(), fd_, parent);
            err_ = pid_ < 0 ? std::strerror(errno) : "";
            argv_ = nullptr;
            done_ = true;
            cv_.notify_all();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    const std::vector<std::string>* argv_ = nullptr;
    int fd_ = -1;
    pid_t pid_ = -1;
    std::string err_;
    bool done_ = false, quit_ = false;
    std::thread thread_;
};

struct Child {
    pid_t pid = -1;
    int fd = -1;
    // Waits up to `grace` for the child to exit on its own, then kills it;
    // returns how it ended.
    std::string reap(std::chrono::milliseconds grace) {
        int status = 0;
        const auto until = Clock::now() + grace;
        for (;;) {
            const pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid || (r < 0 && errno != EINTR)) break;
            if (Clock::now() >= until) {
                kill(pid, SIGKILL);
                while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        if (fd >= 0) close(fd);
        fd = -1;
        pid = -1;
        return describe_status(status);
    }
};

// One child at a time, and the exchange with it. Callers hold `mu`.
class Link {
public:
    explicit Link(EngineProcessOptions o) : opts_(std::move(o)) {}
    ~Link() {
        std::lock_guard lock(mu);
        if (child_) close_child();
    }

    std::timed_mutex mu;

    EngineFacts facts() const {
        std::lock_guard lock(facts_mu_);
        return facts_;
    }
    void set_device_bytes(uint64_t n) {
        std::lock_guard lock(facts_mu_);
        facts_.info.device_bytes_used = n;
    }
    int64_t pid() const { return pid_.load(); }

    // Starts a child and waits for its load: Ready, or throws.
    void load(const std::function<bool()>& cancel, const std::function<void(float, const std::string&)>& progress) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
            throw Error(Code::Internal, fmt::format("cannot create the engine process's socket: {}", std::strerror(errno)));
        std::vector<std::string> argv = opts_.argv;
        argv.insert(argv.end(), {"--parent-pid", std::to_string(getpid())});
        std::string err;
        const pid_t pid = spawner_.spawn(argv, sv[1], err);
        close(sv[1]);
        if (pid < 0) {
            close(sv[0]);
            throw Error(Code::Internal, "cannot start the engine process: " + err);
        }
        child_ = Child{pid, sv[0]};
        pid_ = pid;
        for (;;) {
            std::vector<uint8_t> body;
            wire::Io io;
            wire::Reply r;
            try {
                io = wire::read_frame(child_->fd, body, [&] { return !(cancel && cancel()); });
                if (io == wire::Io::Ok) r = wire::decode_reply(body);
            } catch (const wire::ProtocolError& e) {
                lose(std::chrono::milliseconds(0));
                throw Error(Code::EngineCrashed, fmt::format("the engine process broke the protocol while loading: {}", e.what()));
            }
            if (io == wire::Io::Abandoned) {
                lose(std::chrono::milliseconds(0));
                throw Error(Code::Cancelled, "the model load was cancelled");
            }
            if (io == wire::Io::Closed) {
                const std::string how = lose(std::chrono::milliseconds(2000));
                throw Error(Code::EngineCrashed, fmt::format("the engine process (pid {}) {} while loading the model", pid, how));
            }
            if (r.type == wire::Msg::Progress) {
                if (progress) progress(r.progress, r.message);
                continue;
            }
            if (r.type == wire::Msg::Ready) {
                std::lock_guard lock(facts_mu_);
                facts_ = r.facts;
                return;
            }
            if (r.type == wire::Msg::LoadFailed) {
                lose(std::chrono::milliseconds(2000));
                throw Error(r.code, r.message);
            }
            lose(std::chrono::milliseconds(0));
            throw Error(Code::EngineCrashed, fmt::format("the engine process sent message type {} while loading", int(r.type)));
        }
    }

    // One request and its reply. A dead, hung (`overdue` said so) or
    // garbling child is killed and reaped; that is Error(EngineCrashed).
    // `hung` says why a call that `overdue` ended was abandoned.
    wire::Reply call(const std::vector<uint8_t>& frame, wire::Msg expect, const std::function<bool()>& overdue = {},
                     const char* hung = "did not answer within the inference timeout") {
        if (!child_) throw Error(Code::EngineCrashed, "the engine process is not running: " + down_why_);
        const pid_t pid = child_->pid;
        std::vector<uint8_t> body;
        wire::Reply r;
        std::string bad;
        try {
            const auto keep_waiting = [&] { return !(overdue && overdue()); };
            wire::Io io = wire::write_frame(child_->fd, frame, keep_waiting);
            if (io == wire::Io::Ok) io = wire::read_frame(child_->fd, body, keep_waiting);
            if (io == wire::Io::Abandoned) {
                lose(std::chrono::milliseconds(0));
                crashes_.push_back(Clock::now());
                down_why_ = fmt::format("the engine {}; its process (pid {}) was killed with SIGKILL and is being "
                                        "restarted", hung, pid);
                log_event(lvl::err, "engine_crashed", {{"code", code_name(Code::EngineCrashed)}, {"pid", pid},
                                                        {"reason", "hung"}, {"message", down_why_}});
                throw Error(Code::EngineCrashed, down_why_);
            }
            if (io == wire::Io::Closed) died("");
            r = wire::decode_reply(body);
            if (r.type != expect && r.type != wire::Msg::Error)
                throw wire::ProtocolError(fmt::format("a reply of type {} to a request of type {}", int(r.type), int(expect)));
        } catch (const wire::ProtocolError& e) {
            bad = e.what();
        }
        if (!bad.empty()) broken(bad);
        if (r.type == wire::Msg::Error) throw Error(r.code, r.message);
        return r;
    }

    // Between calls nothing may arrive from the child: its end of the
    // socket closing is its death, bytes are a protocol break. Both throw
    // Error(EngineCrashed); a child with nothing to say returns.
    // A child that is still there but does not answer (stopped, deadlocked)
    // is found by a ping that must come back within kIdleAnswer.
    void check_alive() {
        if (!child_) throw Error(Code::EngineCrashed, "the engine process is not running: " + down_why_);
        pollfd p{child_->fd, POLLIN, 0};
        if (poll(&p, 1, 0) > 0) {
            uint8_t byte = 0;
            const ssize_t n = recv(child_->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
            if (n > 0) broken("a message while no request was in flight");
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) died(" while idle");
        }
        const auto until = Clock::now() + kIdleAnswer;
        call(wire::encode_request(wire::Msg::Ping), wire::Msg::Ping, [&] { return Clock::now() > until; },
             "process did not answer a liveness check within 2 s");
    }

    // The child answered something this host cannot use: it is killed.
    [[noreturn]] void broken(const std::string& what) {
        const pid_t pid = child_ ? child_->pid : -1;
        if (child_) lose(std::chrono::milliseconds(0));
        crashes_.push_back(Clock::now());
        down_why_ = fmt::format("the engine process (pid {}) sent a reply this host cannot use ({}); it was killed and "
                                "is being restarted", pid, what);
        log_event(lvl::err, "engine_crashed", {{"code", code_name(Code::EngineCrashed)}, {"pid", pid},
                                                {"reason", "protocol"}, {"message", down_why_}});
        throw Error(Code::EngineCrashed, down_why_);
    }

    // The restart policy's loop: backoff, then a fresh child's load.
    // `after_load` finishes it (the KV cache); a throw from it counts as a
    // crash too.
    void restart(const std::function<bool()>& stop, const std::function<void()>& after_load) {
        const RestartPolicy& p = opts_.restart;
        for (;;) {
            std::chrono::milliseconds delay;
            size_t n;
            {
                std::lock_guard lock(mu);
                // Alive (it answered with the crash code): it goes too.
                if (child_) {
                    lose(std::chrono::milliseconds(0));
                    crashes_.push_back(Clock::now());
                }
                const auto now = Clock::now();
                while (!crashes_.empty() && now - crashes_.front() > p.window) crashes_.pop_front();
                if (crashes_.empty()) crashes_.push_back(now);
                n = crashes_.size();
                if (n > p.max_restarts)
                    throw Error(Code::EngineCrashed,
                                fmt::format("the engine crashed {} times within {} s and is not restarted again (the last: {})",
                                            n, p.window.count(), down_why_));
                delay = std::min(p.backoff_max, p.backoff_first * (1u << std::min<size_t>(n - 1, 16)));
            }
            log_event(lvl::warn, "engine_restart", {{"attempt", n}, {"delay_ms", delay.count()}});
            for (const auto until = Clock::now() + delay; Clock::now() < until;) {
                if (stop()) throw Error(Code::ShuttingDown, "the server is shutting down");
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
            const auto t0 = Clock::now();
            try {
                {
                    std::lock_guard lock(mu);
                    load(stop, {});
                }
                after_load();
                log_event(lvl::info, "engine_restarted",
                          {{"pid", pid()},
                           {"load_ms", std::chrono::duration<double, std::milli>(Clock::now() - t0).count()}});
                return;
            } catch (const Error& e) {
                if (stop()) throw Error(Code::ShuttingDown, "the server is shutting down");
                {
                    std::lock_guard lock(mu);
                    if (child_) lose(std::chrono::milliseconds(0));
                    down_why_ = e.what();
                    // Once: call() counted a death while the KV cache was made.
                    if (crashes_.size() == n) crashes_.push_back(Clock::now());
                }
                log_event(lvl::err, "engine_restart_failed", {{"code", code_name(e.code())}, {"message", e.what()}});
            }
        }
    }

    // The last answer when the engine is busy for a second (a long step) or
    // down (the scheduler restarts it).
    bool check_residency(std::string* why) {
        std::unique_lock lock(mu, std::chrono::seconds(1));
        if (lock.owns_lock() && child_) {
            try {
                // Only asked while no step runs: a child that takes longer is hung.
                const auto until = Clock::now() + kResidencyAnswer;
                wire::Reply r = call(wire::encode_request(wire::Msg::Residency), wire::Msg::Residency,
                                     [&] { return Clock::now() > until; },
                                     "did not answer a residency check within 10 s");
                std::lock_guard f(facts_mu_);
                resident_ = r.resident;
                resident_why_ = r.message;
            } catch (const Error&) {
            }
        }
        std::lock_guard f(facts_mu_);
        if (why) *why = resident_why_;
        return resident_;
    }

private:
    // The child's end of the socket closed: it is reaped (killed after a
    // grace) and the death counted; `when` says what the host was doing.
    [[noreturn]] void died(const char* when) {
        const pid_t pid = child_->pid;
        const std::string how = lose(std::chrono::milliseconds(2000));
        crashes_.push_back(Clock::now());
        down_why_ = fmt::format("the engine process (pid {}) {}{}; the engine is being restarted", pid, how, when);
        log_event(lvl::err, "engine_crashed", {{"code", code_name(Code::EngineCrashed)}, {"pid", pid},
                                                {"reason", how}, {"message", down_why_}});
        throw Error(Code::EngineCrashed, down_why_);
    }
    // Ends the child (killed at once when there is no grace) and reaps it;
    // returns how it ended.
    std::string lose(std::chrono::milliseconds grace) {
        if (grace.count() == 0) kill(child_->pid, SIGKILL);
        const std::string how = child_->reap(grace);
        child_.reset();
        pid_ = 0;
        return how;
    }
    // Shutdown: the child sees EOF, releases the model and exits.
    void close_child() {
        close(child_->fd);
        child_->fd = -1;
        child_->reap(std::chrono::milliseconds(5000));
        child_.reset();
        pid_ = 0;
    }

    EngineProcessOptions opts_;
    Spawner spawner_;
    std::optional<Child> child_;
    std::atomic<int64_t> pid_{0};
    std::string down_why_;
    std::deque<Clock::time_point> crashes_;
    mutable std::mutex facts_mu_;  // facts_ and the residency answer: read from other threads
    EngineFacts facts_;
    bool resident_ = true;
    std::string resident_why_;
};

class RemoteEngine final : public SeqEngine {
public:
    RemoteEngine(std::shared_ptr<Link> link, const KvBudget& b) : link_(std::move(link)), budget_(b) {
        init();
        first_ = limits_;
    }
    ~RemoteEngine() override = default;

    const SeqLimits& limits() const override { return limits_; }
    uint32_t free_blocks() const override { return free_; }

    SeqId create() override { return adopt(call(wire::encode_request(wire::Msg::Create), wire::Msg::Create)); }
    SeqId fork(SeqId src, uint32_t n) override {
        return adopt(call(wire::encode_request(wire::Msg::Fork, src, n), wire::Msg::Fork));
    }
    void truncate(SeqId seq, uint32_t n) override {
        logits_.erase(seq);
        free_ = call(wire::encode_request(wire::Msg::Truncate, seq, n), wire::Msg::Truncate).free_blocks;
    }
    void release(SeqId seq) override {
        logits_.erase(seq);
        try {
            free_ = call(wire::encode_request(wire::Msg::Release, seq), wire::Msg::Release).free_blocks;
        } catch (const Error&) {
            // A dead engine holds nothing; the next step reports it.
        }
    }
    void set_adapter(SeqId seq, uint32_t adapter) override {
        free_ = call(wire::encode_request(wire::Msg::SetAdapter, seq, adapter), wire::Msg::SetAdapter).free_blocks;
    }
    // The host tier: the parked copies live in the engine process (and die
    // with it: the scheduler forgets the prefix cache after a crash).
    bool can_park() const override { return can_park_; }
    Parked park(SeqId seq, uint32_t n, uint64_t max_bytes) override {
        const wire::Reply r = call(wire::encode_park(seq, n, max_bytes), wire::Msg::Park);
        free_ = r.free_blocks;
        return {r.parked, r.parked_bytes};
    }
    SeqId unpark(uint64_t parked, std::span<const int32_t> tokens) override {
        const wire::Reply r = call(wire::encode_unpark(parked, tokens), wire::Msg::Unpark);
        free_ = r.free_blocks;
        return r.seq;
    }
    void drop_parked(uint64_t parked) override {
        try {
            free_ = call(wire::encode_drop_parked(parked), wire::Msg::DropParked).free_blocks;
        } catch (const Error&) {
            // A dead engine holds nothing.
        }
    }
    void set_sampling(SeqId seq, const eh_sampling_params& p) override {
        free_ = call(wire::encode_set_sampling(seq, p), wire::Msg::SetSampling).free_blocks;
    }
    bool step(std::span<StepItem> items) override {
        std::lock_guard lock(link_->mu);
        wire::Reply r = link_->call(wire::encode_step(items), wire::Msg::Step, overdue_);
        free_ = r.free_blocks;
        if (r.kv_full) return false;
        if (r.tokens.size() != items.size())
            link_->broken(fmt::format("{} results for a step of {} entries", r.tokens.size(), items.size()));
        for (size_t i = 0; i < items.size(); ++i) {
            StepItem& it = items[i];
            const int32_t t = r.tokens[i];
            if (it.sample && (t < 0 || uint32_t(t) >= vocab_))
                link_->broken(fmt::format("sampled token {} outside the vocabulary of {}", t, vocab_));
            it.token = it.sample ? t : -1;
            if (it.verify) {
                if (r.accepted[i] >= it.tokens.size())
                    link_->broken(fmt::format("{} of {} drafts accepted", r.accepted[i], it.tokens.size() - 1));
                it.n_accepted = r.accepted[i];
            }
            if (!it.logits) continue;
            if (!r.logits[i].empty() && r.logits[i].size() != vocab_)
                link_->broken(fmt::format("{} logits for a vocabulary of {}", r.logits[i].size(), vocab_));
            logits_[it.seq] = std::move(r.logits[i]);
        }
        return true;
    }
    std::span<const float> logits(SeqId seq) override {
        auto it = logits_.find(seq);
        return it == logits_.end() ? std::span<const float>() : std::span<const float>(it->second);
    }
    bool has_logits() const override { return has_logits_; }
    void set_overdue(std::function<bool()> fn) override { overdue_ = std::move(fn); }
    void restart(const std::function<bool()>& stop) override {
        logits_.clear();
        link_->restart(stop, [this] {
            init();
            if (limits_.max_seqs != first_.max_seqs || limits_.max_step_tokens != first_.max_step_tokens ||
                limits_.max_step_entries != first_.max_step_entries || limits_.max_seq_tokens != first_.max_seq_tokens ||
                limits_.block_tokens != first_.block_tokens || limits_.total_blocks != first_.total_blocks ||
                limits_.can_fork != first_.can_fork || limits_.batched != first_.batched)
                throw Error(Code::EngineCrashed, fmt::format("the restarted engine granted a different KV cache ({} blocks "
                                                             "of {} tokens; {} of {} before)", limits_.total_blocks,
                                                             limits_.block_tokens, first_.total_blocks, first_.block_tokens));
        });
    }
    int64_t process_id() const override { return link_->pid(); }
    void check_alive() override {
        // A residency check from /health holds the link: it sees a death too.
        std::unique_lock lock(link_->mu, std::try_to_lock);
        if (lock.owns_lock()) link_->check_alive();
    }

private:
    // Any call can hang in a broken plugin, not only a step.
    wire::Reply call(const std::vector<uint8_t>& frame, wire::Msg expect) {
        std::lock_guard lock(link_->mu);
        return link_->call(frame, expect, overdue_);
    }
    SeqId adopt(const wire::Reply& r) {
        free_ = r.free_blocks;
        if (r.seq == 0) {
            std::lock_guard lock(link_->mu);
            link_->broken("sequence id 0");
        }
        return r.seq;
    }
    void init() {
        wire::Reply r = call(wire::encode_kv_init(budget_), wire::Msg::KvInit);
        const SeqLimits& l = r.limits;
        if (!l.block_tokens || !l.total_blocks || !l.max_seqs || !l.max_step_tokens || !l.max_step_entries ||
            !l.max_seq_tokens)
            throw Error(Code::Internal, "the engine process granted a zero KV-cache limit");
        limits_ = l;
        has_logits_ = r.has_logits;
        can_park_ = r.can_park;
        free_ = r.free_blocks;
        link_->set_device_bytes(r.device_bytes);
        vocab_ = link_->facts().info.vocab_size;
    }

    std::shared_ptr<Link> link_;
    KvBudget budget_;
    SeqLimits limits_, first_;
    uint32_t free_ = 0;
    uint32_t vocab_ = 0;
    bool has_logits_ = false;
    bool can_park_ = false;
    std::unordered_map<SeqId, std::vector<float>> logits_;
    std::function<bool()> overdue_;
};

class ProcessSource final : public EngineSource {
public:
    explicit ProcessSource(std::shared_ptr<Link> link) : link_(std::move(link)) {}
    EngineFacts facts() const override { return link_->facts(); }
    std::unique_ptr<SeqEngine> make_engine(const KvBudget& budget) override {
        if (budget.max_seq_tokens == 0) throw Error(Code::InvalidRequest, "the context length is 0");
        return std::make_unique<RemoteEngine>(link_, budget);
    }
    bool check_residency(std::string* why) override { return link_->check_residency(why); }

private:
    std::shared_ptr<Link> link_;
};

}  // namespace

std::shared_ptr<EngineSource> start_engine_process(EngineProcessOptions options) {
    auto cancel = options.cancel;
    auto progress = options.progress;
    auto link = std::make_shared<Link>(std::move(options));
    {
        std::lock_guard lock(link->mu);
        link->load(cancel, progress);
    }
    return std::make_shared<ProcessSource>(std::move(link));
}

}  // namespace eh::service
