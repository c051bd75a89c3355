-- leave.lua: a visitor leaves the line or frees its slot.
--
-- KEYS: the route's five keys (see route.lua).
-- ARGV: [1] id (16 raw bytes)
-- Returns: 1 if the id was in line or active, 0 if unknown (both fine).
-- Invariant: afterwards the id is in neither waiting nor active, and seen
-- holds its tombstone (-now ms, forgotten abandon_after later by
-- admit_tick), so neither its ticket nor its pass is restored as a lost write.

local id = ARGV[1]
local removed = redis.call('ZREM', waiting_key, id)
removed = removed + redis.call('ZREM', active_key, id)
redis.call('ZADD', seen_key, int(-now_ms), id)
if removed > 0 then
  return 1
end
return 0
