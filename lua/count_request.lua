-- count_request.lua: counts one forwarded request of a session on a route
-- with max_requests_per_session, ending the session at the limit.
--
-- KEYS: the route's six keys and its lanes', then qg:{route}:uses:<hex id>
--       (see route.lua).
-- ARGV: [1] id (16 raw bytes), [2] limit (at least 1), [3] how long the
--       count is kept after this request (ms): session_ttl + pass_ttl.
-- Returns: 1 allowed (forward; the session goes on), 2 last (forward; the
--          session has ended), 3 exhausted (do not forward), 4 gone (no
--          live session and no tombstone: nothing counted).
-- Invariant: for one id, at most `limit` calls ever answer 1 or 2 while its
-- count is kept, and the call answering 2 leaves the id as leave.lua does
-- (in neither waiting nor active, a tombstone in seen), so no instance
-- renews or restores the session afterwards. An id with a tombstone (it
-- left, or was ended) or whose count reached the limit answers 3, and one
-- without a live session 4, without counting.

local id = ARGV[1]
local limit = tonumber(ARGV[2])
local keep_ms = tonumber(ARGV[3])
local uses_key = KEYS[extra + 1]
if tombstoned(id) then
  return 3
end
-- The count outlives the tombstone: a session that made its requests stays
-- exhausted while any pass of it can come back.
if (tonumber(redis.call('GET', uses_key)) or 0) >= limit then
  return 3
end
if not is_active(id) then
  return 4
end
local count = redis.call('INCR', uses_key)
redis.call('PEXPIRE', uses_key, keep_ms)
if count > limit then
  return 3
end
if count == limit then
  end_place(id)
  return 2
end
return 1
