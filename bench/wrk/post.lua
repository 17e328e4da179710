-- wrk: every request a POST of $BODY to the URL's path, as JSON. "{id}" in BODY becomes a unique id
-- ($RUN, the thread, a counter): sm4c's starts each need their own instance id.
-- With $RATE (requests per second over all threads), each thread paces itself to its share: it waits
-- while it is ahead of its schedule (an open-loop rate, as far as wrk's 1 ms timers allow).
-- At the end it prints one JSON line: requests, seconds, p50/p99 in ms, errors.
local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } timespec;
  int clock_gettime(int clk_id, timespec *tp);
]]
local ts = ffi.new("timespec")
local function now_ms()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local body = os.getenv("BODY")
local run = os.getenv("RUN") or "r"
local rate = tonumber(os.getenv("RATE") or "0")
local threads = 0
local counter = 0
local start = nil
local per_thread = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  local n = tonumber(os.getenv("THREADS") or "1")
  per_thread = rate / n
end

function delay()
  if per_thread <= 0 then
    return 0
  end
  if start == nil then
    start = now_ms()
  end
  local due = start + counter * 1000 / per_thread
  local ahead = due - now_ms()
  if ahead >= 1 then
    return math.floor(ahead)
  end
  return 0
end

function request()
  counter = counter + 1
  local b = body:gsub("{id}", run .. "-" .. tid .. "-" .. counter)
  return wrk.format(nil, nil, nil, b)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "seconds": %.3f, "p50ms": %.3f, "p99ms": %.3f, "maxms": %.3f, "non2xx": %d, "socketErrors": %d}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1e3, latency:percentile(99) / 1e3,
    latency.max / 1e3, e.status, e.connect + e.read + e.write + e.timeout))
end
