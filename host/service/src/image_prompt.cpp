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
    // Each image's size as the encoder reads it, and so its token count.
    std::vector<image::TileSize> sizes;
    std::vector<uint32_t> counts;
    for (size_t k = 0; k < req.images.size(); ++k) {
        try {
            sizes.push_back(enc->size_for(req.images[k]->width, req.images[k]->height));
        } catch (const image::ImageError& e) {
            throw RequestError("messages", fmt::format("image {}: {}", k, e.what()));
        }
        counts.push_back(enc->tokens_for(sizes.back()));
        if (counts.back() > max_step_tokens)
            throw RequestError("messages", fmt::format("image {} takes {} positions, more than a step holds ({}: raise "
                                                       "--batch-tokens)",
                                                       k, counts.back(), max_step_tokens));
    }
    auto expansion = [&](size_t k) {
        std::string x = ip.before;
        for (uint32_t i = 0; i < counts[k]; ++i) x += ip.token;
        return x + ip.after;
    };

    // Markers outside the literal spans (a message's own U+E000 is inside one).
    auto literal_at = [&](size_t pos) {
        for (const TextSpan& s : req.literal)
            if (pos >= s.begin && pos < s.end) return true;
        return false;
    };
    std::string text;
    std::vector<size_t> marks;  // positions in req.prompt
    size_t from = 0;
    std::vector<size_t> grown;  // bytes the expansions up to and including each mark added
    for (size_t pos = req.prompt.find(kImageMarker); pos != std::string::npos;
         pos = req.prompt.find(kImageMarker, pos + 1)) {
        if (pos < from || literal_at(pos)) continue;
        if (marks.size() == req.images.size())
            throw RequestError("messages", fmt::format("the chat template placed more images than the request's {} (it "
                                                       "must write each message's content once)",
                                                       req.images.size()));
        text.append(req.prompt, from, pos - from);
        const std::string x = expansion(marks.size());
        text += x;
        grown.push_back((grown.empty() ? 0 : grown.back()) + x.size() - kImageMarker.size());
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
    for (TextSpan& s : literal) {
        const size_t before = size_t(std::lower_bound(marks.begin(), marks.end(), s.begin) - marks.begin());
        const size_t grow = before ? grown[before - 1] : 0;
        s.begin += grow;
        s.end += grow;
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
        if (runs[k].second != counts[k])
            throw RequestError("messages", fmt::format("image {} tokenized into {} image tokens, not {}", k,
                                                       runs[k].second, counts[k]));
        auto im = std::make_shared<Job::Image>();
        im->first = runs[k].first;
        im->count = runs[k].second;
        im->width = sizes[k].width;
        im->height = sizes[k].height;
        if (info.span_flags & EH_SPAN_GRID) im->grid_width = sizes[k].width / info.tile;
        im->digest = image::digest(*req.images[k]);
        im->pixels = image::encoder_input(*req.images[k], im->width, im->height, info.mean, info.std, ip.filter);
        job.images.push_back(std::move(im));
    }
}

}  // namespace eh::service
