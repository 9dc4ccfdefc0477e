// A chat's images in its prompt: each marker (kImageMarker) the rendered
// chat holds outside its literal spans becomes the model's image tokens
// (ImagePrompt), and the job records where each image's tokens are, its
// pixels as the encoder takes them and its digest.
#pragma once

#include "eh/service/image_encoder.hpp"
#include "eh/service/job.hpp"
#include "eh/service/text_codec.hpp"

namespace eh::service {

// Sets job.prompt_tokens (the prompt tokenized with its images expanded)
// and job.images from req. RequestError (field "messages") when the server
// has no encoder (`enc` NULL), the template dropped or repeated an image,
// or an image takes more than `max_step_tokens` positions.
void place_images(const GenerationRequest& req, const ImageEncoder* enc, const TextCodec& codec,
                  uint32_t max_step_tokens, Job& job);

}  // namespace eh::service
