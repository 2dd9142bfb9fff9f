// A fresh folder under /tmp for a test (kernel caches), removed when the test program ends.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
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
  char tmpl[] = "/tmp/hb_kernel_cache_XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  if (!d) return "/tmp";
  dirs.made.push_back(d);
  return d;
}

}  // namespace hb::test
