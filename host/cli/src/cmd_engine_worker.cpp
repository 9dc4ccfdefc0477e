// `engine-host engine-worker` (not listed in --help): the engine process of
// `serve --engine-process`. serve starts it with the socket as fd 3; it
// loads the plugin and the model, reports Ready (or why not) and answers the
// scheduler's calls until serve closes the socket. It writes its log lines
// to the same stdout/stderr as serve, in serve's format.
#include <fcntl.h>
#include <unistd.h>

#include <boost/algorithm/string/join.hpp>

#include "cli.hpp"
#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/model/model_file.hpp"
#include "eh/service/event_log.hpp"
#include "eh/service/remote_engine.hpp"
#include "options.hpp"
#include "serve_lora.hpp"

namespace eh::cli {

int cmd_engine_worker(const std::vector<std::string>& args) {
    po::options_description desc("Options");
    desc.add_options()
        ("help,h", "show this help")
        ("manifest", po::value<std::string>()->required(), "the chosen plugin's manifest")
        ("model", po::value<std::string>()->required(), "the model path")
        ("model-name", po::value<std::string>()->default_value(""), "the model's name in log lines")
        ("gpu-device", po::value<int>()->default_value(0), "GPU ordinal")
        ("threads", po::value<uint32_t>()->default_value(0), "CPU threads for CPU engines")
        ("engine-options", po::value<std::string>()->default_value(""), "JSON object for the plugin's model load")
        ("log-format", po::value<std::string>()->default_value("json"), "json or text")
        ("log-level", po::value<std::string>()->default_value("info"), "log level")
        ("log-content", "log prompts and generated text")
        ("worker-id", po::value<std::string>()->default_value(""), "the serving worker's id")
        ("parent-pid", po::value<int64_t>()->required(), "serve's process id");
    add_lora_options(desc);
    po::variables_map vm;
    int code = kOk;
    if (!parse_options(args, desc, "Usage: engine-host engine-worker (started by serve --engine-process)", vm, code))
        return code;
    constexpr int fd = 3;
    if (fcntl(fd, F_GETFD) < 0) {
        print_error("engine-worker is started by `serve --engine-process`, with its socket as file descriptor 3");
        return kUsage;
    }
    const int64_t parent = vm["parent-pid"].as<int64_t>();
    if (int64_t(getppid()) != parent) return kFailure;

    service::LogSettings ls;
    ls.worker_id = vm["worker-id"].as<std::string>();
    ls.model = vm["model-name"].as<std::string>();
    ls.gpu = std::to_string(vm["gpu-device"].as<int>());
    ls.json = vm["log-format"].as<std::string>() != "text";
    ls.log_content = vm.count("log-content") > 0;
    ls.level = spdlog::level::from_str(vm["log-level"].as<std::string>());
    service::init_event_log(ls);

    std::shared_ptr<EngineModel> model;
    std::vector<std::shared_ptr<service::EngineAdapter>> adapters;  // released before the model
    try {
        // serve pre-flighted the plugin in a forked child already; this
        // process is the isolation now.
        loader::LoaderOptions lo;
        lo.device = vm["gpu-device"].as<int>();
        lo.isolate_preflight = false;
        PluginRecord plugin = loader::load_plugin(vm["manifest"].as<std::string>(), lo);
        if (!plugin.accepted)
            throw Error(Code::PluginRejected, "plugin " + plugin.caps.name + " rejected in the engine process: " +
                                                  boost::algorithm::join(plugin.reasons, "; "));
        const std::string path = vm["model"].as<std::string>();
        std::shared_ptr<model::ModelFile> file = model::ModelFile::open(path);
        EngineLoadOptions elo;
        elo.device = lo.device;
        elo.n_threads = vm["threads"].as<uint32_t>();
        elo.options_json = vm["engine-options"].as<std::string>();
        elo.progress = [](float f, const char* stage) { service::send_load_progress(fd, f, stage ? stage : ""); };
        elo.cancel = [parent] { return int64_t(getppid()) != parent; };
        model = EngineModel::load(plugin.api, path, &file->view(), file, elo);
        std::vector<LoraFlag> loras;
        std::string lora_err;
        if (!read_lora_flags(vm, loras, lora_err)) throw Error(Code::ModelLoadFailed, lora_err);
        adapters = load_lora_adapters(model, *file, loras);
        service::send_ready(fd, service::local_engine(model)->facts());
    } catch (const Error& e) {
        service::send_load_failed(fd, e);
        return exit_code_for(e.code());
    } catch (const std::exception& e) {
        service::send_load_failed(fd, Error(Code::Internal, e.what()));
        return kFailure;
    }
    return service::serve_engine_requests(fd, std::move(model), parent, std::move(adapters));
}

}  // namespace eh::cli
