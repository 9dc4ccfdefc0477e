// Real-world JSON-schema coverage: compiles every schema in a set of folders
// the way a request's response_format does (json_schema_grammar on the JSON
// text, then the matcher's start state), and reports per folder (a "source")
// how many are accepted, the most common refusals (by keyword and message,
// with paths left out), and the compile times (issue 51's < 50 ms goal).
// The schemas are collected by whoever runs it; none ship with the project.
// With --samples N FILE, each accepted schema's matcher is also walked N
// times at random to a complete value (the way a sampler that picks any
// allowed byte would), and the values are written to FILE as JSON lines
// {"schema": path, "instance": text} for an independent validator
// (tests/constrain/validate_samples.py).
//   eh-schema-coverage /tmp/schemas            (each subfolder a source)
//   eh-schema-coverage --list /tmp/schemas     (also one line per schema)
//   eh-schema-coverage --list --raw /tmp/schemas  (… with the whole refusal message)
//   eh-schema-coverage --samples 20 /tmp/samples.jsonl /tmp/schemas
//   eh-schema-coverage --repeat 7 /tmp/schemas  (compile times: the fastest of
//                                                7, less disturbed by other load)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
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

// A random complete value: allowed bytes picked at random, leaning to
// closing characters and to ending once the value may end. "" when the walk
// runs past `limit` bytes without ending.
std::string random_value(const std::shared_ptr<eh::constrain::Automaton>& a, std::mt19937& rng, size_t limit) {
    eh::constrain::Matcher m(a);
    std::string out;
    std::uniform_real_distribution<double> u(0, 1);
    while (out.size() < limit) {
        const auto mask = m.mask();
        auto allowed = [&](int id) { return ((*mask)[size_t(id) / 32] >> (id % 32)) & 1u; };
        if (allowed(256) && (m.complete() || u(rng) < 0.3 + double(out.size()) / double(limit))) return out;
        std::vector<int> bytes, closing;
        for (int b = 0; b < 256; ++b)
            if (allowed(b)) {
                bytes.push_back(b);
                if (b == '"' || b == '}' || b == ']') closing.push_back(b);
            }
        if (bytes.empty()) return "";
        const auto& from = !closing.empty() && u(rng) < 0.35 ? closing : bytes;
        const int b = from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
        out += char(b);
        if (!m.accept(b)) return "";
    }
    return "";
}

struct Result {
    std::string file;
    bool accepted = false;
    std::string reason;
    std::string message;  // the refusal as the client would read it (--list --raw)
    double ms = 0;
    size_t bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
    bool list = false, raw = false;
    int samples = 0, repeat = 1;
    std::ofstream sample_out;
    std::vector<fs::path> roots;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--list") == 0) list = true;
        else if (std::strcmp(argv[i], "--raw") == 0) raw = true;
        else if (std::strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
        else if (std::strcmp(argv[i], "--samples") == 0 && i + 2 < argc) {
            samples = std::atoi(argv[++i]);
            sample_out.open(argv[++i]);
        } else roots.emplace_back(argv[i]);
    }
    std::mt19937 rng(51);
    size_t walks = 0, ended = 0;
    if (roots.empty()) {
        std::fprintf(stderr, "usage: eh-schema-coverage [--list [--raw]] [--samples N FILE] [--repeat N] DIR...  (each DIR's "
                             "subfolders are sources)\n");
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
            std::shared_ptr<eh::constrain::Automaton> automaton;
            try {
                auto g = eh::constrain::json_schema_grammar(text);
                automaton = std::make_shared<eh::constrain::Automaton>(std::move(g), vocab);
                r.accepted = true;
            } catch (const eh::constrain::GrammarError& e) {
                r.reason = reason_of(e.keyword(), e.what());
                r.message = e.what();
            } catch (const std::exception& e) {
                r.reason = reason_of("", e.what());
                r.message = e.what();
            }
            r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
            for (int k = 1; r.accepted && k < repeat; ++k) {
                const auto t1 = Clock::now();
                const auto again = std::make_shared<eh::constrain::Automaton>(eh::constrain::json_schema_grammar(text), vocab);
                r.ms = std::min(r.ms, std::chrono::duration<double, std::milli>(Clock::now() - t1).count());
            }
            for (int k = 0; automaton && k < samples; ++k) {
                ++walks;
                std::string v;
                try {
                    v = random_value(automaton, rng, 3000);
                } catch (const std::exception&) {
                    continue;  // a matcher limit (docs/http-api.md); the value is not written
                }
                if (v.empty()) continue;
                ++ended;
                sample_out << nlohmann::json{{"schema", f.string()}, {"instance", v}}.dump() << "\n";
            }
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
    if (samples) std::printf("\nrandom walks: %zu, ended with a complete value: %zu\n", walks, ended);
    if (list)
        for (const auto& [source, results] : by_source)
            for (const auto& r : results)
                std::printf("%s\t%s\t%.2f\t%s\n", r.accepted ? "ok" : "REFUSED", r.file.c_str(), r.ms,
                            (raw ? r.message : r.reason).c_str());
    return 0;
}
