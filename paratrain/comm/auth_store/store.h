// The authenticated store's client: a c10d::Store that proves it knows the
// job's token before the server (server.h) serves it a single key. Gloo and
// paratrain's rendezvous use it like a TCPStore. Not here: the protocol's
// cryptography (handshake.h) or choosing when to use it (rendezvous.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace paratrain::comm::auth {

struct AuthStoreOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // The job's secret and id, as the server was given them. Never logged.
  std::string token;
  std::string job_id = "none";
  // How long to keep trying to connect (rank 0 may start later than the
  // others) and the default for get() and wait().
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

// What answers at host:port, for a process that has no token and is about
// to connect c10d's TCPStore client there (Note [Probing for the greeting]
// in store.cpp). authenticated: the process greeted like this store's
// server (it speaks first); silent: it said nothing within `greet_within`,
// as c10d's TCPStore server does; unreachable: no connection within
// `connect_within` (`why` says why).
enum class Greeting { authenticated, silent, unreachable };
Greeting probe_greeting(const std::string& host, int port, std::chrono::milliseconds connect_within,
                        std::chrono::milliseconds greet_within, std::string& why);

class AuthStore : public c10d::Store {
 public:
  // Connects (retrying until the timeout) and completes the handshake.
  // Throws CommError when the server refuses this process (naming the
  // reason: wrong token, another job) or cannot prove it knows the token,
  // TimeoutError when nothing answered in time.
  explicit AuthStore(AuthStoreOptions options);
  ~AuthStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& currentValue,
                                  const std::vector<uint8_t>& newValue) override;
  // Waits up to the store's timeout for the key, as c10d's stores do.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  // Throws TimeoutError naming the keys when they do not all exist in time.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // A second connection to the same store, for a thread of its own (LibTorch
  // 2.x's c10d::Store::clone(), which its backends call; in 1.13 nothing
  // calls it). No `override`: 1.13's Store has no clone() to override.
  c10::intrusive_ptr<c10d::Store> clone();

  // Keeps `owner` (rank 0's server) alive as long as this store.
  void hold(std::shared_ptr<void> owner) { owner_ = std::move(owner); }
  // "HOST:PORT", for messages.
  const std::string& where() const { return where_; }

 private:
  std::vector<uint8_t> request(const std::vector<uint8_t>& frame, std::chrono::milliseconds reply_within);

  AuthStoreOptions options_;  // kept for clone()
  std::string where_;
  int fd_ = -1;
  std::mutex mu_;  // one request at a time on the one connection
  std::shared_ptr<void> owner_;
};

}  // namespace paratrain::comm::auth
