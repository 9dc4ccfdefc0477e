#include "driver.hpp"

#include "eh/loader/plugin_loader.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace eh::plugin_check {

void fail(const std::string& what) { throw Failure(what); }


eh_step_entry entry(eh_seq* seq, const int32_t* tokens, uint32_t n, uint32_t flags) {
    eh_step_entry e{};
    e.struct_size = sizeof(e);
    e.flags = flags;
    e.seq = seq;
    e.tokens = tokens;
    e.n_tokens = n;
    e.token = -1;
    return e;
}

Driver::Driver(std::shared_ptr<const eh_plugin_api> api, std::shared_ptr<model::ModelFile> file,
               const eh_kv_params& kv, const std::string& options_json, const std::vector<int32_t>& devices)
    : api_(std::move(api)) {
    if (!loader::api_has_step(*api_)) fail("the plugin has no batched step (ABI 1.2's kv_init .. step)");
    try {
        EngineLoadOptions lo;
        lo.options_json = options_json;
        if (!devices.empty()) lo.device = devices[0];
        if (devices.size() > 1) lo.devices = devices;
        model_ = EngineModel::load(api_, file->path(), &file->view(), file, lo);
    } catch (const std::exception& e) {
        fail(fmt::format("model_load failed: {}", e.what()));
    }
    const eh_model_info info = model_->info();
    vocab_ = info.vocab_size;
    if (vocab_ == 0) fail("model_get_info says the vocabulary has 0 tokens");
    granted_.struct_size = sizeof(granted_);
    const eh_status st = api_->kv_init(model(), &kv, &granted_);
    if (st != EH_OK) fail(fmt::format("kv_init returned {}: {}", eh_status_name(st), error()));
}

Driver::~Driver() { release_all(); }

eh_kv_info Driver::kv_info() const {
    eh_kv_info i{};
    i.struct_size = sizeof(i);
    const eh_status st = api_->kv_get_info(model(), &i);
    if (st != EH_OK) fail(fmt::format("kv_get_info returned {}: {}", eh_status_name(st), error()));
    return i;
}

std::string Driver::error() const {
    const char* e = api_->model_last_error(model());
    return e ? e : "";
}

eh_status Driver::try_create(eh_seq** out) {
    *out = nullptr;
    const eh_status st = api_->seq_create(model(), out);
    if (st == EH_OK) {
        if (!*out) fail("seq_create returned OK but no sequence");
        live_.insert(*out);
    }
    return st;
}

eh_seq* Driver::create() {
    eh_seq* s = nullptr;
    const eh_status st = try_create(&s);
    if (st != EH_OK) fail(fmt::format("seq_create returned {}: {}", eh_status_name(st), error()));
    return s;
}

eh_seq* Driver::fork(eh_seq* src, uint32_t n_tokens) {
    eh_seq* s = nullptr;
    const eh_status st = api_->seq_fork(src, n_tokens, &s);
    if (st != EH_OK) fail(fmt::format("seq_fork returned {}: {}", eh_status_name(st), error()));
    if (!s) fail("seq_fork returned OK but no sequence");
    live_.insert(s);
    return s;
}

eh_status Driver::try_unpark(const eh_parked* parked, std::span<const int32_t> tokens, eh_seq** out) {
    *out = nullptr;
    const eh_status st = api_->seq_unpark(model(), parked, tokens.data(), uint32_t(tokens.size()), out);
    if (st == EH_OK && *out) live_.insert(*out);
    return st;
}

void Driver::release(eh_seq* seq) {
    if (live_.erase(seq)) api_->seq_release(seq);
}

void Driver::release_all() {
    for (eh_seq* s : live_) api_->seq_release(s);
    live_.clear();
}

void Driver::set_sampling(eh_seq* seq, const eh_sampling_params& p) {
    const eh_status st = api_->seq_set_sampling(seq, &p);
    if (st != EH_OK) fail(fmt::format("seq_set_sampling returned {}: {}", eh_status_name(st), error()));
}

eh_status Driver::step(std::vector<eh_step_entry>& entries) {
    return api_->step(model(), entries.data(), uint32_t(entries.size()));
}

std::vector<int32_t> Driver::step_ok(std::vector<eh_step_entry>& entries, const char* what) {
    const eh_status st = step(entries);
    if (st != EH_OK) fail(fmt::format("{}: step returned {}: {}", what, eh_status_name(st), error()));
    std::vector<int32_t> out;
    for (size_t i = 0; i < entries.size(); ++i) {
        const eh_step_entry& e = entries[i];
        if ((e.flags & EH_STEP_SAMPLE) && (e.token < 0 || uint32_t(e.token) >= vocab_))
            fail(fmt::format("{}: entry {} sampled token {}, outside the vocabulary of {}", what, i, e.token, vocab_));
        out.push_back(e.token);
    }
    return out;
}

std::vector<int32_t> Driver::generate(eh_seq* seq, std::span<const int32_t> prompt, uint32_t n,
                                      const eh_sampling_params& sp, uint32_t chunk) {
    set_sampling(seq, sp);
    // Chunks no longer than the plugin granted a step.
    const uint32_t size = std::min<uint32_t>(chunk ? chunk : uint32_t(prompt.size()), granted_.max_step_tokens);
    std::vector<int32_t> out;
    for (size_t at = 0; at < prompt.size(); at += size) {
        const uint32_t k = uint32_t(std::min<size_t>(size, prompt.size() - at));
        const bool last = at + k == prompt.size();
        std::vector<eh_step_entry> es{entry(seq, prompt.data() + at, k, last ? EH_STEP_SAMPLE : 0)};
        auto t = step_ok(es, "prefill");
        if (last) out.push_back(t[0]);
    }
    while (out.size() < n) {
        const int32_t tok = out.back();
        std::vector<eh_step_entry> es{entry(seq, &tok, 1, EH_STEP_SAMPLE)};
        out.push_back(step_ok(es, "decode")[0]);
    }
    return out;
}

std::vector<std::vector<int32_t>> Driver::generate_together(const std::vector<eh_seq*>& seqs,
                                                            const std::vector<std::vector<int32_t>>& prompts,
                                                            uint32_t n, const eh_sampling_params& sp) {
    std::vector<std::vector<int32_t>> out(seqs.size());
    std::vector<eh_step_entry> es;
    for (size_t i = 0; i < seqs.size(); ++i) {
        set_sampling(seqs[i], sp);
        es.push_back(entry(seqs[i], prompts[i].data(), uint32_t(prompts[i].size()), EH_STEP_SAMPLE));
    }
    auto first = step_ok(es, "prefill together");
    for (size_t i = 0; i < seqs.size(); ++i) out[i].push_back(first[i]);
    while (out[0].size() < n) {
        std::vector<int32_t> last(seqs.size());
        es.clear();
        for (size_t i = 0; i < seqs.size(); ++i) {
            last[i] = out[i].back();
            es.push_back(entry(seqs[i], &last[i], 1, EH_STEP_SAMPLE));
        }
        auto t = step_ok(es, "decode together");
        for (size_t i = 0; i < seqs.size(); ++i) out[i].push_back(t[i]);
    }
    return out;
}

}  // namespace eh::plugin_check
