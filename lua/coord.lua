-- coord.lua: who coordinates a split route's tick (src/queue/shards.rs).
-- Standalone (no prelude): it touches two keys of the route's own slot.
--
-- KEYS: [1] qg:{route}:coord (string: the generation coordinating now,
--       expiring with its lease)  [2] qg:{route}:stats (its coord_window
--       and coord_gen fields)
-- ARGV: [1] 'take' | 'release'
--   take: [2] tick (ms)  [3] lease (ms)   release: [2] the generation
-- Returns: take: the generation (µs-based, rising), or 0 when another
--          instance coordinates now or already did in this tick window;
--          release: 1 if the lease was still this generation's, else 0.
-- Invariant: at most one coordinator per tick window and at a time (the
-- lease); generations rise even across a wipe of this slot (they follow
-- the store's clock), so sub-lines stamped by a later coordinator refuse an
-- earlier one's moves (shares.lua).

if ARGV[1] == 'release' then
  if redis.call('GET', KEYS[1]) == ARGV[2] then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end

local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local window = string.format('%d', math.floor(now_us / 1000 / tonumber(ARGV[2])))
if redis.call('EXISTS', KEYS[1]) == 1
    or redis.call('HGET', KEYS[2], 'coord_window') == window then
  return 0
end
local gen = math.max(now_us, (tonumber(redis.call('HGET', KEYS[2], 'coord_gen')) or 0) + 1)
gen = string.format('%d', gen)
redis.call('HSET', KEYS[2], 'coord_window', window, 'coord_gen', gen)
redis.call('SET', KEYS[1], gen, 'PX', tonumber(ARGV[3]))
return tonumber(gen)
