// Host-wide error codes. These names are part of the public surface: they
// appear in HTTP error envelopes, SSE `error` events, logs and CLI output, so
// a code is never renamed or reused. docs/http-api.md lists them.
#pragma once

#include <stdexcept>
#include <string>

#include <engine_host/plugin_abi.h>

namespace eh {

enum class Code {
    InvalidRequest,      // caller's input is wrong (HTTP 400)
    ModelLoadFailed,     // model file unreadable, malformed or unsupported
    InsufficientVram,    // the model does not fit on the device at all
    VramOom,             // an allocation failed while serving a request
    CudaError,           // a device API failed
    InferenceTimeout,    // a request ran past --inference-timeout-sec
    Cancelled,           // the client or an operator cancelled the job
    ContextFull,         // prompt + output do not fit the context
    NoPlugin,            // no accepted plugin can serve the model
    PluginRejected,      // a plugin failed validation
    QueueFull,           // too many requests waiting (HTTP 503)
    ShuttingDown,        // the server is stopping (HTTP 503)
    NotFound,            // unknown job, route or file
    Internal,            // a bug
    EngineCrashed,       // the engine process died or hung; its jobs end (HTTP 503)
};

const char* code_name(Code code);

// The host code a plugin status maps to.
Code code_from_status(eh_status status);

class Error : public std::runtime_error {
public:
    Error(Code code, const std::string& message) : std::runtime_error(message), code_(code) {}
    Code code() const noexcept { return code_; }

private:
    Code code_;
};

}  // namespace eh
