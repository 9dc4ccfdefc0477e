// Stop strings matched on text. Text that might be the start of a stop
// string is held back until it is known not to be one, so a stop string
// never reaches the client, not even in part.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace eh::service {

class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

    struct Result {
        std::string emit;     // safe to send now
        bool stopped = false; // a stop string was found; generation ends
    };
    Result feed(std::string_view text);
    // The held-back text, once generation ends without a stop.
    std::string flush();
    // The stop string that ended generation ("" until one did).
    const std::string& matched() const { return matched_; }

private:
    std::vector<std::string> stops_;
    std::string held_;
    std::string matched_;
};

}  // namespace eh::service
