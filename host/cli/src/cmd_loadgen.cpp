// `engine-host loadgen`: aggregate throughput and latency of a running
// server under 1, 4, 16, 64 concurrent clients (eh/tools/loadgen.hpp), with
// short fixed requests or the chat-like workload (eh/tools/chat_workload.hpp).
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <tuple>

#include "cli.hpp"
#include "eh/tools/loadgen.hpp"
#include "options.hpp"

namespace eh::cli {
namespace {

// "MIN:MAX" (or one number: both), each within [1, cap].
std::optional<std::pair<uint32_t, uint32_t>> parse_range(const std::string& s, uint32_t cap) {
    const size_t colon = s.find(':');
    const std::string a = s.substr(0, colon), b = colon == std::string::npos ? a : s.substr(colon + 1);
    auto number = [&](const std::string& t) -> std::optional<uint32_t> {
        if (t.empty() || t.size() > 10 || t.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
        const unsigned long long v = std::stoull(t);
        if (v > cap) return std::nullopt;
        return uint32_t(v);
    };
    const auto lo = number(a), hi = number(b);
    if (!lo || !hi || *lo > *hi) return std::nullopt;
    return std::make_pair(*lo, *hi);
}

void add_loadgen_options(po::options_description& desc) {
    desc.add_options()
        ("help,h", "show this help")
        ("url", po::value<std::string>()->default_value("http://127.0.0.1:8080"), "the server's base URL")
        ("levels", po::value<std::string>()->default_value("1,4,16,64"), "concurrent clients per level, comma-separated (1-1024 each)")
        ("max-tokens,n", po::value<uint32_t>()->default_value(128), "output tokens per request (1-65536)")
        ("requests-per-client", po::value<uint32_t>()->default_value(2), "requests each client sends per level (1-1000)")
        ("model", po::value<std::string>()->default_value(""),
         "the request's model field; a comma-separated list: client c sends the (c mod n)-th (e.g. LoRA adapters: "
         "base,base:a,base:b)")
        ("honor-eos", "let requests end at an end-of-generation token (default: ignore_eos, so each generates -n tokens)")
        ("stream", "stream the answers and also report time to first token and time per output token (TTFT, TPOT)")
        ("extra", po::value<std::string>()->default_value("{}"), "a JSON object merged into every request body, e.g. '{\"response_format\":{\"type\":\"json_object\"}}' (the tool's own fields win)")
        ("workload", po::value<std::string>()->default_value("fixed"),
         "fixed: ~25-token prompts of -n tokens each (as ../shared/peers/loadgen.py); chat: the chat-like load below, "
         "always streamed")
        ("prompt-words", po::value<std::string>()->default_value("200:3000"),
         "chat: each request's own words, MIN:MAX drawn log-uniformly (1-200000; a word is about a token)")
        ("preamble-words", po::value<uint32_t>()->default_value(1000),
         "chat: words of the preamble shared requests begin with (0-200000)")
        ("shared-prefix", po::value<double>()->default_value(0.5),
         "chat: the fraction of requests that begin with the shared preamble (0-1)")
        ("answer-tokens", po::value<std::string>()->default_value("100:200"),
         "chat: each request's max_tokens, MIN:MAX drawn uniformly (1-65536)")
        ("seed", po::value<uint64_t>()->default_value(1),
         "chat: the same seed sends the same requests (use another against a server that already saw them: its "
         "prefix cache holds them)")
        ("timeout-sec", po::value<uint32_t>()->default_value(600), "per request")
        ("json", "print one JSON object instead of a table");
}

// --levels into o.levels; false (the error printed) for a usage error.
bool read_levels(const po::variables_map& vm, tools::LoadOptions& o) {
    o.levels.clear();
    std::stringstream ss(vm["levels"].as<std::string>());
    for (std::string part; std::getline(ss, part, ',');) {
        uint32_t v = 0;
        try {
            size_t used = 0;
            const unsigned long x = std::stoul(part, &used);
            if (used != part.size() || x < 1 || x > 1024) throw std::out_of_range("level");
            v = uint32_t(x);
        } catch (const std::exception&) {
            print_error("--levels takes comma-separated client counts from 1 to 1024, got '" + part + "'");
            return false;
        }
        o.levels.push_back(v);
    }
    if (o.levels.empty()) {
        print_error("--levels is empty");
        return false;
    }
    return true;
}

// --workload chat's flags into o.workload; false (the error printed) for a
// usage error.
bool read_chat_workload(const po::variables_map& vm, tools::LoadOptions& o) {
    tools::ChatWorkload& w = o.workload;
    const auto words = parse_range(vm["prompt-words"].as<std::string>(), tools::kChatMaxWords);
    const auto answers = parse_range(vm["answer-tokens"].as<std::string>(), tools::kChatMaxAnswerTokens);
    if (words) std::tie(w.prompt_words_min, w.prompt_words_max) = *words;
    else w.prompt_words_min = 0;  // check() names the flag
    if (answers) std::tie(w.answer_tokens_min, w.answer_tokens_max) = *answers;
    else w.answer_tokens_min = 0;
    w.preamble_words = vm["preamble-words"].as<uint32_t>();
    w.shared_prefix = vm["shared-prefix"].as<double>();
    w.seed = vm["seed"].as<uint64_t>();
    if (const std::string why = tools::check(w); !why.empty()) {
        print_error(why);
        return false;
    }
    return true;
}

// Everything but the levels and the chat workload; false (the error
// printed) for a usage error.
bool read_load_options(const po::variables_map& vm, tools::LoadOptions& o) {
    o.url = vm["url"].as<std::string>();
    if (!read_levels(vm, o)) return false;
    o.max_tokens = vm["max-tokens"].as<uint32_t>();
    o.requests_per_client = vm["requests-per-client"].as<uint32_t>();
    if (o.max_tokens < 1 || o.max_tokens > 65536 || o.requests_per_client < 1 || o.requests_per_client > 1000) {
        print_error("--max-tokens must be 1-65536 and --requests-per-client 1-1000");
        return false;
    }
    o.model = vm["model"].as<std::string>();
    if (!o.model.empty() && (o.model.front() == ',' || o.model.back() == ',' || o.model.find(",,") != std::string::npos)) {
        print_error("--model: an empty name in the list '" + o.model + "'");
        return false;
    }
    o.ignore_eos = vm.count("honor-eos") == 0;
    o.timeout_s = vm["timeout-sec"].as<uint32_t>();
    o.stream = vm.count("stream") != 0;
    const std::string workload = vm["workload"].as<std::string>();
    if (workload != "fixed" && workload != "chat") {
        print_error("--workload must be fixed or chat, got '" + workload + "'");
        return false;
    }
    o.chat = workload == "chat";
    for (const char* flag : {"prompt-words", "preamble-words", "shared-prefix", "answer-tokens", "seed"})
        if (!o.chat && !vm[flag].defaulted()) {
            print_error(std::string("--") + flag + " applies to --workload chat");
            return false;
        }
    if (o.chat && !vm["max-tokens"].defaulted()) {
        print_error("--workload chat draws each request's max_tokens from --answer-tokens; -n does not apply");
        return false;
    }
    if (o.chat && !read_chat_workload(vm, o)) return false;
    try {
        o.extra = nlohmann::json::parse(vm["extra"].as<std::string>());
    } catch (const std::exception&) {
        o.extra = nullptr;
    }
    if (!o.extra.is_object()) {
        print_error("--extra takes a JSON object, got '" + vm["extra"].as<std::string>() + "'");
        return false;
    }
    return true;
}

}  // namespace

int cmd_loadgen(const std::vector<std::string>& args) {
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, add_loadgen_options, "Usage: engine-host loadgen [--url http://127.0.0.1:8080] [--levels 1,4,16,64] [-n 128] [--json]\n"
                       "       engine-host loadgen --workload chat [--prompt-words 200:3000] [--preamble-words 1000] "
                       "[--shared-prefix 0.5] [--answer-tokens 100:200] [--seed 1] [--levels 64] [--json]",
                       vm, code))
        return code;
    tools::LoadOptions o;
    if (!read_load_options(vm, o)) return kUsage;
    if (!vm.count("json")) o.log = [](const std::string& s) { std::fprintf(stderr, "loadgen: %s\n", s.c_str()); };
    auto r = tools::run_load(o);
    if (vm.count("json")) std::cout << tools::to_json(r, o).dump(2) << "\n";
    else std::cout << tools::to_table(r);
    for (const auto& l : r)
        if (l.failed) return kFailure;
    return kOk;
}

}  // namespace eh::cli
