// LoRA adapters (ABI 1.6) for the CUDA engines: every loaded adapter's
// low-rank pairs in device memory, found through one device table that a
// forward pass reads per token, and the update a batched step adds after
// each adapted matmul, y += s * B (A x), for the rows whose sequence has an
// adapter with a pair for that matrix.
//
// The table has a slot per loaded adapter (kLoraMaxAdapters) and, in each,
// a descriptor per adaptable matrix (a "site": the engine numbers them). A
// step stages each token's slot (-1: none) with its other inputs, so a
// captured CUDA graph stays valid whichever adapters its rows use, and
// adapters loaded or released after the capture are seen at replay: the
// kernels read the table, never a pointer baked in at capture time. A step
// launches nothing for a site no loaded adapter has a pair at; when a site
// gains its first one, the engine's graphs are captured again
// (LoraSet::generation, BatchBase::graph_epoch).
//
// Arithmetic: per row, u = A x in FP32 over FP16 weights, then y += s * B u
// (FP32 accumulation), each adapter's rows of a step together (its pairs
// read once for all of them); an entry of kGemmMinRows or more tokens with
// an adapter (a prefill chunk) takes two cuBLAS GEMMs (FP16 inputs, FP32
// accumulation) instead. Either way a row's result depends on its own entry
// alone, never on the other rows of its step.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <engine_host/lora_adapter.hpp>
#include <engine_host/plugin_abi.h>

#include <ehcuda/batch.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/prefill_workspace.hpp>

struct cublasContext;  // cublasHandle_t is cublasContext*

// The ABI's opaque adapter handle (plugin_abi.h, 1.6).
struct eh_adapter {
    const void* owner = nullptr;  // the eh_model it was loaded for
};

namespace ehcuda {

// Adapters one model holds at once (adapter_load answers NO_CAPACITY past it).
inline constexpr int kLoraMaxAdapters = 64;
// Largest rank a pair may have (ehp::kMaxLoraRank, the format reader's).
inline constexpr int kLoraMaxRank = 1024;

// One pair of one adapter, as the kernels read it: A row-major {rank, n_in},
// B transposed, row-major {rank, n_out} (so a thread per output reads it
// coalesced). rank 0: this adapter leaves the site alone.
struct LoraDesc {
    const __half* a = nullptr;
    const __half* bt = nullptr;
    int rank = 0;
    float scale = 0.0f;
};

// Where a site's update lands: its input width, and the output columns
// [col0, col0 + n_out) of its matmul's output rows. n_out 0: the model has
// no such matrix (a fused one stands in for it).
struct LoraSite {
    int n_in = 0, n_out = 0, col0 = 0;
};

// The device table of one model: kLoraMaxAdapters slots of a descriptor
// per site each, allocated on first use and never moved after.
class LoraSet {
public:
    // Allocates the table (zeroed) the first time; later calls check the
    // sites are the same.
    void init(const std::vector<LoraSite>& sites, MemoryLedger* ledger);
    int n_sites() const { return n_sites_; }
    int max_n_in() const { return max_n_in_; }  // the widest site input
    const LoraSite& site(int i) const { return sites_[size_t(i)]; }
    const LoraDesc* table() const { return table_.as<const LoraDesc>(); }
    // The host's copy of a descriptor (for launch choices and cuBLAS).
    const LoraDesc& host(int slot, int site) const { return host_[size_t(slot) * size_t(n_sites_) + size_t(site)]; }
    // Whether some loaded adapter has a pair at the site: a step launches
    // nothing for the others. generation() grows whenever an adapter with a
    // pair is written into a slot, so an engine drops graphs captured
    // without its launches or without its slot in their launches' lists
    // (LoraApplyArgs::slots; BatchBase::graph_epoch).
    bool used(int site) const { return users_[size_t(site)] > 0; }
    uint64_t generation() const { return generation_; }
    // A free slot; throws ehp::Error(NO_CAPACITY) when every one is taken.
    int claim();
    // Writes a slot's n_sites descriptors (synchronously), or zeroes them
    // and frees the slot.
    void write(int slot, const std::vector<LoraDesc>& sites);
    void release(int slot) noexcept;

private:
    int n_sites_ = 0;
    int max_n_in_ = 0;
    std::vector<LoraSite> sites_;
    DeviceBuffer table_;
    std::vector<LoraDesc> host_;
    std::vector<int> users_;     // per site: loaded adapters with a pair there
    uint64_t generation_ = 0;
    std::vector<bool> used_;
};

// One loaded adapter: its slot in the set and the device memory holding its
// pairs. Released (slot zeroed, memory freed) on destruction; the host
// releases it only after every sequence that used it.
class LoraAdapter : public eh_adapter {
public:
    LoraAdapter(LoraSet& set, int device) : set_(set), device_(device), slot_(set.claim()) {}
    ~LoraAdapter();
    LoraAdapter(const LoraAdapter&) = delete;
    LoraAdapter& operator=(const LoraAdapter&) = delete;
    int slot() const { return slot_; }
    int device() const { return device_; }
    DeviceBuffer data;  // every pair's A and B^T, FP16

private:
    LoraSet& set_;
    int device_ = 0;
    int slot_ = -1;
};

// Sites one launch pair may take: those reading the same input (q, k, v).
inline constexpr int kLoraMaxParts = 3;
// The shrink's input slices, a block each. The scratch holds
// kLoraMaxParts * lora_slices(the widest input) slices' partial sums a row;
// a launch cuts its input into as many slices as that room holds for its
// parts (lora_slice_cols: multiples of 64 columns), so that a few adapters'
// rows still spread over many blocks, each a short walk.
inline constexpr int kSliceCols = 2048;
inline int lora_slices(int n_in) { return (n_in + kSliceCols - 1) / kSliceCols; }
inline int lora_slice_cols(int n_in, int nparts, int room) {
    const int per_part = room / nparts > 0 ? room / nparts : 1;
    const int cols = (n_in + per_part - 1) / per_part;
    return (cols + 63) / 64 * 64;
}
struct LoraPart {
    int site = 0;
    int col0 = 0;   // its outputs' first column in y's rows
    int n_out = 0;
};

// The updates of up to kLoraMaxParts sites that read the same input, over
// a step's rows: a block per adapter of `slots` (those with a pair at one
// of the sites when the launch was made; a slot released since has none)
// takes that adapter's rows.
struct LoraApplyArgs {
    const LoraDesc* table = nullptr;  // LoraSet::table()
    int n_sites = 0;
    LoraPart part[kLoraMaxParts];
    int nparts = 0;
    const int32_t* token_slot = nullptr;  // per step token: its adapter slot, -1 none
    const int32_t* row_token = nullptr;   // row r's token index; NULL: row r is token r
    int nrows = 0;
    const float* x = nullptr;  // nrows rows of n_in, ldx apart
    int ldx = 0, n_in = 0;
    float* y = nullptr;        // nrows rows (added to), ldy apart
    int ldy = 0;
    bool vec = false;          // n_in and ldx even, x 8-byte aligned: column pairs
    // x holds the FFN's gate|up rows (n_in each, up after gate): the input
    // is silu(gate) * up, as the down projection's SwiGLU staging has it.
    bool swiglu = false;
    int32_t slots[kLoraMaxAdapters] = {};
    int nslots = 0;
    // Scratch: u_slices * u_rows rows of kLoraMaxRank floats (the shrink's
    // partial sums per part and input slice).
    float* u = nullptr;
    int u_rows = 0;            // (at least nrows)
    int u_slices = 0;          // (at least nparts * slices)
    int slice_cols = 0;        // lora_slice_cols(n_in, nparts, u_slices)
    int slices = 0;            // n_in / slice_cols, rounded up
};
// Two launches (u = A x; y += s B u) whatever the rows' adapters; rows
// without one are never read. lora_shrink and lora_expand are its halves
// (the shrink reads only x; the expand reads its u and adds into y).
void lora_apply(const LoraApplyArgs& a, cudaStream_t stream);
void lora_shrink(const LoraApplyArgs& a, cudaStream_t stream);
void lora_expand(const LoraApplyArgs& a, cudaStream_t stream);

// The same update for `rows` rows that all have the adapter of the host
// descriptors `desc` (a long prefill span): x in FP16 into xh (rows x n_in),
// then per part with a pair u = x A^T (FP16, uh: rows x rank) and
// y += s * u B^T, two cuBLAS GEMMs (FP32 accumulation) instead of a walk
// over the pairs per row.
struct LoraGemmArgs {
    cublasContext* blas = nullptr;
    LoraDesc desc[kLoraMaxParts];  // rank 0: no pair at that part's site
    LoraPart part[kLoraMaxParts];
    int nparts = 0;
    int rows = 0;
    const float* x = nullptr;
    int ldx = 0, n_in = 0;
    bool swiglu = false;  // as LoraApplyArgs::swiglu
    float* y = nullptr;
    int ldy = 0;
    __half* xh = nullptr;  // rows * n_in
    __half* uh = nullptr;  // rows * kLoraMaxRank
};
void lora_apply_gemm(const LoraGemmArgs& a, cudaStream_t stream);

// adapter_load's part every engine shares. lora_check_params: the call's
// numbers (scale, alpha; INVALID_ARGUMENT). lora_upload: each pair of `info`
// bound to the engine's site for its base weight (site_of; -1: the engine
// does not adapt it, UNSUPPORTED naming it and `adapts`), its shape checked
// against the site's (MODEL_LOAD_FAILED), uploaded as FP16 (A as stored, B
// transposed; where hf_rows says, B's rows put back from the GGUF
// converter's RoPE order into HF's, head_dim rows a head) into a new slot.
void lora_check_params(const eh_adapter_params& p);
struct LoraBindOptions {
    std::function<int(const std::string& base)> site_of;
    std::function<bool(const std::string& base)> hf_rows;  // may be empty
    int head_dim = 0;
    std::string engine;  // for messages
    std::string adapts;  // what it adapts, for the UNSUPPORTED message
};
std::unique_ptr<LoraAdapter> lora_upload(LoraSet& set, int device, MemoryLedger* ledger,
                                         const ehp::LoraAdapterInfo& info, const eh_adapter_params& p,
                                         const LoraBindOptions& o);

// A step's updates after one matmul: `sites` (those reading the same input,
// at most kLoraMaxParts; sites without a matrix skipped) into its output
// rows y, for rows 0 .. nrows - 1 whose adapter has a pair there.
class LoraStep {
public:
    LoraStep() = default;
    ~LoraStep();
    LoraStep(const LoraStep&) = delete;
    LoraStep& operator=(const LoraStep&) = delete;
    // Rows go in launches of at most kRows; the scratch for them (u) is
    // allocated at the first step with an adapter, which runs eagerly
    // (never inside a graph capture), and never moves after.
    static constexpr int kRows = 256;
    // Entries of at least this many tokens with an adapter (prefill chunks)
    // take cuBLAS (lora_apply_gemm), with pw's handle and its FP16
    // activation buffer as scratch; the other rows the kernels (lora_apply).
    static constexpr int kGemmMinRows = 32;
    // row_token: row r's token (the LM head's rows), or NULL: row r is
    // token r (then `spans` may send entries to cuBLAS). swiglu: x holds
    // gate|up rows (LoraApplyArgs::swiglu), the sites' n_in wide each.
    void apply(const LoraSet& set, std::initializer_list<int> sites, const int32_t* token_slot,
               const int32_t* row_token, int nrows, const float* x, int ldx, float* y, int ldy, MemoryLedger* ledger,
               cudaStream_t s, const StepSpan* spans = nullptr, int nspans = 0, PrefillWorkspace* pw = nullptr,
               bool swiglu = false);
    // apply() (row r token r) in two halves around the matmul whose output
    // it adds to: begin() as soon as x holds the matmul's input, finish()
    // after the matmul. Where every row takes the kernels in one launch
    // pair (a decode step), begin() puts the shrink (it reads x alone) on a
    // stream of its own, forked from s, so that it runs beside the matmul,
    // and finish() joins it before the expand; otherwise finish() runs
    // apply() whole. One begin() at a time, each followed by its finish().
    void begin(const LoraSet& set, std::initializer_list<int> sites, const int32_t* token_slot, int nrows, const float* x,
               int ldx, MemoryLedger* ledger, cudaStream_t s, const StepSpan* spans, int nspans, PrefillWorkspace* pw,
               bool swiglu = false);
    void finish(float* y, int ldy, cudaStream_t s);

private:
    // a's parts, adapters and scratch for these sites and x (false: no
    // loaded adapter has a pair at them, nothing to launch).
    bool prepare(const LoraSet& set, const int* sites, int nsites, const float* x, int ldx, MemoryLedger* ledger,
                 bool swiglu, LoraApplyArgs& a);
    void run(const LoraSet& set, const int* sites, int nsites, const int32_t* token_slot, const int32_t* row_token,
             int nrows, const float* x, int ldx, float* y, int ldy, MemoryLedger* ledger, cudaStream_t s,
             const StepSpan* spans, int nspans, PrefillWorkspace* pw, bool swiglu);
    DeviceBuffer u_;
    // begin()'s state until finish().
    struct Pending {
        bool active = false, split = false;
        const LoraSet* set = nullptr;
        int sites[kLoraMaxParts] = {};
        int nsites = 0;
        const int32_t* token_slot = nullptr;
        int nrows = 0;
        const float* x = nullptr;
        int ldx = 0;
        MemoryLedger* ledger = nullptr;
        const StepSpan* spans = nullptr;
        int nspans = 0;
        PrefillWorkspace* pw = nullptr;
        bool swiglu = false;
        LoraApplyArgs a;
    } pending_;
    cudaStream_t side_ = nullptr;
    cudaEvent_t fork_ = nullptr, join_ = nullptr;
};

// Host side of adapter_load: a tensor of an adapter view (F32, F16, BF16 or
// Q8_0, rows of `cols` values) as FP32 rows. Throws ehp::Error
// (MODEL_LOAD_FAILED) when it holds fewer bytes than its shape needs.
std::vector<float> lora_tensor_rows(const eh_tensor& t);

}  // namespace ehcuda
