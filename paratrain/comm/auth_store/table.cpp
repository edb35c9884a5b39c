// Store semantics for the authenticated store: see table.h.
#include "paratrain/comm/auth_store/table.h"

#include <charconv>

namespace paratrain::comm::auth {
namespace {

// At most this many keys in one check/wait: bounds the work one request makes.
constexpr std::uint32_t kMaxKeysPerRequest = 1u << 16;

std::optional<std::vector<std::string>> read_keys(Reader& r) {
  auto n = r.u32();
  if (!n || *n > kMaxKeysPerRequest) return std::nullopt;
  std::vector<std::string> keys;
  keys.reserve(*n);
  for (std::uint32_t i = 0; i < *n; ++i) {
    auto k = r.str();
    if (!k) return std::nullopt;
    keys.push_back(std::move(*k));
  }
  return keys;
}

Outcome malformed() {
  Outcome o;
  o.malformed = true;
  return o;
}

Outcome reply(const Writer& w) {
  Outcome o;
  o.reply = w.frame();
  return o;
}

Outcome status_only(Status status) {
  Outcome o;
  o.reply = reply_status(status);
  return o;
}

}  // namespace

std::vector<std::uint8_t> reply_status(Status status) {
  Writer w;
  w.u8(static_cast<std::uint8_t>(status));
  return w.frame();
}

bool KeyTable::has_all(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (keys_.find(k) == keys_.end()) return false;
  }
  return true;
}

Outcome KeyTable::apply(Reader& r, std::chrono::steady_clock::time_point now) {
  const auto op = r.u8();
  if (!op) return malformed();
  Writer w;
  switch (static_cast<Op>(*op)) {
    case Op::set: {
      auto key = r.str();
      auto value = r.vec();
      if (!key || !value || !r.done()) return malformed();
      keys_[*key] = std::move(*value);
      w.u8(static_cast<std::uint8_t>(Status::ok));
      auto o = reply(w);
      o.changed = true;
      return o;
    }
    case Op::get: {
      auto key = r.str();
      if (!key || !r.done()) return malformed();
      auto it = keys_.find(*key);
      if (it == keys_.end()) return status_only(Status::missing);
      w.u8(static_cast<std::uint8_t>(Status::ok));
      w.vec(it->second);
      return reply(w);
    }
    case Op::add: {
      // Counters are stored as decimal text, as c10d's stores do, so get()
      // of a counter reads "3" whichever store served it.
      auto key = r.str();
      auto delta = r.i64();
      if (!key || !delta || !r.done()) return malformed();
      std::int64_t value = 0;
      auto it = keys_.find(*key);
      if (it != keys_.end()) {
        const auto* first = reinterpret_cast<const char*>(it->second.data());
        const auto* last = first + it->second.size();
        auto [end, ec] = std::from_chars(first, last, value);
        if (ec != std::errc() || end != last) {
          w.u8(static_cast<std::uint8_t>(Status::error));
          w.str("add() on key '" + *key + "', which holds a value that is not an integer");
          return reply(w);
        }
      }
      value += *delta;
      const auto text = std::to_string(value);
      keys_[*key] = std::vector<std::uint8_t>(text.begin(), text.end());
      w.u8(static_cast<std::uint8_t>(Status::ok));
      w.i64(value);
      auto o = reply(w);
      o.changed = true;
      return o;
    }
    case Op::compare_set: {
      // c10d's rule: a missing key is created only when `expected` is empty;
      // the reply is always the value the key holds afterwards (or
      // `expected` itself when the key is missing and was not created).
      auto key = r.str();
      auto expected = r.vec();
      auto desired = r.vec();
      if (!key || !expected || !desired || !r.done()) return malformed();
      bool changed = false;
      std::vector<std::uint8_t> now_holds;
      auto it = keys_.find(*key);
      if (it == keys_.end()) {
        if (expected->empty()) {
          keys_[*key] = *desired;
          now_holds = *desired;
          changed = true;
        } else {
          now_holds = *expected;
        }
      } else {
        if (it->second == *expected) {
          it->second = *desired;
          changed = true;
        }
        now_holds = it->second;
      }
      w.u8(static_cast<std::uint8_t>(Status::ok));
      w.vec(now_holds);
      auto o = reply(w);
      o.changed = changed;
      return o;
    }
    case Op::check: {
      auto keys = read_keys(r);
      if (!keys || !r.done()) return malformed();
      w.u8(static_cast<std::uint8_t>(Status::ok));
      w.u8(has_all(*keys) ? 1 : 0);
      return reply(w);
    }
    case Op::wait: {
      auto timeout_ms = r.i64();
      auto keys = read_keys(r);
      if (!timeout_ms || *timeout_ms < 0 || !keys || !r.done()) return malformed();
      if (has_all(*keys)) return status_only(Status::ok);
      Outcome o;
      PendingWait p;
      p.keys = std::move(*keys);
      if (*timeout_ms > 0) p.deadline = now + std::chrono::milliseconds(*timeout_ms);
      o.park = std::move(p);
      return o;
    }
    case Op::erase: {
      auto key = r.str();
      if (!key || !r.done()) return malformed();
      const bool existed = keys_.erase(*key) > 0;
      w.u8(static_cast<std::uint8_t>(Status::ok));
      w.u8(existed ? 1 : 0);
      return reply(w);
    }
    case Op::num_keys: {
      if (!r.done()) return malformed();
      w.u8(static_cast<std::uint8_t>(Status::ok));
      w.i64(static_cast<std::int64_t>(keys_.size()));
      return reply(w);
    }
  }
  return malformed();
}

}  // namespace paratrain::comm::auth
