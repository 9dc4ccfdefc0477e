// A real trained model: stories260K (llama2.c's 260K-parameter TinyStories
// model, llama GGUF, F32), opened by the host's GGUF reader and run through
// the plugin ABI.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <eh/model/model_file.hpp>

#include "plugin_handle.hpp"

using namespace cpuref_test;

namespace {

const std::string kStories = std::string(EH_TESTDATA_DIR) + "/models/stories260K.gguf";

// BOS (1) then "Once upon a time" in the model's 512-piece SentencePiece
// vocabulary: "▁Once" 403, "▁upon" 407, "▁a" 261, "▁time" 378. Found by
// merging the GGUF's tokenizer.ggml.tokens by their scores (SPM BPE); each
// word is a single piece.
const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378};

std::vector<int32_t> greedy(const eh_model_view* view, size_t n_new, uint32_t n_threads = 2) {
    const eh_plugin_api& api = plugin();
    eh_load_params lp = load_params(view, n_threads);
    eh_model* m = nullptr;
    if (api.model_load(&lp, &m) != EH_OK) throw std::runtime_error(api.plugin_last_error());
    eh_session_params sp{};
    sp.struct_size = sizeof(sp);
    sp.n_ctx = 128;
    eh_session* s = nullptr;
    api.session_create(m, &sp, &s);
    eh_sampling_params g = greedy_params();
    api.session_set_sampling(s, &g);
    api.session_prefill(s, kPrompt.data(), static_cast<uint32_t>(kPrompt.size()));
    std::vector<int32_t> out;
    int32_t t;
    api.session_sample(s, &t);
    while (out.size() < n_new) {
        out.push_back(t);
        api.session_decode(s, t, &t);
    }
    api.session_release(s);
    api.model_release(m);
    return out;
}

std::string detok(const eh::model::ModelFile& f, const std::vector<int32_t>& ids) {
    auto vocab = f.get_string_array("tokenizer.ggml.tokens");
    std::string text;
    for (int32_t id : ids) {
        std::string piece(eh::model::to_sv(vocab[static_cast<size_t>(id)]));
        for (size_t p; (p = piece.find("\xE2\x96\x81")) != std::string::npos;) piece.replace(p, 3, " ");
        text += piece;
    }
    return text;
}

}  // namespace

TEST(Stories260K, GreedyContinuationIsSensibleAndDeterministic) {
    if (!std::filesystem::exists(kStories)) GTEST_SKIP() << "missing " << kStories;
    auto file = eh::model::ModelFile::open(kStories);
    const std::vector<int32_t> a = greedy(&file->view(), 24, 2);
    const std::vector<int32_t> b = greedy(&file->view(), 24, 1);  // thread count must not matter
    EXPECT_EQ(a, b);
    const std::string text = detok(*file, a);
    std::printf("stories260K: \"Once upon a time%s\"\n  ids:", text.c_str());
    for (int32_t id : a) std::printf(" %d", id);
    std::printf("\n");
    // llama2.c's stories models continue this prompt with a comma and a
    // short story sentence
    EXPECT_EQ(text.rfind(",", 0), 0u) << text;
    EXPECT_NE(text.find(" there"), std::string::npos) << text;
    // Regression: what this plugin produced when first verified (text:
    // ", there was a little girl named Lily. She loved to play outside in
    // the p"). tests/reference/make_reference.py records HF transformers'
    // greedy ids for the same prompt; hf_reference_test checks those.
    const std::vector<int32_t> expected = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
                                           401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282};
    EXPECT_EQ(a, expected);
}

TEST(Stories260K, DecodeSpeed) {
    // Reported, not asserted (no timed assertions).
    if (!std::filesystem::exists(kStories)) GTEST_SKIP() << "missing " << kStories;
    auto file = eh::model::ModelFile::open(kStories);
    const eh_plugin_api& api = plugin();
    for (uint32_t threads : {1u, 2u}) {
        eh_load_params lp = load_params(&file->view(), threads);
        eh_model* m = nullptr;
        ASSERT_EQ(api.model_load(&lp, &m), EH_OK);
        eh_session_params sp{};
        sp.struct_size = sizeof(sp);
        sp.n_ctx = 512;
        eh_session* s = nullptr;
        ASSERT_EQ(api.session_create(m, &sp, &s), EH_OK);
        eh_sampling_params g = greedy_params();
        api.session_set_sampling(s, &g);
        api.session_prefill(s, kPrompt.data(), static_cast<uint32_t>(kPrompt.size()));
        int32_t t;
        api.session_sample(s, &t);
        const int n = 256;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) ASSERT_EQ(api.session_decode(s, t, &t), EH_OK);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("stories260K decode: %d tokens in %.3f s = %.0f tok/s (%u thread%s, context 5..%d)\n", n, sec,
                    n / sec, threads, threads > 1 ? "s" : "", 5 + n);
        api.session_release(s);
        api.model_release(m);
    }
}
