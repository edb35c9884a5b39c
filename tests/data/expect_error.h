// Test helper: run a callable, expect an exception of type E whose message
// contains every given fragment (file names, expected/found values, hints).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace paratrain::data::testing {

template <typename E, typename F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "expected an exception, none was thrown";
  } catch (const E& e) {
    const std::string message = e.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks \"" << fragment << "\": " << message;
    }
  }
}

}  // namespace paratrain::data::testing
