// Last words when the process dies on a fatal signal (issue 26, item 5).
//
// Engine plugins run in this process, so a plugin that crashes (SIGSEGV,
// SIGILL, SIGBUS, SIGFPE, SIGABRT) takes the host with it; the supervisor
// restarts the worker. Before it goes, every client with a request in
// flight is told so in the form it expects, instead of seeing a cut
// connection:
//  * no response started yet: a complete HTTP 500 with the error envelope
//    (code INTERNAL, retriable);
//  * an SSE stream between two chunks: a terminal `error` event (native API)
//    or an error object and `data: [DONE]` (OpenAI API), then the end of the
//    chunked body;
//  * a stream that already sent its terminal event, or a response cut in
//    the middle of a chunk or of a non-stream body: nothing can be added
//    without corrupting it, and it is left as it is.
// The handler uses only write() on pre-built bytes and then re-raises the
// signal, so the exit status still names it.
#pragma once

#include <string_view>

namespace eh::http::crash_notice {

// Installs the handlers (once; later calls do nothing).
void install();

// Marks the calling connection thread's request as in flight on `fd` until
// destruction. `openai`: the route is an OpenAI one (its stream form).
class Watch {
public:
    Watch(int fd, bool openai);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

private:
    int slot_;
};

// Every response byte the calling thread's connection sends (to follow the
// head, the chunk boundaries and whether the terminal event went out).
void wrote(int fd, std::string_view bytes, bool whole_call);

}  // namespace eh::http::crash_notice
