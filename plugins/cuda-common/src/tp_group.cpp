// ehcuda::TpGroup and enable_peer_access (tp_group.hpp).
#include "ehcuda/tp_group.hpp"

#include <set>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/allreduce.hpp"
#include "ehcuda/check.hpp"
#include "ehcuda/nccl.hpp"

namespace ehcuda {

void enable_peer_access(const std::vector<int>& devices) {
    int count = 0;
    EHC_CHECK(cudaGetDeviceCount(&count));
    const std::set<int> distinct(devices.begin(), devices.end());
    for (int d : distinct)
        if (d >= count)
            throw ehp::Error(EH_INVALID_ARGUMENT, "the device set names GPU " + std::to_string(d) + "; " +
                                                      std::to_string(count) + " present");
    int prev = 0;
    EHC_CHECK(cudaGetDevice(&prev));
    for (int a : distinct)
        for (int b : distinct) {
            if (a == b) continue;
            int ok = 0;
            EHC_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
            if (!ok)
                throw ehp::Error(EH_UNSUPPORTED, "tensor parallelism over GPUs " + std::to_string(a) + " and " +
                                                     std::to_string(b) + " needs peer access from " + std::to_string(a) +
                                                     " to " + std::to_string(b) +
                                                     ", which the driver refuses (cudaDeviceCanAccessPeer)");
            EHC_CHECK(cudaSetDevice(a));
            const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
            else EHC_CHECK(e);
        }
    EHC_CHECK(cudaSetDevice(prev));
}

TpGroup::TpGroup(const std::vector<int>& devices, int main_device, size_t max_floats, bool use_nccl,
                 MemoryLedger* ledger)
    : main_device_(main_device), max_floats_(max_floats) {
    if (devices.empty() || devices.size() > size_t(kMaxRanks))
        throw ehp::Error(EH_INVALID_ARGUMENT, "tensor parallelism: " + std::to_string(devices.size()) +
                                                  " ranks (1.." + std::to_string(kMaxRanks) + ")");
    ranks_.resize(devices.size());
    try {
        for (size_t r = 0; r < devices.size(); ++r) {
            Rank& k = ranks_[r];
            k.device = devices[r];
            EHC_CHECK(cudaSetDevice(k.device));
            EHC_CHECK(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
            EHC_CHECK(cudaEventCreateWithFlags(&k.ready, cudaEventDisableTiming));
            EHC_CHECK(cudaEventCreateWithFlags(&k.done, cudaEventDisableTiming));
            for (DeviceBuffer& b : k.part) b = DeviceBuffer(max_floats * sizeof(float), ledger);
            k.signal = DeviceBuffer(sizeof(AllReduceSignal), ledger);
            EHC_CHECK(cudaMemset(k.signal.get(), 0, sizeof(AllReduceSignal)));
        }
        EHC_CHECK(cudaSetDevice(main_device));
        EHC_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
        const bool distinct = std::set<int>(devices.begin(), devices.end()).size() == devices.size();
        distinct_ = distinct;
        if (!use_nccl) {
            nccl_why_ = "NCCL not asked for";
        } else if (!distinct || devices.size() < 2) {
            nccl_why_ = "NCCL needs every rank on a GPU of its own";
        } else {
            try {
                comms_ = std::make_unique<nccl::Comms>(devices);
                nccl_why_ = "NCCL " + std::to_string(nccl::load().version);
            } catch (const ehp::Error& e) {
                nccl_why_ = e.what();  // one-shot for every size
            }
        }
        EHC_CHECK(cudaSetDevice(main_device));
    } catch (...) {
        release();
        throw;
    }
}

TpGroup::~TpGroup() { release(); }

void TpGroup::release() noexcept {
    comms_.reset();
    for (Rank& k : ranks_) {
        cudaSetDevice(k.device);
        if (k.stream) cudaStreamSynchronize(k.stream);
        if (k.ready) cudaEventDestroy(k.ready);
        if (k.done) cudaEventDestroy(k.done);
        if (k.stream) cudaStreamDestroy(k.stream);
        k.ready = k.done = nullptr;
        k.stream = nullptr;
        for (DeviceBuffer& b : k.part) b.reset();
        k.signal.reset();
    }
    ranks_.clear();
    cudaSetDevice(main_device_);
    if (fork_) cudaEventDestroy(fork_);
    fork_ = nullptr;
}

void TpGroup::use(int r) const { EHC_CHECK(cudaSetDevice(ranks_[size_t(r)].device)); }

void TpGroup::fork(cudaStream_t main) {
    EHC_CHECK(cudaSetDevice(main_device_));
    EHC_CHECK(cudaEventRecord(fork_, main));
    for (const Rank& k : ranks_) EHC_CHECK(cudaStreamWaitEvent(k.stream, fork_, 0));
    flip_ = 0;
}

void TpGroup::join(cudaStream_t main) {
    for (const Rank& k : ranks_) {
        EHC_CHECK(cudaSetDevice(k.device));
        EHC_CHECK(cudaEventRecord(k.done, k.stream));
    }
    EHC_CHECK(cudaSetDevice(main_device_));
    for (const Rank& k : ranks_) EHC_CHECK(cudaStreamWaitEvent(main, k.done, 0));
}

const char* TpGroup::path_for(size_t n, size_t nccl_min_floats) const {
    return comms_ && n >= nccl_min_floats ? "NCCL" : "one-shot";
}

void TpGroup::all_reduce_add(float* const* out, size_t n, size_t nccl_min_floats, bool signals) {
    if (n > max_floats_)
        throw ehp::Error(EH_INVALID_ARGUMENT, "tensor-parallel all-reduce of " + std::to_string(n) +
                                                  " floats; the buffers hold " + std::to_string(max_floats_));
    const int N = size();
    if (comms_ && n >= nccl_min_floats) {
        comms_->group([&] {
            for (int r = 0; r < N; ++r) {
                float* p = partial(r);
                comms_->all_reduce_sum(r, p, p, n, stream(r));
            }
        });
        for (int r = 0; r < N; ++r) {
            use(r);
            AllReduceArgs a;
            a.in[0] = partial(r);
            a.nranks = 1;
            a.out[0] = out[r];
            a.nout = 1;
            a.n = n;
            a.accumulate = true;
            allreduce_oneshot(a, stream(r));
        }
    } else if (signals) {
        AllReduceSignal* sig[kMaxRanks] = {};
        for (int r = 0; r < N; ++r) sig[r] = ranks_[size_t(r)].signal.as<AllReduceSignal>();
        for (int r = 0; r < N; ++r) {
            use(r);
            AllReduceArgs a;
            for (int s = 0; s < N; ++s) a.in[s] = partial(s);
            a.nranks = N;
            a.out[0] = out[r];
            a.nout = 1;
            a.n = n;
            a.accumulate = true;
            allreduce_oneshot_signal(a, r, sig, stream(r));
        }
    } else {
        // The barrier before: every partial is written before any rank reads.
        for (const Rank& k : ranks_) {
            EHC_CHECK(cudaSetDevice(k.device));
            EHC_CHECK(cudaEventRecord(k.ready, k.stream));
        }
        for (int r = 0; r < N; ++r) {
            use(r);
            for (int s = 0; s < N; ++s)
                if (s != r) EHC_CHECK(cudaStreamWaitEvent(stream(r), ranks_[size_t(s)].ready, 0));
            AllReduceArgs a;
            for (int s = 0; s < N; ++s) a.in[s] = partial(s);
            a.nranks = N;
            a.out[0] = out[r];
            a.nout = 1;
            a.n = n;
            a.accumulate = true;
            allreduce_oneshot(a, stream(r));
        }
    }
    flip_ ^= 1;
    EHC_CHECK(cudaSetDevice(main_device_));
}

}  // namespace ehcuda
