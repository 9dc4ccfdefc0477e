// `engine-host quantize`: convert a GGUF's matrices to another type or mixture.
#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "cli.hpp"
#include "eh/tools/quantize.hpp"
#include "options.hpp"

namespace eh::cli {

int cmd_quantize(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("in", po::value<std::string>()->required(), "input GGUF (F32/F16/BF16 weights)")
        ("out", po::value<std::string>()->required(), "output GGUF")
        ("type", po::value<std::string>()->required(), ("target: " + tools::quant_target_names()).c_str())
        ("threads", po::value<unsigned>()->default_value(0), "worker threads (0 = all cores)")
        ("verbose,v", "one line per converted tensor");
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, desc, "Usage: engine-host quantize --in F --out G --type T", vm, code)) return code;
    tools::QuantizeOptions o;
    o.in = vm["in"].as<std::string>();
    o.out = vm["out"].as<std::string>();
    o.target = tools::parse_quant_target(vm["type"].as<std::string>());
    o.threads = vm["threads"].as<unsigned>();
    if (vm.count("verbose")) o.log = [](const std::string& s) { std::fprintf(stderr, "quantize: %s\n", s.c_str()); };
    auto r = tools::quantize_file(o);
    std::string census;
    for (const auto& [t, n] : r.census) census += fmt::format(" {}={}", t, n);
    std::cout << fmt::format("wrote {} as {}: {} tensors, {:.1f} MiB -> {:.1f} MiB; types:{}\n", o.out, o.target.name(),
                             r.n_tensors, r.in_bytes / 1048576.0, r.out_bytes / 1048576.0, census);
    return kOk;
}

}  // namespace eh::cli
