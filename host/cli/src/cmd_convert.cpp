// `engine-host convert`: Hugging Face safetensors directory to GGUF.
#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "cli.hpp"
#include "eh/tools/convert.hpp"
#include "options.hpp"

namespace eh::cli {

int cmd_convert(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("hf", po::value<std::string>()->required(), "HF model directory (config.json, tokenizer.json, *.safetensors)")
        ("out", po::value<std::string>()->required(), "output GGUF")
        ("type", po::value<std::string>()->default_value("F16"), ("weight type: " + tools::quant_target_names()).c_str())
        ("threads", po::value<unsigned>()->default_value(0), "worker threads (0 = all cores)")
        ("verbose,v", "one line per tensor");
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, desc, "Usage: engine-host convert --hf DIR --out FILE [--type T]", vm, code)) return code;
    tools::ConvertOptions o;
    o.hf_dir = vm["hf"].as<std::string>();
    o.out = vm["out"].as<std::string>();
    o.target = tools::parse_quant_target(vm["type"].as<std::string>());
    o.threads = vm["threads"].as<unsigned>();
    if (vm.count("verbose")) o.log = [](const std::string& s) { std::fprintf(stderr, "convert: %s\n", s.c_str()); };
    auto r = tools::convert_hf(o);
    std::string census;
    for (const auto& [t, n] : r.census) census += fmt::format(" {}={}", t, n);
    std::cout << fmt::format("wrote {} ({}, {} tensors, {:.1f} MiB); types:{}\n", o.out, r.architecture, r.n_tensors,
                             r.out_bytes / 1048576.0, census);
    return kOk;
}

}  // namespace eh::cli
