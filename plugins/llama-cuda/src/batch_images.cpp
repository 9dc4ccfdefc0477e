// llama_cuda::Batch's image half (images.hpp): the step calls take each
// entry's spans first and drop them after, and a chunk that carries a
// bidirectional span attends through ehcuda::attention_span
// (step_attention.hpp, from prefill_attention).
#include <string>

#include "batch.hpp"

namespace llama_cuda {

namespace {

// Drops the step's spans when the step call leaves, however it leaves.
struct ClearAfter {
    ImageSteps& images;
    ~ClearAfter() { images.clear(); }
};

// The step's spans taken (ImageSteps::take). A bidirectional span runs
// attention_span on the step's stream over F16 pools: a quantized pool
// (kv_quant.hpp) and a tensor-parallel load (ranks on streams and GPUs of
// their own; the host takes images only for gemma3, which is not split)
// are refused with one.
void take_images(ImageSteps& images, eh_step_entry* entries, uint32_t n_entries, ehcuda::MemoryLedger* ledger,
                 int max_tokens, uint32_t kv_type, int tp) {
    images.take(entries, n_entries, ledger, max_tokens);
    const int i = images.first_bidirectional();
    if (i < 0) return;
    const std::string at = "step entry " + std::to_string(i) + ": an image's bidirectional span ";
    if (kv_type != EH_TYPE_F16)
        throw ehp::Error(EH_UNSUPPORTED, at + "needs the F16 KV cache, not " + ehp::kv_type_name(kv_type));
    if (tp > 1)
        throw ehp::Error(EH_UNSUPPORTED, at + "is not taken on a tensor-parallel load (" + std::to_string(tp) + " ranks)");
}

}  // namespace

void Batch::step(eh_step_entry* entries, uint32_t n_entries) {
    expect_idle("step");
    ClearAfter after{images_};
    take_images(images_, entries, n_entries, ledger(), max_step_tokens(), kv_type(), m_.tp);
    place_mrope(entries, n_entries);
    BatchBase::step(entries, n_entries);
}

void Batch::begin(eh_step_entry* entries, uint32_t n_entries) {
    ClearAfter after{images_};
    take_images(images_, entries, n_entries, ledger(), max_step_tokens(), kv_type(), m_.tp);
    place_mrope(entries, n_entries);
    BatchBase::begin(entries, n_entries);
}

void Batch::forget(const ehcuda::CudaSeq* seq) {
    images_.forget(seq);
    BatchBase::forget(seq);
    mrope_.forget(seq);
}

void Batch::set_spans(const ehcuda::CudaSeq* seq, const eh_embd_span* spans, uint32_t n) {
    if (!owns(seq)) throw ehp::Error(EH_INVALID_ARGUMENT, "seq_embd_spans: the sequence is not this model's");
    images_.set(seq, spans, n);
}

}  // namespace llama_cuda
