// Timings of one synchronized backward, recorded by the reducer so benchmarks
// can report how much of the gradient communication backward hid.
// Not a profiler: times come from steady_clock around our own calls; see
// Note [Overlap stats] in docs/notes/ddp.md for what each one can miss.
#pragma once

#include <cstdint>
#include <vector>

namespace paratrain::ddp {

// All times in milliseconds since the first gradient hook of the backward.
struct BucketTiming {
  int64_t bytes = 0;
  double ready_ms = -1;      // its last gradient was copied in
  double launched_ms = -1;   // its collective was started
  // Finished: the backend's own stamp (Work::completed_at(), exact) when it
  // gives one, else when first seen finished (an upper bound, see the note).
  double completed_ms = -1;
};

struct StepStats {
  double backward_ms = 0;  // first gradient hook -> autograd's end-of-backward callback
  double wait_ms = 0;      // blocked on collectives after backward ended: exposed communication
  double finalize_ms = 0;  // the whole end-of-backward work (waits, write-back, bookkeeping)
  std::vector<BucketTiming> buckets;  // in bucket (= launch) order

  // Wall time during which at least one bucket's collective was in flight.
  double comm_ms() const;
  // The part of comm_ms() before backward ended: communication hidden behind it.
  double hidden_ms() const;
  // hidden_ms() / comm_ms(), 0 when nothing was communicated.
  double hidden_share() const;
};

}  // namespace paratrain::ddp
