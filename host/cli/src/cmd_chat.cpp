// `engine-host chat`: a conversation in the terminal through the model's
// chat template, replies streamed as they are generated. /reset forgets the
// conversation, /exit (or end of input) leaves, Ctrl-C stops a reply.
// -p PROMPT answers one prompt and exits (scripts, tests).
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "chat_session.hpp"
#include "chat_template_choice.hpp"
#include "cli.hpp"
#include "device_choice.hpp"
#include "eh/loader/plugin_search.hpp"
#include "kv_cache_option.hpp"
#include "model_ref.hpp"
#include "options.hpp"

namespace eh::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void on_sigint(int) { g_interrupted = true; }

enum class Read { Line, Interrupted, End };

// One line from stdin. Ctrl-C while waiting here is reported, not fatal:
// the wait polls the flag the handler sets, so a signal that lands just
// before the wait is seen as well.
Read read_line(std::string& line) {
    line.clear();
    char c;
    while (true) {
        if (g_interrupted.exchange(false)) return Read::Interrupted;
        pollfd p{STDIN_FILENO, POLLIN, 0};
        int ready = ::poll(&p, 1, 100);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) continue;
        ssize_t n = ::read(STDIN_FILENO, &c, 1);
        if (n == 1) {
            if (c == '\n') return Read::Line;
            line.push_back(c);
            if (line.size() >= kMaxChatLineBytes) return Read::Line;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        return line.empty() ? Read::End : Read::Line;
    }
}

void write_out(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}

void add_chat_options(po::options_description& desc) {
    desc.add_options()
        ("help,h", "show this help")
        ("model,m", po::value<std::string>()->required(), kModelHelp)
        ("prompt,p", po::value<std::string>(), "answer this one prompt, print the reply and exit")
        ("system,s", po::value<std::string>(), "system message at the start of the conversation")
        ("chat-template-file", po::value<std::string>(), kChatTemplateFileHelp)
        ("ctx-size,c", po::value<uint32_t>()->default_value(0), "context length (0 = the model's)")
        ("kv-cache-type", po::value<std::string>(), kKvCacheTypeHelp)
        ("n-predict,n", po::value<uint32_t>()->default_value(512), "most tokens in one reply")
        ("temp", po::value<double>()->default_value(0.7, "0.7"), "sampling temperature, 0-2 (0 = greedy)")
        ("top-p", po::value<double>()->default_value(0.95, "0.95"), "nucleus sampling, above 0 up to 1")
        ("top-k", po::value<int32_t>()->default_value(40), "top-k sampling (0 = off)")
        ("seed", po::value<uint64_t>(), "sampling seed (default: random)")
        ("plugins", po::value<std::vector<std::string>>(), kPluginsHelp)
        ("offline", kOfflineHelp)
        ("gpu", po::value<int>()->default_value(0), kGpuHelp)
        ("device", po::value<std::string>()->default_value("auto"), kDeviceHelp)
        ("threads", po::value<uint32_t>()->default_value(0), "CPU threads for CPU engines (0 = plugin default)");
}

// The checked flags; false (the error printed) for a usage error.
bool read_chat_settings(const po::variables_map& vm, ChatSettings& s) {
    const char* bad = vm["n-predict"].as<uint32_t>() < 1 || vm["n-predict"].as<uint32_t>() > 2048
                          ? "--n-predict must be between 1 and 2048"
                      : !(vm["temp"].as<double>() >= 0 && vm["temp"].as<double>() <= 2) ? "--temp must be between 0 and 2"
                      : !(vm["top-p"].as<double>() > 0 && vm["top-p"].as<double>() <= 1) ? "--top-p must be above 0 and at most 1"
                      : vm["top-k"].as<int32_t>() < 0 ? "--top-k must not be negative"
                      : vm["gpu"].as<int>() < 0 ? "--gpu must be 0 or more"
                      : nullptr;
    if (bad) {
        print_error(bad);
        return false;
    }
    if (!chat_template_option(vm, s.chat_template)) return false;
    if (!parse_device_policy(vm["device"].as<std::string>(), s.device)) {
        print_error("--device must be auto, gpu, cpu or any");
        return false;
    }
    s.model_path = resolve_model_ref(vm["model"].as<std::string>(), vm.count("offline") > 0);
    s.plugin_dirs = loader::plugin_dirs(plugins_arg(vm));
    s.gpu = vm["gpu"].as<int>();
    s.gpu_named = !vm["gpu"].defaulted();
    s.threads = vm["threads"].as<uint32_t>();
    s.ctx_size = vm["ctx-size"].as<uint32_t>();
    s.kv_type = kv_cache_type_arg(vm);
    s.max_tokens = vm["n-predict"].as<uint32_t>();
    s.temperature = vm["temp"].as<double>();
    s.top_p = vm["top-p"].as<double>();
    s.top_k = vm["top-k"].as<int32_t>();
    if (vm.count("seed")) s.seed = vm["seed"].as<uint64_t>();
    return true;
}

// Ctrl-C stops a reply (on_sigint); the session loads with SIGINT blocked,
// so the threads made while loading (the service worker, a plugin's pool)
// inherit a mask without it and Ctrl-C always lands on this thread.
std::unique_ptr<ChatSession> open_session(const ChatSettings& s) {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigset_t intr;
    sigemptyset(&intr);
    sigaddset(&intr, SIGINT);
    pthread_sigmask(SIG_BLOCK, &intr, nullptr);
    struct Unblock {
        sigset_t& set;
        ~Unblock() { pthread_sigmask(SIG_UNBLOCK, &set, nullptr); }
    } unblock{intr};
    return std::make_unique<ChatSession>(s);
}

// The conversation: its messages (a system message first when given), each
// reply streamed to stdout.
class Conversation {
public:
    Conversation(ChatSession& chat, const po::variables_map& vm) : chat_(chat) {
        if (vm.count("system")) history_.push_back({"system", vm["system"].as<std::string>()});
        base_ = history_.size();
    }

    // One prompt's reply; `filled` when it ended at the end of the context.
    void answer(const std::string& prompt) {
        history_.push_back({"user", prompt});
        g_interrupted = false;
        std::string reply = chat_.reply(history_, write_out, g_interrupted, &filled);
        if (g_interrupted.exchange(false)) write_out(" [stopped]");
        write_out("\n");
        history_.push_back({"assistant", reply});
    }

    // Lines from stdin until /exit or its end; /reset starts over.
    void interactive() {
        const std::string full_hint = fmt::format(
            "the conversation fills the context ({} tokens); start a new one with /reset", chat_.context_tokens());
        const bool tty = isatty(STDIN_FILENO) != 0;
        if (tty)
            std::fprintf(stderr, "%s\n/reset forgets the conversation, /exit leaves, Ctrl-C stops a reply.\n",
                         chat_.describe().c_str());
        std::string line;
        while (true) {
            if (tty) write_out("> ");
            Read r = read_line(line);
            if (r == Read::End) break;
            if (r == Read::Interrupted) {
                write_out("\n(Ctrl-C stops a reply; /exit or Ctrl-D leaves)\n");
                continue;
            }
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.empty()) continue;
            if (line == "/exit" || line == "/quit") break;
            if (line == "/reset") {
                history_.resize(base_);
                write_out("(conversation reset)\n");
                continue;
            }
            try {
                answer(line);
                if (filled) write_out("(" + full_hint + ")\n");
            } catch (const Error& e) {
                history_.pop_back();  // the turn that failed is not part of the conversation
                if (e.code() == Code::ContextFull)
                    print_error(std::string(e.what()) + "; start a new one with /reset");
                else
                    print_error(std::string(e.what()) + " [" + code_name(e.code()) + "]" +
                                (e.code() == Code::InvalidRequest ? " (/reset starts over)" : ""));
            }
        }
    }

    bool filled = false;  // the last reply ended at the end of the context

private:
    ChatSession& chat_;
    std::vector<service::ChatMessage> history_;
    size_t base_ = 0;
};

}  // namespace

int cmd_chat(const std::vector<std::string>& args) {
    po::variables_map vm;
    int code = kOk;
    const char* usage = "Usage: engine-host chat --model REF [-p PROMPT] [-c CTX] [options]\n"
                        "In the conversation: /reset forgets it, /exit leaves, Ctrl-C stops a reply.";
    if (!parse_options(args, add_chat_options, usage, vm, code)) return code;
    ChatSettings s;
    if (!read_chat_settings(vm, s)) return kUsage;
    const auto chat = open_session(s);
    Conversation conversation(*chat, vm);
    if (vm.count("prompt")) {
        conversation.answer(vm["prompt"].as<std::string>());
        if (conversation.filled)
            std::fprintf(stderr, "(the reply ended at the end of the context, %u tokens)\n", chat->context_tokens());
        return kOk;
    }
    conversation.interactive();
    return kOk;
}

}  // namespace eh::cli
