// libFuzzer target: model references, hub URLs and Location headers, the
// Content-Range, Link and ETag headers, split names and the GGUF (and mmproj) choice. Every input must either parse or throw
// eh::Error; nothing may crash, hang or read out of bounds.
//   build-fuzz/tests/hub/fuzz_hub_ref -max_total_time=600
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "eh/error.hpp"
#include "eh/hub/gguf_choice.hpp"
#include "eh/hub/http_client.hpp"
#include "eh/hub/http_headers.hpp"
#include "eh/hub/ref.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);
    try {
        eh::hub::ModelRef r = eh::hub::parse_ref(text, [](const std::string&) { return false; });
        if (r.is_hub() && r.display().empty()) __builtin_trap();
        if (r.kind == eh::hub::ModelRef::Kind::HubFile) {
            // A file that parsed, decoded, can never leave the snapshot (no '.', '..' or empty segment).
            if (!eh::hub::repo_file_problem(r.file).empty()) __builtin_trap();
            if (eh::hub::parse_ref(r.display()).file != r.file) __builtin_trap();
            eh::hub::shard_set(r.file);
        }
    } catch (const eh::Error&) {
    }
    if (auto u = eh::hub::parse_url(text)) {
        if (u->target.empty() || u->target.front() != '/') __builtin_trap();
        eh::hub::resolve_location(*u, text.substr(text.size() / 2));
    }
    if (auto r = eh::hub::parse_content_range(text); r && r->total && r->start >= r->total) __builtin_trap();
    eh::hub::next_link(text);
    eh::hub::unquote_etag(text);
    eh::hub::encode_path(text);
    eh::hub::quant_label(text);
    eh::hub::parse_split(text);
    // Lines as a repository's file list; the first line as the quant.
    std::vector<std::string> lines;
    size_t start = 0;
    while (start <= text.size() && lines.size() < 64) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        lines.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    std::string quant = lines.front();
    try {
        const std::string model = eh::hub::choose_gguf(lines, quant.size() <= eh::hub::kMaxQuantBytes ? quant : "", "o/r");
        // The projector beside it is one of the listed files, in its folder.
        if (auto m = eh::hub::choose_mmproj(lines, model)) {
            bool listed = false;
            for (const auto& l : lines) listed = listed || l == *m;
            if (!listed) __builtin_trap();
        }
    } catch (const eh::Error&) {
    }
    eh::hub::choose_mmproj(lines, quant);
    return 0;
}
