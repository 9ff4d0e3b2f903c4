#include "kernel_bundle.h"

#include <dlfcn.h>
#include <elf.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "op_contract.h"
#include "openssl/sha.h"
#include "tensorflow/core/platform/logging.h"
#include "tvm/ffi/extra/json.h"
#include "tvm/ffi/extra/module.h"

#ifndef TF_DIETCODE_TVM_VERSION
#error "setup.py defines TF_DIETCODE_TVM_VERSION (the TVM this library links)"
#endif

namespace tf_dietcode {
namespace {

namespace json = tvm::ffi::json;
using tvm::ffi::String;

constexpr char kManifest[] = "manifest.json";

// Manifest problems are exceptions inside Load() and become problem_.
[[noreturn]] void Reject(const std::string& why) {
  throw std::runtime_error(why);
}

template <typename T>
T Field(const json::Object& object, const char* name) {
  auto value = object.Get(String(name));
  if (!value.has_value()) Reject(absl::StrCat("manifest lacks '", name, "'"));
  try {
    return value->cast<T>();
  } catch (const std::exception& e) {  // tvm::ffi::Error: another type
    Reject(absl::StrCat("manifest field '", name, "': ", e.what()));
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) Reject(absl::StrCat("cannot read ", path));
  std::ostringstream data;
  data << file.rdbuf();
  return data.str();
}

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(),
         digest);
  std::string hex;
  for (unsigned char byte : digest) absl::StrAppend(&hex, absl::Hex(byte, absl::kZeroPad2));
  return hex;
}

// A library cut short past its program headers still loads, but its mapped
// segments end at the file's end: running code beyond it raises SIGBUS. So
// every loadable segment must lie inside the file.
void CheckLoadable(const std::string& data, const std::string& path) {
  Elf64_Ehdr header;
  if (data.size() < sizeof header ||
      std::memcmp(data.data(), ELFMAG, SELFMAG) != 0 ||
      data[EI_CLASS] != ELFCLASS64) {
    Reject(absl::StrCat(path, " is not a 64-bit ELF library"));
  }
  std::memcpy(&header, data.data(), sizeof header);
  const auto inside = [&](uint64_t offset, uint64_t size) {
    return size <= data.size() && offset <= data.size() - size;
  };
  if (header.e_phentsize != sizeof(Elf64_Phdr) ||
      !inside(header.e_phoff, uint64_t{header.e_phnum} * sizeof(Elf64_Phdr))) {
    Reject(absl::StrCat(path, " is truncated (program headers)"));
  }
  for (int i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr segment;
    std::memcpy(&segment, data.data() + header.e_phoff + i * sizeof segment,
                sizeof segment);
    if (segment.p_type == PT_LOAD && !inside(segment.p_offset, segment.p_filesz)) {
      Reject(absl::StrCat(path, " is truncated: a segment ends at byte ",
                          segment.p_offset + segment.p_filesz, " of ",
                          data.size()));
    }
  }
}

std::string MajorMinor(const std::string& version) {
  std::vector<std::string> parts = absl::StrSplit(version, '.');
  return parts.size() < 2 ? version : parts[0] + "." + parts[1];
}

// The CPU's feature flags as /proc/cpuinfo spells them (as the tuner records).
const std::set<std::string>& HostCpuFlags() {
  static const auto* flags = [] {
    auto* result = new std::set<std::string>;
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
      if (line.rfind("flags", 0) == 0) {
        for (absl::string_view flag :
             absl::StrSplit(line.substr(line.find(':') + 1), ' ',
                            absl::SkipEmpty())) {
          result->emplace(flag);
        }
        break;
      }
    }
    return result;
  }();
  return *flags;
}

Activation ActivationNamed(const std::string& name) {
  const Activation activation = ParseActivation(name);
  if (activation == Activation::kNone && name != "none") {
    Reject(absl::StrCat("unknown activation '", name, "'"));
  }
  return activation;
}

std::unique_ptr<TunedWorkload> ParseWorkload(const json::Object& entry,
                                             const tvm::ffi::Module& module,
                                             void* library) {
  auto workload = std::make_unique<TunedWorkload>();
  const json::Object key =
      json::Parse(Field<String>(entry, "key")).cast<json::Object>();
  const std::string kind = Field<String>(key, "kind");
  if (kind != "dense" && kind != "batch_matmul") {
    Reject(absl::StrCat("unknown workload kind '", kind, "'"));
  }
  workload->kind =
      kind == "dense" ? TunedKind::kDense : TunedKind::kBatchMatMul;
  workload->transpose_b = Field<bool>(key, "transpose_b");
  workload->bias = Field<bool>(key, "bias");
  workload->activation = ActivationNamed(Field<String>(key, "activation"));
  for (const char* dim : {"b", "m", "n", "k"}) {
    const auto range = Field<json::Object>(key, dim);
    const int64_t lo = Field<int64_t>(range, "lo"), hi = Field<int64_t>(range, "hi");
    if (lo > hi) Reject(absl::StrCat("workload range of ", dim, " is empty"));
    workload->shapes *= static_cast<double>(hi - lo + 1);
  }
  if (workload->kind == TunedKind::kDense) {
    if (key.count(String("groups"))) {  // keys carry groups only where > 1
      workload->groups = Field<int64_t>(key, "groups");
      if (workload->groups < 1) Reject("workload groups must be >= 1");
    }
    const auto layout = Field<json::Object>(entry, "weight_layout");
    workload->packed = Field<bool>(layout, "packed");
    if (workload->packed) {
      workload->packed_blocks = Field<int64_t>(layout, "blocks");
      workload->packed_tile_n = Field<int64_t>(layout, "tile_n");
    }
  }

  const std::string dispatch = Field<String>(entry, "dispatch");
  workload->dispatch =
      reinterpret_cast<TunedWorkload::DispatchFn>(dlsym(library, dispatch.c_str()));
  if (workload->dispatch == nullptr) {
    Reject(absl::StrCat("library lacks dispatch function ", dispatch));
  }
  for (const auto& item : Field<json::Array>(entry, "kernels")) {
    const auto kernel = item.cast<json::Object>();
    const std::string symbol = Field<String>(kernel, "symbol");
    auto function = module->GetFunction(symbol);
    if (!function.has_value()) Reject(absl::StrCat("library lacks kernel ", symbol));
    workload->kernels.push_back(*function);
    workload->kernel_names.push_back(Field<String>(kernel, "name"));
  }
  workload->calls =
      std::make_unique<std::atomic<int64_t>[]>(workload->kernels.size());
  return workload;
}

}  // namespace

bool TunedCall::IsCompactMatrixProduct() const {
  const bool bias_is_vector =
      !bias || (addend_strides[2] == 0 && addend_strides[3] == 1);
  return dims[kB] == 1 && !transpose_b && alpha == 1.0f &&
         x_strides[2] == dims[kK] && y_strides[2] == dims[kN] &&
         out_strides[2] == dims[kN] && bias_is_vector;
}

bool TunedWorkload::Computes(const TunedCall& call) const {
  if (call.bias != bias || call.activation != activation) return false;
  if (kind == TunedKind::kBatchMatMul) {
    return !call.packed && call.transpose_b == transpose_b;
  }
  if (call.groups != groups) return false;
  if (packed) {
    return call.packed && call.packed_blocks == packed_blocks &&
           call.packed_tile_n == packed_tile_n;
  }
  return !call.packed && call.IsCompactMatrixProduct();
}

std::shared_ptr<const KernelBundle> KernelBundle::Get(const std::string& path) {
  static std::mutex mutex;
  static auto* cache =
      new std::map<std::string, std::shared_ptr<const KernelBundle>>;
  std::lock_guard<std::mutex> lock(mutex);
  auto& bundle = (*cache)[path];
  if (bundle == nullptr) {
    auto loaded = std::shared_ptr<KernelBundle>(new KernelBundle(path));
    loaded->Load();
    if (!loaded->problem_.empty()) {
      LOG(WARNING) << "tf_dietcode: kernel bundle '" << path
                   << "' is not used (" << loaded->problem_
                   << "); the ops that name it run the generic kernel";
    } else {  // once per bundle and process: operators see which bundle serves
      LOG(INFO) << "tf_dietcode: kernel bundle '" << path << "' loaded ("
                << loaded->workloads_.size() << " workloads)";
    }
    bundle = std::move(loaded);
  }
  return bundle;
}

void KernelBundle::Load() {
  try {
    // A directory holds the manifest (so an unreadable one is named as such).
    struct stat info;
    const std::string manifest_path =
        stat(path_.c_str(), &info) == 0 && S_ISDIR(info.st_mode)
            ? absl::StrCat(path_, "/", kManifest)
            : path_;
    const std::string directory =
        manifest_path.substr(0, manifest_path.find_last_of('/') + 1);
    String parse_error;
    const json::Value parsed = json::Parse(ReadFile(manifest_path), &parse_error);
    if (!parse_error.empty()) {
      Reject(absl::StrCat("manifest is not JSON: ", std::string(parse_error)));
    }
    const auto manifest = parsed.cast<json::Object>();
    if (Field<int64_t>(manifest, "format") != kBundleFormat) {
      Reject(absl::StrCat("manifest format ", Field<int64_t>(manifest, "format"),
                          ", this library reads format ", kBundleFormat));
    }
    const std::string target_kind =
        Field<String>(Field<json::Object>(manifest, "target"), "kind");
    if (target_kind != "llvm") {
      Reject(absl::StrCat("built for target '", target_kind,
                          "', the CPU ops run 'llvm' kernels"));
    }
    std::vector<std::string> missing;
    for (const auto& feature : Field<json::Array>(manifest, "cpu_features")) {
      const std::string name = feature.cast<String>();
      if (!HostCpuFlags().count(name)) missing.push_back(name);
    }
    if (!missing.empty()) {
      Reject(absl::StrCat("built for a CPU with ", absl::StrJoin(missing, ", "),
                          ", which this CPU lacks"));
    }
    const std::string tvm = Field<String>(manifest, "tvm");
    if (MajorMinor(tvm) != MajorMinor(TF_DIETCODE_TVM_VERSION)) {
      Reject(absl::StrCat("built with TVM ", tvm, ", this library runs TVM ",
                          TF_DIETCODE_TVM_VERSION));
    }
    const std::string library = directory + std::string(Field<String>(manifest, "library"));
    const std::string library_data = ReadFile(library);
    if (Sha256Hex(library_data) != std::string(Field<String>(manifest, "sha256"))) {
      Reject(absl::StrCat(library, " does not match the manifest's SHA-256 ",
                          "(corrupted or replaced)"));
    }
    CheckLoadable(library_data, library);

    ExposeTvmFfiSymbols();
    const tvm::ffi::Module module = tvm::ffi::Module::LoadFromFile(library);
    // Bundles stay loaded for the life of the process: no dlclose.
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) Reject(absl::StrCat("cannot find loaded ", library));
    for (const auto& entry : Field<json::Array>(manifest, "workloads")) {
      workloads_.push_back(ParseWorkload(entry.cast<json::Object>(), module, handle));
    }
    for (const auto& workload : workloads_) narrowest_first_.push_back(workload.get());
    std::stable_sort(narrowest_first_.begin(), narrowest_first_.end(),
                     [](const TunedWorkload* a, const TunedWorkload* b) {
                       return a->shapes < b->shapes;
                     });
    hooks_ = FindBackendHooks(handle);
  } catch (const std::exception& e) {
    problem_ = e.what();
    workloads_.clear();
    narrowest_first_.clear();
  }
}

KernelBundle::Choice KernelBundle::Choose(const TunedCall& call) const {
  for (const TunedWorkload* workload : narrowest_first_) {
    if (!workload->Computes(call)) continue;
    const int64_t kernel = workload->dispatch(call.dims[kB], call.dims[kM],
                                              call.dims[kN], call.dims[kK]);
    if (kernel >= 0 &&
        kernel < static_cast<int64_t>(workload->kernels.size())) {
      workload->calls[kernel].fetch_add(1, std::memory_order_relaxed);
      return {workload, kernel};
    }
  }
  CountGenericCall();
  return {};
}

std::string KernelBundle::StatsJson() const {
  auto Load = [this](PoolUse use) {
    return pool_use_calls_[static_cast<int>(use)].load();
  };
  std::vector<std::string> workloads;
  for (const auto& workload : workloads_) {
    std::vector<std::string> names;
    std::vector<int64_t> calls;
    for (size_t k = 0; k < workload->kernels.size(); ++k) {
      names.push_back(json::Stringify(String(workload->kernel_names[k])));
      calls.push_back(workload->calls[k].load());
    }
    workloads.push_back(absl::StrCat("{\"kernels\":[", absl::StrJoin(names, ","),
                                     "],\"calls\":[", absl::StrJoin(calls, ","),
                                     "]}"));
  }
  return absl::StrCat("{\"path\":", std::string(json::Stringify(String(path_))),
                      ",\"problem\":", std::string(json::Stringify(String(problem_))),
                      ",\"generic_calls\":", generic_calls_.load(),
                      ",\"pool_calls\":", Load(PoolUse::kPoolOnly),
                      ",\"launcher_joined_calls\":", Load(PoolUse::kLauncherJoins),
                      ",\"calling_thread_calls\":", Load(PoolUse::kCallingThreadOnly),
                      ",\"workloads\":[", absl::StrJoin(workloads, ","), "]}");
}

}  // namespace tf_dietcode
