// LoRA adapters (ABI 1.6): an adapter's low-rank pairs bound to the model's
// matrices, and the per-row update a forward pass adds after a matmul:
// y += s * B (A x) for each row whose sequence selected an adapter with a
// pair for that matrix. Rows are grouped by adapter, and every row's update
// is computed with the same arithmetic whichever rows share the step, so a
// sequence's result is the same alone or beside sequences of other adapters.
#pragma once

#include <cstddef>
#include <unordered_map>

#include <engine_host/plugin_abi.h>

#include "model.hpp"
#include "weights.hpp"

namespace cpuref {

class Sequence;

struct LoraPair {
    Matrix a;  // rank rows of n_in values
    Matrix b;  // n_out rows of rank values
    float scale = 0.0f;  // alpha > 0 ? user scale * alpha / rank : user scale
};

class Adapter {
public:
    // Checks the view against the model (ehp::read_lora_adapter) and binds
    // every pair to the model matrix it adapts. Throws ehp::Error:
    // MODEL_LOAD_FAILED for a view that does not fit the model, UNSUPPORTED
    // for a base tensor this engine does not adapt (expert tensors, a part of
    // a fused tensor, a transposed HF layout). The view must outlive it.
    Adapter(const Model& model, const eh_adapter_params& params);

    // The pair adapting `w`, or NULL.
    const LoraPair* find(const Matrix& w) const {
        auto it = pairs_.find(&w);
        return it == pairs_.end() ? nullptr : &it->second;
    }
    const Model& model() const { return model_; }

private:
    const Model& model_;
    std::unordered_map<const Matrix*, LoraPair> pairs_;
};

// Adds the adapters' updates of matrix `w` to y for rows 0..n-1, where
// row t's input is x + t * x_stride, its output y + t * y_stride and its
// adapter adapters[t] (NULL: none).
void lora_update(ThreadPool& pool, const Matrix& w, const Adapter* const* adapters, size_t n, const float* x,
                 size_t x_stride, float* y, size_t y_stride);

}  // namespace cpuref
