// The error hierarchy every layer throws. Messages say which rank, which
// operation, what was wrong and what to do; the launcher and (later) the
// elastic agent tell errors apart by type. A library never calls exit().
#pragma once

#include <stdexcept>
#include <string>

namespace paratrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A collective or point-to-point operation failed (peer gone, socket error).
class CommError : public Error {
 public:
  using Error::Error;
};

/// Something did not happen in time: a rank never joined, a collective stalled.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

/// A checkpoint could not be written or read back (truncated, wrong layout).
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// The user's configuration is wrong: unknown key, wrong type, bad value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A dataset file is missing, truncated or not what it claims to be.
class DataError : public Error {
 public:
  using Error::Error;
};

}  // namespace paratrain
