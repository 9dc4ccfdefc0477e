// The conformance checks eh-plugin-check runs: each drives the plugin
// through the ABI and says by name what does not hold. They check what the
// ABI promises (plugin_abi.h), not model quality: a plugin passes them with
// any weights, and agreement with another plugin (the CPU reference) is a
// check of its own, run when a reference is given.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "eh/model/model_file.hpp"

namespace eh::plugin_check {

struct CheckOptions {
    std::shared_ptr<const eh_plugin_api> plugin;
    std::shared_ptr<const eh_plugin_api> reference;  // may be null: reference_agreement is skipped
    std::shared_ptr<model::ModelFile> model;
    uint32_t n_tokens = 8;                           // tokens each generation samples
    std::vector<std::string> only;                   // names to run; empty = all
    // eh_kv_params.kv_type of the plugin's kv_init calls (ABI 1.4; 0 = its
    // default), so every check runs over that KV cache type; the
    // reference keeps its default.
    uint32_t kv_type = 0;
    // The plugin-specific load options (eh_load_params.options_json) of every
    // load of the plugin under test; the reference loads with none.
    std::string engine_options;
    // (ABI 1.6) the device set of every load of the plugin under test, rank
    // order (a GPU twice: the shard mode); empty: GPU 0 alone. The
    // reference loads on one device.
    std::vector<int32_t> devices;
};

struct CheckResult {
    enum class Status { Pass, Fail, Skip };
    std::string name;
    std::string what;     // one line: what the check holds the plugin to
    Status status = Status::Pass;
    std::string detail;   // why it failed or was skipped
};

// Every check's name and one-line description, in the order they run.
std::vector<std::pair<std::string, std::string>> check_names();

// Runs the checks. Throws eh::Error only when the model cannot be loaded or
// the KV cache not set up at all (then no check can run); a check that fails
// is a result.
std::vector<CheckResult> run_checks(const CheckOptions& options);

}  // namespace eh::plugin_check
