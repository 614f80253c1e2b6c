// The control-plane benchmark's heartbeat load in C++ (gRPC's callback API): the same beats as the Python load
// generator in control_plane.py at about a third of its CPU per beat (~110 µs against ~330 on the 2-core dev box),
// so that the load takes as little as it can of the cores it shares with the head. Built and run by control_plane.py
// (--load native); it beats for the agents the Python side registers, and writes the figures the Python side reads.
//
//   heartbeat_load ADDRESS INTERVAL_S DURATION_S AGENTS_PER_CHANNEL OUT
//
// Standard input: "A NODE_ID NODE_TOKEN" for each agent the Python side registered, as it registers, then
// "S WALL_START": the wall-clock time (s) at which the measured window starts. Each agent opens one bidirectional
// Heartbeat stream as it arrives and, from a random phase on, writes a beat every interval; a beat's round trip runs from just before its write to its reply being read. A beat whose
// predecessor is still unanswered at its slot waits for that reply (and counts as late), as the Python generator's
// sequential write-then-read does. OUT.rtt: the measured round trips (float64 seconds); OUT: a JSON summary.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "farm/proto/v1/agent.grpc.pb.h"

using Clock = std::chrono::steady_clock;
using farm::v1::AgentService;
using farm::v1::HeartbeatReply;
using farm::v1::HeartbeatRequest;

static double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

constexpr double kLateS = 0.1;  // as control_plane.py's LATE_S

struct Window {
  std::atomic<double> start{1e300}, end{1e300};  // steady-clock seconds; set once, read by every agent
};

class Agent : public grpc::ClientBidiReactor<HeartbeatRequest, HeartbeatReply> {
 public:
  Agent(AgentService::Stub* stub, const std::string& node_id, const std::string& token, const Window* window,
        unsigned seed)
      : window_(window), rng_(seed) {
    request_.set_node_id(node_id);
    request_.set_node_token(token);
    request_.set_memory_percent(40.0);
    request_.set_ray_running(true);
    auto* power = request_.add_power();
    power->set_device("cpu");
    power->set_watts(12.5);
    power->set_source("model-estimate");
    power->set_scope("package");
    // The credential in the metadata too: the head's gate refuses a call without it before reading it.
    context_.AddMetadata("authorization", "Bearer " + token);
    context_.AddMetadata("farm-node-id", node_id);
    stub->async()->Heartbeat(&context_, this);
    StartCall();
  }

  // The scheduler thread calls this at the beat's slot.
  void Beat(double slot) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (finished_ || closing_) return;
    if (in_flight_) {  // the previous beat is still unanswered: this one goes out with its reply
      pending_slot_ = slot;
      return;
    }
    WriteLocked(slot);
  }

  // After the window: half-close the stream; the head then ends it.
  void Close() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (finished_ || closing_) return;
    closing_ = true;
    if (!in_flight_) StartWritesDone();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the stream is failing: OnDone says why
    StartRead(&reply_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    double got = now_s();
    std::lock_guard<std::recursive_mutex> lock(mu_);
    in_flight_ = false;
    if (measured_) {
      answered++;
      rtt.push_back(got - sent_);
    }
    if (closing_) {
      StartWritesDone();
    } else if (pending_slot_ > 0) {
      double slot = pending_slot_;
      pending_slot_ = 0;
      WriteLocked(slot);
    }
  }

  void OnWritesDoneDone(bool) override {}

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    finished_ = true;
    code = status.error_code();
    done_cv_.notify_all();
  }

  bool WaitDone(double timeout_s) {
    std::unique_lock<std::recursive_mutex> lock(mu_);
    return done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return finished_; });
  }

  void Cancel() { context_.TryCancel(); }

  // Read by main once the stream is done (or cancelled and done).
  long sent = 0, answered = 0, late = 0;
  std::vector<double> rtt;
  grpc::StatusCode code = grpc::StatusCode::OK;

 private:
  void WriteLocked(double slot) {
    std::uniform_real_distribution<double> cpu(0.0, 30.0);
    request_.set_cpu_percent(cpu(rng_));
    sent_ = now_s();
    measured_ = window_->start <= slot && slot < window_->end;
    if (measured_) {
      sent++;
      late += sent_ - slot > kLateS;
    }
    in_flight_ = true;
    StartWrite(&request_);
  }

  const Window* window_;
  std::mt19937 rng_;
  grpc::ClientContext context_;
  HeartbeatRequest request_;
  HeartbeatReply reply_;
  std::recursive_mutex mu_;  // recursive: a reaction gRPC runs inline from a Start* call takes it again
  std::condition_variable_any done_cv_;
  bool in_flight_ = false, measured_ = false, closing_ = false, finished_ = false;
  double sent_ = 0, pending_slot_ = 0;
};

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s ADDRESS INTERVAL_S DURATION_S AGENTS_PER_CHANNEL OUT\n", argv[0]);
    return 2;
  }
  const std::string address = argv[1], out = argv[5];
  const double interval = std::stod(argv[2]), duration = std::stod(argv[3]);
  const size_t per_channel = std::max(1, std::stoi(argv[4]));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<AgentService::Stub>> stubs;
  std::vector<std::unique_ptr<Agent>> agents;
  Window window;

  // The scheduler: a min-heap of (slot, agent); an agent beats from a random phase after it arrives, every interval,
  // until the window (once known) ends.
  using Slot = std::pair<double, size_t>;
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> slots;
  std::mutex slots_mu;  // slots, agents (appended by the reader below), window
  bool window_set = false;
  std::thread scheduler([&] {
    std::unique_lock<std::mutex> lock(slots_mu);
    while (true) {
      if (window_set && (slots.empty() || slots.top().first >= window.end)) break;
      double wait = slots.empty() ? 0.005 : slots.top().first - now_s();
      if (wait > 0) {  // short naps: an agent arriving meanwhile may beat sooner
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait, 0.005)));
        lock.lock();
        continue;
      }
      auto [slot, i] = slots.top();
      slots.pop();
      Agent* agent = agents[i].get();
      slots.emplace(slot + interval, i);
      lock.unlock();
      agent->Beat(slot);
      lock.lock();
    }
  });

  // Standard input: "A NODE_ID NODE_TOKEN" for each agent as it registers (it beats at once, as a real agent does),
  // then "S WALL_START": the measured window's start, wall clock.
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> phase(0.0, interval);
  std::string kind;
  while (std::cin >> kind) {
    if (kind == "A") {
      std::string id, token;
      std::cin >> id >> token;
      std::lock_guard<std::mutex> lock(slots_mu);
      if (agents.size() % per_channel == 0) {
        grpc::ChannelArguments args;
        args.SetInt("grpc.use_local_subchannel_pool", 1);  // one TCP connection per channel, as in control_plane.py
        channels.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
        stubs.push_back(AgentService::NewStub(channels.back()));
      }
      agents.push_back(std::make_unique<Agent>(stubs.back().get(), id, token, &window,
                                               static_cast<unsigned>(agents.size())));
      slots.emplace(now_s() + phase(rng), agents.size() - 1);
    } else if (kind == "S") {
      double start_wall;
      std::cin >> start_wall;
      double wall_now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::lock_guard<std::mutex> lock(slots_mu);
      window.start = now_s() + (start_wall - wall_now);
      window.end = window.start + duration;
      window_set = true;
      break;
    }
  }
  if (!window_set) {
    std::fprintf(stderr, "heartbeat_load: standard input ended before the window's start\n");
    std::_Exit(2);
  }
  scheduler.join();
  for (auto& agent : agents) agent->Close();
  size_t cut = 0;
  double deadline = now_s() + 10.0;  // as control_plane.py's FINISH_S
  std::vector<bool> was_cut(agents.size());
  for (size_t i = 0; i < agents.size(); i++) {
    if (!agents[i]->WaitDone(std::max(0.0, deadline - now_s()))) {
      cut++;
      was_cut[i] = true;
      agents[i]->Cancel();
      agents[i]->WaitDone(5.0);
    }
  }

  long sent = 0, answered = 0, late = 0;
  std::map<std::string, long> errors;
  std::FILE* rtt = std::fopen((out + ".rtt").c_str(), "wb");
  for (size_t i = 0; i < agents.size(); i++) {
    Agent& agent = *agents[i];
    sent += agent.sent;
    answered += agent.answered;
    late += agent.late;
    // A stream that ended early ends its agent's beats (the head will mark it offline): no reconnection here.
    if (!was_cut[i] && agent.code != grpc::StatusCode::OK)
      errors["stream ended: status " + std::to_string(static_cast<int>(agent.code))]++;
    std::fwrite(agent.rtt.data(), sizeof(double), agent.rtt.size(), rtt);
  }
  std::fclose(rtt);
  if (cut) errors["cut off after the window"] = static_cast<long>(cut);
  std::ofstream summary(out);
  summary << "{\"sent\": " << sent << ", \"answered\": " << answered << ", \"late\": " << late << ", \"errors\": {";
  bool first = true;
  for (auto& [name, count] : errors) {
    summary << (first ? "" : ", ") << "\"" << name << "\": " << count;
    first = false;
  }
  summary << "}}\n";
  summary.close();
  // Streams cancelled above may still hold the channels: exit without tearing gRPC down.
  std::fflush(nullptr);
  std::_Exit(0);
}
