// The LoRA adapter reader (plugin-sdk engine_host/lora_adapter.hpp) on GGUF
// files written by the project's writer: what llama.cpp's format carries is
// read (pairs, ranks, alpha, ignored norm tensors), and every way a file can
// break the format or miss the model is refused with words naming it.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <engine_host/lora_adapter.hpp>

#include "eh/model/gguf_writer.hpp"
#include "eh/model/model_file.hpp"
#include "lora_fuzz_base.hpp"

namespace {

using eh::model::GgufValue;
using eh::model::GgufWriter;
using eh::model::ModelFile;

const std::vector<uint8_t> kZeros(200000, 0);  // the largest tensor below: {32, 1025} F32

std::unique_ptr<ModelFile> base() {
    static const auto bytes = eh::model::testing::lora_fuzz_base_bytes();
    return ModelFile::open_gguf_buffer(bytes.data(), bytes.size(), "base.gguf");
}

// An adapter with `edit` applied to its writer before the tensors are added.
std::vector<uint8_t> adapter(const std::function<void(GgufWriter&)>& edit, bool header = true) {
    GgufWriter w;
    if (header) {
        w.set("general.architecture", GgufValue::string("llama"));
        w.set("general.type", GgufValue::string("adapter"));
        w.set("adapter.type", GgufValue::string("lora"));
    }
    edit(w);
    return w.to_bytes();
}

void pair(GgufWriter& w, const std::string& name, uint64_t n_in, uint64_t r, uint64_t r_b, uint64_t n_out,
          uint32_t type = EH_TYPE_F32) {
    w.add_tensor(name + ".lora_a", type, {n_in, r}, kZeros.data());
    w.add_tensor(name + ".lora_b", type, {r_b, n_out}, kZeros.data());
}

std::string refusal(const std::vector<uint8_t>& bytes, eh_status want = EH_MODEL_LOAD_FAILED) {
    auto f = ModelFile::open_gguf_buffer(bytes.data(), bytes.size(), "adapter.gguf");
    auto b = base();
    try {
        ehp::read_lora_adapter(f->view(), b->view());
    } catch (const ehp::Error& e) {
        EXPECT_EQ(e.status(), want) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "accepted";
    return "";
}

TEST(LoraAdapter, ReadsPairsRanksAlphaAndIgnoresNorms) {
    const auto bytes = eh::model::testing::lora_fuzz_seed_bytes(EH_TYPE_F16, 8, true);
    auto f = ModelFile::open_gguf_buffer(bytes.data(), bytes.size(), "adapter.gguf");
    auto b = base();
    const ehp::LoraAdapterInfo info = ehp::read_lora_adapter(f->view(), b->view());
    EXPECT_FLOAT_EQ(info.alpha, 16.0f);
    ASSERT_EQ(info.pairs.size(), 2u);
    EXPECT_EQ(info.pairs[0].base, "blk.0.attn_q.weight");  // sorted by name
    EXPECT_EQ(info.pairs[0].n_in, 32u);
    EXPECT_EQ(info.pairs[0].n_out, 16u);
    EXPECT_EQ(info.pairs[0].rank, 8u);
    EXPECT_EQ(info.pairs[1].base, "output.weight");
    EXPECT_EQ(info.max_rank, 8u);
    EXPECT_EQ(info.ignored, std::vector<std::string>{"blk.0.attn_norm.weight"});
    EXPECT_EQ(info.pairs[1].w, b->find_tensor("output.weight"));

    const auto no_alpha = eh::model::testing::lora_fuzz_seed_bytes(EH_TYPE_F32, 4, false);
    auto g = ModelFile::open_gguf_buffer(no_alpha.data(), no_alpha.size(), "adapter.gguf");
    EXPECT_EQ(ehp::read_lora_adapter(g->view(), b->view()).alpha, 0.0f);
}

TEST(LoraAdapter, RefusesWhatBreaksTheFormatByName) {
    EXPECT_NE(refusal(adapter([](GgufWriter& w) {
                  w.set("general.architecture", GgufValue::string("llama"));
                  w.set("general.type", GgufValue::string("model"));
              }, false)).find("general.type must be 'adapter' (got 'model')"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) {
                  w.set("general.architecture", GgufValue::string("llama"));
                  w.set("general.type", GgufValue::string("adapter"));
                  w.set("adapter.type", GgufValue::string("control_vector"));
              }, false)).find("adapter.type must be 'lora' (got 'control_vector')"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) {
                  w.set("adapter.lora.alpha", GgufValue::f32(-1.0f));
                  pair(w, "output.weight", 32, 4, 4, 8);
              })).find("adapter.lora.alpha must be a finite number"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) { w.add_tensor("blk.0.attn_q.weight", EH_TYPE_F32, {32, 16}, kZeros.data()); }))
                  .find("tensor 'blk.0.attn_q.weight' is neither a .lora_a nor a .lora_b tensor"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter&) {})).find("no .lora_a / .lora_b tensor pairs"), std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) { pair(w, "output.weight", 32, 4, 2, 8); }))
                  .find("'output.weight': the ranks disagree (lora_a has 4, lora_b 2)"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) { pair(w, "output.weight", 32, 32, 32, 8, EH_TYPE_Q4_0); }))
                  .find("adapters are F32, F16, BF16 or Q8_0"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) { pair(w, "output.weight", 32, 1025, 1025, 8); }))
                  .find("rank 1025 is outside 1..1024"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) {
                  w.add_tensor("output.weight.lora_a", EH_TYPE_F32, {32, 4, 1, 2}, kZeros.data());
                  w.add_tensor("output.weight.lora_b", EH_TYPE_F32, {4, 8}, kZeros.data());
              })).find("tensor 'output.weight.lora_a' must have 2 dimensions, has 4"),
              std::string::npos);
}

TEST(LoraAdapter, RefusesWhatTheModelLacksOrEngineHostDoesNotServe) {
    EXPECT_NE(refusal(adapter([](GgufWriter& w) { pair(w, "blk.0.attn_q.weight", 16, 4, 4, 16); }))
                  .find("lora_a is {16, 4} and lora_b {4, 16}; the model's weight is {32, 16}"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) { pair(w, "blk.7.attn_q.weight", 32, 4, 4, 16); }))
                  .find("'blk.7.attn_q.weight' is not a tensor of the model"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) { pair(w, "blk.0.ffn_up_exps.weight", 32, 4, 4, 8); }),
                      EH_UNSUPPORTED)
                  .find("'blk.0.ffn_up_exps.weight' has 3 dimensions; only 2-D weights are adapted"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) {
                  w.set("adapter.alora.invocation_tokens", GgufValue::array(std::vector<uint32_t>{1, 2}));
                  pair(w, "output.weight", 32, 4, 4, 8);
              }),
                      EH_UNSUPPORTED)
                  .find("activated LoRA"),
              std::string::npos);
    EXPECT_NE(refusal(adapter([](GgufWriter& w) {
                  w.set("general.architecture", GgufValue::string("qwen2"));
                  w.set("general.type", GgufValue::string("adapter"));
                  w.set("adapter.type", GgufValue::string("lora"));
                  pair(w, "output.weight", 32, 4, 4, 8);
              }, false)).find("its architecture 'qwen2' is not the model's 'llama'"),
              std::string::npos);
}

}  // namespace
