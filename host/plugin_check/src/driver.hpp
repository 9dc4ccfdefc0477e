// A plugin driven through the raw C ABI, for the conformance checks: one
// loaded model with its KV cache, sequences the driver releases, and steps
// whose statuses come back as the plugin returned them (a check needs to
// see EH_KV_FULL or EH_NO_CAPACITY, not an exception).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>
#include <engine_host/plugin_abi.hpp>

#include "eh/loader/engine.hpp"
#include "eh/model/model_file.hpp"

namespace eh::plugin_check {

// A check's verdict when something is not as the ABI says.
struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& what);

eh_step_entry entry(eh_seq* seq, const int32_t* tokens, uint32_t n, uint32_t flags);

class Driver {
public:
    // Loads the model and calls kv_init with `kv`; throws Failure naming the
    // call that failed.
    // options_json: the load's plugin-specific options (eh_load_params), "" for none.
    // devices: the load's device set (ABI 1.6), empty for device 0 alone.
    Driver(std::shared_ptr<const eh_plugin_api> api, std::shared_ptr<model::ModelFile> file, const eh_kv_params& kv,
           const std::string& options_json = {}, const std::vector<int32_t>& devices = {});
    ~Driver();
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;

    const eh_plugin_api& api() const { return *api_; }
    eh_model* model() const { return model_->raw(); }
    const eh_kv_info& granted() const { return granted_; }
    uint32_t vocab() const { return vocab_; }
    eh_kv_info kv_info() const;         // kv_get_info now
    std::string error() const;          // model_last_error

    eh_seq* create();                   // Failure unless EH_OK
    eh_status try_create(eh_seq** out); // the plugin's status; *out tracked when OK
    eh_seq* fork(eh_seq* src, uint32_t n_tokens);
    // (1.7) seq_unpark's status; *out tracked when OK, like try_create's.
    eh_status try_unpark(const eh_parked* parked, std::span<const int32_t> tokens, eh_seq** out);
    void release(eh_seq* seq);
    void release_all();
    void set_sampling(eh_seq* seq, const eh_sampling_params& p);
    uint32_t length(eh_seq* seq) const { return api_->seq_length(seq); }

    eh_status step(std::vector<eh_step_entry>& entries);
    // One step that must succeed; the sampled tokens in entry order.
    std::vector<int32_t> step_ok(std::vector<eh_step_entry>& entries, const char* what);

    // Prefills `prompt` in chunks of `chunk` tokens (0 = one step), samples,
    // and decodes until `n` tokens were sampled; returns them.
    std::vector<int32_t> generate(eh_seq* seq, std::span<const int32_t> prompt, uint32_t n,
                                  const eh_sampling_params& sp, uint32_t chunk = 0);
    // The same for several sequences in the same steps (one prefill step
    // for all, then decode steps holding every sequence).
    std::vector<std::vector<int32_t>> generate_together(const std::vector<eh_seq*>& seqs,
                                                        const std::vector<std::vector<int32_t>>& prompts,
                                                        uint32_t n, const eh_sampling_params& sp);

private:
    std::shared_ptr<const eh_plugin_api> api_;
    std::shared_ptr<EngineModel> model_;
    eh_kv_info granted_{};
    uint32_t vocab_ = 0;
    std::set<eh_seq*> live_;
};

}  // namespace eh::plugin_check
