// MPI plumbing for mpi_group.cpp: tensor dtypes as MPI datatypes, our
// ReduceOps as MPI ops (with our own for bf16/fp16, which MPI lacks), error
// codes as CommError, and initializing / finalizing MPI once per process.
// Only included where PARATRAIN_HAVE_MPI is set.
#pragma once

#include <mpi.h>

#include <ATen/core/Tensor.h>

#include <string>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm::mpi_detail {

// Throws CommError("<what>: <MPI's error string>") unless rc is MPI_SUCCESS.
void check(int rc, const std::string& what);

// The datatype of the tensor's elements: MPI's own for float, double and the
// integers; a committed 2-byte type for bf16 and fp16; bool as one byte.
MPI_Datatype mpi_type(const at::Tensor& tensor);

// MPI_SUM / MAX / MIN (kAvg sums; the caller divides), or our ops for bf16
// and fp16 (each element widened to fp32, combined, rounded back), or
// logical OR/AND for bool (sum and max: any, min: all).
MPI_Op mpi_op(ReduceOp op, const at::Tensor& tensor);

// MPI_Init_thread(MPI_THREAD_MULTIPLE) unless MPI is already initialized
// (then checks the thread level it was given). Registers MPI_Finalize for
// process exit when it initialized MPI itself.
void ensure_initialized();
bool finalized();

}  // namespace paratrain::comm::mpi_detail
