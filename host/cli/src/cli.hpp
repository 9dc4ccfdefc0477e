// engine-host command-line interface: shared pieces of the subcommands.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "eh/error.hpp"
#include "eh/model/inspect.hpp"

namespace eh::cli {

// Process exit codes (documented in README.md and `engine-host --help`).
enum Exit : int {
    kOk = 0,
    kFailure = 1,           // anything not listed below
    kUsage = 2,             // bad command line
    kNoPlugin = 3,          // plugin directory unusable, or no plugin serves the model
    kModelInvalid = 4,      // MODEL_LOAD_FAILED: the file is unreadable or malformed
    kInsufficientVram = 5,  // INSUFFICIENT_VRAM
};

int exit_code_for(Code code);

// Prints "error: <message>" (first line) and detail lines to stderr.
void print_error(const std::string& message);

int cmd_plugins(const std::vector<std::string>& args);
int cmd_inspect(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_forge(const std::vector<std::string>& args);
int cmd_quantize(const std::vector<std::string>& args);
int cmd_convert(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_loadgen(const std::vector<std::string>& args);
int cmd_pull(const std::vector<std::string>& args);
int cmd_chat(const std::vector<std::string>& args);
// Not in --help: the engine process `serve --engine-process` starts.
int cmd_engine_worker(const std::vector<std::string>& args);

// The longest line `chat` reads; longer input is split into several turns.
inline constexpr size_t kMaxChatLineBytes = 64 * 1024;

// The "Tokenizer" block of `inspect`. Returns the error when the tokenizer
// does not load (serve refuses such a file), else nullopt. `template_file`:
// the --chat-template-file path given (it replaces the model's template in
// the verdict; the caller has checked that it compiles), or "".
std::optional<Error> append_tokenizer_section(const model::ModelFile& file, std::vector<model::InspectSection>& out,
                                              const std::string& template_file = "");

}  // namespace eh::cli
