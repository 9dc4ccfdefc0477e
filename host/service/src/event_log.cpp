#include "eh/service/event_log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <algorithm>
#include <chrono>
#include <mutex>

namespace eh::service {
namespace {

std::mutex g_mu;
LogSettings g_settings;
std::shared_ptr<spdlog::logger> g_logger;


}  // namespace

std::string now_rfc3339() {
    auto now = std::chrono::system_clock::now();
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
    std::time_t t = std::time_t(ms / 1000);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[40];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    char out[48];
    std::snprintf(out, sizeof out, "%s.%03dZ", buf, int(ms % 1000));
    return out;
}

void init_event_log(const LogSettings& settings) {
    std::lock_guard lock(g_mu);
    g_settings = settings;
    if (!g_logger) {
        g_logger = std::make_shared<spdlog::logger>("eh", std::make_shared<spdlog::sinks::stdout_sink_mt>());
    }
    g_logger->set_pattern("%v");
    g_logger->set_level(settings.level);
    g_logger->flush_on(spdlog::level::trace);
}

void set_log_model(const std::string& model) {
    std::lock_guard lock(g_mu);
    g_settings.model = model;
}

const LogSettings& log_settings() { return g_settings; }

void log_event(spdlog::level::level_enum level, std::string_view event, nlohmann::json fields) {
    std::shared_ptr<spdlog::logger> logger;
    {
        std::lock_guard lock(g_mu);
        if (!g_logger || !g_logger->should_log(level)) return;
        logger = g_logger;
    }
    logger->log(level, "{}", format_event(level, event, std::move(fields), now_rfc3339()));
}

std::string format_event(spdlog::level::level_enum level, std::string_view event, nlohmann::json fields,
                         const std::string& ts) {
    nlohmann::json line;
    bool json;
    {
        std::lock_guard lock(g_mu);
        json = g_settings.json;
        line = {{"ts", ts}, {"level", spdlog::level::to_string_view(level).data()}, {"event", event},
                {"worker_id", g_settings.worker_id}, {"model", g_settings.model}, {"gpu", g_settings.gpu}};
    }
    for (auto& [k, v] : fields.items()) line[k] = v;
    if (json) return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::string text = line["ts"].get<std::string>() + " " + line["level"].get<std::string>() + " " + std::string(event);
    for (auto& [k, v] : line.items()) {
        if (k == "ts" || k == "level" || k == "event") continue;
        // A string with a control character (a job_id with "\n") or a space
        // is written JSON-quoted, so no value can start a line of its own.
        const bool plain = v.is_string() && std::none_of(v.get_ref<const std::string&>().begin(),
                                                         v.get_ref<const std::string&>().end(),
                                                         [](unsigned char c) { return c < 0x20 || c == 0x7f || c == ' '; });
        text += " " + k + "=" +
                (plain ? v.get<std::string>() : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
    return text;
}

}  // namespace eh::service
