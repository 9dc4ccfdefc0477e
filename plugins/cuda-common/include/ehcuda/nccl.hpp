// NCCL, loaded at run time: the plugins link no NCCL, so a machine without
// it still loads them and serves on one GPU; only a load across GPUs needs
// it. The subset of NCCL's C API used here is declared in this header
// (nccl.h is not needed to build): the communicator, ncclCommInitAll for the
// GPUs of this process, and ncclAllReduce of floats (sum), in groups.
// Host code only: a stream is passed as the opaque pointer it is.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace ehcuda::nccl {

// The library's name: the soname of NCCL 2.x's system install (libnccl2).
inline constexpr const char* kLibrary = "libnccl.so.2";

using Comm = struct ncclComm*;  // ncclComm_t
using Result = int;             // ncclResult_t: 0 = ncclSuccess
inline constexpr int kFloat32 = 7;  // ncclDataType_t ncclFloat32
inline constexpr int kSum = 0;      // ncclRedOp_t ncclSum

struct Api {
    int version = 0;  // ncclGetVersion: e.g. 22805 for 2.28.5
    Result (*get_version)(int*) = nullptr;
    const char* (*get_error_string)(Result) = nullptr;
    Result (*comm_init_all)(Comm*, int, const int*) = nullptr;
    Result (*comm_destroy)(Comm) = nullptr;
    Result (*all_reduce)(const void*, void*, size_t, int, int, Comm, void* stream) = nullptr;
    Result (*group_start)() = nullptr;
    Result (*group_end)() = nullptr;
};

// Opens `library` (default kLibrary) once per name and resolves every
// function above; the handle stays open for the process. Throws
// ehp::Error(UNSUPPORTED) naming the library and what failed (dlopen's
// message, a missing symbol, a version below 2.0) when it cannot.
const Api& load(const char* library = kLibrary);

// One communicator per rank over `devices` (one process, ncclCommInitAll),
// destroyed with the object. Throws UNSUPPORTED (no NCCL) or CUDA_ERROR
// (NCCL's message).
class Comms {
public:
    explicit Comms(const std::vector<int>& devices, const char* library = kLibrary);
    ~Comms();
    Comms(const Comms&) = delete;
    Comms& operator=(const Comms&) = delete;

    int size() const { return int(comms_.size()); }
    // rank's share of a sum of `count` floats over every rank; every rank
    // must be called inside one group (group()), each on its own stream.
    void all_reduce_sum(int rank, const float* send, float* recv, size_t count, void* stream) const;
    // Runs f() between ncclGroupStart and ncclGroupEnd.
    template <class F>
    void group(F&& f) const {
        check(api_->group_start(), "ncclGroupStart");
        f();
        check(api_->group_end(), "ncclGroupEnd");
    }

private:
    void check(Result r, const char* what) const;
    const Api* api_;
    std::vector<Comm> comms_;
};

}  // namespace ehcuda::nccl
