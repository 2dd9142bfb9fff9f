// A fresh folder in the system's temporary directory ($TMPDIR, else /tmp) for a test (kernel caches),
// removed when the test program ends.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace hb::test {

inline std::string temp_dir() {
  struct Dirs {
    std::vector<std::string> made;
    ~Dirs() {
      for (const std::string& d : made) std::filesystem::remove_all(d);
    }
  };
  static Dirs dirs;
  std::string tmpl = (std::filesystem::temp_directory_path() / "hb_test_XXXXXX").string();
  const char* d = mkdtemp(tmpl.data());
  // No fallback folder: a test writing into a shared one would see another run's cache.
  if (!d) throw std::runtime_error("temp_dir: mkdtemp failed for " + tmpl);
  dirs.made.push_back(d);
  return d;
}

}  // namespace hb::test
