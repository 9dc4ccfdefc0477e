// ehcuda::nccl (nccl.hpp): dlopen + dlsym, once per library name.
#include "ehcuda/nccl.hpp"

#include <dlfcn.h>

#include <map>
#include <mutex>

#include <engine_host/plugin_abi.hpp>

namespace ehcuda::nccl {
namespace {

[[noreturn]] void unavailable(const std::string& library, const std::string& why) {
    throw ehp::Error(EH_UNSUPPORTED, "NCCL is not available: " + why +
                                         "; a model across several GPUs needs NCCL 2.x (the system's " + library +
                                         ", Debian/Ubuntu package libnccl2)");
}

template <class F>
void resolve(void* h, const std::string& library, const char* name, F& out) {
    void* p = dlsym(h, name);
    if (!p) unavailable(library, std::string(library) + " has no symbol " + name);
    out = reinterpret_cast<F>(p);
}

Api open_api(const std::string& library) {
    void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char* e = dlerror();
        unavailable(library, "dlopen(" + library + ") failed: " + (e ? e : "unknown error"));
    }
    Api a;
    resolve(h, library, "ncclGetVersion", a.get_version);
    resolve(h, library, "ncclGetErrorString", a.get_error_string);
    resolve(h, library, "ncclCommInitAll", a.comm_init_all);
    resolve(h, library, "ncclCommDestroy", a.comm_destroy);
    resolve(h, library, "ncclAllReduce", a.all_reduce);
    resolve(h, library, "ncclGroupStart", a.group_start);
    resolve(h, library, "ncclGroupEnd", a.group_end);
    if (a.get_version(&a.version) != 0 || a.version < 20000)
        unavailable(library, library + " reports version " + std::to_string(a.version) + ", below 2.0");
    return a;  // the handle stays open: the functions live in it
}

}  // namespace

const Api& load(const char* library) {
    static std::mutex mu;
    static std::map<std::string, Api> loaded;
    const std::string name = library ? library : kLibrary;
    std::lock_guard<std::mutex> lock(mu);
    auto it = loaded.find(name);
    if (it == loaded.end()) it = loaded.emplace(name, open_api(name)).first;
    return it->second;
}

Comms::Comms(const std::vector<int>& devices, const char* library) : api_(&load(library)) {
    if (devices.empty()) throw ehp::Error(EH_INVALID_ARGUMENT, "NCCL communicators over no device");
    comms_.assign(devices.size(), nullptr);
    check(api_->comm_init_all(comms_.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
}

Comms::~Comms() {
    for (Comm c : comms_)
        if (c) api_->comm_destroy(c);
}

void Comms::all_reduce_sum(int rank, const float* send, float* recv, size_t count, void* stream) const {
    if (rank < 0 || rank >= size()) throw ehp::Error(EH_INVALID_ARGUMENT, "NCCL all-reduce: no rank " + std::to_string(rank));
    check(api_->all_reduce(send, recv, count, kFloat32, kSum, comms_[size_t(rank)], stream), "ncclAllReduce");
}

void Comms::check(Result r, const char* what) const {
    if (r != 0) {
        const char* msg = api_->get_error_string ? api_->get_error_string(r) : nullptr;
        throw ehp::Error(EH_CUDA_ERROR, std::string(what) + " failed: " + (msg ? msg : "NCCL error " + std::to_string(r)));
    }
}

}  // namespace ehcuda::nccl
