#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include <engine_host/quant_blocks.hpp>

#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/model_file.hpp"
#include "eh/tools/forge.hpp"
#include "eh/tools/profiles.hpp"
#include "eh/tokenizer/chat_template.hpp"
#include "eh/error.hpp"
#include "tools_test_util.hpp"

using namespace eh::tools;
using eh::tools::test::TempDir;

namespace {

std::string forge_tiny(const TempDir& d, const std::string& profile, uint64_t seed = 7, const std::string& vocab = "") {
    ForgeOptions o;
    o.profile = profile;
    o.out = d.file(profile + "-" + std::to_string(seed) + ".gguf");
    o.seed = seed;
    o.vocab = vocab;
    o.threads = 2;
    forge(o);
    return o.out;
}

std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

class TinyProfile : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(TinyProfile, FileMatchesProfileSpec) {
    TempDir d;
    const auto path = forge_tiny(d, GetParam());
    auto mf = eh::model::ModelFile::open(path);
    auto p = find_profile(GetParam());
    EXPECT_EQ(mf->gguf_version(), 3u);
    EXPECT_EQ(mf->architecture(), p.arch);
    for (const auto& [k, v] : p.metadata) EXPECT_TRUE(mf->has(k)) << k;
    EXPECT_EQ(mf->get_uint("general.file_type"), p.target.file_type());
    EXPECT_EQ(mf->get_uint("general.quantization_version"), 2u);
    for (const char* k : {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"})
        EXPECT_TRUE(mf->has(k)) << k;
    const uint64_t n_vocab = mf->get_string_array("tokenizer.ggml.tokens").size();
    EXPECT_EQ(n_vocab, p.n_vocab);  // the real vocab, padded like the real file

    const auto spec = p.tensors(n_vocab);
    ASSERT_EQ(mf->tensors().size(), spec.size());
    for (size_t i = 0; i < spec.size(); ++i) {
        const eh_tensor& t = mf->tensors()[i];
        EXPECT_EQ(eh::model::to_sv(t.name), spec[i].name);
        EXPECT_EQ(t.type, spec[i].type) << spec[i].name;
        for (size_t dd = 0; dd < spec[i].dims.size(); ++dd) EXPECT_EQ(t.dims[dd], spec[i].dims[dd]) << spec[i].name;
    }
}

TEST_P(TinyProfile, LoadsAndRunsOnCpuReference) {
    TempDir d;
    const auto path = forge_tiny(d, GetParam());
    std::shared_ptr<eh::model::ModelFile> mf = eh::model::ModelFile::open(path);
    eh::loader::LoaderOptions lo;
    lo.isolate_preflight = false;
    eh::Registry reg = eh::loader::discover_plugins(EH_PLUGIN_DIR, lo);
    eh::ModelRequirements need{"gguf", std::string(mf->architecture()), {}};
    for (const auto& t : mf->tensors()) need.tensor_types.push_back(eh::model::tensor_type_name(t.type));
    auto res = reg.resolve(need);
    ASSERT_NE(res.plugin, nullptr) << res.explanation;
    eh::EngineLoadOptions opt;
    opt.n_threads = 2;
    auto model = eh::EngineModel::load(res.plugin->api, path, &mf->view(), mf, opt);
    auto s = model->create_session(64);
    eh_sampling_params sp{};
    sp.struct_size = sizeof(sp);
    sp.top_p = 1.0f;
    sp.repetition_penalty = 1.0f;
    sp.repetition_window = -1;
    s->set_sampling(sp);
    std::vector<int32_t> prompt = {1, 100, 1000, 5000, 20000, 30000};
    s->prefill(prompt);
    int32_t tok = s->sample();
    for (int i = 0; i < 8; ++i) tok = s->decode(tok);
    ASSERT_TRUE(s->has_logits());
    auto logits = s->logits();
    ASSERT_EQ(logits.size(), model->info().vocab_size);
    double sumsq = 0;
    for (float x : logits) {
        ASSERT_TRUE(std::isfinite(x));
        sumsq += double(x) * x;
    }
    EXPECT_GT(sumsq, 0.0);  // activations neither vanish nor blow up
}

INSTANTIATE_TEST_SUITE_P(AllTiny, TinyProfile,
                         ::testing::Values("tiny-qwen2.5-q4_k_m", "tiny-phi-3-q4_k_m", "tiny-gpt-oss-mxfp4",
                                           "tiny-llama-3.1-q4_k_m", "tiny-qwen3-q4_k_m", "tiny-qwen3-moe-q4_k_m",
                                           "tiny-gemma-3-q4_k_m", "tiny-gemma-3-hd256-q4_k_m", "tiny-gpt2-f16",
                                           "tiny-gpt2-q8_0"),
                         [](const auto& info) {
                             std::string n = info.param;
                             for (char& c : n) if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                             return n;
                         });

// The tiny Qwen2.5-VL: the tiny Qwen2.5's tensors under qwen2vl with its
// M-RoPE sections, and a toy qwen2.5vl_merger tower in the converter's layout
// (both temporal kernels, the merger's mm.0 / mm.2 to the model's width).
TEST(Forge, QwenVlProfileWritesItsSectionsAndTower) {
    TempDir d;
    ForgeOptions o;
    o.profile = "tiny-qwen2.5-vl-q4_k_m";
    o.out = d.file("qvl.gguf");
    o.threads = 2;
    EXPECT_THROW(forge(o), eh::Error);  // a vision profile needs --mmproj-out
    o.mmproj_out = d.file("qvl-mmproj.gguf");
    forge(o);
    auto mf = eh::model::ModelFile::open(o.out);
    EXPECT_EQ(mf->architecture(), "qwen2vl");
    EXPECT_EQ(mf->get_uint("qwen2vl.embedding_length"), 64u);
    EXPECT_FALSE(mf->has("qwen2.embedding_length"));
    const eh_value* sec = mf->find("qwen2vl.rope.dimension_sections");
    ASSERT_TRUE(sec && sec->type == EH_VALUE_ARRAY && sec->elem_type == EH_VALUE_I32 && sec->count == 4);
    const auto* v = static_cast<const int32_t*>(sec->v.array);
    EXPECT_EQ(std::vector<int32_t>(v, v + 4), (std::vector<int32_t>{2, 3, 3, 0}));
    auto mm = eh::model::ModelFile::open(o.mmproj_out);
    EXPECT_EQ(mm->architecture(), "clip");
    EXPECT_EQ(mm->get_string("clip.projector_type"), "qwen2.5vl_merger");
    EXPECT_EQ(mm->get_uint("clip.vision.patch_size"), 14u);
    EXPECT_EQ(mm->get_uint("clip.vision.projection_dim"), 64u);
    bool frame1 = false, mm2 = false;
    for (const auto& t : mm->tensors()) {
        frame1 = frame1 || eh::model::to_sv(t.name) == "v.patch_embd.weight.1";
        if (eh::model::to_sv(t.name) == "mm.2.weight") mm2 = t.dims[0] == 128 && t.dims[1] == 64;
    }
    EXPECT_TRUE(frame1);
    EXPECT_TRUE(mm2);
}

// Qwen2.5-VL 7B: the text model of that size under qwen2vl with the 7B's
// sections (16, 24, 24 of 64), a vision profile; and a tower of any shape
// (write_qwen25vl_tower) has that shape's keys and F16 matrices when asked,
// a few blocks of the 7B's width standing in for its 32.
TEST(Forge, QwenVl7bProfileAndTowerShapes) {
    const Profile p = find_profile("qwen2.5-vl-7b-instruct-q4_k_m");
    EXPECT_TRUE(p.vision);
    EXPECT_FALSE(p.tiny);
    EXPECT_EQ(p.arch, "qwen2vl");
    EXPECT_EQ(p.shape.n_embd, 3584u);
    EXPECT_EQ(p.shape.n_layer, 28u);
    EXPECT_EQ(p.shape.head_dim, 128u);
    bool sections = false;
    for (const auto& [k, v] : p.metadata)
        if (k == "qwen2vl.rope.dimension_sections" && v.count() == 4 && v.bytes().size() == 16) {
            int32_t x[4];
            std::memcpy(x, v.bytes().data(), 16);
            sections = x[0] == 16 && x[1] == 24 && x[2] == 24 && x[3] == 0;
        }
    EXPECT_TRUE(sections);
    TempDir d;
    const std::string path = d.file("tower.gguf");
    eh::tools::write_qwen25vl_tower(path, 3584, 1, {"test", 14, 1280, 3420, 2, 16, 8, true});
    auto mm = eh::model::ModelFile::open(path);
    EXPECT_EQ(mm->get_string("clip.projector_type"), "qwen2.5vl_merger");
    EXPECT_EQ(mm->get_uint("clip.vision.embedding_length"), 1280u);
    EXPECT_EQ(mm->get_uint("clip.vision.feed_forward_length"), 3420u);
    EXPECT_EQ(mm->get_uint("clip.vision.attention.head_count"), 16u);
    EXPECT_EQ(mm->get_uint("clip.vision.n_wa_pattern"), 8u);
    EXPECT_EQ(mm->get_uint("clip.vision.projection_dim"), 3584u);
    size_t half = 0, blocks = 0;
    for (const auto& t : mm->tensors()) {
        const std::string_view n = eh::model::to_sv(t.name);
        if (n.size() > 2 && t.n_dims >= 2) half += t.type == EH_TYPE_F16;
        if (n == "v.blk.1.ffn_down.weight") blocks = t.dims[0] == 3420 && t.dims[1] == 1280;
    }
    EXPECT_EQ(half, 2u + 2u * 7u + 2u);  // patch kernels, 7 matrices a block, mm.0 and mm.2
    EXPECT_EQ(blocks, 1u);
}

// The real-size Gemma 3 vision profiles (4B, 12B): the text model of that
// size with Gemma's image control tokens, and a vision tower that --mmproj-out
// must name (write_gemma3_siglip_mmproj, checked on the GPU machine by
// scripts/device-vision.sh, where llama.cpp loads the same file).
TEST(Forge, RealGemma3VisionProfilesNeedTheirTower) {
    for (const char* name : {"gemma-3-4b-it-vision-q4_k_m", "gemma-3-12b-it-vision-q4_k_m"}) {
        const Profile p = find_profile(name);
        EXPECT_TRUE(p.vision) << name;
        EXPECT_FALSE(p.tiny) << name;
        EXPECT_EQ(p.arch, "gemma3");
        EXPECT_EQ(p.shape.n_embd, std::string(name).find("-4b-") != std::string::npos ? 2560u : 3840u);
        bool soft = false;
        for (const auto& [id, text] : p.control_tokens) soft = soft || text == "<image_soft_token>";
        EXPECT_TRUE(soft) << name;
        TempDir d;
        ForgeOptions o;
        o.profile = name;
        o.out = d.file("m.gguf");
        o.vocab = "none";
        EXPECT_THROW(forge(o), eh::Error) << "a vision profile needs --mmproj-out";
    }
    EXPECT_FALSE(find_profile("gemma-3-4b-it-q4_k_m").vision);
}

TEST(Forge, SameSeedSameBytesOtherSeedOtherWeights) {
    TempDir d;
    const auto a = slurp(forge_tiny(d, "tiny-gpt2-q8_0", 1));
    ForgeOptions o{"tiny-gpt2-q8_0", d.file("again.gguf"), 1, "", 1, {}};  // one thread: layout-independent
    forge(o);
    EXPECT_EQ(a, slurp(o.out));
    EXPECT_NE(a, slurp(forge_tiny(d, "tiny-gpt2-q8_0", 2)));
}

TEST(Forge, WeightsHaveRealisticScale) {
    TempDir d;
    auto mf = eh::model::ModelFile::open(forge_tiny(d, "tiny-gpt2-f16"));
    auto stats = [&](const char* name) {
        const eh_tensor* t = mf->find_tensor(name);
        uint64_t n = 1;
        for (uint32_t i = 0; i < t->n_dims; ++i) n *= t->dims[i];
        std::vector<float> v(n);
        EXPECT_TRUE(ehp::quant::dequantize_row(t->type, t->data, v.data(), n));
        double s = 0, s2 = 0;
        for (float x : v) { s += x; s2 += double(x) * x; }
        const double mean = s / n;
        return std::pair<double, double>(mean, std::sqrt(s2 / n - mean * mean));
    };
    auto [m0, sd0] = stats("token_embd.weight");
    EXPECT_NEAR(m0, 0.0, 0.001);
    EXPECT_NEAR(sd0, 0.02, 0.002);
    auto [m1, sd1] = stats("blk.0.attn_norm.weight");
    EXPECT_NEAR(m1, 1.0, 0.01);
    EXPECT_LT(sd1, 0.05);
}

TEST(Forge, SyntheticVocabWhenAskedAndErrorsNameTheProblem) {
    TempDir d;
    auto mf = eh::model::ModelFile::open(forge_tiny(d, "tiny-gpt2-f16", 3, "none"));
    EXPECT_EQ(mf->get_string("tokenizer.ggml.model"), "none");
    ForgeOptions bad{"no-such-profile", d.file("x.gguf"), 0, "", 1, {}};
    EXPECT_THROW(forge(bad), eh::Error);
    ForgeOptions missing{"tiny-gpt2-f16", d.file("y.gguf"), 0, d.file("missing.json"), 1, {}};
    EXPECT_THROW(forge(missing), eh::Error);
    EXPECT_FALSE(std::filesystem::exists(d.file("y.gguf")));
}

// The Gemma 3 profiles stand in a SentencePiece vocabulary padded to Gemma's
// 262,144 ids, with Gemma's no-space-prefix flag, and carry a turn template
// of ours that our Jinja engine renders in Gemma's <start_of_turn> form.
TEST(Forge, Gemma3VocabularyAndTemplate) {
    TempDir d;
    auto mf = eh::model::ModelFile::open(forge_tiny(d, "tiny-gemma-3-q4_k_m"));
    EXPECT_EQ(mf->get_string("tokenizer.ggml.model"), "llama");
    EXPECT_EQ(mf->get_string_array("tokenizer.ggml.tokens").size(), 262144u);
    const eh_value* prefix = mf->find("tokenizer.ggml.add_space_prefix");
    ASSERT_NE(prefix, nullptr);
    EXPECT_EQ(prefix->v.u64, 0u);
    const auto tmpl = mf->get_string("tokenizer.chat_template");
    ASSERT_TRUE(tmpl);
    eh::tokenizer::ChatOptions o;
    o.bos_token = "<s>";
    EXPECT_EQ(eh::tokenizer::ChatTemplate::compile(*tmpl)->render(R"([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"}])", o),
              "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
              "<start_of_turn>model\nHello.<end_of_turn>\n"
              "<start_of_turn>user\nBye<end_of_turn>\n"
              "<start_of_turn>model\n");
}

