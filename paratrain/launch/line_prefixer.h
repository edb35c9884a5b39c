// Turns one worker stream (stdout or stderr, read in arbitrary chunks from a
// pipe) into whole lines written to the launcher's fd with the rank in front,
// so lines of different ranks never mix mid-line. Not a reader: the
// supervisor polls the pipes and feeds the bytes here.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace paratrain::launch {

class LinePrefixer {
 public:
  // A line without '\n' after this many bytes is written as it is, so one
  // runaway line cannot grow the launcher's memory without bound.
  static constexpr std::size_t kMaxLine = 64 * 1024;

  // `terminal`: out_fd shows on a terminal, where a worker may keep a status
  // line (a progress bar, core/logging.h: "\r\x1b[K" + text, no newline).
  // Then every line starts by clearing the terminal's current line (another
  // rank's bar), and a worker's status line is drawn, prefixed, as it comes.
  LinePrefixer(std::string prefix, int out_fd, bool terminal = false)
      : prefix_(std::move(prefix)), fd_(out_fd), terminal_(terminal) {}

  // Writes every complete line in pending + bytes; keeps the rest.
  void feed(std::string_view bytes);
  // Writes a partial last line (with a '\n' added). Call at end of stream.
  void finish();

 private:
  void emit(std::string_view line);  // prefix + line + '\n' in one write
  void draw_status();                // terminal: the text after pending_'s last '\r'

  std::string prefix_;
  int fd_;
  bool terminal_;
  std::string pending_;
  std::string scratch_;
};

// write(2) until all of `data` is out, retrying on EINTR and waiting on a
// non-blocking fd. Returns false once the reader is gone (EPIPE) or on another
// error: the caller then drops output rather than stall the workers.
bool write_all(int fd, std::string_view data);

}  // namespace paratrain::launch
