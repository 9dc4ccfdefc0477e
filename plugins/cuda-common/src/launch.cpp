#include <cstdlib>

#include "ehcuda/launch.cuh"

namespace ehcuda {

bool pdl_enabled() {
    static const bool on = [] {
        if (const char* e = std::getenv("EHCUDA_PDL"); e && e[0] == '0') return false;
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess) return false;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
        return major >= 9;
    }();
    return on;
}

}  // namespace ehcuda
