#include <algorithm>
#include <cstring>
#include <mutex>

#include "dtensor/core/error.h"
#include "dtensor/ops/op.h"
#include "families.h"

namespace dtensor {

std::size_t OpAttrs::hash() const {
  std::size_t h = 0xcbf29ce484222325ull;
  auto mix = [&](std::uint64_t v) { h = (h ^ v) * 0x100000001b3ull; };
  for (auto d : dims) mix(static_cast<std::uint64_t>(d));
  mix(0xff);
  for (auto d : ints) mix(static_cast<std::uint64_t>(d));
  std::uint64_t bits;
  static_assert(sizeof bits == sizeof scalar);
  std::memcpy(&bits, &scalar, sizeof bits);
  mix(bits);
  mix(flag);
  for (char c : text) mix(static_cast<unsigned char>(c));
  mix(static_cast<std::uint64_t>(dtype));
  mix(static_cast<std::uint64_t>(device));
  return h;
}

OpRegistry& OpRegistry::global() {
  static OpRegistry registry;
  static std::once_flag builtins;
  std::call_once(builtins, [] { register_builtin_ops(registry); });
  return registry;
}

void OpRegistry::add(OpDef def) {
  if (def.name.empty()) throw ValueError("[ops] an op needs a name");
  if (contains(def.name)) throw ValueError(fmt::format("[ops] op '{}' is already registered", def.name));
  if (!def.meta || !def.strategy)
    throw ValueError(fmt::format("[ops] op '{}' needs a meta function and a strategy function", def.name));
  defs_.push_back(std::make_unique<OpDef>(std::move(def)));
}

bool OpRegistry::contains(std::string_view name) const {
  return std::any_of(defs_.begin(), defs_.end(), [&](const auto& d) { return d->name == name; });
}

const OpDef& OpRegistry::get(std::string_view name) const {
  for (const auto& d : defs_)
    if (d->name == name) return *d;
  std::vector<std::string> close;
  for (const auto& d : defs_)
    if (d->name.find(name.substr(0, 3)) != std::string::npos) close.push_back(d->name);
  throw ValueError(fmt::format("[ops] unknown op '{}'{}", name,
                               close.empty() ? "" : fmt::format(": did you mean {}?", fmt::join(close, ", "))));
}

std::vector<std::string> OpRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& d : defs_) out.push_back(d->name);
  std::sort(out.begin(), out.end());
  return out;
}

void register_builtin_ops(OpRegistry& registry) {
  register_pointwise_ops(registry);
  register_einsum_ops(registry);
  register_reduction_ops(registry);
  register_shape_ops(registry);
  register_embedding_ops(registry);
}

}  // namespace dtensor
