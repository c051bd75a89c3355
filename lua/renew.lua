-- renew.lua: a pass holder renews its session.
--
-- KEYS: the route's five keys (see route.lua).
-- ARGV: [1] id (16 raw bytes)  [2] pass issued at (unix s)
--       [3] session_ttl (ms)  [4] pass_ttl (ms)
-- Returns: 1 the session is active and now lives session_ttl from now,
--          0 it is gone (left, revoked, expired): the pass is not renewed.
-- Invariant: a session missing from a store whose epoch is newer than the
-- pass (less one second for the pass's resolution) was lost with the store:
-- it is restored as active and a hold of pass_ttl starts, so returning
-- visitors are counted before anyone new is admitted.

local id = ARGV[1]
local issued_s = tonumber(ARGV[2])
local session_ttl_ms = tonumber(ARGV[3])
local pass_ttl_ms = tonumber(ARGV[4])

if is_active(id) then
  redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
  return 1
end

if epoch_us > (issued_s - 1) * 1000000 then
  redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
  redis.call('ZREM', waiting_key, id)
  redis.call('ZREM', seen_key, id)
  notice_loss(pass_ttl_ms)
  return 1
end

return 0
