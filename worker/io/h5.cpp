#include "worker/io/h5.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <vector>

#include "orchestrator/files.hpp"

namespace ht::h5 {

void quiet() {
  // Per thread: a thread-safe HDF5 keeps one default error stack per thread.
  thread_local bool done = false;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    done = true;
  }
}

namespace {
herr_t collect_error(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n >= 6) return 0;  // the outer frames say the most; the rest is noise
  char maj[160] = "", min[160] = "";
  H5Eget_msg(e->maj_num, nullptr, maj, sizeof maj);
  H5Eget_msg(e->min_num, nullptr, min, sizeof min);
  if (!out->empty()) *out += "; ";
  *out += fmt::format("{}(): {} ({}: {})", e->func_name ? e->func_name : "?",
                      e->desc ? e->desc : "", maj, min);
  return 0;
}
}  // namespace

namespace {
herr_t collect_description(unsigned, const H5E_error2_t* e, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(e->desc ? e->desc : "");
  return 0;
}

// The error stack in a user's words, from its innermost descriptions (left on the stack).
std::string error_reason() {
  std::vector<std::string> d;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_description, &d);
  auto has = [&](const char* what) {
    return std::any_of(d.begin(), d.end(), [&](const std::string& s) { return s.find(what) != std::string::npos; });
  };
  for (const std::string& s : d) {
    if (s.find("truncated file") == std::string::npos) continue;
    unsigned long long eof = 0, stored = 0;
    const size_t a = s.find("eof = "), b = s.find("stored_eof = ");
    if (a != std::string::npos && b != std::string::npos) {
      eof = std::strtoull(s.c_str() + a + 6, nullptr, 10);
      stored = std::strtoull(s.c_str() + b + 13, nullptr, 10);
      return fmt::format("the file is cut short: it has {} bytes, its header says {} (an incomplete copy or "
                         "write?)", eof, stored);
    }
    return "the file is cut short (an incomplete copy or write?)";
  }
  if (has("signature")) return "it is not an HDF5 file";
  if (has("filter") || has("checksum") || has("inflate") || has("decompress"))
    return "its data is damaged: a chunk does not decode";
  std::string deepest = d.empty() ? "" : d.back();
  std::replace(deepest.begin(), deepest.end(), '\n', ' ');
  return deepest.empty() ? "the file is damaged or unreadable" : "the file is damaged or unreadable (" + deepest + ")";
}
}  // namespace

std::string error_stack() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &text);
  H5Eclear2(H5E_DEFAULT);
  std::replace(text.begin(), text.end(), '\n', ' ');  // HDF5 embeds a newline after the time
  return text.empty() ? std::string("no HDF5 error message") : text;
}

void throw_error(const char* call, const char* file, int line) {
  std::string reason = error_reason();
  throw H5Error(fmt::format("{}:{}: {} failed: {}", file, line, call, error_stack()), std::move(reason));
}

Hid& Hid::operator=(Hid&& o) noexcept {
  if (this != &o) {
    if (valid()) closer_(id_);
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

Hid::~Hid() {
  if (valid()) closer_(id_);  // errors here cannot be reported; close() reports them
}

void Hid::close() {
  if (!valid()) return;
  hid_t id = id_;
  id_ = H5I_INVALID_HID;
  H5_CHECK(closer_(id));
}

std::string shape_string(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t element_count(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string type_name(hid_t type) {
  size_t bits = H5Tget_size(type) * 8;
  switch (H5Tget_class(type)) {
    case H5T_FLOAT:
      return fmt::format("float{}", bits);
    case H5T_INTEGER:
      return fmt::format("{}int{}", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "vlen";
    case H5T_OPAQUE:
      return "opaque";
    default:
      return "unknown type";
  }
}

TypeClass type_class(hid_t type) {
  switch (H5Tget_class(type)) {
    case H5T_FLOAT:
      return TypeClass::Float;
    case H5T_INTEGER:
      return H5Tget_sign(type) == H5T_SGN_NONE ? TypeClass::UnsignedInt : TypeClass::SignedInt;
    case H5T_STRING:
      return TypeClass::String;
    default:
      return TypeClass::Other;
  }
}

std::string why_not_readable(const std::string& path) {
  quiet();
  // Checked before HDF5 opens anything: opening a FIFO would block forever.
  if (std::string problem = input_file_problem(path); !problem.empty()) return problem;
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return "is not an HDF5 file";
  }
  return "";
}

Hid open_file(const std::string& path, unsigned flags) {
  quiet();
  return file_id(H5_CHECK(H5Fopen(path.c_str(), flags, H5P_DEFAULT)));
}

Hid create_file(const std::string& path) {
  quiet();
  return file_id(H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)));
}

bool exists(hid_t loc, const std::string& path) {
  // H5Lexists fails (rather than says no) when an intermediate group is missing.
  std::string prefix;
  size_t pos = 0;
  if (!path.empty() && path[0] == '/') {
    prefix = "/";
    pos = 1;
  }
  while (pos < path.size()) {
    size_t end = path.find('/', pos);
    if (end == std::string::npos) end = path.size();
    if (end > pos) {
      prefix += (prefix.empty() || prefix == "/" ? "" : "/") + path.substr(pos, end - pos);
      if (H5_CHECK(H5Lexists(loc, prefix.c_str(), H5P_DEFAULT)) <= 0) return false;
      if (end < path.size() && !is_group(loc, prefix)) return false;
    }
    pos = end + 1;
  }
  return true;
}

namespace {
H5I_type_t object_type(hid_t loc, const std::string& path) {
  hid_t obj = H5Oopen(loc, path.c_str(), H5P_DEFAULT);
  if (obj < 0) {
    H5Eclear2(H5E_DEFAULT);
    return H5I_BADID;
  }
  H5I_type_t t = H5Iget_type(obj);
  H5Oclose(obj);
  return t;
}
}  // namespace

bool is_group(hid_t loc, const std::string& path) {
  return object_type(loc, path) == H5I_GROUP;
}

bool is_dataset(hid_t loc, const std::string& path) {
  return exists(loc, path) && object_type(loc, path) == H5I_DATASET;
}

Hid open_group(hid_t loc, const std::string& path) {
  return group_id(H5_CHECK(H5Gopen2(loc, path.c_str(), H5P_DEFAULT)));
}

namespace {
Hid intermediate_lcpl() {
  Hid lcpl = plist_id(H5_CHECK(H5Pcreate(H5P_LINK_CREATE)));
  H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
  return lcpl;
}

std::vector<hsize_t> to_hsize(const Shape& s) { return std::vector<hsize_t>(s.begin(), s.end()); }

Hid make_space(const Shape& shape) {
  if (shape.empty()) return space_id(H5_CHECK(H5Screate(H5S_SCALAR)));
  auto dims = to_hsize(shape);
  return space_id(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)));
}

Hid fixed_string_type(size_t size) {
  Hid t = type_id(H5_CHECK(H5Tcopy(H5T_C_S1)));
  H5_CHECK(H5Tset_size(t, std::max<size_t>(size, 1)));  // HDF5 strings cannot be 0 bytes
  H5_CHECK(H5Tset_strpad(t, H5T_STR_NULLPAD));
  return t;
}

// Decodes `count` strings read from an attribute or dataset of type `stored`.
template <typename ReadFn>
std::vector<std::string> read_strings(hid_t stored, int64_t count, ReadFn read) {
  std::vector<std::string> out;
  if (count == 0) return out;
  if (H5Tget_class(stored) != H5T_STRING)
    throw H5Error(fmt::format("expected strings, found {}", type_name(stored)));
  if (H5_CHECK(H5Tis_variable_str(stored)) > 0) {
    Hid mem = type_id(H5_CHECK(H5Tcopy(H5T_C_S1)));
    H5_CHECK(H5Tset_size(mem, H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(mem, H5Tget_cset(stored)));  // HDF5 will not convert ASCII <-> UTF-8
    std::vector<char*> ptrs(size_t(count), nullptr);
    read(mem.id(), ptrs.data());
    for (char* p : ptrs) {
      out.emplace_back(p ? p : "");
      H5free_memory(p);
    }
    return out;
  }
  size_t size = H5Tget_size(stored);
  Hid mem = type_id(H5_CHECK(H5Tcopy(stored)));
  std::vector<char> buf(size_t(count) * size);
  read(mem.id(), buf.data());
  bool space_pad = H5Tget_strpad(stored) == H5T_STR_SPACEPAD;
  for (int64_t i = 0; i < count; ++i) {
    const char* p = buf.data() + size_t(i) * size;
    size_t n = strnlen(p, size);
    if (space_pad)
      while (n > 0 && p[n - 1] == ' ') --n;
    out.emplace_back(p, n);
  }
  return out;
}
}  // namespace

Hid create_group(hid_t loc, const std::string& path) {
  Hid lcpl = intermediate_lcpl();
  return group_id(H5_CHECK(H5Gcreate2(loc, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT)));
}

Hid open_dataset(hid_t loc, const std::string& path) {
  return dataset_id(H5_CHECK(H5Dopen2(loc, path.c_str(), H5P_DEFAULT)));
}

std::vector<std::string> child_names(hid_t group) {
  H5G_info_t info;
  H5_CHECK(H5Gget_info(group, &info));
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t n = H5_CHECK(
        H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT));
    std::string name(size_t(n) + 1, '\0');
    H5_CHECK(H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(),
                                name.size(), H5P_DEFAULT));
    name.resize(size_t(n));
    names.push_back(name);
  }
  return names;
}

bool has_attr(hid_t obj, const std::string& name) {
  return H5_CHECK(H5Aexists(obj, name.c_str())) > 0;
}

namespace {
Hid create_attr(hid_t obj, const std::string& name, hid_t type, hid_t space) {
  if (has_attr(obj, name)) H5_CHECK(H5Adelete(obj, name.c_str()));
  return attr_id(H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)));
}

Hid open_attr(hid_t obj, const std::string& name) {
  return attr_id(H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
}

int64_t attr_points(hid_t attr) {
  Hid space = space_id(H5_CHECK(H5Aget_space(attr)));
  return H5_CHECK(H5Sget_simple_extent_npoints(space));
}

template <typename T>
T read_numeric_attr(hid_t obj, const std::string& name, hid_t mem_type) {
  Hid attr = open_attr(obj, name);
  Hid type = type_id(H5_CHECK(H5Aget_type(attr)));
  TypeClass c = type_class(type);
  if (c == TypeClass::String || c == TypeClass::Other || attr_points(attr) != 1)
    throw H5Error(fmt::format("attribute '{}' is {} with {} values, expected one number", name,
                              type_name(type), attr_points(attr)));
  T value{};
  H5_CHECK(H5Aread(attr, mem_type, &value));
  return value;
}
}  // namespace

void write_attr_string(hid_t obj, const std::string& name, const std::string& value) {
  Hid type = fixed_string_type(value.size());
  Hid space = make_space({});
  Hid attr = create_attr(obj, name, type, space);
  std::string padded = value;
  padded.resize(std::max<size_t>(value.size(), 1), '\0');
  H5_CHECK(H5Awrite(attr, type, padded.data()));
}

std::string read_attr_string(hid_t obj, const std::string& name) {
  Hid attr = open_attr(obj, name);
  Hid type = type_id(H5_CHECK(H5Aget_type(attr)));
  int64_t n = attr_points(attr);
  if (n != 1 || H5Tget_class(type) != H5T_STRING)
    throw H5Error(fmt::format("attribute '{}' is {} with {} values, expected one string", name,
                              type_name(type), n));
  return read_strings(type, 1, [&](hid_t mem, void* buf) { H5_CHECK(H5Aread(attr, mem, buf)); })
      .front();
}

void write_attr_strings(hid_t obj, const std::string& name, const std::vector<std::string>& v) {
  if (v.empty()) {
    Hid space = make_space({0});
    create_attr(obj, name, H5T_IEEE_F64LE, space);
    return;
  }
  size_t size = 1;
  for (const auto& s : v) size = std::max(size, s.size());
  std::vector<char> buf(v.size() * size, '\0');
  for (size_t i = 0; i < v.size(); ++i) std::memcpy(buf.data() + i * size, v[i].data(), v[i].size());
  Hid type = fixed_string_type(size);
  Hid space = make_space({int64_t(v.size())});
  Hid attr = create_attr(obj, name, type, space);
  H5_CHECK(H5Awrite(attr, type, buf.data()));
}

std::vector<std::string> read_attr_strings(hid_t obj, const std::string& name) {
  Hid attr = open_attr(obj, name);
  Hid type = type_id(H5_CHECK(H5Aget_type(attr)));
  try {
    return read_strings(type, attr_points(attr),
                        [&](hid_t mem, void* buf) { H5_CHECK(H5Aread(attr, mem, buf)); });
  } catch (const H5Error& e) {
    throw H5Error(fmt::format("attribute '{}': {}", name, e.what()));
  }
}

void write_attr_int64(hid_t obj, const std::string& name, int64_t value) {
  Hid space = make_space({});
  Hid attr = create_attr(obj, name, H5T_STD_I64LE, space);
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT64, &value));
}

int64_t read_attr_int64(hid_t obj, const std::string& name) {
  return read_numeric_attr<int64_t>(obj, name, H5T_NATIVE_INT64);
}

void write_attr_double(hid_t obj, const std::string& name, double value) {
  Hid space = make_space({});
  Hid attr = create_attr(obj, name, H5T_IEEE_F64LE, space);
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_DOUBLE, &value));
}

double read_attr_double(hid_t obj, const std::string& name) {
  return read_numeric_attr<double>(obj, name, H5T_NATIVE_DOUBLE);
}

Hid create_dataset(hid_t loc, const std::string& path, hid_t file_type, const Shape& shape,
                   const Shape& chunk) {
  Hid lcpl = intermediate_lcpl();
  Hid dcpl = plist_id(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  if (!chunk.empty()) {
    auto dims = to_hsize(chunk);
    H5_CHECK(H5Pset_chunk(dcpl, int(dims.size()), dims.data()));
  }
  Hid space = make_space(shape);
  return dataset_id(
      H5_CHECK(H5Dcreate2(loc, path.c_str(), file_type, space, lcpl, dcpl, H5P_DEFAULT)));
}

Shape dataset_shape(hid_t dataset) {
  Hid space = space_id(H5_CHECK(H5Dget_space(dataset)));
  int rank = H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(size_t(rank), 0);
  if (rank > 0) H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  return Shape(dims.begin(), dims.end());
}

Shape chunk_shape(hid_t dataset) {
  Hid dcpl = plist_id(H5_CHECK(H5Dget_create_plist(dataset)));
  if (H5Pget_layout(dcpl) != H5D_CHUNKED) return {};
  std::vector<hsize_t> dims(32, 0);
  int rank = H5_CHECK(H5Pget_chunk(dcpl, int(dims.size()), dims.data()));
  return Shape(dims.begin(), dims.begin() + rank);
}

namespace {
void write_whole(hid_t loc, const std::string& path, const Shape& shape, hid_t file_type,
                 hid_t mem_type, const void* data) {
  Hid ds = create_dataset(loc, path, file_type, shape);
  if (element_count(shape) > 0) H5_CHECK(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

void read_whole(hid_t dataset, hid_t mem_type, void* dst, int64_t capacity) {
  int64_t n = element_count(dataset_shape(dataset));
  if (n > capacity)
    throw H5Error(fmt::format("dataset has {} elements, the buffer holds {}", n, capacity));
  if (n > 0) H5_CHECK(H5Dread(dataset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst));
}

Hid select_box(hid_t dataset, const Shape& start, const Shape& count) {
  Hid space = space_id(H5_CHECK(H5Dget_space(dataset)));
  auto s = to_hsize(start), c = to_hsize(count);
  H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, s.data(), nullptr, c.data(), nullptr));
  return space;
}
}  // namespace

void write_dataset(hid_t loc, const std::string& path, const Shape& shape, const float* data) {
  write_whole(loc, path, shape, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data);
}
void write_dataset(hid_t loc, const std::string& path, const Shape& shape, const int32_t* data) {
  write_whole(loc, path, shape, H5T_STD_I32LE, H5T_NATIVE_INT32, data);
}
void write_dataset(hid_t loc, const std::string& path, const Shape& shape, const uint8_t* data) {
  write_whole(loc, path, shape, H5T_STD_U8LE, H5T_NATIVE_UINT8, data);
}

void read_dataset(hid_t dataset, float* dst, int64_t capacity) {
  read_whole(dataset, H5T_NATIVE_FLOAT, dst, capacity);
}
void read_dataset(hid_t dataset, int64_t* dst, int64_t capacity) {
  read_whole(dataset, H5T_NATIVE_INT64, dst, capacity);
}
void read_dataset(hid_t dataset, uint8_t* dst, int64_t capacity) {
  read_whole(dataset, H5T_NATIVE_UINT8, dst, capacity);
}

void read_hyperslab(hid_t dataset, const Shape& start, const Shape& count, hid_t mem_type,
                    void* dst) {
  if (element_count(count) == 0) return;
  Hid file_space = select_box(dataset, start, count);
  Hid mem_space = make_space(count);
  H5_CHECK(H5Dread(dataset, mem_type, mem_space, file_space, H5P_DEFAULT, dst));
}

void write_hyperslab(hid_t dataset, const Shape& start, const Shape& count, hid_t mem_type,
                     const void* src) {
  if (element_count(count) == 0) return;
  Hid file_space = select_box(dataset, start, count);
  Hid mem_space = make_space(count);
  H5_CHECK(H5Dwrite(dataset, mem_type, mem_space, file_space, H5P_DEFAULT, src));
}

void write_string_dataset(hid_t loc, const std::string& path, const std::string& value) {
  Hid type = fixed_string_type(value.size());
  Hid ds = create_dataset(loc, path, type, {});
  std::string padded = value;
  padded.resize(std::max<size_t>(value.size(), 1), '\0');
  H5_CHECK(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, padded.data()));
}

std::string read_string_dataset(hid_t loc, const std::string& path) {
  Hid ds = open_dataset(loc, path);
  Hid type = type_id(H5_CHECK(H5Dget_type(ds)));
  int64_t n = element_count(dataset_shape(ds));
  if (n != 1 || H5Tget_class(type) != H5T_STRING)
    throw H5Error(fmt::format("dataset '{}' is {} {}, expected one string", path, type_name(type),
                              shape_string(dataset_shape(ds))));
  return read_strings(type, 1, [&](hid_t mem, void* buf) {
           H5_CHECK(H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf));
         }).front();
}

std::string temp_path(const std::string& path) {
  return fmt::format("{}.tmp-{}", path, long(getpid()));
}

namespace {
void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open for fsync: {}", path, strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error(fmt::format("{}: fsync failed: {}", path, strerror(err)));
}
}  // namespace

void commit_file(const std::string& temp, const std::string& path) {
  fsync_path(temp, O_RDONLY);
  if (std::rename(temp.c_str(), path.c_str()) != 0)
    throw std::runtime_error(
        fmt::format("cannot rename {} to {}: {}", temp, path, strerror(errno)));
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  fsync_path(dir, O_RDONLY | O_DIRECTORY);  // makes the rename itself durable
}

}  // namespace ht::h5
