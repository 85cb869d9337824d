// bench/gemm's reference kernels in child processes (gemm_candidates.h).
#include "gemm_candidates.h"

#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

#include "ops/cpu/gemm_eigen_impl.h"

extern char** environ;

namespace gbench {
namespace {

// CBLAS ABI (LP64 OpenBLAS and BLIS alike): enums and int are int.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using DgemmFn = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double, double*,
                         int);

// The environment for a child: ours without the variables that would change
// what it measures, plus its own setting.
std::vector<std::string> child_environment(const Candidate& c) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    if (v.starts_with("OPENBLAS_CORETYPE=") || v.starts_with("BLIS_ARCH_TYPE=")) continue;
    env.emplace_back(v);
  }
  if (!c.setting.empty()) env.push_back(c.setting);
  return env;
}

/// What a loaded BLAS says about itself (its core type or sub-configuration).
std::string describe(void* handle) {
  using NameFn = char* (*)();
  if (auto core = reinterpret_cast<NameFn>(dlsym(handle, "openblas_get_corename"))) {
    auto config = reinterpret_cast<NameFn>(dlsym(handle, "openblas_get_config"));
    return std::string("OpenBLAS ") + (config ? config() : "") + ", core " + core();
  }
  using ArchFn = int (*)();
  using ArchNameFn = char* (*)(int);
  auto arch = reinterpret_cast<ArchFn>(dlsym(handle, "bli_arch_query_id"));
  auto arch_name = reinterpret_cast<ArchNameFn>(dlsym(handle, "bli_arch_string"));
  auto version = reinterpret_cast<NameFn>(dlsym(handle, "bli_info_get_version_str"));
  if (arch && arch_name) return std::string("BLIS ") + (version ? version() : "") + ", config " + arch_name(arch());
  return "?";
}

/// One thread, whatever the environment says: the library's default.
void single_thread(void* handle) {
  using SetFn = void (*)(int);
  if (auto f = reinterpret_cast<SetFn>(dlsym(handle, "openblas_set_num_threads"))) f(1);
  using BliSetFn = void (*)(std::int64_t);
  if (auto f = reinterpret_cast<BliSetFn>(dlsym(handle, "bli_thread_set_num_threads"))) f(1);
}

template <class T>
struct Buffers {
  std::vector<T> a, b, c;
  void fill(const Shape& s) {
    std::mt19937 gen(1);
    std::uniform_real_distribution<T> u(-1, 1);
    a.resize(static_cast<std::size_t>(s.m * s.k));
    b.resize(static_cast<std::size_t>(s.k * s.n));
    c.assign(static_cast<std::size_t>(s.m * s.n), T{});
    for (auto& x : a) x = u(gen);
    for (auto& x : b) x = u(gen);
  }
};

}  // namespace

bool start(Candidate& c, const char* self) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return false;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, down[0], 0);
  posix_spawn_file_actions_adddup2(&actions, up[1], 1);
  posix_spawn_file_actions_addclose(&actions, down[1]);
  posix_spawn_file_actions_addclose(&actions, up[0]);
  std::vector<std::string> args = {self, "--worker", c.kind, c.library};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto env = child_environment(c);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int rc = posix_spawn(&c.pid, self, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(down[0]);
  close(up[1]);
  if (rc != 0) return false;
  c.to = fdopen(down[1], "w");
  c.from = fdopen(up[0], "r");
  char line[512] = {};
  if (!std::fgets(line, sizeof line, c.from)) line[0] = 0;
  line[std::strcspn(line, "\n")] = 0;
  if (std::strncmp(line, "ok ", 3) != 0) {
    c.info = line[0] ? line : "did not start";
    stop(c);
    return false;
  }
  c.info = line + 3;
  return true;
}

double time_in_child(Candidate& c, const Shape& s) {
  std::fprintf(c.to, "%c %lld %lld %lld %d\n", s.dtype, static_cast<long long>(s.m), static_cast<long long>(s.n),
               static_cast<long long>(s.k), s.trans_b ? 1 : 0);
  std::fflush(c.to);
  double seconds = 0;
  if (std::fscanf(c.from, "%lf", &seconds) != 1) return 0;
  return seconds;
}

void stop(Candidate& c) {
  if (c.to) std::fclose(c.to);
  if (c.from) std::fclose(c.from);
  c.to = c.from = nullptr;
  if (c.pid > 0) waitpid(c.pid, nullptr, 0);
  c.pid = -1;
}

int worker_main(const std::string& kind, const std::string& library) {
  SgemmFn sgemm = nullptr;
  DgemmFn dgemm = nullptr;
  if (kind == "cblas") {
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      std::cout << "not loaded: " << dlerror() << std::endl;
      return 0;
    }
    sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "cblas_sgemm"));
    dgemm = reinterpret_cast<DgemmFn>(dlsym(handle, "cblas_dgemm"));
    if (!sgemm || !dgemm) {
      std::cout << "no cblas_sgemm/dgemm in " << library << std::endl;
      return 0;
    }
    single_thread(handle);
    std::cout << "ok " << describe(handle) << std::endl;
  } else {
    std::cout << "ok Eigen " << EIGEN_WORLD_VERSION << '.' << EIGEN_MAJOR_VERSION << '.' << EIGEN_MINOR_VERSION
              << std::endl;
  }
  Buffers<float> fb;
  Buffers<double> db;
  Shape last{0, 0, 0, 0, false};
  Shape s{};
  int tb = 0;
  while (std::cin >> s.dtype >> s.m >> s.n >> s.k >> tb) {
    s.trans_b = tb != 0;
    const bool fresh = s.dtype != last.dtype || s.m != last.m || s.n != last.n || s.k != last.k || tb != last.trans_b;
    if (fresh && s.dtype == 's') fb.fill(s);
    if (fresh && s.dtype == 'd') db.fill(s);
    last = s;
    const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
    const int ldb = s.trans_b ? k : n;
    auto call = [&] {
      if (s.dtype == 's') {
        if (sgemm)
          sgemm(kRowMajor, kNoTrans, s.trans_b ? kTrans : kNoTrans, m, n, k, 1.0f, fb.a.data(), k, fb.b.data(), ldb,
                0.0f, fb.c.data(), n);
        else
          dtensor::cpu::eigen_gemm<float>(false, s.trans_b, m, n, k, fb.a.data(), k, fb.b.data(), ldb, fb.c.data(), n);
      } else {
        if (dgemm)
          dgemm(kRowMajor, kNoTrans, s.trans_b ? kTrans : kNoTrans, m, n, k, 1.0, db.a.data(), k, db.b.data(), ldb,
                0.0, db.c.data(), n);
        else
          dtensor::cpu::eigen_gemm<double>(false, s.trans_b, m, n, k, db.a.data(), k, db.b.data(), ldb, db.c.data(),
                                           n);
      }
    };
    if (fresh) call();  // page faults, packing buffers, first-call setup
    std::cout << seconds_per_call(call) << std::endl;
  }
  return 0;
}

}  // namespace gbench
