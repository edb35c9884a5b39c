// Compiled only with MPI (PARATRAIN_HAVE_MPI); see mpi_types.h.
#ifdef PARATRAIN_HAVE_MPI
#include "paratrain/comm/mpi/mpi_types.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::comm::mpi_detail {
namespace {

// Types and ops created once, after MPI_Init, freed never (MPI_Finalize
// reclaims them).
struct Custom {
  MPI_Datatype half16 = MPI_DATATYPE_NULL;  // shared by bf16 and fp16: 2 bytes
  MPI_Op bf16[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // sum, max, min
  MPI_Op fp16[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};
Custom custom;
std::once_flag custom_once;

template <typename T, int Kind>
void combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    b[i] = static_cast<T>(Kind == 0 ? x + y : Kind == 1 ? std::max(x, y) : std::min(x, y));
  }
}

void make_custom() {
  check(MPI_Type_contiguous(2, MPI_BYTE, &custom.half16), "MPI_Type_contiguous");
  check(MPI_Type_commit(&custom.half16), "MPI_Type_commit");
  check(MPI_Op_create(&combine<c10::BFloat16, 0>, 1, &custom.bf16[0]), "MPI_Op_create");
  check(MPI_Op_create(&combine<c10::BFloat16, 1>, 1, &custom.bf16[1]), "MPI_Op_create");
  check(MPI_Op_create(&combine<c10::BFloat16, 2>, 1, &custom.bf16[2]), "MPI_Op_create");
  check(MPI_Op_create(&combine<c10::Half, 0>, 1, &custom.fp16[0]), "MPI_Op_create");
  check(MPI_Op_create(&combine<c10::Half, 1>, 1, &custom.fp16[1]), "MPI_Op_create");
  check(MPI_Op_create(&combine<c10::Half, 2>, 1, &custom.fp16[2]), "MPI_Op_create");
}

bool we_initialized = false;

void finalize_at_exit() {
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

}  // namespace

void check(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(fmt::format("{}: MPI error: {}", what, std::string(text, static_cast<std::size_t>(len))));
}

MPI_Datatype mpi_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBool: return MPI_C_BOOL;
    case at::kBFloat16:
    case at::kHalf:
      std::call_once(custom_once, make_custom);
      return custom.half16;
    default:
      throw Error(fmt::format("the MPI backend does not carry {} tensors", c10::toString(t.scalar_type())));
  }
}

MPI_Op mpi_op(ReduceOp op, const at::Tensor& t) {
  const int kind = op == ReduceOp::kMax ? 1 : op == ReduceOp::kMin ? 2 : 0;
  switch (t.scalar_type()) {
    case at::kBFloat16: std::call_once(custom_once, make_custom); return custom.bf16[kind];
    case at::kHalf: std::call_once(custom_once, make_custom); return custom.fp16[kind];
    case at::kBool: return kind == 2 ? MPI_LAND : MPI_LOR;
    default: return kind == 0 ? MPI_SUM : kind == 1 ? MPI_MAX : MPI_MIN;
  }
}

void ensure_initialized() {
  static std::mutex mu;
  std::lock_guard lock(mu);
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (!initialized) {
    if (finalized()) throw CommError("MPI was already finalized in this process; it cannot be initialized again");
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    if (!we_initialized) std::atexit(finalize_at_exit);
    we_initialized = true;
  } else {
    check(MPI_Query_thread(&provided), "MPI_Query_thread");
  }
  if (provided < MPI_THREAD_MULTIPLE)
    throw CommError(fmt::format(
        "the MPI library provides thread level {} but paratrain needs MPI_THREAD_MULTIPLE ({}): DDP issues "
        "collectives from autograd's thread. Use an MPI built with thread support (Debian's OpenMPI is), or "
        "world.backend = \"gloo\"",
        provided, MPI_THREAD_MULTIPLE));
}

bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

}  // namespace paratrain::comm::mpi_detail

#endif
