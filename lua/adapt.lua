-- adapt.lua: a route's origin-health windows and its adaptive capacity
-- (DESIGN §9.1, src/health.rs). Standalone (no prelude): it touches two
-- keys of the route's own slot.
--
-- KEYS: [1] qg:{route}:health (hash: `cap` and `why`, the capacity every
--       instance admits by and why it was set; `w`, the window being
--       counted; `c:n`, `c:e`, `c:<bucket>` its requests, errors and
--       histogram; `p:...` the same for the window before it; and coord.lua's
--       coord_window / coord_gen)  [2] qg:{route}:adapt (the lease coord.lua
--       takes for the decision of one window)
-- ARGV: [1] 'report' | 'set'
--   report: [2] the window (ms)  [3] requests  [4] errors  [5 ..] pairs of
--           bucket index and count (non-zero buckets only)
--   set:    [2] the lease (coord.lua's generation)  [3] capacity  [4] why
-- Returns: report: {capacity (-1: none set), why, the window now counted,
--          the ended window's requests, its errors, {its bucket pairs...}};
--          set: 1 if the lease was still held and the capacity is set, else 0.
-- Invariant: the windows follow the store's clock, so every instance adds
-- to the same one; a report after a window with no report at all starts
-- from empty counts for the window before (nothing ran then). The capacity
-- is only written under the lease of the window it was decided in, so a
-- decider that was too slow cannot undo the next one's decision.

local clock = redis.call('TIME')
local now_ms = math.floor((tonumber(clock[1]) * 1000000 + tonumber(clock[2])) / 1000)

if ARGV[1] == 'set' then
  if redis.call('GET', KEYS[2]) ~= ARGV[2] then
    return 0
  end
  redis.call('HSET', KEYS[1], 'cap', ARGV[3], 'why', ARGV[4])
  return 1
end

local every_ms = tonumber(ARGV[2])
local window = math.floor(now_ms / every_ms)
local counted = tonumber(redis.call('HGET', KEYS[1], 'w'))

local function fields(prefix)
  local found = {}
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == prefix then
      found[#found + 1] = all[i]
      found[#found + 1] = all[i + 1]
    end
  end
  return found
end

if counted ~= window then
  -- The window rolled: what was counted becomes the ended window's, if it
  -- was the one just before; the counts start again.
  local old = fields('p:')
  for i = 1, #old, 2 do
    redis.call('HDEL', KEYS[1], old[i])
  end
  local current = fields('c:')
  for i = 1, #current, 2 do
    redis.call('HDEL', KEYS[1], current[i])
    if counted == window - 1 then
      redis.call('HSET', KEYS[1], 'p:' .. string.sub(current[i], 3), current[i + 1])
    end
  end
  redis.call('HSET', KEYS[1], 'w', string.format('%d', window))
end

if tonumber(ARGV[3]) > 0 then
  redis.call('HINCRBY', KEYS[1], 'c:n', ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'c:e', ARGV[4])
  for i = 5, #ARGV, 2 do
    redis.call('HINCRBY', KEYS[1], 'c:' .. ARGV[i], ARGV[i + 1])
  end
end

local kept = redis.call('HMGET', KEYS[1], 'cap', 'why', 'p:n', 'p:e')
local buckets = {}
local ended = fields('p:')
for i = 1, #ended, 2 do
  local bucket = tonumber(string.sub(ended[i], 3))
  if bucket then
    buckets[#buckets + 1] = bucket
    buckets[#buckets + 1] = tonumber(ended[i + 1])
  end
end
return {
  tonumber(kept[1]) or -1,
  kept[2] or '',
  window,
  tonumber(kept[3]) or 0,
  tonumber(kept[4]) or 0,
  buckets,
}
