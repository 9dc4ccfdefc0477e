// The log line a worker writes when a fatal signal (a crashing engine plugin:
// SIGSEGV, SIGILL, SIGBUS, SIGFPE, SIGABRT) ends it, so the operator reads
// which plugin died, how, and in which phase, instead of only an exit status.
// Issue 26 item 5; the clients' side of a crash is crash_notice.hpp.
#pragma once

#include <functional>
#include <string>

namespace eh::http {

// The time format of the line's timestamp (RFC 3339, UTC, milliseconds),
// the width the handler writes the crash time over.
inline constexpr char kLastWordsTimePlaceholder[] = "0000-00-00T00:00:00.000Z";

// `line_for(signal_name, ts)` builds the whole line (no newline) for each
// fatal signal now, with `ts` = kLastWordsTimePlaceholder; the signal handler
// only copies the line for its signal to stdout, the crash time written over
// the placeholder. Call again when the phase changes (loading -> serving).
// Installs the fatal-signal handlers if they are not yet.
void set_last_words(const std::function<std::string(const char* signal_name, const std::string& ts)>& line_for);

}  // namespace eh::http
