#include "ehcuda/batch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_map>

#include <ehcuda/attention_paged.hpp>
#include <ehcuda/check.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/kv_quant.hpp>

#include "staging_layout.hpp"

namespace ehcuda {
namespace {

// The pool takes this fraction of the memory free after the weights and
// the step buffers when the host names neither a budget nor a fraction.
constexpr float kDefaultMemoryFraction = 0.9f;

}  // namespace

namespace {

// Decode-only steps of up to this many tokens replay a CUDA graph captured
// for their size bucket (1, 2, 4, .. 64), padded with rows that write to a
// scratch block: a step of a few tokens is ~200 small launches, whose launch
// cost would otherwise exceed the GPU work.
constexpr int kGraphMaxTokens = 64;
// kv_init's warm-up pass over this many tokens (or max_step_tokens).
constexpr uint32_t kWarmPrefillTokens = 512;

int bucket_index(int ntok) {
    int b = 0;
    while ((1 << b) < ntok) ++b;
    return b;
}

}  // namespace

BatchBase::BatchBase(const BatchShape& shape, const eh_kv_params& params) : shape_(shape), params_(params) {
    EHC_CHECK(cudaSetDevice(shape.device));
    // The pool's element type (accept_kv_type passed it) and row size.
    if (const uint32_t asked = ehp::asked_kv_type(params)) kv_type_ = asked;
    row_bytes_ = kv_row_bytes(kv_type_, shape.kv_dim);
    if (!row_bytes_)
        ehp::refuse_kv_type(kv_type_, "a K/V row of " + std::to_string(shape.kv_dim) +
                                          " values is not a whole number of 32-value blocks");
    // The limits as granted, but for the block count init_pool() decides.
    const uint64_t block_bytes = 2ull * uint64_t(shape.n_layer) * kPagedBlockTokens * uint64_t(row_bytes_);
    limits_ = ehp::grant_kv(params, kPagedBlockTokens, block_bytes, UINT64_MAX, shape.seq_cap);
    limits_.max_draft_tokens = std::min(kMaxDraftTokens, limits_.max_step_tokens - 1);
    rows_ = limits_.max_step_entries;
    const size_t R = rows_cap(), V = size_t(shape.n_vocab);
    logits_ = DeviceBuffer(R * V * sizeof(float), shape.ledger);
    for (DeviceBuffer& o : out_dev_) o = DeviceBuffer(R * sizeof(int32_t), shape.ledger);
    fwork_ = DeviceBuffer(R * V * sizeof(float), shape.ledger);
    iwork_ = DeviceBuffer(R * V * sizeof(int32_t), shape.ledger);
    EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_logits_), R * V * sizeof(float)));
    if (shape.hidden_dim > 0) {
        const size_t bytes = size_t(limits_.max_step_entries) * size_t(shape.hidden_dim) * sizeof(float);
        hidden_dev_ = DeviceBuffer(bytes, shape.ledger);
        EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_hidden_), bytes));
    }
    EHC_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (cudaEvent_t& e : join_) EHC_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : staged_) EHC_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : uploaded_) EHC_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    flight_.reserve(2);
    PrefillShape ps;
    ps.max_tokens = int(limits_.max_step_tokens);
    ps.max_cols = shape.max_cols;
    workspace_ = std::make_unique<PrefillWorkspace>(ps, stream_.get(), shape.ledger);
}

BatchBase::~BatchBase() {
    cudaStreamSynchronize(stream_.get());
    cudaStreamSynchronize(upload_.get());
    for (cudaEvent_t e : join_)
        if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : staged_)
        if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : uploaded_)
        if (e) cudaEventDestroy(e);
    if (fork_) cudaEventDestroy(fork_);
    live_.clear();
    for (char* h : staging_host_)
        if (h) cudaFreeHost(h);
    if (host_logits_) cudaFreeHost(host_logits_);
    if (host_hidden_) cudaFreeHost(host_hidden_);
}

int BatchBase::fork_side(int n) {
    const int nside = std::min(n, kSideStreams);
    EHC_CHECK(cudaEventRecord(fork_, stream_.get()));
    for (int j = 0; j < nside; ++j) EHC_CHECK(cudaStreamWaitEvent(side_[j].get(), fork_, 0));
    return nside;
}

void BatchBase::join_side(int nside) {
    for (int j = 0; j < nside; ++j) {
        EHC_CHECK(cudaEventRecord(join_[j], side_[j].get()));
        EHC_CHECK(cudaStreamWaitEvent(stream_.get(), join_[j], 0));
    }
}

void BatchBase::init_pool() {
    EHC_CHECK(cudaSetDevice(shape_.device));
    uint64_t budget = params_.budget_bytes;
    auto layer_device = [&](int l) {
        return shape_.layer_devices.empty() ? shape_.device : shape_.layer_devices[size_t(l)];
    };
    if (!budget) {
        // Each GPU holding pool layers gives the fraction of its free memory
        // to its share of a block; the pool is what the fullest one allows.
        const float frac = params_.memory_fraction > 0.0f ? params_.memory_fraction : kDefaultMemoryFraction;
        std::map<int, int> layers_on;
        for (int l = 0; l < shape_.n_layer; ++l) ++layers_on[layer_device(l)];
        budget = UINT64_MAX;
        for (const auto& [dev, n] : layers_on)
            budget = std::min(budget, uint64_t(double(device_memory_info(dev).free_bytes) * frac *
                                               double(shape_.n_layer) / double(n)));
    }
    limits_ = ehp::grant_kv(params_, kPagedBlockTokens, limits_.block_bytes, budget, shape_.seq_cap);
    limits_.max_draft_tokens = std::min(kMaxDraftTokens, limits_.max_step_tokens - 1);
    // One block more than granted: the scratch block padding rows write to.
    scratch_block_ = limits_.total_blocks;
    const size_t layer_bytes = size_t(limits_.total_blocks + 1) * kPagedBlockTokens * row_bytes_;
    for (int l = 0; l < shape_.n_layer; ++l) {
        EHC_CHECK(cudaSetDevice(layer_device(l)));
        k_.emplace_back(layer_bytes, shape_.ledger);
        v_.emplace_back(layer_bytes, shape_.ledger);
    }
    EHC_CHECK(cudaSetDevice(shape_.device));
    pool_ = std::make_unique<ehp::BlockPool>(kPagedBlockTokens, limits_.total_blocks);
    warm_up();
}

size_t BatchBase::table_capacity() const {
    const size_t per_seq = (size_t(limits_.max_seq_tokens) + kPagedBlockTokens - 1) / kPagedBlockTokens;
    return size_t(limits_.max_step_entries) * per_seq + 1;
}

void BatchBase::run_forward(const StepView& v, int slot, int bucket) {
    cudaStream_t s = stream_.get();
    const int kind = kind_of(v);
    if (bucket < 0) {
        forward(v);
    } else if (!graph_warm_[kind][bucket]) {
        forward(v);  // first use: lazy allocations (cuBLAS) happen outside a capture
        graph_warm_[kind][bucket] = true;
    } else {
        CapturedGraph& g = graphs_[kind][slot][bucket];
        if (!g.ready()) {
            try {
                g.capture(s, [&] { forward(v); });
            } catch (const ehp::Error& e) {
                graph_failed_[kind][bucket] = true;  // this bucket runs eagerly from now on
                std::fprintf(stderr, "[ehcuda] batched step: graph capture for %d tokens failed (%s); running eagerly\n",
                             v.ntok, e.what());
            }
        }
        if (g.ready())
            g.launch(s);
        else
            forward(v);
    }
}

void BatchBase::chain_in(const StagingLayout& L, int slot, int n) {
    char* d = slot_dev(slot);
    copy_tokens(out_dev_[1 - slot].as<int32_t>(), reinterpret_cast<const int32_t*>(d + L.chain), n,
                reinterpret_cast<int32_t*>(d + L.tokens), stream_.get());
}

void BatchBase::sample_tail(const StagingLayout& L, int slot, const float* logits, int rows, const uint32_t* masks) {
    cudaStream_t s = stream_.get();
    char* d = slot_dev(slot);
    const int V = shape_.n_vocab;
    int32_t* d_out = out_dev_[slot].as<int32_t>();
    sample_rows(logits, V, rows, V, reinterpret_cast<const SamplerParams*>(d + L.params),
                reinterpret_cast<unsigned long long*>(d + L.counters), {fwork_.as<float>(), iwork_.as<int32_t>()},
                d_out, s, reinterpret_cast<const RowEdits*>(d + L.edits), masks);
    EHC_CHECK(cudaMemcpyAsync(slot_host(slot) + L.out, d_out, size_t(rows) * 4, cudaMemcpyDeviceToHost, s));
}

void BatchBase::whole_body(const StepView& v, const StagingLayout& L, int slot) {
    chain_in(L, slot, v.ntok);  // every row's chain pair: (-1, -1) where its token came from the host
    forward(v);
    sample_tail(L, slot, v.logits, v.nout, nullptr);
}

bool BatchBase::run_whole(const StepView& v, const StagingLayout& L, int slot, int bucket) {
    const int kind = kind_of(v);
    CapturedGraph& g = whole_[kind][slot][bucket];
    if (!g.ready() && !whole_failed_[kind][bucket]) {
        try {
            g.capture(stream_.get(), [&] { whole_body(v, L, slot); });
        } catch (const ehp::Error& e) {
            whole_failed_[kind][bucket] = true;
            std::fprintf(stderr, "[ehcuda] batched step: whole-step graph capture for %d tokens failed (%s); "
                         "running its parts\n", v.ntok, e.what());
        }
    }
    if (!g.ready()) return false;
    g.launch(stream_.get());
    return true;
}

void BatchBase::staged_inputs(StepView& v, const StagingLayout& L, int slot) const {
    const char* d = slot_dev(slot);
    v.d_tokens = reinterpret_cast<const int32_t*>(d + L.tokens);
    v.d_pos = reinterpret_cast<const int32_t*>(d + L.pos);
    v.d_rows = reinterpret_cast<const int32_t*>(d + L.rows);
    v.d_table = reinterpret_cast<const int32_t*>(d + L.table);
    v.d_lora = reinterpret_cast<const int32_t*>(d + L.lora);
    v.d_tables = reinterpret_cast<const int32_t*>(d + L.tables);
    v.d_out_idx = reinterpret_cast<const int32_t*>(d + L.out_idx);
    v.logits = logits_.as<float>();
}

void BatchBase::upload(int slot, size_t from, size_t to) {
    if (to <= from) return;
    cudaStream_t s = stream_.get();
    if (!shape_.upload_aside) {
        EHC_CHECK(cudaMemcpyAsync(slot_dev(slot) + from, slot_host(slot) + from, to - from, cudaMemcpyHostToDevice, s));
        return;
    }
    // The twin is free once the slot's last step has finished (an event
    // never recorded counts as done); the step's stream waits for the copy.
    cudaStream_t u = upload_.get();
    EHC_CHECK(cudaStreamWaitEvent(u, staged_[slot], 0));
    EHC_CHECK(cudaMemcpyAsync(slot_dev(slot) + from, slot_host(slot) + from, to - from, cudaMemcpyHostToDevice, u));
    EHC_CHECK(cudaEventRecord(uploaded_[slot], u));
    EHC_CHECK(cudaStreamWaitEvent(s, uploaded_[slot], 0));
}

void BatchBase::reset_graphs() noexcept {
    for (auto& kind : graphs_)
        for (auto& slot : kind)
            for (CapturedGraph& g : slot) g.reset();
    for (auto& kind : whole_)
        for (auto& slot : kind)
            for (CapturedGraph& g : slot) g.reset();
}

void BatchBase::warm_up() {
    const StagingLayout L(limits_.max_step_tokens, rows_cap(), table_capacity(), 0, 0);
    ensure_staging(L.end);
    // Rows of nothing: token 0 at position 0 of the scratch block.
    const int n = int(std::min<uint32_t>(limits_.max_step_tokens, kWarmPrefillTokens));
    char* h = staging_host_[0];
    for (int t = 0; t < n; ++t) {
        reinterpret_cast<int32_t*>(h + L.tokens)[t] = 0;
        reinterpret_cast<int32_t*>(h + L.pos)[t] = 0;
        reinterpret_cast<int32_t*>(h + L.rows)[t] = int32_t(uint64_t(scratch_block_) * kPagedBlockTokens);
        reinterpret_cast<int32_t*>(h + L.table)[t] = 0;
        if (t < int(limits_.max_step_entries)) reinterpret_cast<int32_t*>(h + L.out_idx)[t] = t;
    }
    // Greedy rows without edits and no chained tokens, for the whole-step graphs.
    for (size_t r = 0; r < rows_cap(); ++r) {
        reinterpret_cast<SamplerParams*>(h + L.params)[r] = SamplerParams{};
        reinterpret_cast<unsigned long long*>(h + L.counters)[r] = 0;
        reinterpret_cast<RowEdits*>(h + L.edits)[r] = RowEdits{};
        reinterpret_cast<int32_t*>(h + L.chain)[2 * r] = -1;
        reinterpret_cast<int32_t*>(h + L.chain)[2 * r + 1] = -1;
    }
    reinterpret_cast<int32_t*>(h + L.tables)[0] = int32_t(scratch_block_);
    // Both slots' device twins get these rows; each slot's graphs read its own.
    StepView vs[2];
    for (int slot = 0; slot < 2; ++slot) {
        char* d = slot_dev(slot);
        EHC_CHECK(cudaMemcpyAsync(d, h, L.tables + 4, cudaMemcpyHostToDevice, stream_.get()));
        StepView& v = vs[slot];
        staged_inputs(v, L, slot);
        v.decode = true;
    }
    // Each decode bucket: its first run, then each slot's capture.
    for (int b = 0; b < kBuckets; ++b) {
        const int size = std::min<int>(1 << b, int(limits_.max_step_entries));
        for (StepView& v : vs) v.ntok = v.nout = size;
        run_forward(vs[0], 0, b);
        for (int slot = 0; slot < 2; ++slot) run_forward(vs[slot], slot, b);
        // Both slots' whole-step graphs, each run once (their sampler and
        // copies start here, not at the first request).
        for (int slot = 0; slot < 2; ++slot) run_whole(vs[slot], L, slot, b);
        if (size == int(limits_.max_step_entries)) break;
    }
    // A prompt-sized pass: cuBLAS and the GEMM kernels start before the
    // first request does.
    StepView& v = vs[0];
    v.ntok = n;
    v.nout = 1;
    v.decode = n == 1;
    forward(v);
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
}

eh_kv_info BatchBase::info() const {
    eh_kv_info i = limits_;
    i.free_blocks = pool_ ? pool_->free_blocks() : 0;
    i.kv_type = kv_type_;
    return i;
}

void BatchBase::copy_block(uint32_t from, uint32_t to, uint32_t n_pos) {
    const size_t row = row_bytes_;
    const size_t src = size_t(from) * kPagedBlockTokens * row, dst = size_t(to) * kPagedBlockTokens * row;
    for (int l = 0; l < shape_.n_layer; ++l) {
        EHC_CHECK(cudaMemcpyAsync(static_cast<char*>(k_[size_t(l)].get()) + dst,
                                  static_cast<char*>(k_[size_t(l)].get()) + src, n_pos * row,
                                  cudaMemcpyDeviceToDevice, stream_.get()));
        EHC_CHECK(cudaMemcpyAsync(static_cast<char*>(v_[size_t(l)].get()) + dst,
                                  static_cast<char*>(v_[size_t(l)].get()) + src, n_pos * row,
                                  cudaMemcpyDeviceToDevice, stream_.get()));
    }
}

std::unique_ptr<CudaSeq> BatchBase::create() {
    if (live_.size() >= limits_.max_seqs)
        throw ehp::Error(EH_NO_CAPACITY, "seq_create: " + std::to_string(live_.size()) +
                                                  " sequences are alive, the most kv_init granted");
    auto s = std::make_unique<CudaSeq>(*pool_, [this](uint32_t f, uint32_t t, uint32_t n) { copy_block(f, t, n); });
    live_.insert(s.get());
    return s;
}

std::unique_ptr<CudaSeq> BatchBase::fork(const CudaSeq& src, uint32_t n_tokens) {
    if (n_tokens > src.blocks.length())
        throw ehp::Error(EH_INVALID_ARGUMENT, "seq_fork: n_tokens " + std::to_string(n_tokens) +
                                                  " exceeds the source's length " +
                                                  std::to_string(src.blocks.length()));
    auto s = create();
    s->blocks.share_prefix(src.blocks, n_tokens);
    s->adapter = src.adapter;
    return s;
}

void BatchBase::set_sampling(CudaSeq& seq, const eh_sampling_params& p) {
    seq.params = sampler_params_of(p);
    const bool has_pf = p.struct_size >= offsetof(eh_sampling_params, frequency_penalty) + sizeof(float);
    seq.presence = has_pf ? p.presence_penalty : 0.0f;
    seq.frequency = has_pf ? p.frequency_penalty : 0.0f;
    seq.sampling_set = true;
}

void BatchBase::ensure_staging(size_t bytes) {
    if (bytes <= staging_bytes_) return;
    const size_t n = std::max(bytes, staging_bytes_ * 2);
    // The steps in flight finish first; their sampled ids move out of the
    // slots that are about to go.
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
    for (Flight& f : flight_) read_picked(f);
    for (char*& h : staging_host_) {
        if (h) cudaFreeHost(h);
        h = nullptr;
    }
    staging_bytes_ = 0;
    reset_graphs();  // they read the old buffer
    for (DeviceBuffer& d : staging_dev_) d = DeviceBuffer(n, shape_.ledger);
    for (char*& h : staging_host_) EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h), n));
    staging_bytes_ = n;
}

void BatchBase::ensure_rows(size_t n) {
    if (n <= rows_) return;
    // Only a verify step needs more rows than entries, and it is step()'s alone.
    if (!flight_.empty()) throw ehp::Error(EH_INTERNAL, "step: sampling rows grown while a step is in flight");
    const size_t R = std::min(2 * size_t(limits_.max_step_entries), std::max(n, rows_ + 64)), V = size_t(shape_.n_vocab);
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
    reset_graphs();  // they read the old buffers and layout
    logits_ = DeviceBuffer(R * V * sizeof(float), shape_.ledger);
    for (DeviceBuffer& o : out_dev_) o = DeviceBuffer(R * sizeof(int32_t), shape_.ledger);
    fwork_ = DeviceBuffer(R * V * sizeof(float), shape_.ledger);
    iwork_ = DeviceBuffer(R * V * sizeof(int32_t), shape_.ledger);
    if (host_logits_) cudaFreeHost(host_logits_);
    host_logits_ = nullptr;
    EHC_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_logits_), R * V * sizeof(float)));
    rows_ = R;
}

void BatchBase::read_picked(Flight& f) {
    if (f.picked_read) return;
    EHC_CHECK(cudaEventSynchronize(staged_[f.slot]));
    size_t rows = 0;
    for (int n : f.nrows) rows += size_t(n);
    const auto* p = reinterpret_cast<const int32_t*>(slot_host(f.slot) + f.out);
    f.picked.assign(p, p + rows);
    f.picked_read = true;
}

void BatchBase::expect_idle(const char* call) const {
    if (!flight_.empty())
        throw ehp::Error(EH_BUSY, std::string(call) + ": a step is in flight (call step_end first)");
}

void BatchBase::forget(const CudaSeq* seq) {
    live_.erase(seq);
    if (flight_.empty()) return;
    // Its blocks go back to the pool once it is deleted: the device must be
    // done with them.
    EHC_CHECK(cudaStreamSynchronize(stream_.get()));
    for (Flight& f : flight_) {
        for (CudaSeq*& q : f.seqs)
            if (q == seq) q = nullptr;
        std::erase_if(f.patches, [&](const Flight::Patch& p) { return p.seq == seq; });
    }
}

void BatchBase::step(eh_step_entry* entries, uint32_t n_entries) {
    expect_idle("step");
    in_step_ = true;
    try {
        begin(entries, n_entries);
    } catch (...) {
        in_step_ = false;
        throw;
    }
    in_step_ = false;
    std::vector<int32_t> picked(n_entries, -1);
    end(picked.data(), n_entries);
    const uint32_t stride = entries[0].struct_size;
    for (uint32_t i = 0; i < n_entries; ++i) {
        eh_step_entry& e = ehp::step_entry(entries, stride, i);
        e.token = picked[i];
        if (e.flags & EH_STEP_VERIFY) e.n_accepted = accepted_[i];
    }
}

// A step's entries as begin() reads them: entry i, its sequence, and its
// tokens as the host sees them (a chained entry's token is `known[i]`, -1
// until the step before is read, the device copying it meanwhile).
struct StepEntries {
    eh_step_entry* base;
    uint32_t stride, n;
    std::vector<int32_t> known;    // a chained entry's token when read on the host
    std::vector<int> chain_row;    // a chained entry's row in the step in flight
    StepEntries(eh_step_entry* b, uint32_t st, uint32_t count) : base(b), stride(st), n(count), known(count, -1), chain_row(count, -1) {}
    eh_step_entry& at(uint32_t i) const { return ehp::step_entry(base, stride, i); }
    CudaSeq& seq(uint32_t i) const { return *static_cast<CudaSeq*>(at(i).seq); }
    bool chained(uint32_t i) const { return at(i).flags & EH_STEP_CHAINED; }
    const int32_t* tokens(uint32_t i) const { return chained(i) ? &known[i] : at(i).tokens; }
};

// Each entry that samples or wants logits gets a row, in entry order, with
// the edits its logits take: biases, then repetition and presence /
// frequency penalties over the history the step leaves behind, as flat
// (token, value) lists; and its allowed-token mask, if any.
struct SamplingRows {
    struct Row {
        uint32_t entry;
        RowEdits e;
    };
    std::vector<Row> rows;
    std::vector<int32_t> etok;
    std::vector<float> eval;
    std::vector<uint32_t> mask_rows;  // entry of each mask, in order
};

// The step's shape once its rows are known: T tokens, R sampling rows, and
// (decode-only steps of few tokens) the graph bucket it is padded to.
struct StepShape {
    size_t T = 0, R = 0, padded = 0, words = 0;  // words: of one mask row
    bool graphed = false;
    int bucket = 0;
    int slot = 0;          // the staging slot it fills
    size_t n_tables = 0;   // block ids staged
    int n_chain = 0;       // chained tokens the device copies
    int n_hid = 0;         // EH_STEP_HIDDEN entries (hidden rows)
    bool deep = false;     // BatchBase::deep_step
    bool lora = false;     // some entry's sequence has a LoRA adapter
};

namespace {

SamplingRows sampling_rows(const StepEntries& E, size_t words) {
    SamplingRows S;
    std::vector<int32_t> hist;
    std::unordered_map<int32_t, uint32_t> counts;
    for (uint32_t i = 0; i < E.n; ++i) {
        const eh_step_entry& e = E.at(i);
        if (!(e.flags & (EH_STEP_SAMPLE | EH_STEP_LOGITS))) continue;
        // A verify entry samples after each of its tokens, over the history
        // up to that token; any other entry after its last.
        const uint32_t first_row = (e.flags & EH_STEP_VERIFY) ? 1 : e.n_tokens;
        for (uint32_t upto = first_row; upto <= e.n_tokens; ++upto) {
            SamplingRows::Row rb{i, {}};
            if (e.flags & EH_STEP_SAMPLE) {
                const CudaSeq& q = E.seq(i);
                rb.e.bias_begin = int32_t(S.etok.size());
                for (uint32_t b = 0; b < e.n_bias; ++b) {
                    S.etok.push_back(e.bias_tokens[b]);
                    S.eval.push_back(e.bias_values[b]);
                }
                rb.e.bias_end = int32_t(S.etok.size());
                if (e.allowed) {
                    rb.e.mask_word = int32_t(S.mask_rows.size() * words);
                    S.mask_rows.push_back(i);
                }
                const bool rep = q.params.repetition_penalty != 1.0f;
                const bool pf = q.presence != 0.0f || q.frequency != 0.0f;
                if (rep || pf) {
                    hist = q.blocks.tokens();
                    hist.insert(hist.end(), E.tokens(i), E.tokens(i) + upto);
                }
                rb.e.rep_begin = rb.e.rep_end = int32_t(S.etok.size());
                if (rep) {
                    const size_t n = hist.size();
                    const size_t start = q.params.repetition_window < 0 ? 0 : n - std::min<size_t>(n, size_t(q.params.repetition_window));
                    counts.clear();
                    for (size_t j = start; j < n; ++j)
                        if (counts.emplace(hist[j], 1).second) {
                            S.etok.push_back(hist[j]);
                            S.eval.push_back(0.0f);
                        }
                    rb.e.rep_end = int32_t(S.etok.size());
                    rb.e.repetition_penalty = q.params.repetition_penalty;
                }
                rb.e.pf_begin = rb.e.pf_end = int32_t(S.etok.size());
                const uint32_t gen_start = q.blocks.gen_start == ehp::SeqBlocks::kNoOutput ? uint32_t(hist.size())
                                                                                           : q.blocks.gen_start;
                if (pf && gen_start < hist.size()) {
                    counts.clear();
                    for (size_t j = gen_start; j < hist.size(); ++j) ++counts[hist[j]];
                    for (auto [tok, c] : counts) {
                        S.etok.push_back(tok);
                        S.eval.push_back(float(c));
                    }
                    rb.e.pf_end = int32_t(S.etok.size());
                    rb.e.presence = q.presence;
                    rb.e.frequency = q.frequency;
                }
            }
            S.rows.push_back(rb);
        }
    }
    return S;
}

}  // namespace

ehp::StepTotals BatchBase::check_entries(eh_step_entry* entries, uint32_t n_entries, const Flight* prev) const {
    const ehp::StepTotals totals = ehp::check_step(
        entries, n_entries, limits_, pool_->free_blocks(), uint32_t(shape_.n_vocab),
        [&](eh_seq* s) -> const ehp::SeqBlocks* {
            auto* seq = static_cast<CudaSeq*>(s);
            return owns(seq) ? &seq->blocks : nullptr;
        },
        [](eh_seq* s) { return static_cast<CudaSeq*>(s)->sampling_set; },
        [&](eh_seq* s) { return prev && static_cast<CudaSeq*>(s)->sampled_in == prev->id; },
        EH_STEP_VERIFY | (shape_.hidden_dim > 0 ? EH_STEP_HIDDEN : 0u));
    for (uint32_t i = 0; i < n_entries && !in_step_; ++i)
        if (ehp::step_entry(entries, totals.stride, i).flags & EH_STEP_VERIFY)
            throw ehp::Error(EH_INVALID_ARGUMENT, "step entry " + std::to_string(i) +
                                                      ": EH_STEP_VERIFY is for step() only, not step_begin");
    if (prev)
        for (uint32_t i = 0; i < n_entries; ++i) {
            const uint32_t flags = ehp::step_entry(entries, totals.stride, i).flags;
            if (flags & (EH_STEP_LOGITS | EH_STEP_HIDDEN))
                throw ehp::Error(EH_INVALID_ARGUMENT, "step entry " + std::to_string(i) + ": " +
                                                          ((flags & EH_STEP_LOGITS) ? "EH_STEP_LOGITS" : "EH_STEP_HIDDEN") +
                                                          " on a step begun while another is in flight");
        }
    return totals;
}

void BatchBase::resolve_chained(StepEntries& E, Flight* prev) {
    // A chained entry's token: its row in the step in flight. Penalties need
    // the token on the host (the history), so such an entry waits for it.
    for (uint32_t i = 0; i < E.n; ++i) {
        if (!E.chained(i)) continue;
        const CudaSeq& q = E.seq(i);
        for (size_t k = 0; k < prev->seqs.size(); ++k)
            if (prev->seqs[k] == &q) E.chain_row[i] = prev->row[k];
        if (E.chain_row[i] < 0) throw ehp::Error(EH_INTERNAL, "step_begin: chained sequence has no row in flight");
        const bool history = q.params.repetition_penalty != 1.0f || q.presence != 0.0f || q.frequency != 0.0f;
        if (history || prev->picked_read) {
            read_picked(*prev);
            E.known[i] = prev->picked[size_t(E.chain_row[i])];
        }
    }
}

BatchBase::Flight BatchBase::stage(const StepEntries& E, const SamplingRows& S, const StagingLayout& L,
                                   StepShape& sh, const Flight* prev) {
    char* h = slot_host(sh.slot);
    auto* tokens = reinterpret_cast<int32_t*>(h + L.tokens);
    auto* pos = reinterpret_cast<int32_t*>(h + L.pos);
    auto* prow = reinterpret_cast<int32_t*>(h + L.rows);
    auto* table = reinterpret_cast<int32_t*>(h + L.table);
    auto* lora = reinterpret_cast<int32_t*>(h + L.lora);
    auto* out_idx = reinterpret_cast<int32_t*>(h + L.out_idx);
    auto* hid_idx = reinterpret_cast<int32_t*>(h + L.hid_idx);
    auto* chain = reinterpret_cast<int32_t*>(h + L.chain);
    auto* tables = reinterpret_cast<int32_t*>(h + L.tables);
    auto* params = reinterpret_cast<SamplerParams*>(h + L.params);
    auto* counters = reinterpret_cast<unsigned long long*>(h + L.counters);
    auto* edits = reinterpret_cast<RowEdits*>(h + L.edits);
    Flight f;
    f.id = ++next_step_;
    f.slot = sh.slot;
    f.out = L.out;
    f.seqs.resize(E.n);
    f.row.assign(E.n, -1);
    f.nrows.assign(E.n, 0);
    f.hid.assign(E.n, -1);
    f.verify.resize(E.n);
    f.flags.resize(E.n);
    size_t t = 0, tb = 0, r = 0;
    int nchain = 0, nhid = 0;
    spans_.clear();
    for (uint32_t i = 0; i < E.n; ++i) {
        const eh_step_entry& e = E.at(i);
        CudaSeq& q = E.seq(i);
        const ehp::SeqBlocks& bl = q.blocks;
        const uint32_t len = bl.length();
        spans_.push_back({int(t), int(e.n_tokens), int(tb), q.adapter});
        const int32_t* toks = E.tokens(i);
        for (uint32_t k = 0; k < e.n_tokens; ++k, ++t) {
            tokens[t] = toks[k] >= 0 ? toks[k] : 0;
            pos[t] = int32_t(len + k);
            prow[t] = int32_t(bl.row(len + k));
            table[t] = int32_t(tb);
            lora[t] = q.adapter;
        }
        if (E.chained(i) && E.known[i] < 0) {
            chain[2 * nchain] = int32_t(t - 1);
            chain[2 * nchain + 1] = E.chain_row[i];
            ++nchain;
            f.patches.push_back({&q, len, prev->id, E.chain_row[i]});
        }
        for (uint32_t blk : bl.blocks()) tables[tb++] = int32_t(blk);
        f.seqs[i] = &q;
        f.flags[i] = e.flags;
        if (e.flags & EH_STEP_HIDDEN) {
            hid_idx[nhid] = int32_t(t - 1);
            f.hid[i] = nhid++;
        }
        if (e.flags & (EH_STEP_SAMPLE | EH_STEP_LOGITS)) {
            f.row[i] = int(r);
            // A verify entry's rows: one after each of its tokens.
            const uint32_t first = (e.flags & EH_STEP_VERIFY) ? 1 : e.n_tokens;
            if (e.flags & EH_STEP_VERIFY) f.verify[i].assign(toks, toks + e.n_tokens);
            for (uint32_t upto = first; upto <= e.n_tokens; ++upto) {
                out_idx[r] = int32_t(t - e.n_tokens + upto - 1);
                SamplerParams sp = q.sampling_set ? q.params : SamplerParams{};
                sp.repetition_penalty = 1.0f;  // adjust_logits applies it
                params[r] = sp;
                counters[r] = len + upto;  // the position of the token drawn
                edits[r] = S.rows[r].e;
                ++r;
                ++f.nrows[i];
            }
        }
    }
    // Padding rows: token 0 at position 0 of a one-block table holding the
    // scratch block, which no sequence ever gets.
    for (; t < sh.padded; ++t) {
        tokens[t] = 0;
        pos[t] = 0;
        prow[t] = int32_t(uint64_t(scratch_block_) * kPagedBlockTokens);
        table[t] = int32_t(tb);
        lora[t] = -1;
        out_idx[t] = int32_t(t);
    }
    if (sh.padded > sh.T) tables[tb++] = int32_t(scratch_block_);
    // A graphed step samples every padded row (greedy, no edits) and copies
    // a token for every chain pair that is not (-1, -1).
    if (sh.graphed) {
        for (size_t p = r; p < sh.padded; ++p) {
            params[p] = SamplerParams{};
            counters[p] = 0;
            edits[p] = RowEdits{};
        }
        for (size_t p = size_t(nchain); p < sh.padded; ++p) chain[2 * p] = chain[2 * p + 1] = -1;
    }
    const StagingLayout::Biases b = L.biases_after(tb);
    if (!S.etok.empty()) {
        std::memcpy(h + b.etok, S.etok.data(), S.etok.size() * 4);
        std::memcpy(h + b.eval, S.eval.data(), S.eval.size() * 4);
    }
    for (size_t m = 0; m < S.mask_rows.size(); ++m)
        std::memcpy(h + b.masks + m * sh.words * 4, E.at(S.mask_rows[m]).allowed, sh.words * 4);
    sh.n_tables = tb;
    sh.n_chain = nchain;
    if (nhid != sh.n_hid) throw ehp::Error(EH_INTERNAL, "step: hidden rows staged differ from those counted");
    return f;
}

void BatchBase::launch(const StepEntries& E, const SamplingRows& S, const StagingLayout& L, const StepShape& sh) {
    cudaStream_t s = stream_.get();
    if (const uint64_t epoch = graph_epoch(); epoch != graph_epoch_) {
        reset_graphs();
        graph_epoch_ = epoch;
    }
    const size_t V = size_t(shape_.n_vocab), R = sh.R;
    char* d = slot_dev(sh.slot);
    // The step before may still run: the forward pass follows it on the
    // stream, and chained tokens come from its sampled ids (its slot's out
    // buffer). One copy: the biases and masks follow the block ids.
    const StagingLayout::Biases b = L.biases_after(sh.n_tables);
    upload(sh.slot, 0, b.end);

    StepView v;
    v.ntok = int(sh.padded);
    v.decode = sh.T == E.n;
    v.deep = v.decode && sh.deep;
    v.lora = sh.lora;
    staged_inputs(v, L, sh.slot);
    v.spans = spans_.data();
    v.nspans = int(spans_.size());
    v.nout = sh.graphed ? int(sh.padded) : int(R);
    v.nhid = sh.n_hid;
    v.d_hid_idx = reinterpret_cast<const int32_t*>(d + L.hid_idx);
    v.hidden = sh.n_hid ? hidden_dev_.as<float>() : nullptr;
    bool keeps_logits = false;
    for (const SamplingRows::Row& row : S.rows) keeps_logits = keeps_logits || (E.at(row.entry).flags & EH_STEP_LOGITS);
    // (graph_warm_: the forward pass ran eagerly once, its lazy set-up done)
    const bool plain = sh.graphed && graph_warm_[kind_of(v)][sh.bucket] && S.etok.empty() && S.mask_rows.empty() && !keeps_logits;
    if (plain && run_whole(v, L, sh.slot, sh.bucket)) {
        EHC_CHECK(cudaEventRecord(staged_[sh.slot], s));
        return;
    }
    if (sh.n_chain) chain_in(L, sh.slot, sh.n_chain);  // prev's slot is the other one
    run_forward(v, sh.slot, sh.graphed ? sh.bucket : -1);
    if (sh.n_hid)
        EHC_CHECK(cudaMemcpyAsync(host_hidden_, v.hidden, size_t(sh.n_hid) * size_t(shape_.hidden_dim) * sizeof(float),
                                  cudaMemcpyDeviceToHost, s));

    if (R) {
        for (size_t k = 0; k < R; ++k)
            if (E.at(S.rows[k].entry).flags & EH_STEP_LOGITS)
                EHC_CHECK(cudaMemcpyAsync(host_logits_ + k * V, v.logits + k * V, V * sizeof(float),
                                          cudaMemcpyDeviceToHost, s));
        // Biases and penalties, where some row has one (a plain or only
        // masked step launches nothing here).
        if (!S.etok.empty())
            adjust_logits(v.logits, int(V), int(R), int(V), reinterpret_cast<const RowEdits*>(d + L.edits),
                          reinterpret_cast<const int32_t*>(d + b.etok), reinterpret_cast<const float*>(d + b.eval), s);
        sample_tail(L, sh.slot, v.logits, int(R),
                    S.mask_rows.empty() ? nullptr : reinterpret_cast<const uint32_t*>(d + b.masks));
    }
    EHC_CHECK(cudaEventRecord(staged_[sh.slot], s));
}

bool BatchBase::deep_step(const StepEntries& E) const {
    const int min_keys = group_min_keys();
    if (min_keys < 0) return false;
    for (uint32_t i = 0; i < E.n; ++i)
        if (uint64_t(E.seq(i).blocks.length()) + E.at(i).n_tokens >= uint64_t(min_keys)) return true;
    return false;
}

void BatchBase::begin(eh_step_entry* entries, uint32_t n_entries) {
    EHC_CHECK(cudaSetDevice(shape_.device));
    if (flight_.size() >= 2)
        throw ehp::Error(EH_BUSY, "step_begin: two steps are in flight (call step_end first)");
    Flight* prev = flight_.empty() ? nullptr : &flight_.back();
    const ehp::StepTotals totals = check_entries(entries, n_entries, prev);
    StepEntries E(entries, totals.stride, n_entries);
    resolve_chained(E, prev);
    // Blocks first (copies of shared partial blocks go on the stream).
    for (uint32_t i = 0; i < n_entries; ++i) E.seq(i).blocks.reserve(E.at(i).n_tokens);

    StepShape sh;
    sh.words = (size_t(shape_.n_vocab) + 31) / 32;
    const SamplingRows S = sampling_rows(E, sh.words);
    sh.T = totals.tokens;
    sh.R = S.rows.size();
    for (uint32_t i = 0; i < n_entries; ++i) sh.n_hid += (E.at(i).flags & EH_STEP_HIDDEN) ? 1 : 0;
    // A step of few tokens that samples every one runs its kind's graph for
    // its bucket, padded to the bucket's size: a decode-only step (one token
    // per entry) or a verify step's drafts (every position a row).
    sh.bucket = bucket_index(int(sh.T));
    sh.deep = sh.T == n_entries && deep_step(E);
    for (uint32_t i = 0; i < n_entries; ++i) sh.lora = sh.lora || E.seq(i).adapter >= 0;
    const int kind = sh.T == n_entries ? (sh.deep ? 2 : 0) : 1;
    const size_t bucket_rows = kind == 0 ? std::min<size_t>(size_t(1) << sh.bucket, limits_.max_step_entries)
                                         : size_t(1) << sh.bucket;
    ensure_rows(sh.R);
    sh.graphed = !step_eager() && sh.T == sh.R && sh.T <= size_t(kGraphMaxTokens) && bucket_rows <= limits_.max_step_tokens &&
                 bucket_rows <= rows_cap() && !graph_failed_[kind + (sh.lora ? 3 : 0)][sh.bucket] && sh.n_hid == 0;
    sh.padded = sh.graphed ? bucket_rows : sh.T;
    const StagingLayout L(limits_.max_step_tokens, rows_cap(), table_capacity(), S.etok.size(),
                          S.mask_rows.size() * sh.words);
    ensure_staging(L.end);  // may wait for the steps in flight (then prev's ids are read)
    if (prev && prev->picked_read)
        for (uint32_t i = 0; i < n_entries; ++i)
            if (E.chained(i) && E.known[i] < 0) E.known[i] = prev->picked[size_t(E.chain_row[i])];
    sh.slot = prev ? 1 - prev->slot : 0;
    Flight f = stage(E, S, L, sh, prev);
    launch(E, S, L, sh);

    // The sequences hold the step's tokens from now on (a chained token as a
    // placeholder until the step before is read).
    for (uint32_t i = 0; i < n_entries; ++i) {
        const eh_step_entry& e = E.at(i);
        CudaSeq& q = E.seq(i);
        // A verify entry's drafts are the sequence's own output as much as its first token.
        const uint32_t first = (e.flags & EH_STEP_VERIFY) ? 1 : e.n_tokens;
        q.blocks.commit(E.tokens(i), first);
        if (first < e.n_tokens) {
            q.blocks.mark_sampled();
            q.blocks.commit(E.tokens(i) + first, e.n_tokens - first);
        }
        q.has_logits = false;
        q.has_hidden = false;
        if (e.flags & EH_STEP_SAMPLE) {
            q.blocks.mark_sampled();
            q.sampled_in = f.id;
        }
    }
    flight_.push_back(std::move(f));
}

void BatchBase::end(int32_t* out_tokens, uint32_t n_entries) {
    EHC_CHECK(cudaSetDevice(shape_.device));
    if (flight_.empty()) throw ehp::Error(EH_INVALID_ARGUMENT, "step_end: no step is in flight");
    Flight& f = flight_.front();
    if (n_entries != f.seqs.size())
        throw ehp::Error(EH_INVALID_ARGUMENT, "step_end: n_entries " + std::to_string(n_entries) +
                                                  " differs from the step's " + std::to_string(f.seqs.size()));
    if (!out_tokens) throw ehp::Error(EH_INVALID_ARGUMENT, "step_end: out_tokens is NULL");
    read_picked(f);
    const size_t V = size_t(shape_.n_vocab);
    accepted_.assign(n_entries, 0);
    for (uint32_t i = 0; i < n_entries; ++i) {
        const int r = f.row[i];
        out_tokens[i] = (f.flags[i] & EH_STEP_SAMPLE) && r >= 0 ? f.picked[size_t(r)] : -1;
        CudaSeq* q = f.seqs[i];
        if (!f.verify[i].empty() && r >= 0) {
            // Drafts stay while each is what its position drew; the first
            // other draw is the token, and the rest leave the sequence.
            const std::vector<int32_t>& t = f.verify[i];
            uint32_t m = 0;
            while (m + 1 < t.size() && f.picked[size_t(r) + m] == t[m + 1]) ++m;
            out_tokens[i] = f.picked[size_t(r) + m];
            accepted_[i] = m;
            if (q) q->blocks.truncate(q->blocks.length() - uint32_t(t.size() - 1 - m));
        }
        if (q && (f.flags[i] & EH_STEP_LOGITS) && r >= 0) {
            q->logits.assign(host_logits_ + size_t(r) * V, host_logits_ + size_t(r + 1) * V);
            q->has_logits = true;
        }
        if (q && f.hid[i] >= 0) {
            const size_t E = size_t(shape_.hidden_dim);
            q->hidden.assign(host_hidden_ + size_t(f.hid[i]) * E, host_hidden_ + size_t(f.hid[i] + 1) * E);
            q->has_hidden = true;
        }
    }
    // The step behind it took some of these tokens on the device: the
    // sequences' histories get them now.
    for (size_t k = 1; k < flight_.size(); ++k)
        for (const Flight::Patch& p : flight_[k].patches)
            if (p.from == f.id) p.seq->blocks.set_token(p.pos, f.picked[size_t(p.from_row)]);
    flight_.erase(flight_.begin());
}

}  // namespace ehcuda
