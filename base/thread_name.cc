#include "base/thread_name.h"

#include <pthread.h>

#include <string>

namespace kv {

void NameThisThread(std::string_view name) {
  std::string cut(name.substr(0, 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace kv
