// Facts about the files and the machine a run reads and writes, checked before anything
// opens or allocates: a FIFO opened for reading blocks forever, a size taken from a file's
// header can exceed the machine, and a run directory under /proc cannot hold checkpoints.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace ht {

// "" when `path` is a regular file this process can read, else why not ("does not exist",
// "is a directory, ...", "is a FIFO (named pipe), expected a regular file", ...). Never
// opens the file, so it cannot block.
std::string input_file_problem(const std::string& path);

// The whole of `path` (callers check input_file_problem first: this opens it). Throws
// ConfigError "<path>: cannot be read: <the system's reason>".
std::string read_text_file(const std::string& path);

// Creates `dir` (and its parents) when missing and checks that it is a directory this
// process can write; "" when it is, else why not (with the system's reason).
std::string writable_directory_problem(const std::string& dir);

// Physical memory of this machine, in bytes.
uint64_t physical_memory_bytes();

// a * b * ..., or UINT64_MAX when the product overflows: sizes from user input or file
// headers are multiplied through this before they are compared with a limit.
uint64_t saturating_product(std::initializer_list<uint64_t> factors);

}  // namespace ht
