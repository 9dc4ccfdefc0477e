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
// (FP32 accumulation); an entry of kGemmMinRows or more tokens with an
// adapter (a prefill chunk) takes two cuBLAS GEMMs (FP16 inputs, FP32
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
    // nothing for the others. generation() grows whenever a site gains its
    // first pair, so an engine drops graphs captured without its launches
    // (BatchBase::graph_epoch).
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
// The shrink's input slices: a block per kSliceCols columns of a row.
inline constexpr int kSliceCols = 2048;
inline int lora_slices(int n_in) { return (n_in + kSliceCols - 1) / kSliceCols; }
struct LoraPart {
    int site = 0;
    int col0 = 0;   // its outputs' first column in y's rows
    int n_out = 0;
};

// The updates of up to kLoraMaxParts sites that read the same input, over
// a step's rows.
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
    // Scratch: kLoraMaxParts * slices * u_rows rows of kLoraMaxRank floats
    // (the shrink's partial sums per input slice).
    float* u = nullptr;
    int u_rows = 0;            // (at least nrows)
    int slices = 0;            // lora_slices(n_in)
};
// Two launches (u = A x; y += s B u) whatever the rows' adapters; rows
// without one cost an early exit.
void lora_apply(const LoraApplyArgs& a, cudaStream_t stream);

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
    float* y = nullptr;
    int ldy = 0;
    __half* xh = nullptr;  // rows * n_in
    __half* uh = nullptr;  // rows * kLoraMaxRank
};
void lora_apply_gemm(const LoraGemmArgs& a, cudaStream_t stream);

// x[t, j] = silu(x[t, j]) * x[t, n_ff + j] in place, for the rows of a
// step whose down projection's input must exist (its adapter reads it).
void swiglu_inplace(float* x, int ld, int n_ff, int ntok, cudaStream_t stream);

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
    // Rows go in launches of at most kRows; the scratch for them (u) is
    // allocated at the first step with an adapter, which runs eagerly
    // (never inside a graph capture), and never moves after.
    static constexpr int kRows = 256;
    // Entries of at least this many tokens with an adapter (prefill chunks)
    // take cuBLAS (lora_apply_gemm), with pw's handle and its FP16
    // activation buffer as scratch; the other rows the per-row kernels.
    static constexpr int kGemmMinRows = 32;
    // row_token: row r's token (the LM head's rows), or NULL: row r is
    // token r (then `spans` may send entries to cuBLAS).
    void apply(const LoraSet& set, std::initializer_list<int> sites, const int32_t* token_slot,
               const int32_t* row_token, int nrows, const float* x, int ldx, float* y, int ldy, MemoryLedger* ledger,
               cudaStream_t s, const StepSpan* spans = nullptr, int nspans = 0, PrefillWorkspace* pw = nullptr);

private:
    DeviceBuffer u_;
};

// Host side of adapter_load: a tensor of an adapter view (F32, F16, BF16 or
// Q8_0, rows of `cols` values) as FP32 rows. Throws ehp::Error
// (MODEL_LOAD_FAILED) when it holds fewer bytes than its shape needs.
std::vector<float> lora_tensor_rows(const eh_tensor& t);

}  // namespace ehcuda
