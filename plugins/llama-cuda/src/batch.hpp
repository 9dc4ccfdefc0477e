// ABI 1.2's batched step for the llama family: the shared CUDA batch engine
// (ehcuda::BatchBase: paged KV pool, sequences, sampling) with this model's
// forward pass over a step's tokens from many sequences at once (the matmul
// policy by token count is in batch.cpp); attention reads each token's own
// sequence through the block tables. A tensor-parallel model (Model::tp > 1)
// runs its ranks' slices one after another on the step's stream (the shard
// mode) and sums each row-parallel matmul's partials into the residual with
// one all-reduce (allreduce.hpp), or (Model::rank_streams) each rank on its
// own stream and GPU with its own residual, the sums through an
// ehcuda::TpGroup (tp_group.hpp); rank r of layer l keeps its KV heads in
// the pool's layer l * tp + r, on its GPU.
// It keeps final hidden states (EH_STEP_HIDDEN: embeddings, rerank), the
// rows the LM head would read, after the output norm.
#pragma once

#include <ehcuda/batch.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/prefill_workspace.hpp>
#include <ehcuda/tp_group.hpp>
#include <ehcuda/tp_rank.hpp>
#include <ehcuda/tp_step.hpp>

#include <memory>
#include <vector>

#include "lora.hpp"
#include "images.hpp"
#include "model.hpp"
#include "mrope_positions.hpp"

namespace llama_cuda {

class Batch : public ehcuda::BatchBase {
public:
    // Throws VRAM_OOM / INSUFFICIENT_VRAM (nothing left allocated).
    Batch(Model& model, const eh_kv_params& params);
    // Each rank's cuBLAS handle and buffers released on its GPU.
    ~Batch() override;
    static constexpr bool kHidden = true;  // forward() fills StepView::hidden
    // ABI 1.6's images (batch_images.cpp, images.hpp): the step calls take
    // each entry's rows (set_spans, from seq_embd_spans) for that step, and
    // a released sequence's pending rows go with it.
    void step(eh_step_entry* entries, uint32_t n_entries);
    void begin(eh_step_entry* entries, uint32_t n_entries);
    void forget(const ehcuda::CudaSeq* seq);
    void set_spans(const ehcuda::CudaSeq* seq, const eh_embd_span* spans, uint32_t n);
    // BatchBase's, plus the M-RoPE positions a qwen2vl sequence keeps
    // (batch_mrope.cpp, mrope_positions.hpp).
    std::unique_ptr<ehcuda::CudaSeq> fork(const ehcuda::CudaSeq& src, uint32_t n_tokens);
    std::unique_ptr<ehcuda::ParkedKv> park(const ehcuda::CudaSeq& seq, uint32_t n_tokens, uint64_t max_bytes,
                                           uint64_t* out_bytes);
    std::unique_ptr<ehcuda::CudaSeq> unpark(const ehcuda::ParkedKv* parked, const int32_t* tokens, uint32_t n_tokens);
    // kv_init's Q8_0 / FP8_E4M3 where the heads take them (kv_accept.hpp),
    // without an image encoder.
    static void accept_kv_type(const Model& m, uint32_t type);

private:
    // One rank's heads, FFN rows and activations (the whole model at tp 1),
    // where its work goes (stream, GPU, cuBLAS workspace) and its residual
    // (tp_rank.hpp; part: its share of attn_output / ffn_down).
    using Rank = ehcuda::RankLane<Config, Layer>;

    void forward(const ehcuda::StepView& v) override;
    // Grouped-query models: from the plan's attn_group_min_keys on, decode
    // steps take the query-group attention (prefill_attention).
    int group_min_keys() const override { return group_attn_ ? m_.plan.attn_group_min_keys : -1; }
    // Graphs hold LoRA launches only for sites some adapter had at capture.
    uint64_t graph_epoch() const override { return m_.lora.generation(); }
    // A decode-only step's attention: RoPE, the K/V store and split-K
    // attention in one launch per layer (rope_attention_decode, paged).
    void decode_attention(const ehcuda::StepView& v, Rank& r, int layer, bool chunks);
    // Otherwise: RoPE + store for every token, then each entry's span by
    // kind (ehcuda::step_attention: image spans bidirectional, long chunks
    // on the tensor cores, the other rows paged).
    void prefill_attention(const ehcuda::StepView& v, Rank& r, int layer);
    bool step_eager() const override { return images_.any(); }
    // qwen2vl: each token's M-RoPE shift for the step being begun, on the
    // device before the step's work (batch_mrope.cpp); and in forward(),
    // rank r's Q and K turned by it (every step of such a model, so a
    // captured graph holds the launch and replays it with the shifts of
    // the step it runs: 0 turns nothing).
    void place_mrope(eh_step_entry* entries, uint32_t n_entries);
    void shift_mrope(const ehcuda::StepView& v, Rank& r);
    // The pool layer of rank r's heads of `layer`.
    int pool_layer(const Rank& r, int layer) const { return layer * m_.tp + r.index; }

    Model& m_;
    const Config& c_;
    // (before ranks_: their workspaces go first, while the streams exist)
    std::unique_ptr<ehcuda::TpGroup> group_;  // rank_streams
    bool signals_ = false;                    // its one-shot all-reduce's barrier in the kernel (the plan's allreduce_signals)
    std::vector<Rank> ranks_;
    Rank head_;  // the LM head's lane: the step's stream and workspace, h_
    ehcuda::TpRows rows_;  // the ranks' residual rows and shares (tp_step.hpp)
    ehcuda::DeviceBuffer h_, xn_, last_;
    bool fused_attn_ = false;
    bool group_attn_ = false;  // attention_decode_group takes the model's heads
    ImageSteps images_;        // the step's image rows (images.hpp)
    MropePositions mrope_;     // qwen2vl's positions per sequence
    std::vector<MropePositions::Shift> shifts_;  // the step's, per token (host)
    ehcuda::DeviceBuffer d_shifts_;              // max_step_tokens of them (qwen2vl only)
    size_t shift_rows_ = 0;                      // leading device rows that may be nonzero
    ehcuda::LoraStep lora_;    // steps with LoRA adapters (lora.hpp)
};

}  // namespace llama_cuda
