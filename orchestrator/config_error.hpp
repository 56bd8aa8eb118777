// The error every user mistake becomes: exit 1 with its one message.
#pragma once

#include <stdexcept>

namespace ht {

// A user error in the config: the message names the file, line, key path, expected and found.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ht
