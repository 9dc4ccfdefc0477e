// The two plugin-backed SeqEngines: BatchedEngine over ABI 1.2's kv_init /
// seq_* / step, and SessionEngine over a 1.0/1.1 plugin's one session.
#include "eh/service/seq_engine.hpp"
#include "eh/service/image_encoder.hpp"

#include "eh/service/engine_source.hpp"
#include "eh/service/kv_cache_type.hpp"

#include <fmt/format.h>

#include <cstddef>
#include <unordered_map>

#include "eh/loader/plugin_loader.hpp"
#include "eh/service/lora.hpp"

namespace eh::service {
namespace {

std::string model_message(const EngineModel& m, eh_status st) {
    const char* msg = m.api().model_last_error(m.raw());
    return msg && *msg ? std::string(msg) : std::string(eh_status_name(st));
}

// A plugin that lets a C++ exception escape is buggy: report INTERNAL.
template <class F>
eh_status guarded(F&& f) {
    try {
        return f();
    } catch (...) {
        return EH_INTERNAL;
    }
}

class BatchedEngine final : public SeqEngine {
public:
    BatchedEngine(std::shared_ptr<EngineModel> model, const KvBudget& b,
                  std::vector<std::shared_ptr<EngineAdapter>> adapters = {})
        : model_(std::move(model)), api_(model_->api()), adapters_(std::move(adapters)) {
        eh_kv_params p{};
        p.struct_size = sizeof(p);
        // Cached prefixes are sequences too: room for as many as run.
        p.max_seqs = b.max_seqs * 2;
        p.max_step_tokens = b.max_step_tokens;
        p.max_step_entries = std::min(b.max_seqs, b.max_step_tokens);
        p.max_seq_tokens = b.max_seq_tokens;
        p.budget_bytes = b.budget_bytes;
        p.memory_fraction = b.memory_fraction;
        p.kv_type = b.kv_type;
        eh_kv_info info{};
        info.struct_size = sizeof(info);
        check(guarded([&] { return api_.kv_init(model_->raw(), &p, &info); }), "kv_init");
        limits_.kv_type = granted_kv_type(info, b.kv_type);
        limits_.max_seqs = info.max_seqs;
        limits_.max_step_tokens = info.max_step_tokens;
        limits_.max_step_entries = info.max_step_entries;
        limits_.max_seq_tokens = info.max_seq_tokens;
        limits_.block_tokens = info.block_tokens;
        limits_.total_blocks = info.total_blocks;
        limits_.block_bytes = info.block_bytes;
        limits_.can_fork = true;
        limits_.batched = true;
        // (1.6) read only from a plugin that knows the member: before, it was padding
        if (api_.abi_minor >= 6) limits_.max_draft_tokens = info.max_draft_tokens;
        if (!info.block_tokens || !info.total_blocks || !info.max_seqs || !info.max_step_tokens ||
            !info.max_step_entries || !info.max_seq_tokens)
            throw Error(Code::Internal, "plugin's kv_init granted a zero limit");
        free_ = info.free_blocks;
    }

    ~BatchedEngine() override {
        for (auto& [id, p] : parked_) api_.parked_release(p);
        for (auto& [id, s] : seqs_) api_.seq_release(s);
    }

    // ABI 1.7: the prefix cache's host tier.
    bool can_park() const override { return park_; }
    Parked park(SeqId seq, uint32_t n, uint64_t max_bytes) override {
        eh_parked* p = nullptr;
        uint64_t bytes = 0;
        const eh_status st = guarded([&] { return api_.seq_park(get(seq), n, max_bytes, &p, &bytes); });
        if (st == EH_NO_CAPACITY) return {0, bytes};
        check(st, "seq_park");
        if (!p) throw Error(Code::Internal, "seq_park: the plugin returned OK but no parked copy");
        parked_[++next_parked_] = p;
        return {next_parked_, bytes};
    }
    SeqId unpark(uint64_t parked, std::span<const int32_t> tokens) override {
        auto it = parked_.find(parked);
        if (it == parked_.end()) throw Error(Code::Internal, fmt::format("unknown parked copy {}", parked));
        eh_seq* s = nullptr;
        const eh_status st = guarded(
            [&] { return api_.seq_unpark(model_->raw(), it->second, tokens.data(), uint32_t(tokens.size()), &s); });
        if (st == EH_KV_FULL) return 0;
        check(st, "seq_unpark");
        return adopt(s);
    }
    void drop_parked(uint64_t parked) override {
        auto it = parked_.find(parked);
        if (it == parked_.end()) return;
        try {
            api_.parked_release(it->second);
        } catch (...) {
        }
        parked_.erase(it);
    }

    const SeqLimits& limits() const override { return limits_; }
    uint32_t free_blocks() const override { return free_; }

    SeqId create() override {
        eh_seq* s = nullptr;
        check(guarded([&] { return api_.seq_create(model_->raw(), &s); }), "seq_create");
        return adopt(s);
    }

    SeqId fork(SeqId src, uint32_t n) override {
        eh_seq* s = nullptr;
        check(guarded([&] { return api_.seq_fork(get(src), n, &s); }), "seq_fork");
        return adopt(s);
    }

    void truncate(SeqId seq, uint32_t n) override {
        check(guarded([&] { return api_.seq_truncate(get(seq), n); }), "seq_truncate");
        refresh();
    }

    void release(SeqId seq) override {
        auto it = seqs_.find(seq);
        if (it == seqs_.end()) return;
        try {
            api_.seq_release(it->second);
        } catch (...) {
        }
        seqs_.erase(it);
        refresh();
    }

    void set_sampling(SeqId seq, const eh_sampling_params& p) override {
        check(guarded([&] { return api_.seq_set_sampling(get(seq), &p); }), "seq_set_sampling");
    }

    void set_adapter(SeqId seq, uint32_t adapter) override {
        if (adapter > adapters_.size())
            throw Error(Code::Internal, fmt::format("set_adapter: no adapter {} (the engine has {})", adapter,
                                                    adapters_.size()));
        eh_seq* s = get(seq);
        if (adapters_.empty()) return;  // a plugin without the 1.6 calls: every sequence is the base model's
        eh_adapter* a = adapter ? adapters_[adapter - 1]->raw() : nullptr;
        check(guarded([&] { return api_.seq_set_adapter(s, a); }), "seq_set_adapter");
    }

    bool step(std::span<StepItem> items) override {
        fill_entries(items);
        if (!started(guarded([&] { return api_.step(model_->raw(), entries_.data(), uint32_t(entries_.size())); }),
                     "step"))
            return false;
        for (size_t i = 0; i < items.size(); ++i) {
            items[i].token = entries_[i].token;
            if (items[i].verify) {
                items[i].n_accepted = entries_[i].n_accepted;
                if (items[i].n_accepted >= items[i].tokens.size())
                    throw Error(Code::Internal, fmt::format("step: the plugin accepted {} of {} draft tokens",
                                                            items[i].n_accepted, items[i].tokens.size() - 1));
            }
        }
        return true;
    }

    bool can_chain() const override { return halves_; }

    bool begin_step(std::span<StepItem> items) override {
        fill_entries(items);
        return started(
            guarded([&] { return api_.step_begin(model_->raw(), entries_.data(), uint32_t(entries_.size())); }),
            "step_begin");
    }

    void end_step(std::span<StepItem> items) override {
        picked_.assign(items.size(), -1);
        check(guarded([&] { return api_.step_end(model_->raw(), picked_.data(), uint32_t(picked_.size())); }), "step_end");
        for (size_t i = 0; i < items.size(); ++i) items[i].token = picked_[i];
        refresh();
    }

    std::span<const float> logits(SeqId seq) override {
        if (!api_.seq_logits) return {};
        const float* p = nullptr;
        uint32_t n = 0;
        if (guarded([&] { return api_.seq_logits(get(seq), &p, &n); }) != EH_OK || !p) return {};
        return {p, n};
    }
    bool has_logits() const override { return api_.seq_logits != nullptr; }

    std::span<const float> hidden(SeqId seq) override {
        if (!hidden_) return {};
        const float* p = nullptr;
        uint32_t n = 0;
        if (guarded([&] { return api_.seq_hidden(get(seq), &p, &n); }) != EH_OK || !p) return {};
        return {p, n};
    }
    bool has_hidden() const override { return hidden_; }

private:
    // The plugin's entries for `items` (they point into items and biases_).
    void fill_entries(std::span<StepItem> items) {
        entries_.assign(items.size(), eh_step_entry{});
        biases_.resize(items.size());
        for (size_t i = 0; i < items.size(); ++i) {
            const StepItem& it = items[i];
            eh_step_entry& e = entries_[i];
            e.struct_size = sizeof(e);
            e.flags = (it.sample ? EH_STEP_SAMPLE : 0u) | (it.logits ? EH_STEP_LOGITS : 0u) |
                      (it.chained ? EH_STEP_CHAINED : 0u) | (it.hidden ? EH_STEP_HIDDEN : 0u) |
                      (it.verify ? EH_STEP_VERIFY : 0u);
            e.seq = get(it.seq);
            e.tokens = it.chained ? nullptr : it.tokens.data();
            e.n_tokens = it.chained ? 1u : uint32_t(it.tokens.size());
            if (it.allowed) e.allowed = it.allowed->data();
            auto& [ids, vals] = biases_[i];
            ids.clear();
            vals.clear();
            if (it.bias)
                for (auto [t, v] : *it.bias) {
                    ids.push_back(t);
                    vals.push_back(v);
                }
            e.n_bias = uint32_t(ids.size());
            e.bias_tokens = ids.empty() ? nullptr : ids.data();
            e.bias_values = vals.empty() ? nullptr : vals.data();
            e.token = -1;
            // An image's rows, for this step only (the plugin drops them after it).
            if (!it.spans.empty()) {
                if (!plugin_takes_images(api_))
                    throw Error(Code::Internal, "the engine plugin takes no image rows (ABI 1.6 seq_embd_spans)");
                check(guarded([&] { return api_.seq_embd_spans(e.seq, it.spans.data(), uint32_t(it.spans.size())); }),
                      "seq_embd_spans");
            }
        }
    }

    // A step call's status: false on KV_FULL (nothing changed), throws on
    // other failures; the free-block count is read again either way it ran.
    bool started(eh_status st, const char* call) {
        if (st != EH_KV_FULL) check(st, call);
        refresh();
        return st == EH_OK;
    }
    // The type the blocks hold, from a plugin that says (ABI 1.4). One that
    // predates kv_type ignored the ask, so only its default can be had; one
    // that grants another type than asked breaks the ABI's rule.
    static uint32_t granted_kv_type(const eh_kv_info& info, uint32_t asked) {
        if (info.struct_size < offsetof(eh_kv_info, kv_type) + sizeof(info.kv_type)) {
            if (asked != 0)
                throw Error(Code::ModelLoadFailed,
                            fmt::format("kv_init: the plugin predates ABI 1.4's KV cache types (it does not report "
                                        "eh_kv_info.kv_type), so it keeps its default cache; {} cannot be asked of it",
                                        kv_cache_type_name(asked)));
            return kKvTypeUnknown;
        }
        if (asked != 0 && info.kv_type != asked)
            throw Error(Code::ModelLoadFailed,
                        fmt::format("kv_init: the plugin granted a {} KV cache where {} was asked (a plugin must refuse "
                                    "a type it cannot store)",
                                    kv_cache_type_name(info.kv_type), kv_cache_type_name(asked)));
        return info.kv_type;
    }
    void check(eh_status st, const char* call) const {
        if (st == EH_OK) return;
        const std::string msg = model_message(*model_, st);
        // plugins often name the call themselves ("kv_init: ...")
        if (msg.rfind(std::string(call) + ": ", 0) == 0) throw Error(code_from_status(st), msg);
        throw Error(code_from_status(st), fmt::format("{}: {}", call, msg));
    }
    SeqId adopt(eh_seq* s) {
        if (!s) throw Error(Code::Internal, "plugin returned OK but no sequence");
        seqs_[++next_] = s;
        refresh();
        return next_;
    }
    eh_seq* get(SeqId id) const {
        auto it = seqs_.find(id);
        if (it == seqs_.end()) throw Error(Code::Internal, fmt::format("unknown sequence {}", id));
        return it->second;
    }
    void refresh() {
        eh_kv_info info{};
        info.struct_size = sizeof(info);
        if (guarded([&] { return api_.kv_get_info(model_->raw(), &info); }) == EH_OK) free_ = info.free_blocks;
    }

    std::shared_ptr<EngineModel> model_;
    const eh_plugin_api& api_;
    // Released after the sequences (the destructor's body) and before the model.
    std::vector<std::shared_ptr<EngineAdapter>> adapters_;
    SeqLimits limits_;
    uint32_t free_ = 0;
    std::unordered_map<SeqId, eh_seq*> seqs_;
    SeqId next_ = 0;
    std::unordered_map<uint64_t, eh_parked*> parked_;  // (1.7) released before the sequences
    uint64_t next_parked_ = 0;
    const bool park_ = loader::api_has_park(api_);
    std::vector<eh_step_entry> entries_;
    std::vector<std::pair<std::vector<int32_t>, std::vector<float>>> biases_;
    std::vector<int32_t> picked_;
    const bool halves_ = loader::api_has_step_halves(api_);
    const bool hidden_ = loader::api_has_hidden(api_);
};

// One session holds the one sequence. Its "block" is the whole context.
class SessionEngine final : public SeqEngine {
public:
    SessionEngine(std::shared_ptr<EngineModel> model, const KvBudget& b) : model_(std::move(model)) {
        if (b.kv_type != 0)
            throw Error(Code::ModelLoadFailed,
                        fmt::format("the plugin runs sessions only (no batched calls, so no kv_init): its KV cache "
                                    "keeps the plugin's own type; {} cannot be asked of it",
                                    kv_cache_type_name(b.kv_type)));
        session_ = model_->create_session(b.max_seq_tokens, [this] { return interrupt_ && interrupt_(); });
        limits_.max_seqs = 1;
        limits_.max_step_tokens = b.max_seq_tokens;
        limits_.max_step_entries = 1;
        limits_.max_seq_tokens = b.max_seq_tokens;
        limits_.block_tokens = b.max_seq_tokens;
        limits_.total_blocks = 1;
        limits_.can_fork = false;
        limits_.batched = false;
    }

    const SeqLimits& limits() const override { return limits_; }
    uint32_t free_blocks() const override { return live_ ? 0 : 1; }

    SeqId create() override {
        if (live_) throw Error(Code::Internal, "the session engine holds one sequence at a time");
        session_->reset();
        live_ = ++next_;
        has_logits_ = false;
        return live_;
    }
    SeqId fork(SeqId, uint32_t) override { throw Error(Code::Internal, "this plugin cannot fork sequences"); }
    void truncate(SeqId seq, uint32_t n) override {
        expect(seq);
        if (n != 0) throw Error(Code::Internal, "this plugin can only truncate a sequence to 0 tokens");
        session_->reset();
        has_logits_ = false;
    }
    void release(SeqId seq) override {
        if (seq == live_) live_ = 0;
    }
    void set_sampling(SeqId seq, const eh_sampling_params& p) override {
        expect(seq);
        // A 1.0/1.1 plugin reads the struct up to its own size; the host
        // refuses requests that need the fields it would not see.
        session_->set_sampling(p);
    }
    bool step(std::span<StepItem> items) override {
        if (items.size() != 1) throw Error(Code::Internal, "the session engine steps one sequence at a time");
        StepItem& it = items[0];
        expect(it.seq);
        if (it.allowed || (it.bias && !it.bias->empty()))
            throw Error(Code::Internal, "this plugin takes no token masks or logit biases");
        // One token after a sampled step is a decode: the plugins' fast
        // path (CUDA plugins run it one step ahead).
        if (it.tokens.size() == 1 && it.sample && session_->n_past() > 0) {
            it.token = session_->decode(it.tokens[0]);
        } else {
            session_->prefill(it.tokens);
            it.token = it.sample ? session_->sample() : -1;
        }
        has_logits_ = it.logits;
        return true;
    }
    std::span<const float> logits(SeqId seq) override {
        if (seq != live_ || !has_logits_ || !session_->has_logits()) return {};
        return session_->logits();
    }
    bool has_logits() const override { return model_->api().session_logits != nullptr; }
    void set_interrupt(std::function<bool()> fn) override { interrupt_ = std::move(fn); }

private:
    void expect(SeqId seq) const {
        if (seq == 0 || seq != live_) throw Error(Code::Internal, fmt::format("unknown sequence {}", seq));
    }
    std::shared_ptr<EngineModel> model_;
    std::unique_ptr<EngineSession> session_;
    SeqLimits limits_;
    SeqId live_ = 0, next_ = 0;
    bool has_logits_ = false;
    std::function<bool()> interrupt_;
};

class LocalEngine final : public EngineSource {
public:
    LocalEngine(std::shared_ptr<EngineModel> model, std::vector<std::shared_ptr<EngineAdapter>> adapters)
        : model_(std::move(model)), adapters_(std::move(adapters)) {}
    EngineFacts facts() const override {
        EngineFacts f;
        f.info = model_->info();
        if (const eh_plugin_info* pi = model_->api().info()) {
            f.plugin_name = pi->name ? pi->name : "";
            f.plugin_version = pi->version ? pi->version : "";
        }
        // Logprobs come from the path make_seq_engine picks: the batched
        // step's seq_logits, or the session's logits without that group.
        const eh_plugin_api& api = model_->api();
        f.logits = loader::api_has_step(api) ? api.seq_logits != nullptr : api.session_logits != nullptr;
        f.hidden = loader::api_has_hidden(api);
        return f;
    }
    std::unique_ptr<SeqEngine> make_engine(const KvBudget& budget) override {
        return make_seq_engine(model_, budget, adapters_);
    }
    bool check_residency(std::string* why) override { return model_->check_residency(why); }

private:
    std::shared_ptr<EngineModel> model_;
    std::vector<std::shared_ptr<EngineAdapter>> adapters_;
};

}  // namespace

std::unique_ptr<SeqEngine> make_seq_engine(std::shared_ptr<EngineModel> model, const KvBudget& budget,
                                           std::vector<std::shared_ptr<EngineAdapter>> adapters) {
    if (budget.max_seq_tokens == 0) throw Error(Code::InvalidRequest, "the context length is 0");
    if (loader::api_has_step(model->api()))
        return std::make_unique<BatchedEngine>(std::move(model), budget, std::move(adapters));
    if (!adapters.empty())
        throw Error(Code::ModelLoadFailed, "LoRA adapters need a plugin with the batched step (ABI 1.2 and 1.6)");
    return std::make_unique<SessionEngine>(std::move(model), budget);
}

std::shared_ptr<EngineSource> local_engine(std::shared_ptr<EngineModel> model,
                                           std::vector<std::shared_ptr<EngineAdapter>> adapters) {
    return std::make_shared<LocalEngine>(std::move(model), std::move(adapters));
}

}  // namespace eh::service
