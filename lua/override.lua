-- override.lua: a route's runtime override (DESIGN §9.4), read, written or
-- cleared. Every instance reads it once per tick and follows it.
--
-- KEYS: [1] qg:{route}:override
-- ARGV: [1] 'get', 'set' or 'del'  [2] for 'set': the override (JSON text,
--       src/queue/overrides.rs)
-- Returns: 'get': the override's text, or nil when there is none;
--          'set', 'del': 1.
-- Invariant: one value per route, replaced whole.

if ARGV[1] == 'get' then
  return redis.call('GET', KEYS[1])
elseif ARGV[1] == 'set' then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
elseif ARGV[1] == 'del' then
  redis.call('DEL', KEYS[1])
  return 1
end
return redis.error_reply('ERR override.lua: unknown operation')
