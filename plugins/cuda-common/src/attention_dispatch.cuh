// What the attention kernels' launchers share (attention.cu,
// attention_decode.cu): argument checks and the dispatch on head dim.
#pragma once

#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/kernels.hpp"

namespace ehcuda::detail {

inline void validate(const AttnArgs& a) {
    if (!attention_head_dim_supported(a.head_dim))
        throw ehp::Error(EH_UNSUPPORTED, "attention: head_dim " + std::to_string(a.head_dim) + " unsupported (max " +
                                             std::to_string(kAttentionMaxHeadDim) + ")");
    if (a.n_kv <= 0 || a.n_head % a.n_kv)
        throw ehp::Error(EH_INTERNAL, "attention: n_head must be a multiple of n_kv");
}

template <class F>
void by_dpl(int head_dim, F&& f) {
    switch (head_dim / 32) {
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 8: f.template operator()<8>(); break;
    default: throw ehp::Error(EH_UNSUPPORTED, "attention: head_dim unsupported");
    }
}

}  // namespace ehcuda::detail
