// ABI 1.2's batched calls for a CUDA engine, written once for all of them:
// the paged KV pool in device memory (FP16, kPagedBlockTokens positions per
// block, per layer [row][kv_dim]), the sequences (ehp::SeqBlocks over the
// pool), and step(): check every entry, take blocks (copy on write of a
// shared partial block), lay the step's tokens out on the device, run the
// engine's forward pass, then apply each sampling entry's biases, mask and
// penalties and sample every row in one launch. A plugin derives from
// BatchBase, allocates its step activations for max_step_tokens(), calls
// init_pool(), and implements forward().
// ABI 1.3's two halves: begin() does all of that without waiting for the
// stream and end() waits for the oldest step begun. Two steps may be in
// flight; each has its own pinned staging slot (the device staging is one
// buffer: the stream orders a step's uploads after the step before it), and
// a chained entry's token is copied on the device from the sampled ids of
// the step before it.
// ABI 1.6's verification (EH_STEP_VERIFY, step() only): every position of
// the entry is a sampling row of its own (its history up to there, its draw
// keyed by its position), and a draft stays while it is what its row drew;
// the first other draw is the entry's token, and the sequence is cut back
// behind the accepted drafts. Draws keyed by position make that exactly the
// tokens plain steps would give. The step buffers hold max_step_entries
// rows until a verify step needs more (ensure_rows: at most twice that, the
// drafts of a step being at most max_step_entries), so a server that never
// speculates never pays for them.
// ABI 1.5's final hidden state (EH_STEP_HIDDEN), for an engine whose
// forward() fills StepView::hidden (BatchShape::hidden_dim set, and its
// Batch's kHidden true, which exports seq_hidden): an entry that asks gets a
// hidden row, its last token's state after the output norm, copied to the
// host behind the step's sampled ids (end() waits for nothing more). Such a
// step runs eagerly, never a graph, and may not be begun behind another.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <engine_host/kv_blocks.hpp>
#include <engine_host/plugin_abi.h>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/prefill_workspace.hpp>
#include <ehcuda/sampler.hpp>

// The ABI's opaque sequence handle; `owner` is the model whose last-error
// slot the sequence's calls report to.
struct eh_seq {
    eh_model* owner = nullptr;
};

namespace ehcuda {

// A sequence's draws are keyed by (seed, position of the token drawn), not
// by how many draws came before: a sequence the host recomputes after a
// preemption (released, then prefilled again) draws the same numbers.
class CudaSeq : public eh_seq {
public:
    explicit CudaSeq(ehp::BlockPool& pool, ehp::SeqBlocks::CopyFn copy) : blocks(pool, std::move(copy)) {}

    ehp::SeqBlocks blocks;
    bool sampling_set = false;
    SamplerParams params;  // repetition_penalty applied by adjust_logits, not the sampler
    float presence = 0.0f, frequency = 0.0f;
    std::vector<float> logits;     // raw logits kept by the last step that asked
    bool has_logits = false;
    std::vector<float> hidden;     // final hidden state kept by the last step that asked
    bool has_hidden = false;
    uint64_t sampled_in = 0;       // id of the last step begun that samples for it
    int32_t adapter = -1;          // the engine's LoRA slot (seq_set_adapter; forks keep it), -1: none
};

// Where one entry's tokens are in a step: tokens first .. first + n - 1,
// their sequence's block ids at d_tables + table, its LoRA adapter.
struct StepSpan {
    int first = 0, n = 0, table = 0;
    int adapter = -1;  // its sequence's LoRA slot (CudaSeq::adapter)
};

// What forward() gets: the step's tokens laid out entry after entry, in
// device memory.
struct StepView {
    int ntok = 0;
    bool decode = false;  // every token is the only one of its sequence in this step
    // A decode step whose longest row attends at least group_min_keys()
    // keys (its own graphs: the derived class's attention differs).
    bool deep = false;
    // Some token's sequence has a LoRA adapter (graphs of its own kinds):
    // d_lora holds each token's adapter slot, -1 for none and padding.
    bool lora = false;
    const int32_t* d_lora = nullptr;
    const int32_t* d_tokens = nullptr;
    const int32_t* d_pos = nullptr;    // each token's position in its sequence
    const int32_t* d_rows = nullptr;   // the pool row its K/V go to
    const int32_t* d_table = nullptr;  // offset of its sequence's block ids in d_tables
    const int32_t* d_tables = nullptr;
    // Host memory: each entry's span (none for the warm-up's rows), for
    // launch choices such as the tensor-core attention for a long chunk.
    const StepSpan* spans = nullptr;
    int nspans = 0;
    // forward() leaves the logits of token d_out_idx[r] in logits + r * n_vocab.
    int nout = 0;
    const int32_t* d_out_idx = nullptr;
    float* logits = nullptr;
    // forward() leaves the final hidden state (after the output norm) of
    // token d_hid_idx[j] in hidden + j * BatchShape::hidden_dim, for j < nhid
    // (0 unless the engine keeps hidden states).
    int nhid = 0;
    const int32_t* d_hid_idx = nullptr;
    float* hidden = nullptr;
};

struct BatchShape {
    int device = 0;
    MemoryLedger* ledger = nullptr;
    int n_vocab = 0;
    int n_layer = 0;
    int kv_dim = 0;                  // n_kv * head_dim
    uint32_t seq_cap = UINT32_MAX;   // longest sequence the model allows
    int max_cols = 0;                // widest matmul input (the prefill workspace)
    int hidden_dim = 0;              // n_embd where forward() fills StepView::hidden, else 0
    // The GPU of each pool layer (tensor parallelism over GPUs: a rank's
    // layers on its own); empty: every layer on `device`. The pool's size
    // from free memory is what the fullest of them allows.
    std::vector<int> layer_devices;
    // A step's inputs go up on a copy stream of their own, into the device
    // twin of their staging slot, while the step before still computes
    // (the step waits for them with an event); false: on the step's stream
    // in front of it, as part of the step's time (plan key
    // step_upload_aside).
    bool upload_aside = true;
};

// begin()'s working state (batch.cpp).
struct StepEntries;
struct SamplingRows;
struct StepShape;
struct StagingLayout;
class ParkedKv;  // kv_park.hpp

class BatchBase {
public:
    // Whether the engine's forward() fills StepView::hidden (PluginGlue
    // exports seq_hidden then); a derived Batch that does says so again.
    static constexpr bool kHidden = false;
    BatchBase(const BatchShape& shape, const eh_kv_params& params);
    virtual ~BatchBase();
    // kv_init's check of a kv_type other than F16, before the Batch is
    // built: throws ehp::refuse_kv_type's error naming why. An engine whose
    // kernels read a quantized pool says so with its own accept_kv_type.
    template <class Model>
    static void accept_kv_type(const Model&, uint32_t type) {
        ehp::refuse_kv_type(type, "this plugin's KV cache is F16 only");
    }
    BatchBase(const BatchBase&) = delete;
    BatchBase& operator=(const BatchBase&) = delete;

    eh_kv_info info() const;
    std::unique_ptr<CudaSeq> create();
    std::unique_ptr<CudaSeq> fork(const CudaSeq& src, uint32_t n_tokens);
    // The sequence is going away: steps in flight are waited for first.
    void forget(const CudaSeq* seq);
    bool owns(const CudaSeq* seq) const { return live_.count(seq) != 0; }
    void set_sampling(CudaSeq& seq, const eh_sampling_params& p);
    // Throws ehp::Error; on INVALID_ARGUMENT and KV_FULL nothing has changed.
    void step(eh_step_entry* entries, uint32_t n_entries);
    // Draft tokens one verify entry may carry.
    static constexpr uint32_t kMaxDraftTokens = 16;
    // ABI 1.3's step_begin / step_end (plugin_abi.h has the rules). Throw
    // ehp::Error as step() does.
    void begin(eh_step_entry* entries, uint32_t n_entries);
    void end(int32_t* out_tokens, uint32_t n_entries);
    // Throws BUSY (ABI 1.4) naming `call` while a step is in flight.
    void expect_idle(const char* call) const;
    // ABI 1.7's host-memory tier (kv_park.cpp): the first n_tokens of seq
    // copied into pinned host memory (NO_CAPACITY past max_bytes, which
    // *out_bytes is compared with), and back into a new sequence (the
    // checks of ehp::check_unpark, then NO_CAPACITY as create()).
    std::unique_ptr<ParkedKv> park(const CudaSeq& seq, uint32_t n_tokens, uint64_t max_bytes, uint64_t* out_bytes);
    std::unique_ptr<CudaSeq> unpark(const ParkedKv* parked, const int32_t* tokens, uint32_t n_tokens);

protected:
    // One forward pass over v.ntok tokens: K/V of token t into row
    // v.d_rows[t] of every layer's pool, attention over the sequence's
    // earlier rows, logits of the v.nout chosen tokens into v.logits.
    virtual void forward(const StepView& v) = 0;
    // Decode steps whose longest row attends at least this many keys are
    // StepView::deep; -1: none.
    virtual int group_min_keys() const { return -1; }
    // Whether the step being begun must run eagerly, never through a
    // captured graph: a derived engine that feeds its forward pass what a
    // graph would not replay (ABI 1.6's image rows) says so.
    virtual bool step_eager() const { return false; }
    // What the derived forward pass launches may change between steps
    // (LoRA: a site gains its first adapter, LoraSet::generation): when
    // this differs from the last step's, every captured graph is dropped
    // before the step (captured again on use). Changes only while no step
    // is in flight (the calls that change it are refused with BUSY then).
    virtual uint64_t graph_epoch() const { return 0; }
    // After the derived class allocated its step buffers: sizes the pool
    // from the budget (or the free memory), allocates it, and warms up
    // (every decode bucket's graph captured, cuBLAS started), so the first
    // request pays none of that.
    void init_pool();

    int max_step_tokens() const { return int(limits_.max_step_tokens); }
    int max_step_entries() const { return int(limits_.max_step_entries); }
    uint32_t max_seq_tokens() const { return limits_.max_seq_tokens; }
    cudaStream_t stream() const { return stream_.get(); }
    PrefillWorkspace* workspace() const { return workspace_.get(); }
    __half* k_pool(int layer) const { return k_[size_t(layer)].as<__half>(); }
    __half* v_pool(int layer) const { return v_[size_t(layer)].as<__half>(); }
    // The pools' element type: kv_init's kv_type, F16 when it named none.
    // A Q8_0 / FP8_E4M3 pool's rows are bytes (ehcuda/kv_quant.hpp), which
    // k_pool / v_pool then point at.
    uint32_t kv_type() const { return kv_type_; }
    MemoryLedger* ledger() const { return shape_.ledger; }
    // fn(t, stream) for t < n: on the step's stream when n == 1, else spread
    // over side streams forked from the step's stream and joined back, so
    // the single-token kernels of a few tokens overlap (a captured graph
    // keeps them as parallel branches).
    template <class F>
    void per_token(int n, F&& fn) {
        if (n == 1) {
            fn(0, stream());
            return;
        }
        const int nside = fork_side(n);
        for (int t = 0; t < n; ++t) fn(t, side_[t % nside].get());
        join_side(nside);
    }

private:
    // Whether a decode step of these entries is StepView::deep.
    bool deep_step(const StepEntries& E) const;
    // per_token's fork (returns the side streams used) and join.
    int fork_side(int n);
    void join_side(int nside);
    void copy_block(uint32_t from, uint32_t to, uint32_t n_pos);
    // park()'s and unpark()'s copy of seq's first n_tokens rows, waited for.
    void park_copy(const CudaSeq& seq, uint32_t n_tokens, const ParkedKv& parked, bool to_host);
    // forward(v), through bucket's graph when bucket >= 0 (run eagerly on
    // its first use, captured on its second).
    void run_forward(const StepView& v, int slot, int bucket);
    // A plain decode step (bucket's padded rows all sampled, no edits, masks
    // or kept logits) whole: the chained tokens' copy, forward(), sampling
    // and the ids' copy into the slot's staging, replayed as one graph per
    // slot and bucket, so the device goes from step to step with no gap for
    // the host's separate launches. Captured on first use; false (nothing
    // enqueued) where the capture failed, and that bucket keeps the parts.
    bool run_whole(const StepView& v, const StagingLayout& L, int slot, int bucket);
    // What that graph holds.
    void whole_body(const StepView& v, const StagingLayout& L, int slot);
    // The two ends of a step's device work around its forward pass, shared
    // by launch() and whole_body(): the first n chain pairs' tokens copied
    // from the sampled ids of the step in the other slot, and then `rows`
    // rows of `logits` sampled (`masks`: the allowed-token words, or NULL)
    // with their ids copied into slot's staging for the host.
    void chain_in(const StagingLayout& L, int slot, int n);
    void sample_tail(const StagingLayout& L, int slot, const float* logits, int rows, const uint32_t* masks);
    // Copies bytes [from, to) of the slot's pinned staging to its device
    // twin, ordered before the step's next work on the step's stream (see
    // BatchShape::upload_aside).
    void upload(int slot, size_t from, size_t to);
    // The forward pass's inputs in the slot's device twin (StepView's d_*
    // pointers) and the logits rows.
    void staged_inputs(StepView& v, const StagingLayout& L, int slot) const;
    void reset_graphs() noexcept;
    void warm_up();
    // Grows the pinned staging and its device twin to at least `bytes`
    // (dropping the graphs, which read the old one).
    void ensure_staging(size_t bytes);
    // Block ids a step's tables may hold: every entry at full length, plus
    // the padding rows' table.
    size_t table_capacity() const;

    // A step begun and not ended.
    struct Flight {
        uint64_t id = 0;
        int slot = 0;                    // pinned staging slot (and its event)
        size_t out = 0;                  // offset of the sampled ids in the slot
        std::vector<CudaSeq*> seqs;      // per entry; NULL once released
        std::vector<int> row;            // per entry: its (first) sampling row, or -1
        std::vector<int> nrows;          // per entry: its sampling rows (a verify entry: one per token)
        std::vector<int> hid;            // per entry: its hidden row (EH_STEP_HIDDEN), or -1
        std::vector<std::vector<int32_t>> verify;  // per entry: a verify entry's tokens, else empty
        std::vector<uint32_t> flags;     // per entry
        // Chained entries: the sequence position holding a placeholder until
        // step `from`'s row `from_row` is read.
        struct Patch {
            CudaSeq* seq;
            uint32_t pos;
            uint64_t from;
            int from_row;
        };
        std::vector<Patch> patches;
        std::vector<int32_t> picked;     // the sampled ids once read (picked_read)
        bool picked_read = false;
    };
    // Waits for f and reads its sampled ids into f.picked.
    void read_picked(Flight& f);
    // begin()'s steps, in order. Every check before anything changes
    // (check_step's, and no EH_STEP_LOGITS behind a step in flight).
    ehp::StepTotals check_entries(eh_step_entry* entries, uint32_t n_entries, const Flight* prev) const;
    // The sampling rows the step buffers hold (logits_, fwork_, iwork_,
    // out_dev_, host_logits_): max_step_entries, more once a verify step
    // needed them.
    size_t rows_cap() const { return rows_; }
    // Grows them to hold n rows (at least 64 more, at most twice
    // max_step_entries), only while no step is in flight; the graphs are
    // captured again, as the staging layout moves.
    void ensure_rows(size_t n);
    // The chained entries' rows in prev, and their tokens where the host
    // needs them now (penalties) or prev was read already.
    void resolve_chained(StepEntries& E, Flight* prev);
    // Writes the step's inputs into staging slot sh.slot (host side),
    // sets sh.n_tables and sh.n_chain, and returns the step's Flight.
    Flight stage(const StepEntries& E, const SamplingRows& S, const StagingLayout& L, StepShape& sh,
                 const Flight* prev);
    // Uploads the slot, runs the forward pass (the bucket's graph when
    // graphed), then the logits copies, edits and sampling of its rows.
    void launch(const StepEntries& E, const SamplingRows& S, const StagingLayout& L, const StepShape& sh);
    char* slot_host(int slot) const { return staging_host_[slot]; }
    char* slot_dev(int slot) const { return staging_dev_[slot].as<char>(); }

    BatchShape shape_;
    eh_kv_params params_;
    uint32_t kv_type_ = EH_TYPE_F16;
    size_t row_bytes_ = 0;  // one pool row (kv_quant.hpp)
    eh_kv_info limits_{};  // as granted, total_blocks from init_pool on
    std::unique_ptr<ehp::BlockPool> pool_;
    std::vector<DeviceBuffer> k_, v_;
    std::unordered_set<const CudaSeq*> live_;
    std::vector<StepSpan> spans_;

    Stream stream_;
    static constexpr int kSideStreams = 4;
    Stream side_[kSideStreams];
    cudaEvent_t fork_ = nullptr, join_[kSideStreams] = {};
    std::unique_ptr<PrefillWorkspace> workspace_;
    DeviceBuffer logits_, fwork_, iwork_;
    // A step's inputs: pinned, one slot per step in flight, and each slot's
    // device twin (the step in flight reads one while the next step's
    // inputs go up to the other).
    DeviceBuffer staging_dev_[2];
    DeviceBuffer out_dev_[2];        // a slot's sampled ids on the device
    char* staging_host_[2] = {};
    cudaEvent_t staged_[2] = {};     // a slot's step has finished
    Stream upload_;                  // upload_aside's copies
    cudaEvent_t uploaded_[2] = {};   // a slot's inputs are on the device
    size_t staging_bytes_ = 0;
    std::vector<Flight> flight_;     // oldest first, at most two
    bool in_step_ = false;           // begin() called by step(): verify entries allowed
    std::vector<uint32_t> accepted_; // end()'s drafts accepted per entry (verify entries)
    uint64_t next_step_ = 0;
    float* host_logits_ = nullptr;  // pinned, rows_cap() rows
    // EH_STEP_HIDDEN's rows (max_step_entries x hidden_dim): forward()
    // writes them, and they come to the pinned twin behind the step. One
    // pair is enough: such a step is never begun behind another.
    DeviceBuffer hidden_dev_;
    float* host_hidden_ = nullptr;
    size_t rows_ = 0;                // rows_cap()
    uint32_t scratch_block_ = 0;    // the pool's extra block, outside the BlockPool
    // Graphs per kind and size bucket (1, 2, 4, .. 64 tokens). Kinds:
    // decode-only steps (one token per entry, the fused decode attention)
    // and steps that sample every position of multi-token entries (verify
    // steps' drafts, the paged attention), and deep decode steps, whose
    // forward() differs; each again for steps with LoRA adapters.
    static constexpr int kBuckets = 7;
    static constexpr int kKinds = 6;
    static int kind_of(const StepView& v) { return (v.decode ? (v.deep ? 2 : 0) : 1) + (v.lora ? 3 : 0); }
    // (per staging slot too: a graph reads its slot's device twin)
    CapturedGraph graphs_[kKinds][2][kBuckets];
    bool graph_warm_[kKinds][kBuckets] = {};
    bool graph_failed_[kKinds][kBuckets] = {};
    // Plain steps whole (run_whole): per kind, staging slot (whose ids they
    // write) and bucket.
    CapturedGraph whole_[kKinds][2][kBuckets];
    bool whole_failed_[kKinds][kBuckets] = {};
    uint64_t graph_epoch_ = 0;  // graph_epoch() when the graphs were captured
};

}  // namespace ehcuda
