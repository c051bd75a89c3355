-- arrive.lua: a visitor without a usable ticket or pass arrives.
--
-- KEYS: the route's five keys, then the client's key when the client is
--       known and a per-client limit is on (see route.lua).
-- ARGV: [1] id (16 raw bytes)  [2] admit_now (1|0)  [3] capacity
--       [4] max_admit_per_tick  [5] tick (ms)  [6] session_ttl (ms)
--       [7] abandon_after (ms)  [8] max_waiting
--       [9] unconfirmed session life (ms)  [10] unconfirmed ticket life (ms)
--       [11] client places (0 = off)  [12] client joins per minute (0 = off)
--       [13] client memory (ms)  [14] join window (ms)
--       [15] too late after (unix ms, the caller's clock): the caller has
--            given up on this call by then
--       [16] the epoch this instance saw last (µs), or '' if none
--       [17] pass_ttl (ms): the hold when [16] shows a lost store
-- Returns: {1}                                   admitted (or already active)
--          {2, join score µs, position, waiting} in line (new or same place)
--          {3, waiting}                          line full, nobody queued
--          {4, retry after ms}                   the client is over a limit:
--                                                nothing was stored for it
--          {5}                                   run too late: nothing stored
-- Invariant: admit-now only when nobody waits, no hold is on, the active
-- count (expiry > now) is below capacity and the tick window has room; it
-- spends one from the same window budget the admitter uses. Join scores are
-- unique and increasing, so the line is FIFO. New sessions and tickets are
-- unconfirmed (.25 in active, .5 in seen). An id already in line or active
-- is not a new place and is never refused.

local id = ARGV[1]
local admit_now = ARGV[2] == '1'
local capacity = tonumber(ARGV[3])
local max_admit_per_tick = tonumber(ARGV[4])
local tick_ms = tonumber(ARGV[5])
local session_ttl_ms = tonumber(ARGV[6])
local abandon_after_ms = tonumber(ARGV[7])
local max_waiting = tonumber(ARGV[8])
local unconfirmed_session_ms = tonumber(ARGV[9])
local unconfirmed_ticket_ms = tonumber(ARGV[10])
local client_places = tonumber(ARGV[11])
local client_joins = tonumber(ARGV[12])
local client_memory_ms = tonumber(ARGV[13])
local join_window_ms = tonumber(ARGV[14])
local too_late_ms = tonumber(ARGV[15])
local known_epoch_us = tonumber(ARGV[16])
local pass_ttl_ms = tonumber(ARGV[17])

-- The caller timed out and went on without this call (a local line may have
-- given the visitor a ticket): storing it now would place the id twice.
if now_ms > too_late_ms then
  return {5}
end

-- The epoch this instance remembered changed: the store was lost since its
-- last tick. Hold before anyone is let in at once ahead of the visitors whose
-- sessions were lost.
if known_epoch_us and known_epoch_us ~= epoch_us then
  notice_loss(pass_ttl_ms)
end

-- Ghosts and unconfirmed tickets go first (counted by the next tick), this
-- visitor included.
local ghosts, unconfirmed = drop_ghosts(abandon_after_ms, 100)
if is_ghost(id, abandon_after_ms) then
  if unconfirmed_ticket(id) then
    unconfirmed = unconfirmed + 1
  else
    ghosts = ghosts + 1
  end
  redis.call('ZREM', waiting_key, id)
  redis.call('ZREM', seen_key, id)
end
if ghosts > 0 then
  redis.call('HINCRBY', stats_key, 'pending_abandoned', ghosts)
end
if unconfirmed > 0 then
  redis.call('HINCRBY', stats_key, 'pending_unconfirmed_tickets', unconfirmed)
end

-- Arriving again is not coming back with a cookie: an unconfirmed session
-- stays unconfirmed, an unconfirmed ticket unpolled.
if is_active(id) then
  local expiry = tonumber(redis.call('ZSCORE', active_key, id))
  if not marked(expiry, 0.25) then
    redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
  end
  return {1}
end

local score = tonumber(redis.call('ZSCORE', waiting_key, id))
if score then
  if not unconfirmed_ticket(id) then
    redis.call('ZADD', seen_key, int(now_ms), id)
  end
  return place(id, score)
end

local wait_ms = client_refusal(client_places, client_joins, join_window_ms,
  unconfirmed_ticket_ms, abandon_after_ms)
if wait_ms > 0 then
  return {4, math.floor(wait_ms)}
end

local waiting = redis.call('ZCARD', waiting_key)
if admit_now and waiting == 0 and now_us >= hold_until()
    and active_count() < capacity then
  local window, used, room = tick_window(tick_ms, max_admit_per_tick)
  if room > 0 then
    redis.call('ZADD', active_key, int(now_ms + unconfirmed_session_ms) .. '.25', id)
    record_admissions(window, used, 1)
    client_record(id, client_memory_ms)
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
redis.call('ZADD', seen_key,
  int(now_ms - (abandon_after_ms - unconfirmed_ticket_ms)) .. '.5', id)
client_record(id, client_memory_ms)
return place(id, score)
