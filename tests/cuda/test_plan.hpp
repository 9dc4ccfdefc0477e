// The kernel unit tests' KernelPlan: installed on the test's thread the
// first time a test changes it, then changed in place by the setters below
// (the variants the tests compare). Kernels the tests launch read it through
// ehcuda::plan(); before any change that is the default plan.
#pragma once

#include <ehcuda/kernel_plan.hpp>

namespace ehtest {

inline ehcuda::KernelPlan& test_plan() {
    static thread_local ehcuda::KernelPlan p = ehcuda::plan();
    static thread_local ehcuda::PlanScope scope(p);
    return p;
}

inline void set_gemv_input(ehcuda::GemvInput in) { test_plan().gemv_input = in; }
inline void set_gemv_bulk(bool on) { test_plan().gemv_bulk = on; }
inline bool gemv_bulk_on() { return ehcuda::plan().gemv_bulk; }
inline void set_gemv_bulk_ring(int min_waves) { test_plan().bulk_ring_waves = min_waves < 0 ? 0 : min_waves; }
inline int gemv_bulk_ring() { return ehcuda::plan().bulk_ring_waves; }
inline void set_bulk_max_tokens(int n) { test_plan().bulk_max_tokens = n; }
inline void set_bulk_group_once(bool on) { test_plan().bulk_group_once = on; }
inline void set_bulk_group_norm(bool on) { test_plan().bulk_group_norm = on; }
inline void set_bulk_group_kslice(bool on) { test_plan().bulk_group_kslice = on; }
inline void set_bulk_group_stage_cols(int cols) { test_plan().bulk_group_stage_cols = cols; }
inline void set_gemv_early_regs(bool on) { test_plan().early_regs = on; }
inline void set_attention_early(int mode) { test_plan().attn_early = mode < 0 ? 0 : mode > 2 ? 2 : mode; }
inline void set_attention_pipe(bool on) { test_plan().attn_pipe = on; }

// Sets the single-token GEMV input form for a scope.
struct InputGuard {
    ehcuda::GemvInput old = ehcuda::plan().gemv_input;
    explicit InputGuard(ehcuda::GemvInput in) { set_gemv_input(in); }
    ~InputGuard() { set_gemv_input(old); }
};

// Sets the choice of the bulk-copy kernels (KernelPlan::gemv_bulk) for a scope.
struct BulkGuard {
    bool old = ehcuda::plan().gemv_bulk;
    explicit BulkGuard(bool on) { set_gemv_bulk(on); }
    ~BulkGuard() { set_gemv_bulk(old); }
};

}  // namespace ehtest
