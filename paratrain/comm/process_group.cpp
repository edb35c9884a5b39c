// Small shared pieces of the process-group interface.
#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

}  // namespace paratrain::comm
