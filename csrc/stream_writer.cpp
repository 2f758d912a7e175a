#include "stream_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>

#include "backward.h"

namespace hooktrace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .htrace format is little-endian; blocks are written from memory as-is");

namespace {

// Slicing-by-8: eight table lookups per 8 bytes, no dependency on zlib's
// headers at build time. Measured in benchmarks/streaming.py against the drain
// rate it has to sustain (20 M events/s = 640 MB/s).
struct CrcTables {
  uint32_t t[8][256];
  CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
  }
};

const CrcTables& crc_tables() {
  static const CrcTables tables;
  return tables;
}

uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - since)
                                   .count());
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc_tables().t;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; n && (reinterpret_cast<uintptr_t>(p) & 7u); --n) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    const uint32_t lo = static_cast<uint32_t>(v) ^ crc;
    const uint32_t hi = static_cast<uint32_t>(v >> 32);
    crc = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
  for (; n; --n) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
  return ~crc;
}

StreamWriter::StreamWriter(std::shared_ptr<Session> session, int fd, uint32_t period_ms)
    : session_(std::move(session)),
      wakeup_(std::make_shared<Wakeup>()),
      fd_(fd),
      caller_fd_(fd),
      period_(period_ms) {
  if (period_ms == 0) throw std::invalid_argument("period_ms must be > 0");
  const off_t at = ::lseek(fd_, 0, SEEK_CUR);
  if (at < 0) throw std::invalid_argument(std::string("stream file: ") + std::strerror(errno));
  offset_ = static_cast<uint64_t>(at);
  session_->enable_streaming(wakeup_);
}

StreamWriter::~StreamWriter() {
  if (thread_.joinable()) stop();
}

void StreamWriter::start() {
  if (thread_.joinable()) throw std::logic_error("the stream writer is already running");
  {
    std::lock_guard<std::mutex> lock(done_mutex_);
    running_ = true;
  }
  thread_ = std::thread(&StreamWriter::run, this);
}

void StreamWriter::set_rolling(std::string path, std::string stem, std::string prefix,
                               uint64_t segment_bytes, uint64_t max_bytes) {
  if (thread_.joinable()) throw std::logic_error("set_rolling() comes before start()");
  if (segment_bytes == 0 || max_bytes < segment_bytes)
    throw std::invalid_argument("rolling: expected 0 < segment_bytes <= max_bytes");
  path_ = std::move(path);
  stem_ = std::move(stem);
  prefix_ = std::move(prefix);
  segment_bytes_ = segment_bytes;
  max_bytes_ = max_bytes;
  segment_start_ = 0;  // the first segment's header and META count too
}

void StreamWriter::roll() {
  // The current file becomes the next closed segment; a fresh one takes `path`.
  const std::string closed = stem_ + "." + std::to_string(next_segment_) + ".htrace";
  if (::rename(path_.c_str(), closed.c_str()) != 0) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (stats_.error.empty())
      stats_.error = std::string("rolling: rename to ") + closed + " failed: " + std::strerror(errno);
    segment_bytes_ = 0;  // stop rolling, keep writing the one file
    return;
  }
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    failed_ = true;
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.error = "rolling: opening a new segment at " + path_ + " failed: " + std::strerror(errno);
    return;
  }
  closed_.push_back({closed, offset_, segment_events_});
  ++next_segment_;
  if (fd_ != caller_fd_) ::close(fd_);
  fd_ = fd;
  offset_ = 0;
  segment_events_ = 0;
  // header and META, then everything the events may refer to, restated
  size_t done = 0;
  while (done < prefix_.size()) {
    const ssize_t n = ::write(fd_, prefix_.data() + done, prefix_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == ENOSPC || errno == EDQUOT) && cut_back(0) &&
        drop_oldest_for_space()) {
      done = 0;  // room made: the header again, from the start
      continue;
    }
    if (n <= 0) {
      failed_ = true;
      std::lock_guard<std::mutex> lock(stats_mutex_);
      stats_.error = "rolling: writing a new segment's header failed: " +
                     std::string(std::strerror(errno));
      return;
    }
    done += static_cast<size_t>(n);
  }
  offset_ = prefix_.size();
  clock_written_ = false;
  names_written_ = 0;
  last_dropped_ = ~uint64_t(0);  // STATS restated too
  {
    std::lock_guard<std::mutex> lock(modules_mutex_);
    modules_written_ = 0;
  }
  // Oldest first out, while the closed segments and the new one exceed the bound
  // (the new one may grow to segment_bytes before the next roll).
  uint64_t total = segment_bytes_;
  for (const Closed& c : closed_) total += c.bytes;
  size_t gone = 0;
  uint64_t events = 0, bytes = 0;
  while (gone < closed_.size() && total > max_bytes_) {
    ::unlink(closed_[gone].path.c_str());
    total -= closed_[gone].bytes;
    events += closed_[gone].events;
    bytes += closed_[gone].bytes;
    ++gone;
  }
  closed_.erase(closed_.begin(), closed_.begin() + static_cast<std::ptrdiff_t>(gone));
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++stats_.segments;
  stats_.rolled_off_segments += gone;
  stats_.rolled_off_events += events;
  stats_.rolled_off_bytes += bytes;
}

bool StreamWriter::drop_oldest_for_space() {
  if (closed_.empty()) return false;
  const Closed oldest = closed_.front();
  closed_.erase(closed_.begin());
  ::unlink(oldest.path.c_str());
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++stats_.rolled_off_segments;
  ++stats_.full_disk_rolled_off_segments;
  stats_.rolled_off_events += oldest.events;
  stats_.rolled_off_bytes += oldest.bytes;
  return true;
}

bool StreamWriter::cut_back(uint64_t at) {
  // A block the disk had no room for may be partly written: the file ends where
  // the last whole block did, so it stays readable whatever follows.
  return ::ftruncate(fd_, static_cast<off_t>(at)) == 0 &&
         ::lseek(fd_, static_cast<off_t>(at), SEEK_SET) == static_cast<off_t>(at);
}

void StreamWriter::flush() {
  {
    std::lock_guard<std::mutex> lock(done_mutex_);
    if (!running_) return;
  }
  uint64_t target;
  {
    // A round numbered after rounds_started_ begins its collection after this.
    std::lock_guard<std::mutex> lock(wakeup_->mutex);
    target = rounds_started_ + 1;
    wakeup_->pending = true;
  }
  wakeup_->cv.notify_one();
  std::unique_lock<std::mutex> lock(done_mutex_);
  done_cv_.wait(lock, [&] { return rounds_done_ >= target || !running_; });
}

void StreamWriter::before_fork() {
  // The writer takes these one at a time, or round_mutex_ first: no lock-order
  // inversion.
  round_mutex_.lock();
  modules_mutex_.lock();
  stats_mutex_.lock();
  done_mutex_.lock();
  wakeup_->mutex.lock();
}

void StreamWriter::after_fork(bool in_child) {
  if (in_child) {
    forked_ = true;
    running_ = false;  // (done_mutex_ is held here): flush() returns at once
    // The parent's writer thread may wait on these; it does not exist here, and
    // destroying a condition variable with waiters blocks forever (glibc): fresh
    // ones, the old state dropped without its destructor.
    new (&wakeup_->cv) std::condition_variable();
    new (&done_cv_) std::condition_variable();
  }
  wakeup_->mutex.unlock();
  done_mutex_.unlock();
  stats_mutex_.unlock();
  modules_mutex_.unlock();
  round_mutex_.unlock();
}

void StreamWriter::stop() {
  if (forked_) {
    // The thread is the parent's: forget its handle without joining (a joinable
    // std::thread's destructor would terminate) and write nothing.
    if (thread_.joinable()) new (&thread_) std::thread();
    stopped_ = true;
    return;
  }
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(wakeup_->mutex);
      stop_requested_ = true;
    }
    wakeup_->cv.notify_one();
    thread_.join();
  } else if (!stopped_) {
    std::lock_guard<std::mutex> lock(round_mutex_);
    round(true);  // never started: the final drain still runs
  }
  stopped_ = true;
}

void StreamWriter::set_modules(uint32_t first,
                               std::vector<std::pair<std::string, std::string>> entries) {
  std::lock_guard<std::mutex> lock(modules_mutex_);
  if (first > modules_.size())
    throw std::invalid_argument("set_modules: first " + std::to_string(first) +
                                " leaves a gap after the " + std::to_string(modules_.size()) +
                                " modules known");
  for (size_t i = 0; i < entries.size(); ++i) {
    const size_t slot = first + i;
    if (slot == modules_.size()) {
      modules_.push_back(std::move(entries[i]));
    } else if (modules_[slot] != entries[i]) {
      modules_[slot] = std::move(entries[i]);
      if (slot < modules_written_) modules_written_ = slot;  // restated from there
    }
  }
}

StreamStats StreamWriter::stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

void StreamWriter::run() {
  // Asynchronous signals go to the other threads: a SIGINT handled here would
  // only set Python's flag late, and a handler must not run inside a write.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  // SCHED_BATCH: the writer's wake-ups never preempt the recording threads.
  // With the default policy each wake-up (every period_ms) could take the CPU
  // from the model thread, which then queued behind the other tasks of a
  // loaded machine: +1.2 us per module call on 1000 x Identity on the shared
  // 2-core VM (load ~8), against none with the writer asleep. Best effort.
  sched_param param{};
  param.sched_priority = 0;
  pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  for (;;) {
    bool last;
    uint64_t number;
    {
      std::unique_lock<std::mutex> lock(wakeup_->mutex);
      wakeup_->cv.wait_for(lock, period_, [&] { return wakeup_->pending || stop_requested_; });
      wakeup_->pending = false;
      last = stop_requested_;
      number = ++rounds_started_;
    }
    {
      std::lock_guard<std::mutex> lock(round_mutex_);
      round(last);
    }
    {
      std::lock_guard<std::mutex> lock(done_mutex_);
      rounds_done_ = number;
      if (last) running_ = false;
    }
    done_cv_.notify_all();
    if (last) return;
  }
}

void StreamWriter::round(bool last) {
  const auto t0 = std::chrono::steady_clock::now();
  // A segment the disk filled with nothing older left to delete is closed here:
  // its events are kept (the oldest out when room is needed next), and a thread's
  // events resume in the new one, whose blocks may start at any index.
  if (segment_bytes_ && !failed_ && (offset_ >= segment_bytes_ || full_)) roll();
  full_ = false;
  segments_.clear();
  session_->begin_collect(&segments_);
  uint64_t collected = 0;
  for (const Segment& s : segments_) collected += s.count;
  uint64_t written = 0;
  if (!failed_ && (collected || !clock_written_ || last)) {
    // The clock and the names the events may refer to come before them: a
    // file cut right after an EVENTS block can still convert and name it.
    if (!clock_written_ || last ||
        t0 - last_clock_ >= std::chrono::milliseconds(kClockPeriodMs)) {
      const ClockConversion c = session_->clock();
      unsigned char payload[24];
      std::memcpy(payload, &c.ticks0, 8);
      std::memcpy(payload + 8, &c.unix_ns0, 8);
      std::memcpy(payload + 16, &c.ns_per_tick, 8);
      write_block(kBlockClock, nullptr, 0, payload, sizeof(payload));
      if (!full_) {
        clock_written_ = true;
        last_clock_ = t0;
      }
    }
    const std::vector<std::string> names = node_names_since(names_written_);
    if (!names.empty()) {
      std::string payload;
      const uint32_t head[2] = {static_cast<uint32_t>(names_written_),
                                static_cast<uint32_t>(names.size())};
      payload.append(reinterpret_cast<const char*>(head), sizeof(head));
      for (const std::string& n : names) {
        const uint32_t len = static_cast<uint32_t>(n.size());
        payload.append(reinterpret_cast<const char*>(&len), 4);
        payload += n;
      }
      write_block(kBlockNodeNames, nullptr, 0, payload.data(), payload.size());
      if (!full_) names_written_ += names.size();
    }
    // Collected after begin_collect: every event collected was recorded after its
    // module's set_modules() (which comes before the slot is registered).
    std::string modules;
    uint32_t modules_first = 0;
    {
      std::lock_guard<std::mutex> lock(modules_mutex_);
      if (modules_written_ < modules_.size()) {
        modules_first = static_cast<uint32_t>(modules_written_);
        const uint32_t head[2] = {modules_first,
                                  static_cast<uint32_t>(2 * (modules_.size() - modules_written_))};
        modules.append(reinterpret_cast<const char*>(head), sizeof(head));
        for (size_t i = modules_written_; i < modules_.size(); ++i) {
          for (const std::string* text : {&modules_[i].first, &modules_[i].second}) {
            const uint32_t len = static_cast<uint32_t>(text->size());
            modules.append(reinterpret_cast<const char*>(&len), 4);
            modules += *text;
          }
        }
        modules_written_ = modules_.size();
      }
    }
    if (!modules.empty()) {
      write_block(kBlockModules, nullptr, 0, modules.data(), modules.size());
      if (full_) {  // not written: restated in the next segment (which restates all)
        std::lock_guard<std::mutex> lock(modules_mutex_);
        modules_written_ = std::min<size_t>(modules_written_, modules_first);
      }
    }
    for (const Segment& s : segments_) {
      unsigned char sub[kEventsSubHeaderSize];
      std::memcpy(sub, &s.thread, 4);
      std::memcpy(sub + 4, &s.tid, 4);
      std::memcpy(sub + 8, &s.first, 8);
      write_block(kBlockEvents, sub, sizeof(sub), s.events, size_t(s.count) * sizeof(Event));
      if (failed_ || full_) break;
      written += s.count;
      segment_events_ += s.count;
    }
    const SessionStats ss = session_->stats();
    if (ss.dropped != last_dropped_) {
      const uint64_t payload[2] = {ss.dropped, ss.overwritten};
      write_block(kBlockStats, nullptr, 0, payload, sizeof(payload));
      if (!full_) last_dropped_ = ss.dropped;
    }
  }
  // After a write error the events are still consumed (memory stays bounded)
  // and counted as lost.
  session_->end_collect();
  timespec cpu{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.cpu_ns = static_cast<uint64_t>(cpu.tv_sec) * 1000000000ull +
                  static_cast<uint64_t>(cpu.tv_nsec);
  ++stats_.rounds;
  stats_.events += written;
  stats_.segment_events = segment_events_;
  if (full_)
    stats_.full_disk_lost_events += collected - written;
  else
    stats_.lost_events += collected - written;
  stats_.busy_ns += elapsed_ns(t0);
}

void StreamWriter::write_block(uint32_t type, const void* sub, size_t sub_len, const void* data,
                               size_t data_len) {
  if (failed_ || full_) return;
  const uint64_t length = sub_len + data_len;
  const uint32_t payload_crc = crc32(data, data_len, crc32(sub, sub_len));
  unsigned char head[kBlockHeaderSize];
  const uint32_t reserved = 0;
  std::memcpy(head, &type, 4);
  std::memcpy(head + 4, &reserved, 4);
  std::memcpy(head + 8, &length, 8);
  std::memcpy(head + 16, &payload_crc, 4);
  const uint32_t head_crc = crc32(head, 20);
  std::memcpy(head + 20, &head_crc, 4);

  // One writev per block; a short write (a signal, a full disk) continues
  // where it stopped.
  iovec iov[3] = {{head, sizeof(head)},
                  {const_cast<void*>(sub), sub_len},
                  {const_cast<void*>(data), data_len}};
  int first = 0;
  const int count = 3;
  uint64_t done = 0;
  const uint64_t total = sizeof(head) + length;
  while (done < total) {
    const ssize_t n = ::writev(fd_, iov + first, count - first);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      if (segment_bytes_ && (err == ENOSPC || err == EDQUOT) && cut_back(offset_)) {
        // Rolling (--max-disk) on a full disk: the oldest segment makes room and the
        // block is written again from its start; with none left, the round stops here
        // and the next one begins a segment (round()).
        if (drop_oldest_for_space()) {
          iov[0] = {head, sizeof(head)};
          iov[1] = {const_cast<void*>(sub), sub_len};
          iov[2] = {const_cast<void*>(data), data_len};
          first = 0;
          done = 0;
          continue;
        }
        full_ = true;
        return;
      }
      failed_ = true;
      std::lock_guard<std::mutex> lock(stats_mutex_);
      stats_.error = "offset " + std::to_string(offset_ + done) + ": write failed: " +
                     std::strerror(err);
      return;
    }
    done += static_cast<uint64_t>(n);
    size_t left = static_cast<size_t>(n);
    while (first < count && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < count) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  offset_ += total;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++stats_.blocks;
  stats_.bytes += total;
}

}  // namespace hooktrace
