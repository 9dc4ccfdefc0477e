// `engine-host loadgen`: aggregate throughput and latency of a running
// server under 1, 4, 16, 64 concurrent clients (eh/tools/loadgen.hpp).
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli.hpp"
#include "eh/tools/loadgen.hpp"
#include "options.hpp"

namespace eh::cli {

int cmd_loadgen(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("url", po::value<std::string>()->default_value("http://127.0.0.1:8080"), "the server's base URL")
        ("levels", po::value<std::string>()->default_value("1,4,16,64"), "concurrent clients per level, comma-separated (1-1024 each)")
        ("max-tokens,n", po::value<uint32_t>()->default_value(128), "output tokens per request (1-65536)")
        ("requests-per-client", po::value<uint32_t>()->default_value(2), "requests each client sends per level (1-1000)")
        ("model", po::value<std::string>()->default_value(""), "the request's model field")
        ("honor-eos", "let requests end at an end-of-generation token (default: ignore_eos, so each generates -n tokens)")
        ("stream", "stream the answers and also report time to first token and time per output token (TTFT, TPOT)")
        ("extra", po::value<std::string>()->default_value("{}"), "a JSON object merged into every request body, e.g. '{\"response_format\":{\"type\":\"json_object\"}}' (the tool's own fields win)")
        ("timeout-sec", po::value<uint32_t>()->default_value(600), "per request")
        ("json", "print one JSON object instead of a table");
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, desc, "Usage: engine-host loadgen [--url http://127.0.0.1:8080] [--levels 1,4,16,64] [-n 128] [--json]",
                       vm, code))
        return code;
    tools::LoadOptions o;
    o.url = vm["url"].as<std::string>();
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
            return kUsage;
        }
        o.levels.push_back(v);
    }
    if (o.levels.empty()) {
        print_error("--levels is empty");
        return kUsage;
    }
    o.max_tokens = vm["max-tokens"].as<uint32_t>();
    o.requests_per_client = vm["requests-per-client"].as<uint32_t>();
    if (o.max_tokens < 1 || o.max_tokens > 65536 || o.requests_per_client < 1 || o.requests_per_client > 1000) {
        print_error("--max-tokens must be 1-65536 and --requests-per-client 1-1000");
        return kUsage;
    }
    o.model = vm["model"].as<std::string>();
    o.ignore_eos = vm.count("honor-eos") == 0;
    o.timeout_s = vm["timeout-sec"].as<uint32_t>();
    o.stream = vm.count("stream") != 0;
    try {
        o.extra = nlohmann::json::parse(vm["extra"].as<std::string>());
    } catch (const std::exception&) {
        o.extra = nullptr;
    }
    if (!o.extra.is_object()) {
        print_error("--extra takes a JSON object, got '" + vm["extra"].as<std::string>() + "'");
        return kUsage;
    }
    if (!vm.count("json")) o.log = [](const std::string& s) { std::fprintf(stderr, "loadgen: %s\n", s.c_str()); };
    auto r = tools::run_load(o);
    if (vm.count("json")) std::cout << tools::to_json(r).dump(2) << "\n";
    else std::cout << tools::to_table(r);
    for (const auto& l : r)
        if (l.failed) return kFailure;
    return kOk;
}

}  // namespace eh::cli
