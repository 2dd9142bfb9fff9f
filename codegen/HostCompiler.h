// Builds generated C++ (codegen/FlexKernelGen.h) into a shared library with the host's C++ compiler (or
// generated CUDA with nvcc) and loads it, through a disk cache, as PyTorch's cpp extensions and Inductor's C++ backend do. Plain C++
// (no libtorch). Settings come as values (python/hintbackend/options.py reads them once).
//
// The cache: <cache_dir>/kernels/<key>.so beside <key>.cpp, the key a hash of the source, the compile
// command, the compiler's version and the CPU's feature flags (the code is built for -march=native).
// An entry is used only when its .cpp holds exactly this source and the .so loads; anything else (a
// stale, foreign or corrupt entry) is rebuilt, never trusted. Writers build under a unique temporary
// name and rename into place (the .so first, then the .cpp), so concurrent processes never see half
// an entry.
#pragma once
#include <memory>
#include <string>

namespace hb {

struct HostCompileSettings {
  std::string compiler;   // the command ("c++", "ccache g++"); empty: no compiler, nothing is built
  std::string cache_dir;  // e.g. ~/.cache/hintbackend
  bool enabled() const { return !compiler.empty() && !cache_dir.empty(); }
};

// A loaded library; unloaded when the last user lets go.
class HostModule {
 public:
  explicit HostModule(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  ~HostModule();
  HostModule(const HostModule&) = delete;
  HostModule& operator=(const HostModule&) = delete;
  // The "C" symbol `name`, or null.
  void* symbol(const char* name) const;
  const std::string& path() const { return path_; }

 private:
  void* handle_;
  std::string path_;
};

struct HostBuild {
  std::shared_ptr<HostModule> module;  // null when the build failed
  std::string path;                    // the cached library
  bool cache_hit = false;              // loaded from the disk cache (or this process's)
  double seconds = 0;                  // compile time on a miss
  std::string error;                   // why it failed (the compiler's output, trimmed)
};

// Builds (or finds in the cache) and loads `source`. Never throws: failures come back in .error.
HostBuild build_host_module(const std::string& source, const HostCompileSettings& settings);

// The flags build_host_module gives the compiler on this machine (after the command).
std::string host_compile_flags();

// How generated CUDA kernels are built: nvcc into a shared library (host launchers and the device code
// for one architecture, the CUDA runtime linked statically), cached as host modules are, the key also
// holding nvcc's version and the architecture. python/hintbackend/options.py finds nvcc, the GPU's
// architecture and CUTLASS's headers (the nvidia-cutlass wheel) once per compile.
struct CudaCompileSettings {
  std::string nvcc;             // the command; empty: no CUDA kernels are built
  std::string arch;             // "90" (sm_90), the GPU's compute capability
  std::string cutlass_include;  // the folder holding cute/ and cutlass/
  std::string cache_dir;
  // The GPU's shared memory per block with opt-in (bytes; 0: unknown, not checked): kernel selection keeps
  // a generated kernel that asks for more off this GPU. Not part of the build (nor of the cache key).
  long long smem_per_block = 0;
  bool enabled() const { return !nvcc.empty() && !arch.empty() && !cutlass_include.empty() && !cache_dir.empty(); }
  // Why not enabled ("" when it is), for the kernels dump.
  std::string why_not() const;
};
HostBuild build_cuda_module(const std::string& source, const CudaCompileSettings& settings);

}  // namespace hb
