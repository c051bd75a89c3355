-- ended.lua: the ids whose places ended (a leave, a session ended by the
-- origin, an exit path or its last allowed request, a purged no-show) at or
-- after a time, so that every instance refuses their passes within a tick,
-- not only at their next renewal.
--
-- KEYS: the route's six keys and its lanes' (see route.lua).
-- ARGV: [1] since (ms, store time; 0: every tombstone still kept)
-- Returns: {now ms (as a string), id, id, ...}: at most 10,000 ids, the
--          most recent first. Tombstones are kept abandon_after.

local since_ms = tonumber(ARGV[1])
local reply = {tostring(now_ms)}
local ids = redis.call('ZRANGEBYSCORE', seen_key, '-inf', int(-since_ms),
  'LIMIT', 0, 10000)
for i = 1, #ids do
  reply[#reply + 1] = ids[i]
end
return reply
