// Structured logs: one JSON object per line (or a human line with
// --log-format text), each naming its event and carrying worker_id, model
// and gpu, plus job_id and correlation_id for job events. Prompts and
// generated text appear only with --log-content.
#pragma once

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

namespace eh::service {

// The current UTC time as RFC 3339 with milliseconds ("2026-11-26T01:02:03.456Z").
std::string now_rfc3339();

struct LogSettings {
    std::string worker_id;
    std::string model;
    std::string gpu;
    bool json = true;
    bool log_content = false;
    spdlog::level::level_enum level = spdlog::level::info;
};

// Installs the process-wide logger (stdout). Safe to call again (tests).
void init_event_log(const LogSettings& settings);
void set_log_model(const std::string& model);
const LogSettings& log_settings();

// Logs `event` with `fields` merged over the process-wide ones.
void log_event(spdlog::level::level_enum level, std::string_view event, nlohmann::json fields = nlohmann::json::object());
// The line log_event() writes (without its newline), with `ts` as its time.
std::string format_event(spdlog::level::level_enum level, std::string_view event, nlohmann::json fields,
                         const std::string& ts);

}  // namespace eh::service
