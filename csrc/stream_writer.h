// Streaming to disk (issue #9): a background thread drains a streaming
// Session's chunks into a .htrace file while the model runs, so memory stays
// bounded by the session's capacity for any run length. The recording threads
// never wait for it: when it falls behind, chunks run out and events are
// dropped and counted (session.h, "Streaming").
//
// The thread wakes every `period_ms`, or earlier when refill() finds half the
// capacity in flight or had to drop (session.h Wakeup), collects every
// thread's unconsumed events, appends them as framed blocks with plain
// write(2)/writev(2) calls, and only then releases the chunks (end_collect).
// It never takes the GIL. No fsync: a killed process loses nothing that write()
// returned (it is in the page cache); only a machine crash can, and then the
// reader loads the complete blocks before the damage.
//
// File format version 3 (the stream format; hooktrace/format/stream.py reads it
// and documents the same layout). Little-endian throughout.
//
//   file header, 16 bytes (written by Python before the writer starts):
//     off size
//       0    8  magic "HTRACE\0\0"
//       8    4  u32 format version = 3
//      12    4  u32 header size = 16
//   then blocks until the FOOTER, each a 24-byte header and a payload:
//       0    4  u32 type (BlockType below)
//       4    4  u32 reserved, 0
//       8    8  u64 payload length in bytes
//      16    4  u32 crc32 of the payload (zlib's CRC-32)
//      20    4  u32 crc32 of header bytes 0-19
//      24       payload
//
//   META (1)       UTF-8 JSON, the first block (Python): pid, hostname,
//                  versions, mode, policy, capacity, start_unix_ns, modules
//                  ([[qualified name, class name], ...], slot i = module i;
//                  [] for a process scope, whose table grows: MODULES),
//                  thread_names at the start.
//   CLOCK (2)      24 bytes: u64 ticks0, i64 unix_ns0, f64 ns_per_tick; the
//                  conversion measured up to now. Written before the first
//                  EVENTS and at most every kClockPeriodMs after; the reader
//                  applies the last one to every event.
//   NODE_NAMES (3) u32 first, u32 count, count x (u32 byte length + UTF-8):
//                  autograd node names [first, first + count) (the table
//                  grows while recording); written before the EVENTS that
//                  may use them, `first` = the names written so far.
//   EVENTS (4)     16-byte sub-header: u32 thread (the thread's index in the
//                  session), u32 tid, u64 first (index of the block's first
//                  event among that thread's events: blocks of a thread are
//                  contiguous, in order); then n x 32-byte events (event.h),
//                  all of that thread, as recorded.
//   STATS (5)      16 bytes: u64 dropped_events, u64 overwritten_events so far
//                  (written when they change, so a killed run still counts).
//   FOOTER (6)     UTF-8 JSON, the last block (Python, after the final drain):
//                  dropped/overwritten counts, stop_unix_ns, thread_names,
//                  events (the total written). Nothing follows it.
//   MODULES (7)    u32 first, then a string table of 2 x n strings (u32 count =
//                  2n, then each u32 byte length + UTF-8): qualified name and
//                  class name of modules [first, first + n). A process scope's
//                  module table grows while recording (modules are named on
//                  their first call, set_modules()); written before the EVENTS
//                  that may use them. `first` is the modules written so far, or
//                  less when earlier names changed (the main model became
//                  known, scopes.py): those are restated, and the table never
//                  shrinks (first + n >= the modules so far).
//
// A process killed at any moment leaves a file whose blocks up to the first
// truncated one load; the reader says where it was cut.
//
// Rolling (issue #31, `--max-disk`): set_rolling() bounds the disk a stream
// takes. At a round's start (a chunk boundary: no block is ever split), once
// the file at `path` holds `segment_bytes` or more, it is renamed to
// `<stem>.<k>.htrace` (k = 1, 2, ... oldest first) and a new file is started
// at `path` with `prefix` (header and META) and every CLOCK, NODE_NAMES and
// MODULES entry restated, so each segment loads alone; a thread's first EVENTS
// block in a segment continues its event index (META says "rolling"). Then the
// oldest segments are deleted while all of them together exceed `max_bytes`,
// their events counted as rolled off (stats). Only the newest file, at
// `path`, gets the FOOTER.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "session.h"

namespace hooktrace {

enum BlockType : uint32_t {
  kBlockMeta = 1,
  kBlockClock = 2,
  kBlockNodeNames = 3,
  kBlockEvents = 4,
  kBlockStats = 5,
  kBlockFooter = 6,
  kBlockModules = 7,
};

constexpr size_t kBlockHeaderSize = 24;
constexpr size_t kEventsSubHeaderSize = 16;

// zlib's CRC-32 (reflected 0xEDB88320), continued from `crc` as zlib.crc32 is.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

struct StreamStats {
  uint64_t rounds = 0;          // collections done
  uint64_t events = 0;          // events written
  uint64_t bytes = 0;           // bytes written by this writer (blocks + payloads)
  uint64_t blocks = 0;
  uint64_t lost_events = 0;     // collected after a write error, not written
  uint64_t busy_ns = 0;         // wall time spent collecting and writing (not waiting)
  uint64_t cpu_ns = 0;          // the writer thread's CPU time (on a loaded machine
                                // busy_ns also counts time it was preempted)
  std::string error;            // the first write error, "" if none
  uint64_t segments = 1;        // rolling: segments started (the first included)
  uint64_t rolled_off_segments = 0;  // deleted to stay within max_bytes
  uint64_t rolled_off_events = 0;    // the events they held
  uint64_t rolled_off_bytes = 0;
  uint64_t segment_events = 0;  // events in the newest segment (= events without rolling)
  // Rolling on a full disk (ENOSPC/EDQUOT): the oldest closed segments are deleted to
  // make room (counted in rolled_off_* and here); with none left, the round's unwritten
  // events are lost (counted here, not an error) and the next round starts a segment.
  uint64_t full_disk_rolled_off_segments = 0;
  uint64_t full_disk_lost_events = 0;
};

class StreamWriter {
 public:
  // A CLOCK block at most this often: a clock measurement is ~1000 clock-pair
  // reads (tens of us), and the conversion's slope only gets more exact.
  static constexpr int64_t kClockPeriodMs = 100;

  // `fd` is open for writing and positioned after the META block; it stays
  // the caller's (not closed here). Puts `session` into streaming mode, so it
  // must not have started.
  StreamWriter(std::shared_ptr<Session> session, int fd, uint32_t period_ms);
  ~StreamWriter();
  StreamWriter(const StreamWriter&) = delete;
  StreamWriter& operator=(const StreamWriter&) = delete;

  void start();
  // Rolling segments (see the format notes above); before start().
  void set_rolling(std::string path, std::string stem, std::string prefix, uint64_t segment_bytes,
                   uint64_t max_bytes);
  // The file descriptor of the newest segment (the caller's fd until the first
  // roll); after stop() the caller writes the FOOTER to it and closes it.
  int fd() const { return fd_; }
  // Sets entries [first, first + n) of the module table the MODULES blocks carry
  // (first at most its size: it grows or restates, never has a gap). Called off
  // the hot path, once per new module, before the module's slot is registered,
  // so the round that collects its events writes its name first. Never waits
  // for a write: the writer copies the new entries under modules_mutex_ only.
  void set_modules(uint32_t first, std::vector<std::pair<std::string, std::string>> entries);
  // Returns once a round that began after the call has written everything
  // recorded before it (a live snapshot reads the file then).
  void flush();
  // A final round, then the thread ends. Stop the session first: the final
  // round then drains every event, partial chunks included.
  void stop();
  StreamStats stats();

  // os.fork() (a DataLoader's workers, multiprocessing): before_fork() waits for
  // the round in progress and holds every mutex the writer takes, so the child
  // never inherits one locked by the writer thread, which does not exist there;
  // after_fork() releases them. In the child the writer is inert: stop() joins
  // nothing and writes nothing (the file is the parent's), flush() returns.
  void before_fork();
  void after_fork(bool in_child);

 private:
  void run();
  void round(bool last);
  void roll();
  // Rolling, full disk: deletes the oldest closed segment (counted); false if none.
  bool drop_oldest_for_space();
  // Cuts the current segment back to `at` bytes after a failed write; false on error.
  bool cut_back(uint64_t at);
  void write_block(uint32_t type, const void* sub, size_t sub_len, const void* data,
                   size_t data_len);

  std::shared_ptr<Session> session_;
  std::shared_ptr<Wakeup> wakeup_;
  int fd_;
  const int caller_fd_;             // the caller's: never closed here
  // Rolling (writer thread only once started): 0 = off.
  uint64_t segment_bytes_ = 0, max_bytes_ = 0;
  std::string path_, stem_, prefix_;
  struct Closed { std::string path; uint64_t bytes, events; };
  std::vector<Closed> closed_;      // closed segments still on disk, oldest first
  uint64_t segment_start_ = 0;      // offset_ where the current segment's blocks began
  uint64_t segment_events_ = 0;     // events written to the current segment
  uint64_t next_segment_ = 1;
  const std::chrono::milliseconds period_;
  std::thread thread_;

  bool stop_requested_ = false;     // guarded by wakeup_->mutex
  uint64_t rounds_started_ = 0;     // guarded by wakeup_->mutex
  std::mutex done_mutex_;
  std::condition_variable done_cv_;
  uint64_t rounds_done_ = 0;        // guarded by done_mutex_
  bool running_ = false;            // guarded by done_mutex_

  // Writer thread only (or the caller's, once the thread is joined).
  std::vector<Segment> segments_;
  uint64_t offset_ = 0;             // file offset of the next block
  size_t names_written_ = 0;
  bool clock_written_ = false;
  std::chrono::steady_clock::time_point last_clock_;
  uint64_t last_dropped_ = 0;
  bool failed_ = false;
  bool full_ = false;               // rolling: this round met a full disk, nothing to drop
  bool stopped_ = false;            // caller's thread only
  bool forked_ = false;             // this is a forked child's copy (caller's thread)
  std::mutex round_mutex_;          // held by the writer thread through each round

  std::mutex modules_mutex_;
  std::vector<std::pair<std::string, std::string>> modules_;  // guarded by modules_mutex_
  size_t modules_written_ = 0;      // guarded by modules_mutex_: [0, this) written as is

  std::mutex stats_mutex_;
  StreamStats stats_;               // guarded by stats_mutex_
};

}  // namespace hooktrace
