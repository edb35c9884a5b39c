// Per-rank timeline of a pipeline step: when each micro-batch's forward,
// backward, recompute and each send/recv ran, kept in memory and written as
// one JSONL file per rank (<run_dir>/trace/rank_<r>.jsonl). Recording and
// reading only; the Chrome trace is chrome_trace.h, the schedules are elsewhere.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace paratrain::pipeline {

enum class EventKind { kForward, kBackward, kRecompute, kSend, kRecv, kWait, kOptimizer };

// "forward", "backward", "recompute", "send", "recv", "wait", "optimizer":
// the "kind" field of the rank files.
std::string to_string(EventKind kind);

struct TimelineEvent {
  EventKind kind = EventKind::kForward;
  int64_t step = 0;
  int microbatch = -1;  // -1: not about one micro-batch (optimizer, a step-wide wait)
  int chunk = -1;       // model chunk of interleaved schedules; -1 or 0 for plain ones
  int peer = -1;        // the other rank of a send/recv
  int64_t bytes = 0;    // payload of a send/recv
  // std::chrono::steady_clock in microseconds. On Linux that is
  // CLOCK_MONOTONIC, one clock shared by every process of a machine, so the
  // rows of ranks on one machine line up. Ranks on different machines have
  // unrelated clocks: their rows do not line up and a measured bubble across
  // them is meaningless.
  int64_t start_us = 0;
  int64_t end_us = 0;
};

// First line of a rank file: who wrote it, so a trace can name its rows
// "rank r (stage s, dp d)". -1 = not known (the writer was not told).
struct TimelineHeader {
  int rank = -1;
  int stage = -1;
  int dp = -1;
};

struct TimelineOptions {
  // The rank's JSONL file (usually timeline_path(run_dir, rank)). Empty keeps
  // events in memory only (tests, the benchmark). The file is created at the
  // first recorded event, so a run that records nothing leaves no file.
  std::filesystem::path path;
  // Record only steps in [first_step, first_step + max_steps), first_step
  // being the step of the first recorded event: a bounded file and memory
  // however long the run is, at the price of seeing only the first steps
  // (which include warm-up; a trace of later steps needs a larger value).
  // 0 records nothing.
  int64_t max_steps = 20;
  // Pipeline stage and data-parallel index of this rank, written to the
  // header line for the trace's row names; -1 = unknown.
  int stage = -1;
  int dp = -1;
};

// One per rank. Thread-compatible: one thread records (the executor's).
class Timeline {
 public:
  Timeline(int rank, TimelineOptions options);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;
  Timeline(Timeline&&) = default;  // not while a Scope of it is open
  Timeline& operator=(Timeline&&) = default;

  static int64_t now_us();

  // Whether events of `step` are kept. Callers skip the clock reads when not.
  bool recording(int64_t step) const;
  // Appends `e` when recording(e.step), and buffers one JSON line for the
  // rank file. Never throws on I/O: a failed write is reported by end_step.
  void record(const TimelineEvent& e);
  // Flushes the rank file, so a crash later loses at most the current step.
  // Throws Error naming the file when writing failed (disk full, ...).
  void end_step(int64_t step);

  const std::vector<TimelineEvent>& events() const { return events_; }
  const TimelineHeader& header() const { return header_; }

  // Records [construction, destruction) as one event of `timeline` (a null
  // timeline or a step not recorded costs no clock read):
  //   Timeline::Scope s(timeline, {EventKind::kForward, step, mb, chunk});
  class Scope {
   public:
    Scope(Timeline& timeline, const TimelineEvent& event) : Scope(&timeline, event) {}
    Scope(Timeline* timeline, const TimelineEvent& event);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timeline* timeline_;  // null when not recording
    TimelineEvent event_;
  };

 private:
  TimelineHeader header_;
  TimelineOptions options_;
  std::vector<TimelineEvent> events_;
  int64_t first_step_ = -1;  // step of the first recorded event; -1 before it
  std::ofstream out_;        // opened at the first recorded event
};

// <run_dir>/trace/rank_<rank>.jsonl
std::filesystem::path timeline_path(const std::filesystem::path& run_dir, int rank);

// One rank file read back. Lines: an optional header {"rank":r,"stage":s,"dp":d},
// then {"kind":"forward","step":..,"mb":..,"chunk":..,"peer":..,"bytes":..,
// "start_us":..,"end_us":..} per event.
struct RankTimeline {
  TimelineHeader header;
  std::vector<TimelineEvent> events;
};

// Throws Error naming the file and line on malformed input. A last line
// without its newline that does not parse is dropped: that is what a crash
// in the middle of a write leaves, and the steps before it are still good.
RankTimeline read_rank_timeline(const std::filesystem::path& file);
std::vector<TimelineEvent> read_timeline(const std::filesystem::path& file);

// Every <run_dir>/trace/rank_<r>.jsonl, ordered by rank (the header's rank
// is the file's). Throws Error saying how to get the files when there are none.
std::vector<RankTimeline> read_run_timelines(const std::filesystem::path& run_dir);

// The measured bubble of one step across ranks:
//   span   = latest end over all ranks' events of the step - earliest start
//            of a compute event (of any event when the step has no compute):
//            a receive posted before the step's first forward overlaps the
//            previous step, whose span already holds it
//   busy_r = time rank r spent in forward, backward and recompute events
//   idle_share[r] = 1 - busy_r / span;  bubble = 1 - mean(busy) / span = mean(idle_share)
// A rank without events in the step counts as idle throughout. Sends,
// receives and waits count as idle: they are what a bubble looks like from
// inside a rank. A span of 0 gives bubble 0.
struct BubbleReport {
  int64_t step = 0;
  double span_us = 0;
  double bubble = 0;
  std::vector<double> idle_share;  // one per rank, in the order given
};
// Throws Error when no rank has an event of `step`.
BubbleReport measure_bubble(const std::vector<std::vector<TimelineEvent>>& per_rank, int64_t step);

// The steps any rank recorded, ascending.
std::vector<int64_t> recorded_steps(const std::vector<std::vector<TimelineEvent>>& per_rank);

// A short table, one line per report: step, span in ms, bubble and each
// rank's idle share in percent. `ranks` names the idle-share columns (the
// ranks measure_bubble was given, in order); empty = 0, 1, 2, ...
std::string format_bubbles(const std::vector<BubbleReport>& reports, const std::vector<int>& ranks = {});

}  // namespace paratrain::pipeline
