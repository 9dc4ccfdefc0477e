// Real-world JSON-schema coverage: compiles every schema in a set of folders
// the way a request's response_format does (json_schema_grammar on the JSON
// text, then the matcher's start state), and reports per folder (a "source")
// how many are accepted, the most common refusals (by keyword and message,
// with paths left out), and the compile times (issue 51's < 50 ms goal).
// The schemas are collected by whoever runs it; none ship with the project.
//   eh-schema-coverage /tmp/schemas            (each subfolder a source)
//   eh-schema-coverage --list /tmp/schemas     (also one line per schema)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "eh/constrain/automaton.hpp"
#include "eh/constrain/grammar.hpp"
#include "eh/error.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::shared_ptr<const eh::constrain::TokenVocab> byte_vocab() {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
    bytes.emplace_back();
    return std::make_shared<const eh::constrain::TokenVocab>(std::move(bytes), std::vector<int32_t>{256});
}

// A refusal's message without what varies per schema: quoted paths and
// names become '…', numbers stay (they are mostly limits).
std::string reason_of(const std::string& keyword, const std::string& message) {
    std::string out = keyword.empty() ? "" : "[" + keyword + "] ";
    bool quoted = false;
    for (char c : message) {
        if (c == '\'') {
            quoted = !quoted;
            out += quoted ? "'…" : "'";
            continue;
        }
        if (!quoted) out += c;
    }
    // Keep the keyword visible: "the JSON-schema keyword '…'" says nothing.
    return out.substr(0, 140);
}

struct Result {
    std::string file;
    bool accepted = false;
    std::string reason;
    double ms = 0;
    size_t bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
    bool list = false;
    std::vector<fs::path> roots;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--list") == 0) list = true;
        else roots.emplace_back(argv[i]);
    }
    if (roots.empty()) {
        std::fprintf(stderr, "usage: eh-schema-coverage [--list] DIR...  (each DIR's subfolders are sources)\n");
        return 2;
    }
    const auto vocab = byte_vocab();
    std::map<std::string, std::vector<Result>> by_source;
    for (const auto& root : roots) {
        std::vector<fs::path> files;
        for (const auto& e : fs::recursive_directory_iterator(root))
            if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
        std::sort(files.begin(), files.end());
        for (const auto& f : files) {
            std::ifstream in(f, std::ios::binary);
            std::stringstream ss;
            ss << in.rdbuf();
            const std::string text = ss.str();
            const fs::path rel = fs::relative(f, root);
            const std::string source = rel.has_parent_path() ? rel.begin()->string() : root.filename().string();
            Result r;
            r.file = rel.string();
            r.bytes = text.size();
            const auto t0 = Clock::now();
            try {
                auto g = eh::constrain::json_schema_grammar(text);
                eh::constrain::Automaton a(std::move(g), vocab);
                r.accepted = true;
            } catch (const eh::constrain::GrammarError& e) {
                r.reason = reason_of(e.keyword(), e.what());
            } catch (const std::exception& e) {
                r.reason = reason_of("", e.what());
            }
            r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
            by_source[source].push_back(std::move(r));
        }
    }
    std::map<std::string, int> reasons;
    std::vector<const Result*> all;
    int total = 0, accepted = 0;
    std::printf("| source | schemas | accepted | %% |\n|---|---|---|---|\n");
    for (const auto& [source, results] : by_source) {
        int ok = 0;
        for (const auto& r : results) {
            ok += r.accepted;
            if (!r.accepted) ++reasons[r.reason];
            all.push_back(&r);
        }
        total += int(results.size());
        accepted += ok;
        std::printf("| %s | %zu | %d | %.0f %% |\n", source.c_str(), results.size(), ok,
                    100.0 * ok / double(results.size()));
    }
    std::printf("| all | %d | %d | %.0f %% |\n\n", total, accepted, total ? 100.0 * accepted / total : 0.0);
    std::vector<std::pair<int, std::string>> top;
    for (const auto& [r, n] : reasons) top.emplace_back(n, r);
    std::sort(top.rbegin(), top.rend());
    std::printf("refusals by reason:\n");
    for (const auto& [n, r] : top) std::printf("%4d  %s\n", n, r.c_str());
    std::sort(all.begin(), all.end(), [](const Result* a, const Result* b) { return a->ms > b->ms; });
    std::printf("\nslowest compiles (ms, bytes, accepted):\n");
    for (size_t i = 0; i < std::min<size_t>(10, all.size()); ++i)
        std::printf("%8.2f  %8zu  %s  %s\n", all[i]->ms, all[i]->bytes, all[i]->accepted ? "yes" : "no ",
                    all[i]->file.c_str());
    if (list)
        for (const auto& [source, results] : by_source)
            for (const auto& r : results)
                std::printf("%s\t%s\t%.2f\t%s\n", r.accepted ? "ok" : "REFUSED", r.file.c_str(), r.ms, r.reason.c_str());
    return 0;
}
