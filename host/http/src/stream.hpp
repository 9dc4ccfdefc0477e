// Pumps a job's events into a chunked HTTP response. A failed write means
// the client went away: the job is cancelled. Idle streams get SSE comment
// heartbeats, which is also how a vanished client is noticed while its job
// waits in the queue.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "eh/service/service.hpp"
#include "impl.hpp"

namespace eh::http {

// `render` turns an event into bytes to write ("" writes nothing).
// `trailer` is written after the terminal event (e.g. "data: [DONE]\n\n"),
// `trailer_after_error` says whether an error event gets it too. `on_close`
// (if set) runs once when the response is done, however it ended (the
// client's disconnect included).
void stream_job(Server::Impl& s, httplib::Response& res, std::shared_ptr<service::Service> svc,
                std::shared_ptr<service::Job> job, std::function<std::string(const service::JobEvent&)> render,
                std::string trailer = "", bool trailer_after_error = false, std::function<void()> on_close = {});

// Several jobs in one stream (OpenAI `n` > 1; stream_job is the one-job
// case): events interleave as they come, `render` gets the job's index; the
// trailer follows the last job's end (and an error, with
// `trailer_after_error`). An error event from any job ends the stream and
// cancels the others.
void stream_jobs(Server::Impl& s, httplib::Response& res, std::shared_ptr<service::Service> svc,
                 std::vector<std::shared_ptr<service::Job>> jobs,
                 std::function<std::string(size_t, const service::JobEvent&)> render, std::string trailer,
                 bool trailer_after_error = false, std::function<void()> on_close = {});

}  // namespace eh::http
