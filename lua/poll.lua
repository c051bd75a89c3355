-- poll.lua: a waiter polls; the poll is its heartbeat, and confirms a new
-- ticket.
--
-- KEYS: the route's six keys and its lanes', then the client's key when
--       the client is known and the places limit is on (see route.lua).
-- ARGV: [1] id (16 raw bytes)  [2] ticket's join score (µs)
--       [3] ticket's last seen (µs; the score if never polled)
--       [4] session_ttl (ms)  [5] abandon_after (ms)  [6] pass_ttl (ms)
--       [7] client memory (ms)  [8] confirm_within (ms)
--       [9] the ticket's lane (1-based among the lanes' keys): where a
--           restore puts it
-- Returns: {2, join score µs, position, waiting, lane}
--                                                 still in line (or restored):
--                                                 position and count within
--                                                 its lane, lane 0-based
--          {1}                                    admitted: the visitor has
--                                                 shown up, session_ttl from now
--          {0}                                    gone: join anew at the back
-- Invariant: an entry missing from the store is restored at the ticket's
-- score only when its holder could still be in line (seen + abandon_after >
-- now), no tombstone says it left or never showed up, and either
-- - the ticket is confirmed (seen after score) and the epoch is newer than
--   the score (the store was wiped; a hold of pass_ttl starts), or
-- - the ticket is confirmed and the score is younger than abandon_after (a
--   write lost in a failover), or
-- - the ticket was never polled and the score is younger than
--   confirm_within as well: a ticket an instance's local line issued during
--   an outage, polled for the first time now. The store would still hold it
--   unconfirmed had it been written, so nothing dropped comes back. A waiter still in line keeps
-- its place, in whichever lane holds it (the ticket's lane is not trusted
-- for that); a restore goes into the ticket's lane: ghosts are dropped by
-- arrive and admit_tick.

local id = ARGV[1]
local ticket_us = tonumber(ARGV[2])
local seen_us = tonumber(ARGV[3])
local session_ttl_ms = tonumber(ARGV[4])
local abandon_after_ms = tonumber(ARGV[5])
local pass_ttl_ms = tonumber(ARGV[6])
local client_memory_ms = tonumber(ARGV[7])
local confirm_within_ms = tonumber(ARGV[8])
local ticket_lane = tonumber(ARGV[9]) or 1
if not lane_keys[ticket_lane] then
  ticket_lane = 1
end

local lane, score = find_lane(id)
if lane then
  beat_now(id)
  client_touch(id, client_memory_ms)
  return place(id, score, lane)
end

if is_active(id) then
  redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
  client_touch(id, client_memory_ms)
  return {1}
end

if tombstoned(id) then
  return {0}
end
if seen_us + abandon_after_ms * 1000 <= now_us then
  return {0}
end

local age_us = now_us - ticket_us
local confirmed = seen_us > ticket_us
local wiped = confirmed and epoch_us > ticket_us
local lost_write = age_us < abandon_after_ms * 1000
  and (confirmed or age_us < confirm_within_ms * 1000)
if wiped or lost_write then
  put_in_lane(ticket_lane, ticket_us, id)
  beat_now(id)
  if wiped then
    notice_loss(pass_ttl_ms)
  end
  return place(id, ticket_us, ticket_lane)
end

return {0}
