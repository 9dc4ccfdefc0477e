// Multimodal RoPE (M-RoPE) of Qwen2-VL and Qwen2.5-VL (GGUF architecture
// `qwen2vl`, as llama.cpp's converter writes both; a Hugging Face directory's
// `mrope_section`, which the host passes as hf.rope_parameters.mrope_section
// or hf.rope_scaling.mrope_section), read the same way by every plugin that
// serves it.
//
// - A position has three components: time, row, column. The rotation's
//   n_rot / 2 frequencies are split into sections (`{arch}.rope.
//   dimension_sections`, four integers of which the converter writes
//   transformers' `mrope_section` and a 0; Qwen2.5-VL 7B: 16, 24, 24, 0):
//   frequency i of the first section turns by the time component, of the
//   second by the row, of the third by the column (transformers'
//   apply_multimodal_rotary_pos_emb with the rotate-half pairing). The
//   sections must cover every frequency.
// - Text positions advance all three together (p, p, p), so text alone is
//   plain NEOX RoPE. An image of gh x gw tokens starting at text position p
//   gives its token at row r, column c the position (p, p + r, p + c) (a
//   still image has one time step), and the text after it continues at
//   p + max(gh, gw): one past the largest component (transformers'
//   get_rope_index).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include <engine_host/plugin_abi.hpp>

namespace ehp::mrope {

struct Sections {
    std::array<uint32_t, 3> n{};  // frequencies per component: time, row, column; all 0 = not M-RoPE
    bool active() const { return n[0] + n[1] + n[2] > 0; }
    // The component (0 time, 1 row, 2 column) frequency i turns by.
    uint32_t component(uint32_t i) const { return i < n[0] ? 0 : i < n[0] + n[1] ? 1 : 2; }
};

// The sections of a view whose architecture uses M-RoPE (`qwen2vl`), for a
// rotation of n_rot dimensions; {} for other architectures. Throws
// ehp::Error(EH_MODEL_LOAD_FAILED) naming the key when it is missing,
// malformed, or does not cover the n_rot / 2 frequencies.
inline Sections read_sections(const ModelView& v, uint32_t n_rot) {
    if (v.architecture() != "qwen2vl") return {};
    std::string key = v.arch_key("rope.dimension_sections");
    const eh_value* x = v.find(key);
    for (const char* hf : {"hf.rope_parameters.mrope_section", "hf.rope_scaling.mrope_section"})
        if (!x && (x = v.find(hf))) key = hf;
    if (!x) throw Error(EH_MODEL_LOAD_FAILED, "missing metadata '" + v.arch_key("rope.dimension_sections") +
                                                  "' (M-RoPE sections)");
    if (x->type != EH_VALUE_ARRAY || x->count < 3 || x->count > 4)
        throw Error(EH_MODEL_LOAD_FAILED, "'" + key + "' must be an array of 3 or 4 integers");
    std::array<int64_t, 4> s{};
    for (uint64_t i = 0; i < x->count; ++i) {
        switch (x->elem_type) {
        case EH_VALUE_I32: s[i] = static_cast<const int32_t*>(x->v.array)[i]; break;
        case EH_VALUE_U32: s[i] = static_cast<const uint32_t*>(x->v.array)[i]; break;
        case EH_VALUE_I64: s[i] = static_cast<const int64_t*>(x->v.array)[i]; break;
        case EH_VALUE_U64: s[i] = int64_t(std::min<uint64_t>(static_cast<const uint64_t*>(x->v.array)[i], 1u << 20)); break;
        default: throw Error(EH_MODEL_LOAD_FAILED, "'" + key + "' must be an array of integers");
        }
        if (s[i] < 0 || s[i] > (1 << 16)) throw Error(EH_MODEL_LOAD_FAILED, "'" + key + "' holds " + std::to_string(s[i]));
    }
    // The fourth section (llama.cpp's extra axis) is 0 for Qwen2-VL and 2.5-VL.
    if (s[3] != 0)
        throw Error(EH_UNSUPPORTED, "'" + key + "' has a fourth section of " + std::to_string(s[3]) +
                                        " (Qwen2-VL / Qwen2.5-VL use three)");
    if (s[0] + s[1] + s[2] != int64_t(n_rot / 2))
        throw Error(EH_MODEL_LOAD_FAILED, "'" + key + "' sections " + std::to_string(s[0]) + ", " + std::to_string(s[1]) +
                                              ", " + std::to_string(s[2]) + " do not add up to the " +
                                              std::to_string(n_rot / 2) + " rotary frequencies");
    Sections out;
    for (int i = 0; i < 3; ++i) out.n[i] = uint32_t(s[i]);
    return out;
}

struct Position {
    int32_t t = 0, h = 0, w = 0;
    int32_t operator[](uint32_t c) const { return c == 0 ? t : c == 1 ? h : w; }
};

// The positions of n tokens appended to a sequence whose next text position
// is `next`, with the grid spans among them (EH_SPAN_GRID, sorted, checked:
// inside the n tokens, count a multiple of grid_width > 0); other spans are
// text positions. pos[i] gets token i's position and after[i] the next text
// position once token i is in (the running largest component + 1), which is
// what a sequence cut after token i continues from.
inline void place(int32_t next, uint32_t n, const eh_embd_span* spans, uint32_t n_spans, Position* pos,
                  int32_t* after) {
    int32_t top = next - 1;  // the largest component so far
    uint32_t j = 0;
    for (uint32_t i = 0; i < n;) {
        while (j < n_spans && (!(spans[j].flags & EH_SPAN_GRID) || spans[j].first + spans[j].count <= i)) ++j;
        if (j < n_spans && spans[j].first == i) {
            const eh_embd_span& s = spans[j];
            const int32_t p = top + 1;
            for (uint32_t k = 0; k < s.count; ++k, ++i) {
                pos[i] = {p, p + int32_t(k / s.grid_width), p + int32_t(k % s.grid_width)};
                top = std::max({top, pos[i].h, pos[i].w});
                after[i] = top + 1;
            }
            continue;
        }
        pos[i] = {top + 1, top + 1, top + 1};
        top += 1;
        after[i] = top + 1;
        ++i;
    }
}

}  // namespace ehp::mrope
