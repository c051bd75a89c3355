-- arrive.lua: visitors without a usable ticket or pass arrive; one call for
-- a batch of them (an instance gathers the arrivals made while its previous
-- call was in flight), handled in order as if each were its own call.
--
-- KEYS: the route's six keys and its lanes' (see route.lua), then the keys
--       of the clients the arrivals came from that the limits count, each
--       once (any number, all under the route's hash tag).
-- ARGV: [1] capacity ('': the sub-line's share, see route.lua)
--       [2] max_admit_per_tick  [3] tick (ms)
--       [4] session_ttl (ms)  [5] abandon_after (ms)  [6] max_waiting
--       [7] unconfirmed session life (ms)  [8] unconfirmed ticket life (ms)
--       [9] client places (0 = off)  [10] client joins per minute (0 = off)
--       [11] client memory (ms)  [12] join window (ms)
--       [13] too late after (unix ms, the caller's clock): the caller has
--            given up on this call by then
--       [14] the epoch this instance saw last (µs), or '' if none
--       [15] pass_ttl (ms): the hold when [14] shows a lost store
--       [16] when the route opens (µs), or '' if it has no opening: before
--            it nobody is admitted at once (DESIGN §8.7)
--       then for each arrival: id (16 raw bytes), admit_now (1|0), the
--       index of its client's key in KEYS after the lanes' (0: none), the
--       lane it joins (1-based among the lanes' keys)
-- Returns: five numbers per arrival, in order:
--          {1, 0, 0, 0, 0}                       admitted (or already active)
--          {2, join score µs, position, waiting, lane}
--                                                in line (new or same place):
--                                                position and count within
--                                                the lane, lane 0-based
--          {3, waiting, 0, 0, 0}                 line full (every lane
--                                                together), nobody queued
--          {4, retry after ms, 0, 0, 0}          the client is over a limit:
--                                                nothing was stored for it
--          {5, 0, 0, 0, 0}                       run too late: nothing stored
-- Invariant: admit-now only when the route has opened, nobody waits (on a
-- sub-line of a split route: nobody waited anywhere at the last tick), no
-- hold is on, the active count (expiry > now) is below capacity and the
-- tick window has room; it
-- spends one from the same window budget the admitter uses; nobody waits
-- means in no lane. Join scores are unique and increasing across lanes, so
-- each lane is FIFO, in the batch's order within a batch; an id already in
-- any lane keeps its place there. New sessions and tickets are unconfirmed (.25 in active, `u` in
-- beat). An id already in line or active is not a new place and is never
-- refused.

local capacity = capacity_of(ARGV[1])
local max_admit_per_tick = tonumber(ARGV[2])
local tick_ms = tonumber(ARGV[3])
local session_ttl_ms = tonumber(ARGV[4])
local abandon_after_ms = tonumber(ARGV[5])
local max_waiting = tonumber(ARGV[6])
local unconfirmed_session_ms = tonumber(ARGV[7])
local unconfirmed_ticket_ms = tonumber(ARGV[8])
local client_places = tonumber(ARGV[9])
local client_joins = tonumber(ARGV[10])
local client_memory_ms = tonumber(ARGV[11])
local join_window_ms = tonumber(ARGV[12])
local too_late_ms = tonumber(ARGV[13])
local known_epoch_us = tonumber(ARGV[14])
local pass_ttl_ms = tonumber(ARGV[15])
local opens_at_us = tonumber(ARGV[16])
local FIRST_ARRIVAL = 17
-- A sub-line of a split route admits at once only while the last tick
-- found nobody waiting anywhere (admit_tick.lua's `open`).
local at_once_open = ARGV[1] ~= '' or redis.call('HGET', stats_key, 'open') == '1'

local reply = {}

-- The caller timed out and went on without this call (a local line may have
-- given the visitors tickets): storing them now would place the ids twice.
if now_ms > too_late_ms then
  for _ = FIRST_ARRIVAL, #ARGV, 4 do
    reply[#reply + 1] = 5
    for _ = 1, 4 do
      reply[#reply + 1] = 0
    end
  end
  return reply
end

-- The epoch this instance remembered changed: the store was lost since its
-- last tick. Hold before anyone is let in at once ahead of the visitors whose
-- sessions were lost.
if known_epoch_us and known_epoch_us ~= epoch_us then
  notice_loss(pass_ttl_ms)
end

-- Ghosts and unconfirmed tickets go first (counted by the next tick): a
-- small slice of the scan here (all of a short line), the tick does the rest.
local ghosts, unconfirmed = drop_ghosts(abandon_after_ms, 10)

local function arrive_one(id, admit_now, lane)
  -- This visitor's own entry, if it is a ghost.
  if is_ghost(id, abandon_after_ms) then
    if unconfirmed_ticket(id) then
      unconfirmed = unconfirmed + 1
    else
      ghosts = ghosts + 1
    end
    remove_from_line(id)
    redis.call('HDEL', beat_key, id)
  end

  -- Arriving again is not coming back with a cookie: an unconfirmed session
  -- stays unconfirmed, an unconfirmed ticket unpolled.
  if is_active(id) then
    local expiry = tonumber(redis.call('ZSCORE', active_key, id))
    if not marked(expiry, 0.25) then
      redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
    end
    return {1, 0, 0, 0, 0}
  end

  local held, score = find_lane(id)
  if held then
    if not unconfirmed_ticket(id) then
      beat_now(id)
    end
    return place(id, score, held)
  end

  local wait_ms = client_refusal(client_places, client_joins, join_window_ms,
    unconfirmed_ticket_ms, abandon_after_ms)
  if wait_ms > 0 then
    return {4, math.floor(wait_ms), 0, 0, 0}
  end

  local waiting = waiting_total()
  if admit_now and waiting == 0 and at_once_open and now_us >= hold_until()
      and (opens_at_us == nil or now_us >= opens_at_us)
      and active_count() < capacity then
    local window, used, room = tick_window(tick_ms, max_admit_per_tick)
    if room > 0 then
      redis.call('ZADD', active_key, int(now_ms + unconfirmed_session_ms) .. '.25', id)
      record_admissions(window, used, 1)
      client_record(id, client_memory_ms)
      return {1, 0, 0, 0, 0}
    end
  end

  if waiting >= max_waiting then
    return {3, waiting, 0, 0, 0}
  end

  score = now_us
  local last = tonumber(redis.call('HGET', stats_key, 'last_score'))
  if last and score <= last then
    score = last + 1
  end
  redis.call('HSET', stats_key, 'last_score', int(score))
  put_in_lane(lane, score, id)
  redis.call('HSET', beat_key, id,
    beat_value(now_ms - (abandon_after_ms - unconfirmed_ticket_ms), true))
  -- A tombstone of an earlier place goes with the new one.
  redis.call('ZREM', seen_key, id)
  client_record(id, client_memory_ms)
  return place(id, score, lane)
end

for i = FIRST_ARRIVAL, #ARGV, 4 do
  local client = tonumber(ARGV[i + 2])
  -- The prelude's client functions read client_key.
  if client > 0 then
    client_key = KEYS[extra + client]
  else
    client_key = nil
  end
  local lane = tonumber(ARGV[i + 3])
  if not lane_keys[lane] then
    lane = 1
  end
  local answer = arrive_one(ARGV[i], ARGV[i + 1] == '1', lane)
  for j = 1, 5 do
    reply[#reply + 1] = answer[j]
  end
end

if ghosts > 0 then
  redis.call('HINCRBY', stats_key, 'pending_abandoned', ghosts)
end
if unconfirmed > 0 then
  redis.call('HINCRBY', stats_key, 'pending_unconfirmed_tickets', unconfirmed)
end
return reply
