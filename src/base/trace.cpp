#include "fsdp/trace.h"
#include "base/trace_events.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

namespace fsdp::trace {
namespace {

struct Event {
  std::string name;
  const char* category;
  std::string detail;
  double begin_us;
  double duration_us;
  std::thread::id thread;
};

std::atomic<bool> on{false};
std::thread::id compute_thread;
std::mutex events_mutex;
std::vector<Event> events;
std::map<std::thread::id, std::string> thread_names;  // guarded by events_mutex

const std::chrono::steady_clock::time_point& origin() {
  static const auto start = std::chrono::steady_clock::now();
  return start;
}

}  // namespace

void enable(bool enable_tracing) {
  origin();
  compute_thread = std::this_thread::get_id();
  on = enable_tracing;
}

bool enabled() { return on.load(std::memory_order_relaxed); }

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin()).count();
}

void name_thread(std::string name) {
  std::lock_guard<std::mutex> lock(events_mutex);
  thread_names[std::this_thread::get_id()] = std::move(name);
}

void complete(std::string name, const char* category, double begin_us, std::string detail) {
  if (!enabled() || begin_us < 0) return;
  const double end = now_us();
  std::lock_guard<std::mutex> lock(events_mutex);
  events.push_back({std::move(name), category, std::move(detail), begin_us, end - begin_us, std::this_thread::get_id()});
}

Span::Span(std::string name, const char* category, std::string detail)
    : name_(std::move(name)), category_(category), detail_(std::move(detail)), begin_us_(enabled() ? now_us() : -1.0) {}

Span::~Span() { complete(std::move(name_), category_, begin_us_, std::move(detail_)); }

void write(const std::string& path, int rank) {
  std::vector<Event> copy;
  std::map<std::thread::id, std::string> names;
  {
    std::lock_guard<std::mutex> lock(events_mutex);
    copy = events;
    names = thread_names;
  }
  // The thread that enabled tracing is "compute"; the others, in order of
  // first appearance, are communication threads unless named.
  std::map<std::thread::id, int> tids{{compute_thread, 0}};
  std::vector<std::thread::id> order{compute_thread};
  for (const auto& e : copy) {
    if (tids.emplace(e.thread, static_cast<int>(tids.size())).second) order.push_back(e.thread);
  }
  nlohmann::json trace_events = nlohmann::json::array();
  trace_events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
  for (size_t i = 0; i < order.size(); ++i) {
    const auto named = names.find(order[i]);
    const std::string name = i == 0 ? std::string("compute")
                             : named != names.end() ? named->second
                                                    : "comm " + std::to_string(i);
    trace_events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", i}, {"args", {{"name", name}}}});
  }
  for (const auto& e : copy) {
    nlohmann::json event = {{"ph", "X"}, {"name", e.name}, {"cat", e.category}, {"pid", rank},
                            {"tid", tids[e.thread]}, {"ts", e.begin_us}, {"dur", e.duration_us}};
    if (!e.detail.empty()) event["args"] = {{"detail", e.detail}};
    trace_events.push_back(std::move(event));
  }
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp);
    TORCH_CHECK(out, "cannot write the trace file '", path, "'");
    out << nlohmann::json{{"traceEvents", trace_events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
    TORCH_CHECK(out.good(), "writing the trace file '", path, "' failed");
  }
  TORCH_CHECK(std::rename(temp.c_str(), path.c_str()) == 0, "cannot complete the trace file '", path, "'");
}

}  // namespace fsdp::trace
