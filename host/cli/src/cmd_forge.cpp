// `engine-host forge`: write a GGUF with a real model's layout and random
// weights (host/tools/include/eh/tools/forge.hpp, docs/forge.md).
#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "cli.hpp"
#include "eh/tools/forge.hpp"
#include "eh/tools/profiles.hpp"
#include "options.hpp"

namespace eh::cli {

int cmd_forge(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("like", po::value<std::string>(), "profile to imitate (--list shows them)")
        ("out", po::value<std::string>(), "output GGUF file")
        ("seed", po::value<uint64_t>()->default_value(0), "weight seed")
        ("vocab", po::value<std::string>()->default_value(""),
         "vocab GGUF or tokenizer.json (default: the profile's real vocab under the testdata dir; 'none' = synthetic)")
        ("threads", po::value<unsigned>()->default_value(0), "worker threads (0 = all cores)")
        ("mmproj-out", po::value<std::string>()->default_value(""), "a vision profile's projector GGUF (--mmproj for serve)")
        ("list", "list the profiles and exit")
        ("quiet,q", "no progress lines");
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, desc, "Usage: engine-host forge --like PROFILE --out FILE [--seed N] [--vocab FILE]", vm, code))
        return code;
    if (vm.count("list")) {
        for (const auto& n : tools::profile_names()) {
            auto p = tools::find_profile(n);
            std::cout << fmt::format("{:<32} {}\n", n, p.description);
        }
        return kOk;
    }
    if (!vm.count("like") || !vm.count("out")) {
        print_error("forge: --like and --out are required (try --help)");
        return kUsage;
    }
    tools::ForgeOptions o;
    o.profile = vm["like"].as<std::string>();
    o.out = vm["out"].as<std::string>();
    o.seed = vm["seed"].as<uint64_t>();
    o.vocab = vm["vocab"].as<std::string>();
    o.threads = vm["threads"].as<unsigned>();
    o.mmproj_out = vm["mmproj-out"].as<std::string>();
    if (!vm.count("quiet")) o.log = [](const std::string& s) { std::fprintf(stderr, "forge: %s\n", s.c_str()); };
    auto r = tools::forge(o);
    std::string census;
    for (const auto& [t, n] : r.census) census += fmt::format(" {}={}", t, n);
    std::cout << fmt::format("wrote {} ({} tensors, {:.2f} GiB, vocab {} from {}) in {:.1f} s; types:{}\n", o.out,
                             r.n_tensors, r.file_bytes / double(1ull << 30), r.n_vocab, r.vocab_source, r.seconds, census);
    return kOk;
}

}  // namespace eh::cli
