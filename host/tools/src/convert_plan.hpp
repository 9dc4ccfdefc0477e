// The converter's tensor plan: which GGUF tensor comes from which
// safetensors tensor(s), and what is done to the values on the way.
// Names come from the host's HF reader (eh::model::hf_tensor_name_to_gguf);
// this file adds only the data layout changes a GGUF file needs and the
// host's reader leaves to the plugins:
//   llama     Q/K rows permuted so that interleaved rotary pairs reproduce
//             HF's rotate_half;
//   gpt2      Conv1D weights ([in, out]) transposed; the tied head written
//             out as output.weight;
//   gpt-oss   experts' fused gate_up split into gate (even rows) and up
//             (odd rows), dense experts ([n_expert, in, out]) transposed,
//             MXFP4 blocks+scales repacked into ggml MXFP4 blocks;
//   qwen3moe  experts stacked into one tensor per matrix, from one tensor
//             per expert or from the fused gate_up_proj (gate rows first);
//   gemma3    every norm weight stored as 1 + w (Gemma's RMSNorm scales by
//             1 + w; llama.cpp's converter writes the sum).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "eh/model/gguf_writer.hpp"
#include "eh/tools/parallel.hpp"
#include "eh/tools/safetensors.hpp"

namespace eh::tools {

enum class Op {
    Copy,          // same values, ggml dims = reversed HF shape
    Transpose,     // 2-D [in, out] -> rows are outputs
    PermuteHeads,  // llama Q/K
    Experts,       // dense experts [X, in, phys_out]: row r of expert e is column r*step+offset
    Strided,       // expert bias [X, phys]: element r of expert e is r*step+offset
    Mxfp4,         // HF MXFP4 blocks [X, phys, in/32, 16] + scales [X, phys, in/32]
    ExpertRows,    // rows layout, expert by expert: hf_experts[e] whole, or
                   // rows [offset, offset + rows) of expert e in hf [X, phys, in]
    AddOne,        // Copy, each value + 1 (gemma3 norms)
};

struct Planned {
    std::string gguf;
    std::string hf;         // source tensor (Mxfp4: the blocks)
    std::string hf_scales;  // Mxfp4 only
    std::vector<std::string> hf_experts;  // ExpertRows from one tensor per expert
    Op op = Op::Copy;
    uint32_t heads = 0;     // PermuteHeads
    uint64_t step = 1, offset = 0;
    std::vector<uint64_t> dims;  // ggml dims of the output
};

struct PlanInput {
    std::string arch;
    uint32_t n_layer = 0, n_head = 0, n_head_kv = 0;
    uint32_t n_expert = 0;  // qwen3moe: the config's num_experts
    bool tied = false;  // config's tie_word_embeddings
    std::function<void(const std::string&)> log;
};

// Every tensor the GGUF file gets, in llama.cpp's order (embeddings, then
// each block, then the output). Throws eh::Error(ModelLoadFailed) naming the
// tensor when a shape or dtype does not fit, or when an expert tensor lacks
// its partner.
std::vector<Planned> plan_tensors(const PlanInput& in, const std::map<std::string, SafeTensor>& st);

// Streams one planned tensor as `type` to the sink.
void write_planned(const Planned& p, const std::map<std::string, SafeTensor>& st, uint32_t type, WorkerPool& pool,
                   model::ByteSink& sink);

}  // namespace eh::tools
