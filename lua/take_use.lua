-- take_use.lua: counts one use of an invite token.
--
-- KEYS: the route's six keys (see route.lua), then KEYS[7]
--       qg:{route}:invite:<hex token key>: the uses counted, a string that
--       expires with the token.
-- ARGV: [1] max uses  [2] the token's expiry (unix s)
-- Returns: 2 if this use is the last of max uses, 1 if it is within them
--          and not the last, 0 if not within them or the token expired.
-- Invariant: of any number of calls for one token before it expires, at
-- most `max uses` answer 1 or 2, and one at most answers 2; an expired
-- token counts nothing.

local invite_key = KEYS[7]
local max_uses = tonumber(ARGV[1])
local expires_s = tonumber(ARGV[2])
if expires_s <= math.floor(now_ms / 1000) then
  return 0
end
local uses = redis.call('INCR', invite_key)
redis.call('EXPIREAT', invite_key, int(expires_s))
if uses == max_uses then
  return 2
end
if uses < max_uses then
  return 1
end
return 0
