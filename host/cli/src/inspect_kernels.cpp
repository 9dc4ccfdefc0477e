#include "inspect_kernels.hpp"

#include <nlohmann/json.hpp>

#include <charconv>

#include <ehcuda/kernel_route.hpp>
#include <ehcuda/model_matrices.hpp>
#include <ehcuda/options.hpp>

#include "eh/error.hpp"

namespace eh::cli {
namespace {

// The architectures whose matrix list ehcuda::dense_matrices knows
// (llama-cuda's), and those of ehcuda::gpt_matrices (gpt-cuda's).
bool dense_architecture(std::string_view a) {
    return a == "llama" || a == "qwen2" || a == "qwen3" || a == "phi3" || a == "gemma3" || a == "qwen2vl";
}
bool gpt_architecture(std::string_view a) { return a == "gpt2" || a == "gpt-oss" || a == "qwen3moe"; }

bool parse_int(std::string_view s, int lo, int hi, int& out) {
    int v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return false;
    out = v;
    return true;
}

}  // namespace

std::optional<std::vector<int>> parse_batches(const std::string& s) {
    std::vector<int> out;
    size_t start = 0;
    while (true) {
        const size_t comma = s.find(',', start);
        const std::string_view part(s.data() + start, (comma == std::string::npos ? s.size() : comma) - start);
        int v = 0;
        if (!parse_int(part, 1, 65536, v) || out.size() == 16) return std::nullopt;
        out.push_back(v);
        if (comma == std::string::npos) return out;
        start = comma + 1;
    }
}

bool parse_kernel_device(const std::string& s, KernelsRequest& r) {
    const size_t colon = s.find(':');
    if (s.rfind("sm_", 0) != 0 || colon == std::string::npos || colon < 5) return false;
    const std::string_view cc(s.data() + 3, colon - 3);
    int cc_num = 0, sms = 0;
    if (!parse_int(cc, 10, 999, cc_num) || !parse_int(std::string_view(s).substr(colon + 1), 1, 1024, sms)) return false;
    r.cc_major = cc_num / 10;
    r.cc_minor = cc_num % 10;
    r.sm_count = sms;
    r.device_given = true;
    return true;
}

model::InspectSection kernels_section(const eh_model_view& raw, const KernelsRequest& r) {
    model::InspectSection s{"Kernels", {}, {}};
    const ehp::ModelView view(&raw);
    const std::string arch(view.architecture());
    const ehcuda::DeviceTraits dev{r.cc_major, r.cc_minor, r.sm_count};
    const std::string device = "sm_" + std::to_string(r.cc_major) + std::to_string(r.cc_minor) + ", " +
                               std::to_string(r.sm_count) + " multiprocessors" +
                               (r.device_given ? " (--kernel-device)" : " (the default: an H100 / H200; --kernel-device sm_XY:SMS for another)");
    nlohmann::json j = {{"device", device}, {"architecture", arch}};
    s.facts.push_back({"device", device});
    const bool gpt = gpt_architecture(arch);
    if (!dense_architecture(arch) && !gpt) {
        const std::string why = "not listed for architecture '" + arch +
                                "': the matrix lists cover llama-cuda's architectures (llama, qwen2, qwen3, phi3, "
                                "gemma3, qwen2vl) and gpt-cuda's (gpt2, gpt-oss, qwen3moe)";
        s.facts.push_back({"routes", why});
        j["routes"] = nullptr;
        j["why"] = why;
        s.raw_json = j.dump();
        return s;
    }
    ehcuda::KernelPlan plan;
    std::vector<ehcuda::MatrixKind> mats;
    std::vector<ehcuda::StepMatrix> gpt_mats;
    try {
        // The plan the plugin chooses at load (EHCUDA_PLAN applies, as
        // there): gpt-cuda's with exact routing (int16x2 input).
        plan = ehcuda::load_plan(dev, gpt, ehcuda::Options(nullptr));
        if (gpt) {
            gpt_mats = ehcuda::gpt_matrices(view, plan, {});
        } else {
            const uint64_t n_head = view.require_uint(view.arch_key("attention.head_count"));
            const uint64_t n_embd = view.require_uint(view.arch_key("embedding_length"));
            ehcuda::DenseMatrixOptions o;
            o.head_dim = int(view.get_uint(view.arch_key("attention.key_length")).value_or(n_head ? n_embd / n_head : 0));
            mats = ehcuda::dense_matrices(view, plan, o);
        }
    } catch (const ehp::Error& e) {
        throw Error(e.status() == EH_INVALID_ARGUMENT ? Code::InvalidRequest : Code::ModelLoadFailed,
                    std::string("--kernels: ") + e.what());
    }
    s.facts.push_back({"plan", ehcuda::describe_plan(plan, dev)});
    // (gpt-cuda's steps keep the threshold of a model without mirrors:
    // its mirrors only change what cuBLAS reads)
    const bool mirrored = r.mirrored && !gpt;
    const std::string from = "steps take cuBLAS from " + std::to_string(ehcuda::step_per_token_max(plan, mirrored) + 1) +
                             " tokens";
    s.facts.push_back({"mirrors", gpt ? from + " whether or not gpt-cuda keeps FP16 weight mirrors (they change only "
                                               "what cuBLAS reads)"
                                  : r.mirrored ? "FP16 weight mirrors kept (--fp16-mirrors): " + from
                                               : "none assumed (--fp16-mirrors: as with them): " + from});
    if (gpt)
        s.facts.push_back({"experts", "forms chosen by the average routed pairs an expert (step tokens x top-k / "
                                      "experts); the load option batch_invariant (other forms) not assumed"});
    j["plan"] = ehcuda::describe_plan(plan, dev);
    j["mirrored"] = r.mirrored;
    nlohmann::json steps = nlohmann::json::array();
    for (int n : r.batches) {
        const std::vector<std::string> lines = gpt ? ehcuda::step_route_lines(plan, dev, gpt_mats, n, false)
                                                   : ehcuda::route_lines(plan, dev, mats, n, r.mirrored);
        const std::string key = "batch " + std::to_string(n);
        for (size_t i = 0; i < lines.size(); ++i) s.facts.push_back({i ? "" : key, lines[i]});
        steps.push_back({{"tokens", n}, {"routes", lines}});
    }
    j["steps"] = steps;
    s.raw_json = j.dump();
    return s;
}

}  // namespace eh::cli
