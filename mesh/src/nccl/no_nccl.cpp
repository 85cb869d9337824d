// Stub chosen by meson in a build without NCCL: it says what is missing.
#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/backends.h"

namespace dtensor {
namespace {
[[noreturn]] void unavailable(std::string_view what) {
  throw UnsupportedError(
      fmt::
          format("[nccl] {} needs NCCL, and this build has none (configure with -Dcuda=enabled where nvcc and NCCL are "
                 "installed)",
                 what));
}
}  // namespace

bool nccl_available() { return false; }
int nccl_version() { return 0; }
std::unique_ptr<Communicator> nccl_world(const NcclOptions&) { unavailable("nccl_world"); }
std::vector<std::unique_ptr<Communicator>> nccl_local_group(std::span<const int>, const NcclOptions&) {
  unavailable("nccl_local_group");
}

}  // namespace dtensor
