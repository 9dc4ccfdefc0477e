// `engine-host inspect`: what a model file is, which plugin would serve it
// (by serve's rule, --device), and whether serve would refuse it. Reads only
// headers and the tokenizer (the file is mapped, never loaded into a
// plugin) unless --load asks for the plugin's own checks; --kernels adds the
// CUDA kernel routes of its matrices (inspect_kernels.hpp).
#include <nlohmann/json.hpp>

#include <iostream>
#include <optional>

#include "chat_template_choice.hpp"
#include "cli.hpp"
#include "device_choice.hpp"
#include "eh/loader/engine.hpp"
#include "eh/loader/plugin_loader.hpp"
#include "eh/loader/plugin_search.hpp"
#include "eh/model/descriptor.hpp"
#include "eh/model/inspect.hpp"
#include "eh/model/model_file.hpp"
#include "inspect_kernels.hpp"
#include "model_ref.hpp"
#include "options.hpp"
#include "plugin_report.hpp"

namespace eh::cli {
namespace {

// Why serve would refuse the file, with the exit code serve gives for it.
struct Refusal {
    int exit = kOk;
    std::string why;
};

Refusal refusal_of(const Error& e) {
    return {exit_code_for(e.code()), std::string(e.what()) + " [" + code_name(e.code()) + "]"};
}

// The "Serves" block: the verdict, what it rests on, and (JSON) the exit code.
model::InspectSection verdict_section(const std::optional<Refusal>& refusal, const std::string& checked) {
    model::InspectSection s{"Serves", {}, {}};
    s.facts = {{"verdict", refusal ? "no: serve refuses this file" : "yes, as far as checked"}};
    if (refusal) s.facts.push_back({"why", refusal->why});
    s.facts.push_back({"checked", checked});
    nlohmann::json j = {{"serves", !refusal}, {"exit_code", refusal ? refusal->exit : int(kOk)}, {"checked", checked}};
    if (refusal) j["why"] = refusal->why;
    s.raw_json = j.dump();
    return s;
}

void add_inspect_options(po::options_description& desc) {
    desc.add_options()
        ("help,h", "show this help")
        ("model,m", po::value<std::string>()->required(), kModelHelp)
        ("offline", kOfflineHelp)
        ("plugins", po::value<std::vector<std::string>>(), "plugin directory (repeatable): also say which plugin would serve the model")
        ("gpu", po::value<int>()->default_value(0), kGpuHelp)
        ("device", po::value<std::string>()->default_value("auto"), "which kind of plugin may serve it, as serve's --device: auto, gpu, cpu or any")
        ("load", "also load the model through that plugin, as serve does, and release it: the plugin's own checks (tensors, shapes); "
                 "takes the memory (VRAM for a GPU plugin) and time serve's load takes. Without --plugins, the default plugin search")
        ("chat-template-file", po::value<std::string>(), "the Jinja chat template serve would be given (--chat-template-file): "
                                                          "checked as serve checks it, and the verdict is on it instead of the model's")
        ("tensors", "list every tensor")
        ("kernels", "also the CUDA kernels (and their parameters) each weight matrix runs in a batched step, from the "
                    "kernel plan llama-cuda or gpt-cuda would choose (a MoE layer's experts too); no GPU needed")
        ("batch", po::value<std::string>()->default_value("1"), "with --kernels: the steps' token counts, e.g. 1,8,64 "
                                                                 "(1 .. 65536 each, at most 16)")
        ("kernel-device", po::value<std::string>(), "with --kernels: the device the plan is for, sm_XY:SMS (compute "
                                                    "capability X.Y, SMS multiprocessors); default sm_90:132, an H100 / H200")
        ("fp16-mirrors", "with --kernels: as when the model keeps FP16 weight mirrors (steps take cuBLAS sooner)")
        ("json", "print JSON instead of text");
}

// --kernels and what goes with it; false (the error printed) for a usage error.
bool read_kernels_request(const po::variables_map& vm, KernelsRequest& kernels) {
    if (!vm.count("kernels")) {
        if (!vm["batch"].defaulted() || vm.count("kernel-device") || vm.count("fp16-mirrors")) {
            print_error("--batch, --kernel-device and --fp16-mirrors go with --kernels");
            return false;
        }
        return true;
    }
    const auto batches = parse_batches(vm["batch"].as<std::string>());
    if (!batches) {
        print_error("--batch must be 1 to 16 token counts of 1 .. 65536, comma-separated (e.g. 1,8,64)");
        return false;
    }
    kernels.batches = *batches;
    if (vm.count("kernel-device") && !parse_kernel_device(vm["kernel-device"].as<std::string>(), kernels)) {
        print_error("--kernel-device must be sm_XY:SMS (e.g. sm_90:132, sm_80:108)");
        return false;
    }
    kernels.mirrored = vm.count("fp16-mirrors") > 0;
    return true;
}

// The "Plugin" section: which plugin serve would choose (with --load, its
// load too, released at once); a refusal where none would, or the load fails.
model::InspectSection plugin_section(const po::variables_map& vm, DevicePolicy policy, const model::ModelDescriptor& d,
                                     const std::shared_ptr<model::ModelFile>& file, bool load, std::string& checked,
                                     std::optional<Refusal>& refusal) {
    checked += ", plugin choice";
    loader::LoaderOptions lo;
    lo.device = vm["gpu"].as<int>();
    Registry reg = loader::discover_plugins(loader::plugin_dirs(plugins_arg(vm)), lo);
    Resolution res = reg.resolve(d.requirements(), policy);
    model::InspectSection s{"Plugin", {}, {}};
    const std::string gpu_problem = vm["gpu"].defaulted() ? "" : named_gpu_problem(reg, vm["gpu"].as<int>(), policy);
    if (!gpu_problem.empty() || !res.plugin) {
        const std::string why = gpu_problem.empty() ? no_plugin_message(reg, d.requirements(), res) : gpu_problem;
        s.facts = {{"serves it", "none"}, {"why", why}};
        s.raw_json = nlohmann::json{{"plugin", nullptr}, {"why", why}}.dump();
        refusal = Refusal{kNoPlugin, why + " [NO_PLUGIN]"};
        return s;
    }
    s.facts = {{"serves it", res.plugin->caps.name + " " + res.plugin->caps.version}, {"why", res.explanation}};
    s.raw_json = nlohmann::json{{"plugin", record_json(*res.plugin)}, {"why", res.explanation}}.dump();
    if (load) {
        checked += ", plugin load";
        try {
            EngineLoadOptions elo;
            elo.device = vm["gpu"].as<int>();
            EngineModel::load(res.plugin->api, file->path(), &file->view(), file, elo);  // released at once
        } catch (const Error& e) {
            refusal = refusal_of(e);
        }
    }
    return s;
}

}  // namespace

int cmd_inspect(const std::vector<std::string>& args) {
    po::variables_map vm;
    int code = kOk;
    const char* usage =
        "Usage: engine-host inspect --model REF [--plugins DIR] [--load] [--chat-template-file FILE] [--json] [--tensors]\n"
        "       [--kernels [--batch 1,8,64] [--kernel-device sm_90:132] [--fp16-mirrors]]\n"
        "Exit code: what serve would exit with for this file as far as checked: 0 it serves, 2 the --chat-template-file\n"
        "is unusable, 3 no plugin (with --plugins or --load), 4 the file or its tokenizer is unusable (or, with --load,\n"
        "the plugin's load refuses it), 5 (--load) it does not fit in device memory.";
    if (!parse_options(args, add_inspect_options, usage, vm, code)) return code;

    DevicePolicy policy;
    if (!parse_device_policy(vm["device"].as<std::string>(), policy)) {
        print_error("--device must be auto, gpu, cpu or any");
        return kUsage;
    }
    const bool load = vm.count("load") > 0;
    KernelsRequest kernels;
    if (!read_kernels_request(vm, kernels)) return kUsage;
    // serve reads --chat-template-file before it resolves the model and exits
    // 2 when it cannot use it
    std::optional<Refusal> refusal;
    std::string template_file;
    if (vm.count("chat-template-file")) {
        template_file = vm["chat-template-file"].as<std::string>();
        try {
            chat_template_from_file(template_file);
        } catch (const Error& e) {
            refusal = Refusal{kUsage, std::string(e.what()) + " [" + code_name(e.code()) + "]"};
            template_file.clear();
        }
    }
    // The report still describes the file; a model that cannot be opened
    // after an unusable template is serve's exit 2 all the same.
    std::shared_ptr<model::ModelFile> file;
    try {
        file = model::ModelFile::open(resolve_model_ref(vm["model"].as<std::string>(), vm.count("offline") > 0));
    } catch (const Error&) {
        if (!refusal) throw;
        print_error(refusal->why);
        return refusal->exit;
    }
    model::ModelDescriptor d = model::describe(*file);
    model::InspectOptions opt;
    opt.list_tensors = vm.count("tensors") > 0;
    const std::optional<Error> tokenizer_error = append_tokenizer_section(*file, opt.extra_sections, template_file);
    if (vm.count("kernels")) opt.extra_sections.push_back(kernels_section(file->view(), kernels));

    // In serve's order: the plugin choice, the plugin's load, the tokenizer.
    std::string checked = vm.count("chat-template-file") ? "--chat-template-file, file, tokenizer" : "file, tokenizer";
    if (!refusal && (vm.count("plugins") || load))
        opt.extra_sections.push_back(plugin_section(vm, policy, d, file, load, checked, refusal));
    if (!refusal && tokenizer_error) refusal = refusal_of(*tokenizer_error);
    if (!load) checked += " (not the plugin's own checks of tensors and shapes: --load)";
    opt.extra_sections.push_back(verdict_section(refusal, checked));
    std::cout << (vm.count("json") ? model::inspect_json(*file, opt) + "\n" : model::inspect_text(*file, opt));
    return refusal ? refusal->exit : kOk;
}

}  // namespace eh::cli
