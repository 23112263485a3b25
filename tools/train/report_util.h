#pragma once
// Small helpers of fsdp-train's reports.

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/comm.h"

namespace fsdp_train {

// "1h2m3s", "4m5s", "6s".
inline std::string human_seconds(double seconds) {
  std::ostringstream s;
  int64_t total = static_cast<int64_t>(seconds + 0.5);
  if (total >= 3600) s << total / 3600 << "h";
  if (total >= 60) s << (total / 60) % 60 << "m";
  s << total % 60 << "s";
  return s.str();
}

// The median (0 for none).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The bytes of the files directly in a folder (a checkpoint's).
inline double directory_bytes(const std::string& path) {
  double total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.is_regular_file()) total += static_cast<double>(entry.file_size());
  }
  return total;
}

// The kinds a training step uses (a broadcast only initializes), as the
// log, the summary and the planner's CommBytes name them.
inline constexpr fsdp::CollectiveKind kStepKinds[] = {
    fsdp::CollectiveKind::kAllGather, fsdp::CollectiveKind::kReduceScatter, fsdp::CollectiveKind::kAllReduce,
    fsdp::CollectiveKind::kAllToAll};

// A step's collective bytes by kind, as the log and the summary record them.
inline nlohmann::json comm_bytes_json(const fsdp::CommStats& comm) {
  nlohmann::json comm_bytes;
  for (auto kind : kStepKinds) comm_bytes[fsdp::enum_name(kind)] = comm.bytes[static_cast<size_t>(kind)];
  return comm_bytes;
}

// The bytes of every kind together.
inline int64_t total_bytes(const fsdp::CommStats& comm) {
  int64_t total = 0;
  for (int64_t bytes : comm.bytes) total += bytes;
  return total;
}

}  // namespace fsdp_train
