#include "codegen/HostCompiler.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace hb {

namespace {

// -fno-math-errno and -fno-trapping-math change no value (the code reads neither errno nor the floating-point
// exception flags) but let the compiler if-convert and vectorize the tile loops: without the second it
// will not compute a float operation that one side of a select guards (codegen/FlexMath.h's logarithms).
constexpr const char* kFlags = "-O3 -march=native -fPIC -shared -std=c++17 -fno-math-errno -fno-trapping-math -w";
// On a CPU with AVX-512, vectors of 512 bits: -march=native alone keeps GCC at 256 (its tuning for the
// cores that slow their clock on wide vectors); with it a log or sigmoid score_mod ran 1.04-1.09x faster on
// the 2-core development machine, forward and backward (docs/flex-attention.md).
constexpr const char* kWideVectorFlag = " -mprefer-vector-width=512";

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Runs a shell command, returning its exit status and combined output. Without LD_PRELOAD: a library
// preloaded into this process (a sanitizer runtime under .ci/sanitize) must not run inside the compiler.
int run(const std::string& cmd, std::string* output) {
  FILE* p = popen(("env -u LD_PRELOAD " + cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) output->append(buf.data(), n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

bool make_dirs(const std::string& dir) {
  std::string cur;
  std::istringstream parts(dir);
  for (std::string p; std::getline(parts, p, '/');) {
    cur += p + "/";
    if (p.empty()) continue;
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

// `compiler --version`, once per compiler and process.
std::string compiler_version(const std::string& compiler) {
  static std::mutex mu;
  static std::map<std::string, std::string> memo;
  std::lock_guard<std::mutex> lock(mu);
  auto it = memo.find(compiler);
  if (it != memo.end()) return it->second;
  std::string version;
  run(compiler + " --version", &version);
  return memo[compiler] = version;
}

// The CPU's feature line of /proc/cpuinfo ("flags" on x86, "Features" on Arm), or "": read once.
const std::string& cpu_features() {
  static const std::string features = [] {
    std::string line;
    std::ifstream info("/proc/cpuinfo");
    while (std::getline(info, line))
      if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) return line;
    return std::string();
  }();
  return features;
}

// What a host kernel's key must change with besides the source: the compiler and the CPU's features.
std::string machine_identity(const std::string& compiler) { return compiler_version(compiler) + "\n" + cpu_features(); }

// Libraries this process loaded, by path: a second graph with the same kernel shares it.
std::mutex g_loaded_mu;
std::map<std::string, std::weak_ptr<HostModule>> g_loaded;

std::shared_ptr<HostModule> open(const std::string& path, std::string* error) {
  std::lock_guard<std::mutex> lock(g_loaded_mu);
  auto it = g_loaded.find(path);
  if (it != g_loaded.end())
    if (auto m = it->second.lock()) return m;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    *error = e ? e : "dlopen failed";
    return nullptr;
  }
  auto m = std::make_shared<HostModule>(h, path);
  g_loaded[path] = m;
  return m;
}

}  // namespace

// The flags for this machine: kFlags, and wide vectors where the CPU has AVX-512.
std::string host_compile_flags() {
  const std::string& f = cpu_features();
  return std::string(kFlags) + (f.rfind("flags", 0) == 0 && f.find(" avx512f") != std::string::npos ? kWideVectorFlag : "");
}

HostModule::~HostModule() {
  if (handle_) dlclose(handle_);
}

void* HostModule::symbol(const char* name) const { return dlsym(handle_, name); }

namespace {

// The cache protocol shared by both languages: <dir>/<key>.so validated by <key><ext> holding `source`.
HostBuild build_cached(const std::string& source, const std::string& cache_dir, const std::string& cmd,
                       const std::string& identity, const std::string& ext, const std::string& who) {
  HostBuild r;
  const std::string dir = cache_dir + "/kernels";
  const std::string key = hex(fnv1a(source, fnv1a(cmd + "\n" + identity)));
  const std::string so = dir + "/" + key + ".so", src = dir + "/" + key + ext;
  r.path = so;

  std::string cached;
  if (read_file(src, &cached) && cached == source) {
    std::string err;
    if ((r.module = open(so, &err))) {
      r.cache_hit = true;
      return r;
    }
    // A corrupt or foreign library: rebuild it below.
  }
  if (!make_dirs(dir)) {
    r.error = "cannot create the kernel cache directory " + dir;
    return r;
  }
  const std::string tmp = dir + "/" + key + ".tmp" + std::to_string(getpid()) + "." +
                          hex(fnv1a(std::to_string(std::chrono::steady_clock::now().time_since_epoch().count())));
  {
    std::ofstream out(tmp + ext, std::ios::binary);
    out << source;
    if (!out) {
      r.error = "cannot write " + tmp + ext;
      return r;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string output;
  const int rc = run(cmd + " -o " + quote(tmp + ".so") + " " + quote(tmp + ext), &output);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rc != 0) {
    std::remove((tmp + ext).c_str());
    std::remove((tmp + ".so").c_str());
    if (output.size() > 2000) output = output.substr(0, 2000) + "...";
    r.error = "`" + who + "` failed (exit " + std::to_string(rc) + "): " + output;
    return r;
  }
  // The library first, then the source that validates it: a reader that sees the source sees all.
  if (std::rename((tmp + ".so").c_str(), so.c_str()) != 0 || std::rename((tmp + ext).c_str(), src.c_str()) != 0) {
    std::remove((tmp + ext).c_str());
    std::remove((tmp + ".so").c_str());
    r.error = "cannot move the built kernel into " + dir;
    return r;
  }
  {
    // A library of the same path loaded before (a corrupt one) must not be reused.
    std::lock_guard<std::mutex> lock(g_loaded_mu);
    g_loaded.erase(so);
  }
  std::string err;
  r.module = open(so, &err);
  if (!r.module) r.error = "cannot load " + so + ": " + err;
  return r;
}

}  // namespace

HostBuild build_host_module(const std::string& source, const HostCompileSettings& s) {
  if (!s.enabled()) {
    HostBuild r;
    r.error = "no host C++ compiler is configured";
    return r;
  }
  return build_cached(source, s.cache_dir, s.compiler + " " + host_compile_flags(), machine_identity(s.compiler), ".cpp", s.compiler);
}

std::string CudaCompileSettings::why_not() const {
  if (nvcc.empty()) return "no nvcc (install the CUDA toolkit, or set HINTBACKEND_NVCC)";
  if (arch.empty()) return "no CUDA device architecture";
  if (cutlass_include.empty()) return "no CUTLASS headers (pip install nvidia-cutlass, or set HINTBACKEND_CUTLASS_INCLUDE)";
  if (cache_dir.empty()) return "no cache_dir";
  return "";
}

HostBuild build_cuda_module(const std::string& source, const CudaCompileSettings& s) {
  if (!s.enabled()) {
    HostBuild r;
    r.error = s.why_not();
    return r;
  }
  // sm_XX machine code only (no PTX for the driver to compile at load); the runtime statically linked,
  // so the library needs nothing beyond the driver that torch already loaded. -prec-div=false: float
  // division within 2 ulp (a score_mod's `score / c` runs per score element; IEEE division is a long
  // instruction sequence; the approximate one is a reciprocal and a multiply).
  // On sm_90 (H100, H200) the arch-specific target sm_90a, which has the warpgroup MMAs the template's
  // Hopper kernels use (HB_SM90).
  const std::string target = s.arch == "90" ? "arch=compute_90a,code=sm_90a -DHB_SM90=1" : "arch=compute_" + s.arch + ",code=sm_" + s.arch;
  const std::string cmd = s.nvcc + " -O3 -std=c++17 -prec-div=false -shared -Xcompiler -fPIC -w -gencode " + target + " -I" +
                          quote(s.cutlass_include);
  std::string cutlass;  // the headers' version is part of what the kernel is built from
  read_file(s.cutlass_include + "/cutlass/version.h", &cutlass);
  return build_cached(source, s.cache_dir, cmd, compiler_version(s.nvcc) + "\n" + cutlass, ".cu", s.nvcc);
}

}  // namespace hb
