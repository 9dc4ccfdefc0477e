#include "eh/error.hpp"

namespace eh {

const char* code_name(Code code) {
    switch (code) {
    case Code::InvalidRequest: return "INVALID_REQUEST";
    case Code::ModelLoadFailed: return "MODEL_LOAD_FAILED";
    case Code::InsufficientVram: return "INSUFFICIENT_VRAM";
    case Code::VramOom: return "VRAM_OOM";
    case Code::CudaError: return "CUDA_ERROR";
    case Code::InferenceTimeout: return "INFERENCE_TIMEOUT";
    case Code::Cancelled: return "CANCELLED";
    case Code::ContextFull: return "CONTEXT_FULL";
    case Code::NoPlugin: return "NO_PLUGIN";
    case Code::PluginRejected: return "PLUGIN_REJECTED";
    case Code::QueueFull: return "QUEUE_FULL";
    case Code::ShuttingDown: return "SHUTTING_DOWN";
    case Code::NotFound: return "NOT_FOUND";
    case Code::Internal: return "INTERNAL";
    case Code::EngineCrashed: return "ENGINE_CRASHED";
    }
    return "INTERNAL";
}

Code code_from_status(eh_status status) {
    switch (status) {
    case EH_OK: return Code::Internal;  // not an error; callers check first
    case EH_INVALID_ARGUMENT: return Code::InvalidRequest;
    case EH_UNSUPPORTED: return Code::ModelLoadFailed;
    case EH_MODEL_LOAD_FAILED: return Code::ModelLoadFailed;
    case EH_INSUFFICIENT_VRAM: return Code::InsufficientVram;
    case EH_VRAM_OOM: return Code::VramOom;
    case EH_CUDA_ERROR: return Code::CudaError;
    case EH_CANCELLED: return Code::Cancelled;
    case EH_CONTEXT_FULL: return Code::ContextFull;
    case EH_INTERNAL: return Code::Internal;
    case EH_KV_FULL: return Code::VramOom;  // the scheduler handles it; never expected here
    case EH_NO_CAPACITY: return Code::Internal;  // the scheduler keeps within max_seqs: a bug if seen
    case EH_BUSY: return Code::Internal;         // the host never calls out of turn: a bug if seen
    }
    return Code::Internal;
}

}  // namespace eh
