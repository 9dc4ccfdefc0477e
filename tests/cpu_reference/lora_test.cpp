// ABI 1.6's LoRA adapters on the CPU reference, with stories260K and a forged
// adapter written by the project's GGUF writer: the adapted logits equal a
// merged-weights model's (W + s B A, run without an adapter); sequences of
// different adapters (and none) in one step get what each gets alone; a
// fork keeps its source's adapter; the rules of seq_set_adapter; adapters
// that do not fit the model are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "eh/model/model_file.hpp"

#include "batched_model.hpp"
#include "lora_forge.hpp"
#include "plugin_handle.hpp"

namespace {

using namespace cpuref_test;

const std::string kStories = std::string(EH_TESTDATA_DIR) + "/models/stories260K.gguf";

std::vector<lora_forge::Target> every_kind() {
    return {{"blk.0.attn_q.weight", 4, EH_TYPE_F32},   {"blk.0.attn_k.weight", 2, EH_TYPE_F32},
            {"blk.1.attn_v.weight", 8, EH_TYPE_F16},   {"blk.2.attn_output.weight", 4, EH_TYPE_F32},
            {"blk.3.ffn_gate.weight", 32, EH_TYPE_Q8_0}, {"blk.3.ffn_up.weight", 4, EH_TYPE_BF16},
            {"blk.4.ffn_down.weight", 4, EH_TYPE_F32},  {"output.weight", 2, EH_TYPE_F32}};
}

struct LoadedAdapter {
    std::unique_ptr<eh::model::ModelFile> file;
    eh_adapter* adapter = nullptr;
    ~LoadedAdapter() {
        if (adapter) plugin().adapter_release(adapter);
    }
};

eh_status load_adapter(BatchedModel& m, const std::vector<uint8_t>& gguf, float scale, float alpha,
                       LoadedAdapter& out) {
    out.file = eh::model::ModelFile::open_gguf_buffer(gguf.data(), gguf.size(), "adapter");
    eh_adapter_params p{};
    p.struct_size = sizeof(p);
    p.view = &out.file->view();
    p.scale = scale;
    p.alpha = alpha;
    return plugin().adapter_load(m.model, &p, &out.adapter);
}

std::vector<int32_t> prompt(uint32_t n, uint32_t salt = 0) {
    std::vector<int32_t> p(n);
    for (uint32_t i = 0; i < n; ++i) p[i] = int32_t((i * 37 + 11 + salt * 101) % 512);
    return p;
}

// Logits after a prompt (one step) and after `decode` more greedy tokens.
std::vector<std::vector<float>> run(BatchedModel& m, eh_adapter* a, const std::vector<int32_t>& p, int decode) {
    eh_seq* s = m.create();
    if (a) {
        EXPECT_EQ(plugin().seq_set_adapter(s, a), EH_OK) << m.error();
    }
    std::vector<std::vector<float>> out;
    eh_step_entry e = entry(s, p.data(), uint32_t(p.size()));
    EXPECT_EQ(plugin().step(m.model, &e, 1), EH_OK) << m.error();
    out.push_back(m.logits(s));
    for (int i = 0; i < decode; ++i) {
        const int32_t t = e.token;
        e = entry(s, &t, 1);
        EXPECT_EQ(plugin().step(m.model, &e, 1), EH_OK) << m.error();
        out.push_back(m.logits(s));
    }
    m.release(s);
    return out;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
}

TEST(Stories260K, LoraLogitsEqualMergedWeights) {
    auto base = eh::model::ModelFile::open(kStories);
    const auto ad = lora_forge::forge(*base, every_kind(), 16.0f, 7);
    const float scale = 0.75f;
    lora_forge::MergedView merged(*base, ad, scale);

    BatchedModel m(&base->view());
    LoadedAdapter la;
    ASSERT_EQ(load_adapter(m, ad.gguf(), scale, ad.alpha, la), EH_OK) << m.error();
    const auto p = prompt(20);
    const auto adapted = run(m, la.adapter, p, 6);
    const auto plain = run(m, nullptr, p, 6);

    BatchedModel mm(&merged.view);
    const auto want = run(mm, nullptr, p, 6);
    ASSERT_EQ(adapted.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_LT(max_diff(adapted[i], want[i]), 2e-4f) << "position " << i;
        // and the adapter changes them (the check above would pass for a no-op adapter on a no-op merge)
        EXPECT_GT(max_diff(plain[i], want[i]), 0.05f) << "position " << i;
    }
}

// Without alpha the scale is the user's alone.
TEST(Stories260K, LoraWithoutAlphaScalesByTheUsersScale) {
    auto base = eh::model::ModelFile::open(kStories);
    const auto ad = lora_forge::forge(*base, {{"blk.1.attn_q.weight", 4}, {"blk.2.ffn_down.weight", 3}}, 0.0f, 3);
    lora_forge::MergedView merged(*base, ad, 2.0f);
    BatchedModel m(&base->view()), mm(&merged.view);
    LoadedAdapter la;
    ASSERT_EQ(load_adapter(m, ad.gguf(), 2.0f, 0.0f, la), EH_OK) << m.error();
    const auto p = prompt(12, 1);
    EXPECT_LT(max_diff(run(m, la.adapter, p, 0)[0], run(mm, nullptr, p, 0)[0]), 2e-4f);
}

TEST(Stories260K, LoraMixedAdaptersInOneStepEqualEachAlone) {
    auto base = eh::model::ModelFile::open(kStories);
    const auto a1 = lora_forge::forge(*base, every_kind(), 16.0f, 1);
    const auto a2 = lora_forge::forge(*base, {{"blk.0.attn_q.weight", 8}, {"blk.4.ffn_up.weight", 4}}, 8.0f, 2);
    BatchedModel m(&base->view());
    LoadedAdapter l1, l2;
    ASSERT_EQ(load_adapter(m, a1.gguf(), 1.0f, a1.alpha, l1), EH_OK) << m.error();
    ASSERT_EQ(load_adapter(m, a2.gguf(), 0.5f, a2.alpha, l2), EH_OK) << m.error();
    eh_adapter* which[4] = {l1.adapter, nullptr, l2.adapter, l1.adapter};

    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::vector<float>> alone;
    for (int i = 0; i < 4; ++i) {
        prompts.push_back(prompt(9 + 3 * i, i));
        alone.push_back(run(m, which[i], prompts[i], 0)[0]);
    }
    std::vector<eh_seq*> seqs;
    std::vector<eh_step_entry> es;
    for (int i = 0; i < 4; ++i) {
        seqs.push_back(m.create());
        if (which[i]) {
            ASSERT_EQ(plugin().seq_set_adapter(seqs[i], which[i]), EH_OK) << m.error();
        }
        es.push_back(entry(seqs[i], prompts[i].data(), uint32_t(prompts[i].size())));
    }
    ASSERT_EQ(plugin().step(m.model, es.data(), 4), EH_OK) << m.error();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(m.logits(seqs[i]), alone[i]) << "entry " << i;  // bit for bit
    EXPECT_GT(max_diff(alone[0], alone[3]), 0.0f);  // same adapter, different prompts: the check can fail
    EXPECT_NE(alone[0], run(m, nullptr, prompts[0], 0)[0]);
}

TEST(Stories260K, LoraForkKeepsTheAdapterAndSetAdapterGuardsTheKv) {
    auto base = eh::model::ModelFile::open(kStories);
    const auto ad = lora_forge::forge(*base, every_kind(), 16.0f, 5);
    BatchedModel m(&base->view());
    LoadedAdapter la, lb;
    ASSERT_EQ(load_adapter(m, ad.gguf(), 1.0f, ad.alpha, la), EH_OK) << m.error();
    ASSERT_EQ(load_adapter(m, ad.gguf(), 0.25f, ad.alpha, lb), EH_OK) << m.error();
    const auto p = prompt(24, 3);
    const auto want = run(m, la.adapter, p, 1);  // prompt, then one decode

    eh_seq* s = m.create();
    ASSERT_EQ(plugin().seq_set_adapter(s, la.adapter), EH_OK) << m.error();
    eh_step_entry e = entry(s, p.data(), uint32_t(p.size()));
    ASSERT_EQ(plugin().step(m.model, &e, 1), EH_OK) << m.error();
    const int32_t next = e.token;
    // Its KV was computed with la: another adapter (or none) is refused, the same one is fine.
    EXPECT_EQ(plugin().seq_set_adapter(s, lb.adapter), EH_INVALID_ARGUMENT);
    EXPECT_NE(m.error().find("another adapter"), std::string::npos) << m.error();
    EXPECT_EQ(plugin().seq_set_adapter(s, nullptr), EH_INVALID_ARGUMENT);
    EXPECT_EQ(plugin().seq_set_adapter(s, la.adapter), EH_OK) << m.error();

    eh_seq* f = nullptr;
    ASSERT_EQ(plugin().seq_fork(s, uint32_t(p.size()), &f), EH_OK) << m.error();
    m.seqs.push_back(f);
    eh_sampling_params g = greedy_params();
    ASSERT_EQ(plugin().seq_set_sampling(f, &g), EH_OK);
    e = entry(f, &next, 1);
    ASSERT_EQ(plugin().step(m.model, &e, 1), EH_OK) << m.error();
    EXPECT_EQ(m.logits(f), want[1]);  // computed with la, as its source

    // Emptied, a sequence may change adapter.
    ASSERT_EQ(plugin().seq_truncate(s, 0), EH_OK);
    EXPECT_EQ(plugin().seq_set_adapter(s, lb.adapter), EH_OK) << m.error();
}

TEST(Stories260K, LoraAdaptersThatDoNotFitAreRefusedByName) {
    auto base = eh::model::ModelFile::open(kStories);
    BatchedModel m(&base->view());
    auto expect_refused = [&](const std::vector<uint8_t>& gguf, eh_status st, const std::string& words) {
        LoadedAdapter la;
        EXPECT_EQ(load_adapter(m, gguf, 1.0f, 0.0f, la), st) << words;
        EXPECT_EQ(la.adapter, nullptr);
        EXPECT_NE(m.error().find(words), std::string::npos) << m.error();
    };
    auto ad = lora_forge::forge(*base, {{"blk.0.attn_q.weight", 4}}, 8.0f, 9);

    auto other = ad;
    other.architecture = "qwen2";
    expect_refused(other.gguf(), EH_MODEL_LOAD_FAILED, "architecture 'qwen2' is not the model's 'llama'");

    auto missing = ad;
    missing.pairs[0].name = "blk.9.attn_q.weight";
    expect_refused(missing.gguf(), EH_MODEL_LOAD_FAILED, "'blk.9.attn_q.weight' is not a tensor of the model");

    // lora_b of the wrong height: {r, 32} for a {64, 64} weight
    auto shape = ad;
    shape.pairs[0].n_out = 32;
    shape.pairs[0].b_bytes.resize(32 * 4 * 4);
    expect_refused(shape.gguf(), EH_MODEL_LOAD_FAILED, "'blk.0.attn_q.weight': lora_a is {64, 4} and lora_b {4, 32}");

    eh::model::GgufWriter half;
    half.set("general.architecture", eh::model::GgufValue::string("llama"));
    half.set("general.type", eh::model::GgufValue::string("adapter"));
    half.set("adapter.type", eh::model::GgufValue::string("lora"));
    half.add_tensor("blk.0.attn_q.weight.lora_a", EH_TYPE_F32, {64, 4}, ad.pairs[0].a_bytes.data());
    expect_refused(half.to_bytes(), EH_MODEL_LOAD_FAILED, "'blk.0.attn_q.weight.lora_b' is missing");

    eh::model::GgufWriter model_file;  // a model, not an adapter
    model_file.set("general.architecture", eh::model::GgufValue::string("llama"));
    expect_refused(model_file.to_bytes(), EH_MODEL_LOAD_FAILED, "general.type must be 'adapter'");

    auto embd = lora_forge::forge(*base, {{"token_embd.weight", 2}}, 0.0f, 1);
    expect_refused(embd.gguf(), EH_UNSUPPORTED, "'token_embd.weight' (an adapter of the token embeddings) is not supported");
}

}  // namespace

namespace {

// A llama served from a Hugging Face directory keeps q/k rows in HF order,
// while a GGUF adapter's lora_b follows GGUF's RoPE permutation: adapting
// attn_q / attn_k there is refused by name; other weights adapt as on the
// GGUF of the same model.
TEST(LoraHfDirectory, LlamaQkRefusedOthersMatchTheGguf) {
    const std::string dir = std::string(CPUREF_REFERENCE_DIR) + "/llama";
    auto hf = eh::model::ModelFile::open(dir + "/hf");
    auto gguf = eh::model::ModelFile::open(dir + "/model.gguf");
    BatchedModel mh(&hf->view()), mg(&gguf->view());

    const auto qk = lora_forge::forge(*gguf, {{"blk.0.attn_q.weight", 4}}, 8.0f, 1);
    LoadedAdapter refused;
    EXPECT_EQ(load_adapter(mh, qk.gguf(), 1.0f, qk.alpha, refused), EH_UNSUPPORTED);
    EXPECT_NE(mh.error().find("'blk.0.attn_q.weight' of a llama served from a Hugging Face directory"),
              std::string::npos)
        << mh.error();

    const auto ad = lora_forge::forge(*gguf, {{"blk.0.attn_v.weight", 4}, {"blk.1.ffn_down.weight", 4},
                                              {"blk.1.attn_output.weight", 2}, {"output.weight", 4}},
                                      8.0f, 2);
    LoadedAdapter lh, lg;
    ASSERT_EQ(load_adapter(mh, ad.gguf(), 1.0f, ad.alpha, lh), EH_OK) << mh.error();
    ASSERT_EQ(load_adapter(mg, ad.gguf(), 1.0f, ad.alpha, lg), EH_OK) << mg.error();
    const std::vector<int32_t> p = {1, 17, 93, 4, 250, 31, 31, 7};
    const auto from_hf = run(mh, lh.adapter, p, 3), from_gguf = run(mg, lg.adapter, p, 3);
    const auto base = run(mg, nullptr, p, 0);
    for (size_t i = 0; i < from_gguf.size(); ++i) EXPECT_LT(max_diff(from_hf[i], from_gguf[i]), 1e-4f) << i;
    EXPECT_GT(max_diff(from_gguf[0], base[0]), 1e-3f);
}

}  // namespace
