-- hold.lua: an instance admitted visitors on its own while it could not
-- reach the store; nobody new is admitted for one pass_ttl, so their passes
-- come back (renew.lua) and are counted first.
--
-- KEYS: the route's six keys and its lanes' (see route.lua).
-- ARGV: [1] pass_ttl (ms)
-- Returns: the end of the hold (µs).
-- Invariant: a hold already running longer is kept.

local pass_ttl_ms = tonumber(ARGV[1])
local until_us = now_us + pass_ttl_ms * 1000
if until_us > hold_until() then
  redis.call('HSET', stats_key, 'hold_until', int(until_us))
  return until_us
end
return hold_until()
