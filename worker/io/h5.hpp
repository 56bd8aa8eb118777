// Thin RAII layer over the HDF5 C API: one check macro, owning handles, and the few
// attribute/dataset helpers the data reader, synthetic data and Keras checkpoints need.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ht::h5 {

// A failed HDF5 call: the message reads "file:line: CALL failed: <HDF5 error stack>".
class H5Error : public std::runtime_error {
 public:
  explicit H5Error(const std::string& what, std::string reason = "")
      : std::runtime_error(what), reason_(reason.empty() ? what : std::move(reason)) {}
  // What is wrong in a user's words ("the file is cut short: ..."), without source
  // locations or HDF5 calls: for messages about a user's file.
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

// Turns off HDF5's automatic error printing for the calling thread (the library is built
// thread-safe, so the setting is per thread). Cheap after the first call per thread;
// every entry point of the HDF5-using classes calls it.
void quiet();

// The calling thread's HDF5 error stack as one line, innermost call last; clears it.
std::string error_stack();

[[noreturn]] void throw_error(const char* call, const char* file, int line);

template <typename T>
T check(T value, const char* call, const char* file, int line) {
  if (value < 0) throw_error(call, file, line);
  return value;
}

}  // namespace ht::h5

// Wraps any HDF5 call returning hid_t/herr_t/htri_t/hssize_t: negative throws H5Error.
#define H5_CHECK(call) ::ht::h5::check((call), #call, __FILE__, __LINE__)

namespace ht::h5 {

// An owning hid_t with the close function of its kind. Move-only.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Hid(Hid&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  Hid& operator=(Hid&& o) noexcept;
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid();

  hid_t id() const { return id_; }
  operator hid_t() const { return id_; }  // pass straight to the C API
  bool valid() const { return id_ >= 0; }
  void close();  // checked close (a file close flushes: its error must not be lost)

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Checked constructors: each takes the result of an HDF5 call (checked by H5_CHECK).
inline Hid file_id(hid_t id) { return Hid(id, H5Fclose); }
inline Hid group_id(hid_t id) { return Hid(id, H5Gclose); }
inline Hid dataset_id(hid_t id) { return Hid(id, H5Dclose); }
inline Hid space_id(hid_t id) { return Hid(id, H5Sclose); }
inline Hid type_id(hid_t id) { return Hid(id, H5Tclose); }
inline Hid attr_id(hid_t id) { return Hid(id, H5Aclose); }
inline Hid plist_id(hid_t id) { return Hid(id, H5Pclose); }

using Shape = std::vector<int64_t>;

std::string shape_string(const Shape& shape);  // "[16, 97, 83, 1]"
int64_t element_count(const Shape& shape);     // 1 for a scalar

// "float32", "uint16", "int64", "string", "compound", ...: for error messages.
std::string type_name(hid_t type);

enum class TypeClass { Float, SignedInt, UnsignedInt, String, Other };
TypeClass type_class(hid_t type);

// Why `path` cannot be opened as an HDF5 file ("does not exist", "is a directory",
// "cannot be read: permission denied", "is not an HDF5 file"), or "" when it can.
std::string why_not_readable(const std::string& path);

// Files. open_file does not pre-check: callers wanting user-facing messages check first.
Hid open_file(const std::string& path, unsigned flags = H5F_ACC_RDONLY);
Hid create_file(const std::string& path);  // truncates

// True when every component of `path` (relative to `loc`, '/'-separated) exists.
bool exists(hid_t loc, const std::string& path);
bool is_group(hid_t loc, const std::string& path);
bool is_dataset(hid_t loc, const std::string& path);
Hid open_group(hid_t loc, const std::string& path);
Hid create_group(hid_t loc, const std::string& path);  // creates intermediate groups
Hid open_dataset(hid_t loc, const std::string& path);
// Names of the direct children of a group, in creation-independent (name) order.
std::vector<std::string> child_names(hid_t group);

// Attributes. Strings are written as Keras/numpy `bytes` are: fixed-length, null-padded.
// Readers accept fixed and variable-length strings, scalar or one-element arrays.
bool has_attr(hid_t obj, const std::string& name);
void write_attr_string(hid_t obj, const std::string& name, const std::string& value);
std::string read_attr_string(hid_t obj, const std::string& name);
// A 1-D array of fixed-length strings (numpy 'S<n>'); an empty list is written as Keras
// does (np.asarray([]) is a float64 array of shape (0,)).
void write_attr_strings(hid_t obj, const std::string& name, const std::vector<std::string>& v);
// Reads a string array; any zero-length attribute reads as an empty list.
std::vector<std::string> read_attr_strings(hid_t obj, const std::string& name);
void write_attr_int64(hid_t obj, const std::string& name, int64_t value);
int64_t read_attr_int64(hid_t obj, const std::string& name);
void write_attr_double(hid_t obj, const std::string& name, double value);
double read_attr_double(hid_t obj, const std::string& name);

// Datasets. `chunk` empty: contiguous. An empty `shape` is a scalar dataset.
Hid create_dataset(hid_t loc, const std::string& path, hid_t file_type, const Shape& shape,
                   const Shape& chunk = {});
Shape dataset_shape(hid_t dataset);
Shape chunk_shape(hid_t dataset);  // empty when not chunked
void write_dataset(hid_t loc, const std::string& path, const Shape& shape, const float* data);
void write_dataset(hid_t loc, const std::string& path, const Shape& shape, const int32_t* data);
void write_dataset(hid_t loc, const std::string& path, const Shape& shape, const uint8_t* data);
// Whole-dataset reads converted to the memory type; `capacity` elements are checked.
void read_dataset(hid_t dataset, float* dst, int64_t capacity);
void read_dataset(hid_t dataset, int64_t* dst, int64_t capacity);
void read_dataset(hid_t dataset, uint8_t* dst, int64_t capacity);
// Reads the box [start, start+count) (one entry per dimension) into a dense buffer of
// `mem_type` laid out in the dataset's dimension order.
void read_hyperslab(hid_t dataset, const Shape& start, const Shape& count, hid_t mem_type,
                    void* dst);
void write_hyperslab(hid_t dataset, const Shape& start, const Shape& count, hid_t mem_type,
                     const void* src);
// A scalar fixed-length string dataset (for text too large for an attribute).
void write_string_dataset(hid_t loc, const std::string& path, const std::string& value);
std::string read_string_dataset(hid_t loc, const std::string& path);

// Crash-safe publishing of a finished file: `temp_path(path)` is where to write it,
// `commit_file` fsyncs it, renames it onto `path` and fsyncs the directory, so `path`
// is either the old file or the complete new one. Throws std::runtime_error (errno text).
std::string temp_path(const std::string& path);  // path + ".tmp-<pid>"
void commit_file(const std::string& temp, const std::string& path);

}  // namespace ht::h5
