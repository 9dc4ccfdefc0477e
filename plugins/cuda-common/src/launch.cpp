#include "ehcuda/kernel_plan.hpp"
#include "ehcuda/launch.cuh"

namespace ehcuda {

namespace detail {

// A device attribute of the current device, `fallback` when the query fails.
static int device_attribute(cudaDeviceAttr what, int fallback) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, what, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return fallback;
    }
    return v;
}

int sm_count() {
    static const int n = device_attribute(cudaDevAttrMultiProcessorCount, 100);
    return n;
}

int cc_major() {
    static const int n = device_attribute(cudaDevAttrComputeCapabilityMajor, 0);
    return n;
}

namespace {
LaunchRecorder* g_recorder = nullptr;
}  // namespace

LaunchRecorder* launch_recorder() { return g_recorder; }

}  // namespace detail

void set_launch_recorder(LaunchRecorder* r) { detail::g_recorder = r; }

bool pdl_enabled() { return plan().pdl && detail::cc_major() >= 9; }

}  // namespace ehcuda
