// Images in, the service's part: which plugin tables take images (ABI 1.6's
// three calls, all of them, from a 1.6-sized table beside the batched step),
// the prompt forms known per architecture, and place_images' refusals. The
// whole path (markers, expansion, spans, cache keys) runs in
// tests/http/vision_e2e_test.cpp against the CPU reference.
#include <gtest/gtest.h>

#include "eh/loader/plugin_loader.hpp"
#include "eh/service/chat_prompt.hpp"
#include "eh/service/image_encoder.hpp"
#include "eh/service/image_prompt.hpp"

using namespace eh::service;

TEST(ImageEncoder, OnlyA16TableWithAllThreeCallsTakesImages) {
    eh_plugin_api api{};
    api.abi_major = 1;
    api.abi_minor = 6;
    api.struct_size = sizeof(eh_plugin_api);
    api.step = [](eh_model*, eh_step_entry*, uint32_t) { return EH_OK; };
    api.image_encoder_load = [](eh_model*, const eh_model_view*, eh_image_encoder_info*) { return EH_OK; };
    api.image_encode = [](eh_model*, const float*, float*) { return EH_OK; };
    api.seq_embd_spans = [](eh_seq*, const eh_embd_span*, uint32_t) { return EH_OK; };
    EXPECT_TRUE(plugin_takes_images(api));
    api.abi_minor = 5;
    EXPECT_FALSE(plugin_takes_images(api));
    api.abi_minor = 6;
    api.struct_size = uint32_t(offsetof(eh_plugin_api, image_encoder_load));
    EXPECT_FALSE(plugin_takes_images(api));
    api.struct_size = sizeof(eh_plugin_api);
    api.seq_embd_spans = nullptr;
    EXPECT_FALSE(plugin_takes_images(api));
    api.seq_embd_spans = [](eh_seq*, const eh_embd_span*, uint32_t) { return EH_OK; };
    api.step = nullptr;  // only beside the batched step
    EXPECT_FALSE(plugin_takes_images(api));
}

TEST(ImageEncoder, PromptFormsByArchitecture) {
    const ImagePrompt g = image_prompt_for("gemma3");
    EXPECT_EQ(g.before, "\n\n<start_of_image>");
    EXPECT_EQ(g.token, "<image_soft_token>");
    EXPECT_EQ(g.after, "<end_of_image>\n\n");
    const ImagePrompt q = image_prompt_for("qwen2vl");  // Qwen2-VL / Qwen2.5-VL
    EXPECT_EQ(q.before, "<|vision_start|>");
    EXPECT_EQ(q.token, "<|image_pad|>");
    EXPECT_EQ(q.after, "<|vision_end|>");
    EXPECT_EQ(q.filter, eh::image::Filter::Bicubic);
    EXPECT_EQ(g.filter, eh::image::Filter::Bilinear);
    try {
        image_prompt_for("llama");
        FAIL() << "llama has no image prompt";
    } catch (const eh::Error& e) {
        EXPECT_NE(std::string(e.what()).find("'llama'"), std::string::npos) << e.what();
    }
}

TEST(ImagePrompt, WithoutAnEncoderARequestWithImagesIsRefused) {
    GenerationRequest req;
    req.prompt = std::string("look: ") + std::string(kImageMarker);
    req.images.push_back(std::make_shared<const eh::image::Rgb8>(eh::image::Rgb8{1, 1, {1, 2, 3}}));
    ByteCodec codec;
    Job job;
    try {
        place_images(req, nullptr, codec, 2048, job);
        FAIL() << "no encoder, yet the image was placed";
    } catch (const RequestError& e) {
        EXPECT_EQ(e.field(), "messages");
        EXPECT_NE(std::string(e.what()).find("--mmproj"), std::string::npos) << e.what();
    }
}

TEST(ImagePrompt, AMessagesOwnMarkerTextIsNoImage) {
    // ChatLiterals marks a message's own U+E000, so its copy of the marker
    // is a literal span: mark() then unmark() keeps it literal.
    ChatLiterals lit({"<start_of_image>"});
    ChatMessage m;
    m.role = "user";
    m.content = std::string("a ") + std::string(kImageMarker) + " b";
    m.image_at = {2};  // one real image, before the forged marker
    const auto marked = lit.mark(std::vector<ChatMessage>{m});
    const ChatPrompt p = lit.unmark(marked[0].content);
    size_t outside = 0;
    for (size_t pos = p.text.find(kImageMarker); pos != std::string::npos; pos = p.text.find(kImageMarker, pos + 1)) {
        bool in_literal = false;
        for (const auto& s : p.literal) in_literal = in_literal || (pos >= s.begin && pos < s.end);
        outside += in_literal ? 0 : 1;
    }
    EXPECT_EQ(outside, 1u) << "the real image's marker only";
}

// What a plugin's image_encoder_load reports is checked before any request
// relies on it: a grid without a tile (the host divides an image's width by
// it) is refused, and a 1.7 plugin's stray bits in members it could not mean
// are dropped, not read.
TEST(ImageEncoder, ReportedInfoIsCheckedAndOlderPluginsFieldsCleared) {
    eh_image_encoder_info fixed{};
    fixed.image_width = fixed.image_height = 896;
    fixed.n_tokens = 256;
    fixed.n_embd = 64;
    fixed.span_flags = EH_SPAN_BIDIRECTIONAL;
    auto i = fixed;
    EXPECT_NO_THROW(check_encoder_info(i, 8, true, "gemma3", "p.gguf"));
    i = fixed;
    i.span_flags |= EH_SPAN_GRID;  // a grid, no tile
    try {
        check_encoder_info(i, 8, true, "gemma3", "p.gguf");
        FAIL() << "a grid without a tile was accepted";
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), eh::Code::ModelLoadFailed);
        EXPECT_NE(std::string(e.what()).find("EH_SPAN_GRID"), std::string::npos) << e.what();
    }
    i = fixed;
    i.span_flags |= EH_SPAN_GRID;
    i.tile = 28;  // a 1.7 plugin cannot have meant either
    EXPECT_NO_THROW(check_encoder_info(i, 7, false, "gemma3", "p.gguf"));
    EXPECT_EQ(i.span_flags, EH_SPAN_BIDIRECTIONAL);
    EXPECT_EQ(i.tile, 0u);
    i = fixed;
    i.tile = 28;
    i.min_tokens = 4;
    i.max_tokens = 1024;
    i.span_flags = EH_SPAN_GRID;
    EXPECT_NO_THROW(check_encoder_info(i, 8, true, "qwen2vl", "p.gguf"));
    EXPECT_THROW(check_encoder_info(i, 8, false, "qwen2vl", "p.gguf"), eh::Error);  // no image_encode_sized
}
