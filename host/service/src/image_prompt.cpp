#include "eh/service/image_prompt.hpp"

#include <fmt/format.h>

#include "eh/service/chat_prompt.hpp"

namespace eh::service {

void place_images(const GenerationRequest& req, const ImageEncoder* enc, const TextCodec& codec,
                  uint32_t max_step_tokens, Job& job) {
    if (!enc)
        throw RequestError("messages", "this server takes no images: start it with --mmproj FILE (the model's "
                                       "multimodal projector GGUF, as llama.cpp's converter writes it)");
    const eh_image_encoder_info& info = enc->info();
    const ImagePrompt& ip = enc->prompt();
    if (info.n_tokens > max_step_tokens)
        throw RequestError("messages", fmt::format("an image takes {} positions, more than a step holds ({}: raise "
                                                   "--batch-tokens)",
                                                   info.n_tokens, max_step_tokens));
    std::string expansion = ip.before;
    for (uint32_t i = 0; i < info.n_tokens; ++i) expansion += ip.token;
    expansion += ip.after;

    // Markers outside the literal spans (a message's own U+E000 is inside one).
    auto literal_at = [&](size_t pos) {
        for (const TextSpan& s : req.literal)
            if (pos >= s.begin && pos < s.end) return true;
        return false;
    };
    std::string text;
    std::vector<size_t> marks;  // positions in req.prompt
    size_t from = 0;
    for (size_t pos = req.prompt.find(kImageMarker); pos != std::string::npos;
         pos = req.prompt.find(kImageMarker, pos + 1)) {
        if (pos < from || literal_at(pos)) continue;
        text.append(req.prompt, from, pos - from);
        text += expansion;
        marks.push_back(pos);
        from = pos + kImageMarker.size();
    }
    text.append(req.prompt, from, std::string::npos);
    if (marks.size() != req.images.size())
        throw RequestError("messages", fmt::format("the chat template placed {} of the request's {} images (it must "
                                                   "write each message's content once)",
                                                   marks.size(), req.images.size()));
    // Literal spans move by the expansions before them.
    std::vector<TextSpan> literal = req.literal;
    const size_t grow = expansion.size() - kImageMarker.size();
    for (TextSpan& s : literal) {
        const size_t before = size_t(std::lower_bound(marks.begin(), marks.end(), s.begin) - marks.begin());
        s.begin += before * grow;
        s.end += before * grow;
    }
    job.prompt_tokens = codec.encode(text, req.add_special, req.parse_special, literal);

    const std::vector<int32_t> tok = codec.encode(ip.token, false, true, {});
    if (tok.size() != 1)
        throw Error(Code::Internal, fmt::format("the model's vocabulary has no '{}' control token", ip.token));
    std::vector<std::pair<uint32_t, uint32_t>> runs;
    const auto& t = job.prompt_tokens;
    for (size_t i = 0; i < t.size();) {
        if (t[i] != tok[0]) {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < t.size() && t[j] == tok[0]) ++j;
        runs.emplace_back(uint32_t(i), uint32_t(j - i));
        i = j;
    }
    if (runs.size() != req.images.size())
        throw RequestError("messages", fmt::format("the prompt holds {} runs of image tokens for {} images", runs.size(),
                                                   req.images.size()));
    for (size_t k = 0; k < runs.size(); ++k) {
        if (runs[k].second != info.n_tokens)
            throw RequestError("messages", fmt::format("image {} tokenized into {} image tokens, not {}", k,
                                                       runs[k].second, info.n_tokens));
        auto im = std::make_shared<Job::Image>();
        im->first = runs[k].first;
        im->count = runs[k].second;
        im->digest = image::digest(*req.images[k]);
        im->pixels = image::encoder_input(*req.images[k], info.image_width, info.image_height, info.mean, info.std);
        job.images.push_back(std::move(im));
    }
}

}  // namespace eh::service
