// bench/gemm's reference kernels in child processes (gemm_candidates.h).
#include "gemm_candidates.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

extern char** environ;

namespace gbench {
namespace {

// The environment for a child: ours without the variables that would change
// what it measures, plus its own setting.
std::vector<std::string> child_environment(const Candidate& c) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    if (v.starts_with("OPENBLAS_CORETYPE=") || v.starts_with("BLIS_ARCH_TYPE=") || v.starts_with("OMP_NUM_THREADS="))
      continue;
    env.emplace_back(v);
  }
  if (!c.setting.empty()) env.push_back(c.setting);
  return env;
}

}  // namespace

bool start(Candidate& c, const std::string& worker) {
  // Close-on-exec, so that no child inherits another's pipe ends (its stdin
  // would then never reach end of file).
  int down[2], up[2];
  if (pipe2(down, O_CLOEXEC) != 0 || pipe2(up, O_CLOEXEC) != 0) return false;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, down[0], 0);
  posix_spawn_file_actions_adddup2(&actions, up[1], 1);
  posix_spawn_file_actions_addclose(&actions, down[1]);
  posix_spawn_file_actions_addclose(&actions, up[0]);
  std::vector<std::string> args = {worker, c.kind, c.library};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto env = child_environment(c);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int rc = posix_spawn(&c.pid, worker.c_str(), &actions, nullptr, argv.data(), envp.data());
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
  std::fprintf(c.to, "%c %lld %lld %lld %d %d\n", s.dtype, static_cast<long long>(s.m), static_cast<long long>(s.n),
               static_cast<long long>(s.k), s.trans_a ? 1 : 0, s.trans_b ? 1 : 0);
  std::fflush(c.to);
  double seconds = 0;
  constexpr double kNotMeasured = std::numeric_limits<double>::infinity();
  if (std::fscanf(c.from, "%lf", &seconds) != 1) return kNotMeasured;
  return seconds > 0 ? seconds : kNotMeasured;
}

void stop(Candidate& c) {
  if (c.to) std::fclose(c.to);
  if (c.from) std::fclose(c.from);
  c.to = c.from = nullptr;
  if (c.pid > 0) waitpid(c.pid, nullptr, 0);
  c.pid = -1;
}

}  // namespace gbench
