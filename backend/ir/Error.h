// Errors that split blame. UserError: the graph, hint or option we were given is wrong, and the
// message says which node and how to fix it. InternalError: hintbackend is wrong; the message says
// how to get a dump. Neither aborts: both are exceptions that the bindings turn into Python errors.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace hb {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct InternalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
// Collects a message with operator<< and throws when it goes out of scope of the full expression.
template <typename E>
class Thrower {
 public:
  explicit Thrower(const char* prefix) { os_ << prefix; }
  template <typename T>
  Thrower& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  [[noreturn]] ~Thrower() noexcept(false) { throw E(os_.str()); }

 private:
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace hb

// user_check(cond) << "message naming the node and a fix";
#define HB_USER_CHECK(cond) \
  if (cond) {               \
  } else                    \
    ::hb::detail::Thrower<::hb::UserError>("hintbackend: ")
#define HB_INTERNAL_CHECK(cond) \
  if (cond) {                   \
  } else                        \
    ::hb::detail::Thrower<::hb::InternalError>("hintbackend internal error (" __FILE__ "): ")
#define HB_USER_FAIL() ::hb::detail::Thrower<::hb::UserError>("hintbackend: ")
