-- stats.lua: a route's live numbers.
--
-- KEYS: the route's six keys and its lanes' (see route.lua).
-- ARGV: none.
-- Returns: {waiting (every lane), active, admitted_total, admit rate per
--           second (string), epoch µs, hold_until µs (0 if none), now µs,
--           then per lane in order: waiting, admitted from the line}
-- Invariant: the active count is counted from expiry scores (expiry > now);
-- the admit rate is decayed admissions / decayed elapsed time (tau 60 s, see
-- route.lua), the same on every instance and in the memory store. Writes nothing but the epoch of an unseen route.

local rate = admit_rate()
local hold = hold_until()
if hold <= now_us then
  hold = 0
end
local reply = {
  waiting_total(),
  active_count(),
  tonumber(redis.call('HGET', stats_key, 'admitted_total')) or 0,
  string.format('%.17g', rate),
  epoch_us,
  hold,
  now_us,
}
for l = 1, #lane_keys do
  reply[#reply + 1] = redis.call('ZCARD', lane_keys[l])
  reply[#reply + 1] = tonumber(redis.call('HGET', stats_key,
    'admitted:' .. lane_names[l])) or 0
end
return reply
