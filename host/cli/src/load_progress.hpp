// The model-load progress bar of `serve` (issue 24). The `model_load_progress`
// log lines (0, 25, 50, 75, 100 %) are always written; the bar, redrawn in
// place on stderr, only when it cannot be broken by them: stderr must be a
// terminal, and the log (stdout) must not go to that same terminal. On a
// plain `engine-host -m MODEL` in a terminal the log lines are the progress;
// with the log sent elsewhere (`> serve.log`, a pipe) the terminal gets the
// bar; without a terminal (CI, a supervisor) there is never a bar.
#pragma once

namespace eh::cli {

// Whether a bar on `bar_fd` would stay intact with log lines on `log_fd`.
bool progress_bar_fits(int bar_fd, int log_fd);

class LoadProgressBar {
public:
    explicit LoadProgressBar(bool enabled) : on_(enabled) {}
    void update(float fraction);  // 0..1; the line ends at 100 %

private:
    bool on_;
    int last_ = -1;
};

}  // namespace eh::cli
