-- arrive.lua: a visitor without a usable ticket or pass arrives.
--
-- KEYS: the route's five keys (see route.lua).
-- ARGV: [1] id (16 raw bytes)  [2] admit_now (1|0)  [3] capacity
--       [4] max_admit_per_tick  [5] tick (ms)  [6] session_ttl (ms)
--       [7] abandon_after (ms)  [8] max_waiting
-- Returns: {1}                                   admitted (or already active)
--          {2, join score µs, position, waiting} in line (new or same place)
--          {3, waiting}                          line full, nobody queued
-- Invariant: admit-now only when nobody waits, no hold is on, the active
-- count (expiry > now) is below capacity and the tick window has room; it
-- spends one from the same window budget the admitter uses. Join scores are
-- unique and increasing, so the line is FIFO.

local id = ARGV[1]
local admit_now = ARGV[2] == '1'
local capacity = tonumber(ARGV[3])
local max_admit_per_tick = tonumber(ARGV[4])
local tick_ms = tonumber(ARGV[5])
local session_ttl_ms = tonumber(ARGV[6])
local abandon_after_ms = tonumber(ARGV[7])
local max_waiting = tonumber(ARGV[8])

-- Ghosts go first (counted by the next tick), this visitor included.
local dropped = drop_ghosts(abandon_after_ms, 100)
if is_ghost(id, abandon_after_ms) then
  redis.call('ZREM', waiting_key, id)
  redis.call('ZREM', seen_key, id)
  dropped = dropped + 1
end
if dropped > 0 then
  redis.call('HINCRBY', stats_key, 'pending_abandoned', dropped)
end

if is_active(id) then
  redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
  return {1}
end

local score = tonumber(redis.call('ZSCORE', waiting_key, id))
if score then
  redis.call('ZADD', seen_key, int(now_ms), id)
  return place(id, score)
end

local waiting = redis.call('ZCARD', waiting_key)
if admit_now and waiting == 0 and now_us >= hold_until()
    and active_count() < capacity then
  local window, used, room = tick_window(tick_ms, max_admit_per_tick)
  if room > 0 then
    redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
    record_admissions(window, used, 1)
    return {1}
  end
end

if waiting >= max_waiting then
  return {3, waiting}
end

score = now_us
local last = tonumber(redis.call('HGET', stats_key, 'last_score'))
if last and score <= last then
  score = last + 1
end
redis.call('HSET', stats_key, 'last_score', int(score))
redis.call('ZADD', waiting_key, int(score), id)
redis.call('ZADD', seen_key, int(now_ms), id)
return place(id, score)
