// Speculative decoding's serve flags: --spec-ngram or --draft-model FILE,
// and the draft length, prompt-lookup lengths and batch limit
// (speculation.hpp has what each does).
#pragma once

#include <cstdint>
#include <string>

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include "eh/error.hpp"
#include "eh/service/speculation.hpp"

namespace eh::cli {

inline void add_spec_options(boost::program_options::options_description& desc) {
    namespace po = boost::program_options;
    desc.add_options()
        ("spec-ngram", "speculative decoding from prompt lookup: draft the tokens that followed the latest earlier "
                       "occurrence of the request's last tokens (no model; pays off when outputs repeat their input)")
        ("draft-model", po::value<std::string>(),
         "speculative decoding from a draft model: a smaller GGUF of the same vocabulary, loaded by the served model's "
         "plugin with a KV cache of its own")
        ("spec-draft-max", po::value<uint32_t>()->default_value(4),
         "most draft tokens one step verifies for a request (1-16; each request's own length adapts below it)")
        ("spec-ngram-min", po::value<uint32_t>()->default_value(1), "--spec-ngram: shortest suffix looked up (1-16)")
        ("spec-ngram-max", po::value<uint32_t>()->default_value(3), "--spec-ngram: longest suffix looked up, tried first (1-16)")
        ("spec-max-batch", po::value<uint32_t>()->default_value(8),
         "speculate only while at most this many requests decode (at least 1; above it drafts cost more than they "
         "give back)");
}

// The flags as options (no draft engine yet) and the draft model's file.
// Throws Error(InvalidRequest) naming the flag (exit 2).
inline service::SpecOptions read_spec_options(const boost::program_options::variables_map& vm, std::string& draft_path) {
    service::SpecOptions o;
    const bool ngram = vm.count("spec-ngram") > 0, draft = vm.count("draft-model") > 0;
    if (ngram && draft) throw Error(Code::InvalidRequest, "--spec-ngram and --draft-model are two draft sources: pass one");
    o.source = ngram ? service::SpecSource::Ngram : draft ? service::SpecSource::DraftModel : service::SpecSource::Off;
    o.draft_max = vm["spec-draft-max"].as<uint32_t>();
    o.ngram_min = vm["spec-ngram-min"].as<uint32_t>();
    o.ngram_max = vm["spec-ngram-max"].as<uint32_t>();
    o.max_batch = vm["spec-max-batch"].as<uint32_t>();
    if (o.source == service::SpecSource::Off) {
        for (const char* f : {"spec-draft-max", "spec-ngram-min", "spec-ngram-max", "spec-max-batch"})
            if (!vm[f].defaulted())
                throw Error(Code::InvalidRequest, fmt::format("--{} needs --spec-ngram or --draft-model", f));
    } else if (o.source == service::SpecSource::DraftModel) {
        for (const char* f : {"spec-ngram-min", "spec-ngram-max"})
            if (!vm[f].defaulted()) throw Error(Code::InvalidRequest, fmt::format("--{} is for --spec-ngram", f));
    }
    service::check_spec_options(o);
    if (draft) {
        draft_path = vm["draft-model"].as<std::string>();
        if (draft_path.empty()) throw Error(Code::InvalidRequest, "--draft-model needs a file");
        o.draft_name = draft_path;
    }
    return o;
}

}  // namespace eh::cli
