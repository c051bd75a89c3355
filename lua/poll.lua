-- poll.lua: a waiter polls; the poll is its heartbeat.
--
-- KEYS: the route's five keys (see route.lua).
-- ARGV: [1] id (16 raw bytes)  [2] ticket's join score (µs)
--       [3] session_ttl (ms)  [4] abandon_after (ms)  [5] pass_ttl (ms)
-- Returns: {2, join score µs, position, waiting}  still in line (or restored)
--          {1}                                    admitted: the visitor has
--                                                 shown up, session_ttl from now
--          {0}                                    gone: join anew at the back
-- Invariant: an entry missing from the store is restored at the ticket's
-- score only when the epoch is newer than the score (the store was wiped; a
-- hold of pass_ttl starts) or the score is younger than abandon_after (a
-- write lost in a failover), and never for a no-show (admitted, did not come
-- within arrival_grace: a tombstone in seen, or its expired .5 expiry). A
-- waiter still in line keeps its place: ghosts are dropped by arrive and
-- admit_tick.

local id = ARGV[1]
local ticket_us = tonumber(ARGV[2])
local session_ttl_ms = tonumber(ARGV[3])
local abandon_after_ms = tonumber(ARGV[4])
local pass_ttl_ms = tonumber(ARGV[5])

local score = tonumber(redis.call('ZSCORE', waiting_key, id))
if score then
  redis.call('ZADD', seen_key, int(now_ms), id)
  return place(id, score)
end

if is_active(id) then
  redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
  return {1}
end

if is_no_show(id) then
  return {0}
end

local wiped = epoch_us > ticket_us
if wiped or now_us - ticket_us < abandon_after_ms * 1000 then
  redis.call('ZADD', waiting_key, int(ticket_us), id)
  redis.call('ZADD', seen_key, int(now_ms), id)
  if wiped then
    notice_loss(pass_ttl_ms)
  end
  return place(id, ticket_us)
end

return {0}
