// What the scheduler drives: sequences whose KV cache lives in blocks and a
// batched step over them. Two implementations wrap a plugin (the 1.2 batched
// calls, or the 1.0/1.1 session calls one sequence at a time), a third
// drives them in an engine process (remote_engine.hpp); tests use a fake.
// Calls come from the scheduler's thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <engine_host/plugin_abi.h>

#include "eh/error.hpp"
#include "eh/loader/engine.hpp"

namespace eh::service {

class EngineAdapter;  // lora.hpp

using SeqId = uint64_t;

struct SeqLimits {
    uint32_t max_seqs = 1;          // sequences alive at once, cached prefixes included
    uint32_t max_step_tokens = 1;
    uint32_t max_step_entries = 1;
    uint32_t max_seq_tokens = 1;    // the context length
    uint32_t block_tokens = 1;
    uint32_t total_blocks = 1;
    uint64_t block_bytes = 0;
    uint32_t kv_type = UINT32_MAX;  // eh_tensor_type the blocks hold; kKvTypeUnknown (kv_cache_type.hpp) when the plugin does not say
    bool can_fork = false;          // prefix reuse and n > 1 need it
    bool batched = false;           // more than one sequence per step
    // Draft tokens one verify item may carry (ABI 1.6 EH_STEP_VERIFY); 0:
    // the engine does not verify, and speculative decoding stays off.
    uint32_t max_draft_tokens = 0;
};

struct StepItem {
    SeqId seq = 0;
    std::span<const int32_t> tokens;   // empty when chained
    // One token: the one the sequence's step in flight samples (begin_step
    // only; the engine takes it without the host reading it first).
    bool chained = false;
    bool sample = false;
    bool logits = false;            // keep the raw logits for logprobs
    bool hidden = false;            // keep the last position's final hidden state (has_hidden() engines)
    const std::vector<uint32_t>* allowed = nullptr;   // bitset, or NULL
    const std::vector<std::pair<int32_t, float>>* bias = nullptr;
    // Speculative verification (step() only, where max_draft_tokens > 0):
    // tokens are [t, d1..dk] and sample is set; the engine keeps t and the
    // drafts it accepts, n_accepted says how many, token is the one after.
    bool verify = false;
    uint32_t n_accepted = 0;        // out
    int32_t token = -1;             // out
    // Rows in place of some of `tokens`' embeddings (an image's; ABI 1.6
    // seq_embd_spans), pointing into the job's rows.
    std::vector<eh_embd_span> spans;
};

class SeqEngine {
public:
    virtual ~SeqEngine() = default;
    virtual const SeqLimits& limits() const = 0;
    virtual uint32_t free_blocks() const = 0;
    // Throw eh::Error on failure.
    virtual SeqId create() = 0;
    virtual SeqId fork(SeqId src, uint32_t n_tokens) = 0;   // can_fork only
    virtual void truncate(SeqId seq, uint32_t n_tokens) = 0;
    virtual void release(SeqId seq) = 0;                     // never throws
    virtual void set_sampling(SeqId seq, const eh_sampling_params& p) = 0;
    // The LoRA adapter (1-based, in the order the engine was given them; 0:
    // none) the sequence's later steps compute with (ABI 1.6). Only while
    // it is empty or to the one it has; a fork keeps its source's. Engines
    // made without adapters refuse any but 0.
    virtual void set_adapter(SeqId seq, uint32_t adapter) {
        (void)seq;
        if (adapter) throw Error(Code::InvalidRequest, "this engine serves no LoRA adapters");
    }
    // false: not enough free KV blocks, and nothing changed. Other failures
    // throw eh::Error; the sequences of the step are then unusable.
    virtual bool step(std::span<StepItem> items) = 0;
    // A step in two halves, so the next can start before this one's tokens
    // are read (ABI 1.3); only where can_chain(). begin_step checks and
    // starts a step (false: not enough free KV blocks, nothing changed;
    // other failures throw as step() does); end_step waits for the oldest
    // step begun and fills its items' tokens (the same items, in order). At
    // most two steps are in flight; while any is, the scheduler calls
    // nothing else but free_blocks(), and a step begun then asks no logits.
    virtual bool can_chain() const { return false; }
    virtual bool begin_step(std::span<StepItem> items) {
        (void)items;
        throw Error(Code::Internal, "this engine does not run steps in two halves");
    }
    virtual void end_step(std::span<StepItem> items) {
        (void)items;
        throw Error(Code::Internal, "this engine does not run steps in two halves");
    }
    // Logits of the sequence's last step that asked for them; empty if none.
    virtual std::span<const float> logits(SeqId seq) = 0;
    virtual bool has_logits() const = 0;
    // The final hidden state (after the output norm) of the last position of
    // the sequence's last step that asked for it (StepItem::hidden); empty
    // if none. Only engines whose plugin hands it out (ABI 1.5 seq_hidden).
    virtual std::span<const float> hidden(SeqId seq) {
        (void)seq;
        return {};
    }
    virtual bool has_hidden() const { return false; }
    // Polled inside a long step by engines that can stop one (the session
    // engine's prefill): true ends the step with Error(Cancelled).
    virtual void set_interrupt(std::function<bool()> fn) { (void)fn; }

    // An engine that can abandon a step (by killing its process) polls this
    // while one runs: true means a job in it is past its deadline or the
    // server's shutdown grace. It then throws Error(EngineCrashed).
    virtual void set_overdue(std::function<bool()> fn) { (void)fn; }
    // After Error(EngineCrashed) every sequence is gone. restart() brings
    // the engine back with the same limits and no sequences, or throws
    // eh::Error when it gives up (then it stays down); `stop` polled while
    // it waits ends it with Error(ShuttingDown). In-process engines never
    // crash that way and cannot restart.
    virtual void restart(const std::function<bool()>& stop) {
        (void)stop;
        throw Error(Code::Internal, "this engine cannot be restarted");
    }
    // The engine process's id; 0 in this process.
    virtual int64_t process_id() const { return 0; }
    // Called by the scheduler while it has nothing to run: an engine whose
    // process can end between calls throws Error(EngineCrashed) when it has,
    // so the restart need not wait for the next request. In-process engines
    // never end that way.
    virtual void check_alive() {}

    // The host-memory tier of the prefix cache (ABI 1.7 seq_park /
    // seq_unpark), only where can_park().
    virtual bool can_park() const { return false; }
    struct Parked {
        uint64_t id = 0;     // 0: not parked
        uint64_t bytes = 0;  // host memory it holds (or would hold)
    };
    // Copies the KV of seq's first n_tokens into host memory; the sequence
    // is unchanged. id 0 when that would take more than max_bytes (bytes
    // says how many) or the host memory cannot be had. Other failures throw.
    virtual Parked park(SeqId seq, uint32_t n_tokens, uint64_t max_bytes) {
        (void)seq, (void)n_tokens, (void)max_bytes;
        throw Error(Code::Internal, "this engine has no host-memory tier");
    }
    // A new sequence holding the parked copy's tokens, which must be
    // `tokens` (the engine refuses others); 0 when the free KV blocks do not
    // suffice (nothing changed). The parked copy stays until dropped.
    virtual SeqId unpark(uint64_t parked, std::span<const int32_t> tokens) {
        (void)parked, (void)tokens;
        throw Error(Code::Internal, "this engine has no host-memory tier");
    }
    virtual void drop_parked(uint64_t parked) { (void)parked; }  // never throws
};

struct KvBudget {
    uint32_t max_seqs = 64;
    uint32_t max_step_tokens = 2048;
    uint32_t max_seq_tokens = 0;    // the context length
    uint64_t budget_bytes = 0;      // 0: memory_fraction
    float memory_fraction = 0;      // 0: the plugin's default
    // ABI 1.4 eh_kv_params.kv_type: 0, the plugin's default, or the
    // eh_tensor_type asked for; a plugin that cannot store it fails the
    // engine's start (never another type instead).
    uint32_t kv_type = 0;
};

// The plugin's batched calls when it has them (kv_init runs here), else its
// sessions, one sequence at a time, with one session of max_seq_tokens.
// `adapters` (ABI 1.6, batched plugins only) are what set_adapter() picks
// from; the engine holds them and releases its sequences first.
std::unique_ptr<SeqEngine> make_seq_engine(std::shared_ptr<EngineModel> model, const KvBudget& budget,
                                           std::vector<std::shared_ptr<EngineAdapter>> adapters = {});

}  // namespace eh::service
